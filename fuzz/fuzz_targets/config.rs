//! The config file: TOML parse, then the whole validation (subscriptions, connectors, schedules,
//! queues, workflows, bindings, api keys, limits). Whatever the text, an error list or a catalog,
//! never a panic. Secrets are `env:` references to variables that are not set (so they fail as
//! they would for an operator) or `file:` references inside an empty folder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trigger_bridge::config::{validate, Config};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = toml::from_str::<Config>(text) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    match validate(cfg, dir.path()) {
        Ok(_) => {}
        Err(errs) => assert!(!errs.is_empty(), "a refusal says why"),
    }
});
