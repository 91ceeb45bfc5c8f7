//! The SSRF guard on the http executor: a worker URL that names, or resolves to, a
//! loopback address fails its attempt with `destination_forbidden` and never reaches the worker,
//! unless its workflow says `allow_private = true`.

mod support;

use std::sync::atomic::Ordering;

use support::*;
use tb_core::binding::Binding;
use tb_core::connector::ConnectorSpec;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, SubscriptionConfig};

fn http(id: &str, url: String, allow_private: bool) -> Workflow {
    Workflow {
        id: id.into(),
        executor: Executor::Http {
            url,
            secret: WORKER_KEY.to_vec(),
            timeout_ms: 2_000,
            allow_private,
            non_retryable_statuses: vec![410],
        },
    }
}

fn start(id: &str, wf: &str) -> Binding {
    opened_binding(id, "github", wf, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_destinations_are_refused_unless_the_workflow_allows_them() {
    let (url, hits) = worker(vec![]).await;
    let port = url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/run")
        .to_string();
    let (dir, store) = store();
    let sub = SubscriptionConfig {
        retry: fast_retry(1),
        ..SubscriptionConfig::webhook("github", ConnectorSpec::Github, GH_SECRET.as_bytes())
    };
    let workflows = vec![
        // An address written in the URL, in two spellings.
        http("literal", format!("http://127.0.0.1:{port}/run"), false),
        http(
            "mapped",
            format!("http://[::ffff:127.0.0.1]:{port}/run"),
            false,
        ),
        // A name that resolves to a loopback address.
        http("named", format!("http://localhost:{port}/run"), false),
        // The operator's own worker.
        http("allowed", format!("http://127.0.0.1:{port}/run"), true),
    ];
    let bindings = ["literal", "mapped", "named", "allowed"]
        .map(|w| start(&format!("to-{w}"), w))
        .to_vec();
    let s = serve(
        dir,
        store,
        Catalog::new(vec![sub], bindings, workflows),
        Vec::new(),
    )
    .await;
    let (st, v) = s
        .post_github("pull_request", "ssrf-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st.as_u16(), 202, "{v}");
    let ids: Vec<(String, String)> = v["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["bindingId"].as_str().unwrap().to_string(),
                d["deliveryId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(ids.len(), 4, "{v}");
    for (binding, id) in ids {
        let d = s
            .wait_for(&format!("/v1/deliveries/{id}"), |d| {
                d["attempts"].as_array().is_some_and(|a| !a.is_empty())
            })
            .await;
        let a = &d["attempts"][0];
        if binding == "to-allowed" {
            assert_eq!(a["outcome"], "delivered", "{d}");
        } else {
            assert_eq!(a["errorClass"], "destination_forbidden", "{binding}: {d}");
            let m = a["message"].as_str().unwrap();
            assert!(
                m.contains("a private, loopback, link-local or metadata address")
                    && m.contains("allow_private = true"),
                "{binding}: {m}"
            );
        }
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "only the allowed workflow reached the worker"
    );
}
