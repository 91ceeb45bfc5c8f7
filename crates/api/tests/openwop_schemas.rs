//! Every event the pipeline emits validates against the OpenWOP schemas in `tests/fixtures/openwop/`:
//! run events against `run-event.schema.json` (envelope) and `run-event-payloads` `$defs/runStarted`;
//! trigger events against `$defs/triggerDeliveryAttempted` / `$defs/triggerSubscriptionStateChanged`,
//! with exactly the spec's declared property set; subscriptions against `trigger-subscription.schema.json`.

mod support;

use serde_json::{json, Value};
use support::{check, schema};

/// A validator for `$defs/{def}` of a schema document.
fn def_validator(doc: &Value, def: &str) -> jsonschema::Validator {
    assert!(doc["$defs"].get(def).is_some(), "schema has no $defs/{def}");
    let mut s = doc.clone();
    s["$ref"] = json!(format!("#/$defs/{def}"));
    jsonschema::validator_for(&s).expect("schema compiles")
}

const FORBIDDEN: [&str; 7] = [
    "body",
    "headers",
    "payload",
    "secret",
    "credentials",
    "token",
    "apiKey",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_events_validate_against_the_openwop_schemas() {
    // A worker that fails twice with a breaker threshold of 1: retrying, failed, then delivered, active.
    let (url, _) = support::worker(vec![500, 500]).await;
    let s = support::start(Some(url), support::fast_retry(5), 1).await;
    let (_, a) = s
        .post_github(
            "pull_request",
            "schema-1",
            support::opened(),
            support::GH_SECRET,
        )
        .await;
    let run_id = a["runId"].as_str().unwrap().to_string();
    s.wait_for(&format!("/v1/runs/{run_id}"), |v| {
        v["status"] == "completed"
    })
    .await;
    // Pause + resume for operator transitions.
    s.http
        .post(format!("{}/v1/trigger-subscriptions/github/pause", s.base))
        .send()
        .await
        .unwrap();
    s.http
        .post(format!("{}/v1/trigger-subscriptions/github/resume", s.base))
        .send()
        .await
        .unwrap();

    let payloads = schema("run-event-payloads.trigger-subset.schema.json");
    let attempted = def_validator(&payloads, "triggerDeliveryAttempted");
    let changed = def_validator(&payloads, "triggerSubscriptionStateChanged");
    let started = def_validator(&payloads, "runStarted");
    // The validators are not vacuous: a payload missing required fields or with a bad enum fails.
    assert!(!attempted.is_valid(&json!({"subscriptionId": "s", "dedupKey": "k", "attempt": 1})));
    assert!(!attempted.is_valid(
        &json!({"subscriptionId": "s", "dedupKey": "k", "attempt": 0, "outcome": "delivered"})
    ));
    assert!(!changed.is_valid(&json!({"subscriptionId": "s", "source": "webhook", "fromState": "active", "toState": "gone"})));
    let declared: Vec<String> = payloads["$defs"]["triggerDeliveryAttempted"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();

    let events = s
        .engine
        .store
        .subscription_events("github", 100)
        .await
        .unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for e in &events {
        let keys: Vec<&String> = e.payload.as_object().unwrap().keys().collect();
        for k in FORBIDDEN {
            assert!(
                !keys.iter().any(|x| *x == k),
                "content-free: {} carries {k}",
                e.event_type
            );
        }
        match e.event_type.as_str() {
            "trigger.delivery.attempted" => {
                check(&attempted, &e.payload);
                for k in &keys {
                    assert!(
                        declared.contains(k),
                        "undeclared field {k} on trigger.delivery.attempted"
                    );
                }
            }
            "trigger.subscription.state.changed" => check(&changed, &e.payload),
            other => panic!("unexpected event {other}"),
        }
        *seen.entry(e.event_type.clone()).or_insert(0) += 1;
    }
    assert_eq!(seen.get("trigger.delivery.attempted"), Some(&3));
    assert_eq!(
        seen.get("trigger.subscription.state.changed"),
        Some(&4),
        "failed, active, paused, active"
    );

    let envelope =
        jsonschema::validator_for(&schema("run-event.schema.json")).expect("schema compiles");
    let evs = s.get(&format!("/v1/runs/{run_id}/events/poll")).await;
    let evs = evs["events"].as_array().unwrap();
    assert_eq!(
        evs.len(),
        3,
        "run.started, the delivered attempt, run.completed"
    );
    let attempted_on_log = evs
        .iter()
        .find(|e| e["type"] == "trigger.delivery.attempted")
        .unwrap();
    check(&attempted, &attempted_on_log["payload"]);
    assert_eq!(
        attempted_on_log["eventId"], evs[0]["causationId"],
        "the run log shows the causing attempt"
    );
    for e in evs {
        check(&envelope, e);
    }
    check(&started, &evs[0]["payload"]);

    let sub = schema("trigger-subscription.schema.json");
    let sub_v = jsonschema::validator_for(&sub).expect("schema compiles");
    assert!(!sub_v.is_valid(&json!({"subscriptionId": "s", "source": "webhook", "state": "active", "connector": "github"})));
    let subs = s.get("/v1/trigger-subscriptions").await;
    for x in subs["subscriptions"].as_array().unwrap() {
        check(&sub_v, x);
    }
}
