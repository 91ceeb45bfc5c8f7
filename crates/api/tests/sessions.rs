//! Sessions, durable signals and waits over real HTTP: GitHub and Azure DevOps events start
//! exactly one session per coalesce key and signal it afterwards; signals are buffered FIFO and
//! consumed by waits; timers, races, user-input interruption, mailbox overflow and capability URLs.

mod support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};
use support::*;
use tb_core::binding::{Binding, BindingAction, OnExisting};
use tb_core::connector::ConnectorSpec;
use tb_core::signal::{MailboxPolicy, Overflow};
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, SubscriptionConfig};

const ADO_USER: &str = "ado";
const ADO_PASS: &str = "ado-pass";
const PR_KEY: &str = "{repository.full_name}#{pull_request.number}";
const ADO_KEY: &str = "{resource.repository.id}#{resource.pullRequestId}";

fn session_config() -> Value {
    json!({"agent": "reviewer", "model": "approved-model", "namespace": "team-a", "tools": ["git"], "budget": {"turns": 20}})
}

fn sub(id: &str, connector: ConnectorSpec, secret: &str) -> SubscriptionConfig {
    SubscriptionConfig {
        retry: fast_retry(3),
        ..SubscriptionConfig::webhook(id, connector, secret.as_bytes())
    }
}

fn binding(id: &str, sub: &str, types: &[&str], action: BindingAction) -> Binding {
    Binding {
        rate_limit_per_min: 0,
        id: id.into(),
        subscription: sub.into(),
        event_types: types.iter().map(|s| s.to_string()).collect(),
        filter: Default::default(),
        action,
        inputs: [
            ("repository".to_string(), "repository.full_name".to_string()),
            ("number".to_string(), "pull_request.number".to_string()),
        ]
        .into_iter()
        .collect(),
    }
}

fn session_workflow(id: &str, bound: u32, overflow: Overflow) -> Workflow {
    Workflow {
        id: id.into(),
        executor: Executor::Session {
            config: session_config(),
            mailbox: MailboxPolicy { bound, overflow },
        },
    }
}

/// The quickstart's shape: `pull_request.opened` starts a `pr-session` keyed by repository and PR
/// number; later `pull_request` events raise `pr.<action>` on it. Azure DevOps does the same.
async fn start() -> Server {
    let (dir, store) = store();
    let later = [
        "pull_request.synchronize",
        "pull_request.closed",
        "pull_request.reopened",
        "pull_request.edited",
    ];
    let catalog = Catalog::new(
        vec![
            sub("github", ConnectorSpec::Github, GH_SECRET),
            sub(
                "ado",
                ConnectorSpec::AzureDevops {
                    basic_username: Some(ADO_USER.into()),
                    header_name: None,
                },
                ADO_PASS,
            ),
        ],
        vec![
            binding(
                "pr-session-open",
                "github",
                &["pull_request.opened"],
                BindingAction::StartRun {
                    workflow: "pr-session".into(),
                    coalesce_key: Some(PR_KEY.into()),
                    on_existing: OnExisting::Signal,
                    signal: Some("pr.{action}".into()),
                    prompt: None,
                    wake: false,
                },
            ),
            binding(
                "pr-session-events",
                "github",
                &later,
                BindingAction::RaiseSignal {
                    workflow: Some("pr-session".into()),
                    coalesce_key: Some(PR_KEY.into()),
                    run: None,
                    signal: "pr.{action}".into(),
                    wake: false,
                },
            ),
            Binding {
                inputs: Default::default(),
                ..binding(
                    "ado-session",
                    "ado",
                    &["git.pullrequest.created"],
                    BindingAction::StartRun {
                        workflow: "pr-session".into(),
                        coalesce_key: Some(ADO_KEY.into()),
                        on_existing: OnExisting::Noop,
                        signal: None,
                        prompt: None,
                        wake: false,
                    },
                )
            },
            Binding {
                inputs: Default::default(),
                ..binding(
                    "ado-events",
                    "ado",
                    &["git.pullrequest.updated"],
                    BindingAction::RaiseSignal {
                        workflow: Some("pr-session".into()),
                        coalesce_key: Some(ADO_KEY.into()),
                        run: None,
                        signal: "ado.updated".into(),
                        wake: true,
                    },
                )
            },
        ],
        vec![
            session_workflow("pr-session", 64, Overflow::Reject),
            session_workflow("tiny-reject", 2, Overflow::Reject),
            session_workflow("tiny-drop", 2, Overflow::DropOldest),
        ],
    );
    serve(dir, store, catalog, Vec::new()).await
}

/// A real GitHub payload re-pointed at `repo` / PR `number` (the key the session coalesces on).
fn pr_event(file: &str, repo: &str, number: u64) -> Vec<u8> {
    let p = fixtures().join("github/pull_request").join(file);
    let mut v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    v["repository"]["full_name"] = json!(repo);
    v["pull_request"]["number"] = json!(number);
    v["number"] = json!(number);
    serde_json::to_vec(&v).unwrap()
}

fn ado_event(id: &str, event_type: &str, pr: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "subscriptionId": "00000000-0000-0000-0000-000000000000",
        "notificationId": 4,
        "id": id,
        "eventType": event_type,
        "publisherId": "tfs",
        "message": {"text": "Jamal Hartnett created a new pull request"},
        "detailedMessage": {"text": "Jamal Hartnett created a new pull request"},
        "resource": {
            "repository": {"id": "4bc14d40-c903-45e2-872e-0462c7748079", "name": "Fabrikam", "project": {"id": "6ce954b1-ce1f-45d1-b94d-e6bf2464ba2c", "name": "Fabrikam"}},
            "pullRequestId": pr,
            "status": "active",
            "title": "my first pull request",
            "sourceRefName": "refs/heads/mytopic",
            "targetRefName": "refs/heads/master"
        },
        "resourceVersion": "1.0",
        "resourceContainers": {"collection": {"id": "c12d0eb8-e382-443b-9f9c-c52cba5014c2"}, "project": {"id": "be9b3917-87e6-42a4-a549-2bc06a7a878f"}},
        "createdDate": "2026-11-30T00:00:00Z"
    }))
    .unwrap()
}

impl Server {
    async fn post_ado(&self, body: Vec<u8>) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}/v1/trigger-subscriptions/ado/ingest", self.base))
            .header("content-type", "application/json; charset=utf-8")
            .header(
                "authorization",
                tb_ingress::azure_devops::basic_authorization(ADO_USER, ADO_PASS.as_bytes()),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Runs of `workflow`, oldest first.
    async fn runs_of(&self, workflow: &str) -> Vec<Value> {
        let mut v: Vec<Value> = self.get("/v1/runs?limit=500").await["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["workflowId"] == workflow)
            .cloned()
            .collect();
        v.reverse();
        v
    }

    /// A new session run through `POST /v1/runs` (started by the worker).
    async fn session(&self, workflow: &str) -> String {
        let (st, r) = self
            .post("/v1/runs", json!({"workflowId": workflow, "inputs": {}}))
            .await;
        assert_eq!(st, StatusCode::CREATED, "{r}");
        let id = r["runId"].as_str().unwrap().to_string();
        self.wait_for(&format!("/v1/runs/{id}"), |v| v["status"] == "running")
            .await;
        id
    }

    async fn signal(&self, run: &str, body: Value) -> (StatusCode, Value) {
        self.post(&format!("/v1/runs/{run}/signals"), body).await
    }

    async fn wait(&self, run: &str, body: Value) -> (StatusCode, Value) {
        self.post(&format!("/v1/runs/{run}/waits"), body).await
    }

    async fn claim(&self, run: &str) -> Value {
        let (st, t) = self
            .post(&format!("/v1/runs/{run}/turns:claim?timeout=5"), json!({}))
            .await;
        assert_eq!(st, StatusCode::OK, "{t}");
        t
    }

    async fn ack(&self, run: &str, turn: &Value) {
        let (st, t) = self
            .post(
                &format!(
                    "/v1/runs/{run}/turns/{}/ack?claim={}",
                    turn["turnId"].as_str().unwrap(),
                    turn["claims"]
                ),
                json!({}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{t}");
    }
}

fn names(signals: &Value, state: &str) -> Vec<String> {
    signals["signals"]
        .as_array()
        .unwrap()
        .iter()
        .rev() // newest first on the wire; arrival order here
        .filter(|s| s["state"] == state)
        .map(|s| s["signal"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn redelivered_github_event_starts_one_session_and_later_events_signal_it() {
    let s = start().await;
    let opened = pr_event("00-opened.json", "acme/app", 42);
    // The same delivery five times, concurrently: one receipt, one session.
    let posts =
        (0..5).map(|_| s.post_github("pull_request", "gh-open-42", opened.clone(), GH_SECRET));
    let answers = futures_util::future::join_all(posts).await;
    assert_eq!(
        answers
            .iter()
            .filter(|(st, _)| *st == StatusCode::ACCEPTED)
            .count(),
        1,
        "{answers:?}"
    );
    assert_eq!(
        answers
            .iter()
            .filter(|(st, _)| *st == StatusCode::OK)
            .count(),
        4
    );
    let runs = loop {
        let r = s.runs_of("pr-session").await;
        if !r.is_empty() {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(runs.len(), 1);
    let run = runs[0]["runId"].as_str().unwrap().to_string();
    assert_eq!(runs[0]["status"], "running");
    assert_eq!(
        runs[0]["inputs"],
        json!({"repository": "acme/app", "number": 42})
    );

    // A different delivery of another `opened` for the same PR coalesces: it signals, no new session.
    let (st, _) = s
        .post_github(
            "pull_request",
            "gh-open-42-again",
            opened.clone(),
            GH_SECRET,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    // Later events with the same key raise pr.<action> on that session.
    let (st, sync) = s
        .post_github(
            "pull_request",
            "gh-sync-42",
            pr_event("22-synchronize.json", "acme/app", 42),
            GH_SECRET,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{sync}");
    let (st, _) = s
        .post_github(
            "pull_request",
            "gh-closed-42",
            pr_event("03-closed.json", "acme/app", 42),
            GH_SECRET,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let sigs = s
        .wait_for(&format!("/v1/runs/{run}/signals"), |v| v["buffered"] == 3)
        .await;
    assert_eq!(
        names(&sigs, "buffered"),
        ["pr.opened", "pr.synchronize", "pr.closed"]
    );
    let first = &sigs["signals"][1]["signal"];
    assert_eq!(first["version"], 1);
    assert_eq!(first["source"]["kind"], "webhook");
    assert_eq!(first["source"]["receiptId"], sync["receiptId"]);
    assert_eq!(
        first["data"],
        json!({"repository": "acme/app", "number": 42})
    );
    assert_eq!(s.runs_of("pr-session").await.len(), 1, "still one session");
    // Delivered to the mailbox = queued, not consumed.
    let rid = sync["receiptId"].as_str().unwrap();
    s.wait_for(&format!("/v1/receipts/{rid}"), |v| {
        v["receipt"]["state"] == "queued"
    })
    .await;

    // Another PR number is another session.
    s.post_github(
        "pull_request",
        "gh-open-43",
        pr_event("00-opened.json", "acme/app", 43),
        GH_SECRET,
    )
    .await;
    for _ in 0..200 {
        if s.runs_of("pr-session").await.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.runs_of("pr-session").await.len(), 2);

    // A wait consumes the buffered pr.synchronize; its receipt becomes consumed.
    let (st, w) = s
        .wait(
            &run,
            json!({"kind": "signal", "names": ["pr.synchronize"], "reason": "waiting for a push"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "resolved at once: {w}");
    assert_eq!(w["state"], "resolved");
    assert_eq!(w["winner"]["kind"], "signal");
    assert_eq!(w["winner"]["signal"]["name"], "pr.synchronize");
    let r = s.get(&format!("/v1/receipts/{rid}")).await;
    assert_eq!(r["receipt"]["state"], "consumed", "{r}");
    let states: Vec<&str> = r["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "received",
            "authenticated",
            "normalized",
            "matched",
            "routed",
            "attempted",
            "queued",
            "consumed"
        ]
    );
    assert!(!r["timeline"].to_string().contains("acme/app"), "redacted");
}

#[tokio::test]
async fn a_synchronize_for_an_unknown_pr_is_routing_failed_not_a_new_session() {
    let s = start().await;
    let (st, a) = s
        .post_github(
            "pull_request",
            "gh-sync-orphan",
            pr_event("22-synchronize.json", "acme/app", 7),
            GH_SECRET,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let rid = a["receiptId"].as_str().unwrap();
    let r = s
        .wait_for(&format!("/v1/receipts/{rid}"), |v| {
            v["receipt"]["state"] == "routing_failed"
        })
        .await;
    assert_eq!(
        r["deliveries"][0]["deadLetterReason"], "target_missing",
        "{r}"
    );
    assert!(s.runs_of("pr-session").await.is_empty());
}

#[tokio::test]
async fn redelivered_azure_devops_event_starts_one_session() {
    let s = start().await;
    let created = ado_event(
        "8a1f0b3e-0d8c-4c45-b5b8-7b0b3a1e7f01",
        "git.pullrequest.created",
        1,
    );
    for _ in 0..3 {
        let (st, a) = s.post_ado(created.clone()).await;
        assert!(st == StatusCode::ACCEPTED || st == StatusCode::OK, "{a}");
    }
    let run = loop {
        let r = s.runs_of("pr-session").await;
        if let Some(r) = r.first() {
            break r["runId"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (st, _) = s
        .post_ado(ado_event(
            "8a1f0b3e-0d8c-4c45-b5b8-7b0b3a1e7f02",
            "git.pullrequest.updated",
            1,
        ))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let sigs = s
        .wait_for(&format!("/v1/runs/{run}/signals"), |v| v["buffered"] == 1)
        .await;
    assert_eq!(names(&sigs, "buffered"), ["ado.updated"]);
    assert_eq!(s.runs_of("pr-session").await.len(), 1);
    // wake = true: the signal also became a turn, after the start turn.
    let start = s.claim(&run).await;
    assert_eq!(start["kind"], "start");
    assert_eq!(start["content"]["session"], session_config());
    s.ack(&run, &start).await;
    let wake = s.claim(&run).await;
    assert_eq!(wake["kind"], "signal");
    assert_eq!(
        wake["content"]["untrusted"]["signal"]["name"],
        "ado.updated"
    );
    // A wrong password is 401 and starts nothing.
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/ado/ingest", s.base))
        .header("content-type", "application/json")
        .header(
            "authorization",
            tb_ingress::azure_devops::basic_authorization(ADO_USER, b"wrong"),
        )
        .body(ado_event(
            "8a1f0b3e-0d8c-4c45-b5b8-7b0b3a1e7f09",
            "git.pullrequest.created",
            9,
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

#[tokio::test]
async fn signals_raised_before_the_wait_are_consumed_oldest_first() {
    let s = start().await;
    let run = s.session("pr-session").await;
    for (name, id) in [("ci.done", "s1"), ("review.done", "s2"), ("ci.done", "s3")] {
        let (st, r) = s
            .signal(
                &run,
                json!({"name": name, "signalId": id, "data": {"n": id}}),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
        assert_eq!(r["status"], "queued");
    }
    // A repeated signalId is recorded and suppressed.
    let (st, dup) = s
        .signal(
            &run,
            json!({"name": "ci.done", "signalId": "s1", "data": {"n": "s1"}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(dup["status"], "duplicate");
    // The same signalId for another signal is a conflict, not a silent duplicate.
    let (st, e) = s
        .signal(&run, json!({"name": "other", "signalId": "s1"}))
        .await;
    assert_eq!(
        (st.as_u16(), e["error"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );
    // Body rules: too large is 413, another content type 415, both in the envelope.
    let big = json!({"name": "x", "data": "y".repeat(1 << 20)});
    let (st, e) = s.signal(&run, big).await;
    assert_eq!(
        (st.as_u16(), e["error"].as_str()),
        (413, Some("payload_too_large"))
    );
    let r = s
        .http
        .post(format!("{}/v1/runs/{run}/signals", s.base))
        .header("content-type", "text/plain")
        .body(r#"{"name":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let mut got = Vec::new();
    for names in [
        json!(["ci.done"]),
        json!(["ci.done", "review.done"]),
        json!(["ci.done"]),
    ] {
        let (st, w) = s
            .wait(
                &run,
                json!({"kind": "signal", "names": names, "reason": "r"}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{w}");
        got.push(
            w["winner"]["signal"]["signalId"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(got, ["s1", "s2", "s3"]);
    let sigs = s.get(&format!("/v1/runs/{run}/signals")).await;
    assert_eq!(sigs["buffered"], 0);
    assert_eq!(names(&sigs, "consumed").len(), 3);
    let events = s.get(&format!("/v1/runs/{run}/events/poll")).await;
    let types: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "tb.signal.duplicate")
            .count(),
        1
    );
    assert_eq!(
        types.iter().filter(|t| **t == "tb.signal.consumed").count(),
        3
    );
    // Events are content-free: no signal data in the log.
    assert!(!events.to_string().contains("\"n\""), "{events}");
    // Every session event is a valid OpenWOP run event (vendor-prefixed `tb.` types).
    let v = validator("run-event.schema.json");
    for e in events["events"].as_array().unwrap() {
        check(&v, e);
    }
}

#[tokio::test]
async fn a_wait_times_out_by_its_durable_timer() {
    let s = start().await;
    let run = s.session("pr-session").await;
    let (st, w) = s
        .wait(
            &run,
            json!({"kind": "signal", "names": ["never"], "timeoutMs": 300, "reason": "waiting for CI"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(w["state"], "armed");
    let r = s.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(r["status"], "waiting-external");
    assert_eq!(r["waitReason"], "waiting for CI");
    let id = w["waitId"].as_str().unwrap();
    let done = s
        .get(&format!("/v1/runs/{run}/waits/{id}?timeout=10"))
        .await;
    assert_eq!(done["state"], "resolved", "{done}");
    assert_eq!(done["winner"]["kind"], "timer");
    assert_eq!(done["winner"]["deadline"], w["deadline"]);
    assert_eq!(s.get(&format!("/v1/runs/{run}")).await["status"], "running");
    // The resolution is a turn for the driver.
    let start = s.claim(&run).await;
    s.ack(&run, &start).await;
    let t = s.claim(&run).await;
    assert_eq!(t["kind"], "wait");
    assert_eq!(t["content"]["untrusted"]["wait"]["winner"]["kind"], "timer");
}

#[tokio::test]
async fn wait_for_any_picks_by_precedence_and_keeps_losers() {
    let s = start().await;
    let run = s.session("pr-session").await;
    // Both a signal and user input are already there when the race starts.
    s.signal(&run, json!({"name": "ci.done", "signalId": "ci-1"}))
        .await;
    let (st, prompt) = s
        .post(
            &format!("/v1/runs/{run}/prompts"),
            json!({"text": "please stop and summarize"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{prompt}");
    let (st, w) = s
        .wait(
            &run,
            json!({"kind": "any", "names": ["ci.done"], "timeoutMs": 60000, "reason": "race"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{w}");
    assert_eq!(w["winner"]["kind"], "user_input");
    assert_eq!(w["winner"]["turnId"], prompt["turnId"]);
    assert_eq!(
        w["losers"],
        json!([{"kind": "signal", "disposition": "left_buffered"}])
    );
    // The losing signal is still buffered and wins the next race.
    assert_eq!(
        names(&s.get(&format!("/v1/runs/{run}/signals")).await, "buffered"),
        ["ci.done"]
    );
    let (_, w2) = s
        .wait(
            &run,
            json!({"kind": "any", "names": ["ci.done"], "reason": "race 2"}),
        )
        .await;
    assert_eq!(w2["winner"]["kind"], "signal");
    assert_eq!(w2["winner"]["signal"]["signalId"], "ci-1");
    // Stop beats everything: an armed race resolves with `stop` when the run is cancelled.
    let (st, w3) = s
        .wait(
            &run,
            json!({"kind": "any", "names": ["x"], "timeoutMs": 60000, "reason": "race 3"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = s.post(&format!("/v1/runs/{run}/cancel"), json!({})).await;
    assert!(st.is_success());
    let id = w3["waitId"].as_str().unwrap();
    let w3 = s.get(&format!("/v1/runs/{run}/waits/{id}")).await;
    assert_eq!(w3["winner"]["kind"], "stop", "{w3}");
    // The run ended: signals and waits get target_terminal (409, never 410).
    let (st, e) = s.signal(&run, json!({"name": "late"})).await;
    assert_eq!(
        (st.as_u16(), e["error"].as_str()),
        (409, Some("target_terminal"))
    );
    let (st, _) = s
        .wait(
            &run,
            json!({"kind": "signal", "names": ["x"], "reason": "r"}),
        )
        .await;
    assert_eq!(st.as_u16(), 409);
    // Its turns are closed too.
    let (st, e) = s
        .post(&format!("/v1/runs/{run}/turns:claim?timeout=0"), json!({}))
        .await;
    assert_eq!(
        (st.as_u16(), e["error"].as_str()),
        (409, Some("target_terminal"))
    );
}

#[tokio::test]
async fn user_input_interrupts_a_signal_wait_which_rearms_with_its_remaining_deadline() {
    let s = start().await;
    let run = s.session("pr-session").await;
    let start = s.claim(&run).await;
    s.ack(&run, &start).await;
    let (st, w) = s
        .wait(
            &run,
            json!({"kind": "signal", "names": ["ci.done"], "timeoutMs": 60000, "reason": "waiting for CI"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let id = w["waitId"].as_str().unwrap().to_string();
    s.post(
        &format!("/v1/runs/{run}/prompts"),
        json!({"text": "how is it going?"}),
    )
    .await;
    let mid = s.get(&format!("/v1/runs/{run}/waits/{id}")).await;
    assert_eq!(mid["state"], "armed");
    assert_eq!(mid["interrupted"], true);
    assert_eq!(s.get(&format!("/v1/runs/{run}")).await["status"], "running");
    // A signal during the interruption is buffered, not consumed.
    s.signal(&run, json!({"name": "ci.done", "signalId": "during"}))
        .await;
    assert_eq!(
        s.get(&format!("/v1/runs/{run}/waits/{id}")).await["state"],
        "armed"
    );
    // The driver handles the user's turn; acknowledging it re-arms the same wait with the same
    // absolute deadline, which then takes the buffered signal.
    let t = s.claim(&run).await;
    assert_eq!(t["kind"], "prompt");
    assert_eq!(t["content"]["prompt"], "how is it going?");
    s.ack(&run, &t).await;
    let after = s.get(&format!("/v1/runs/{run}/waits/{id}")).await;
    assert_eq!(after["waitId"], w["waitId"]);
    assert_eq!(after["deadline"], w["deadline"], "the original deadline");
    assert_eq!(after["state"], "resolved");
    assert_eq!(after["winner"]["signal"]["signalId"], "during");

    // Re-armed with nothing buffered, a wait interrupted past its deadline resolves by timer on ack.
    let (_, w2) = s
        .wait(
            &run,
            json!({"kind": "signal", "names": ["ci.done"], "timeoutMs": 200, "reason": "r"}),
        )
        .await;
    let id2 = w2["waitId"].as_str().unwrap().to_string();
    let wait_turn = s.claim(&run).await; // the first wait's resolution turn
    s.ack(&run, &wait_turn).await;
    s.post(&format!("/v1/runs/{run}/prompts"), json!({"text": "again"}))
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        s.get(&format!("/v1/runs/{run}/waits/{id2}")).await["state"],
        "armed",
        "an interrupted wait's timer does not fire"
    );
    let t = s.claim(&run).await;
    s.ack(&run, &t).await;
    let w2 = s.get(&format!("/v1/runs/{run}/waits/{id2}")).await;
    assert_eq!(w2["winner"]["kind"], "timer", "{w2}");
}

#[tokio::test]
async fn payload_fields_naming_targets_or_credentials_change_nothing() {
    let s = start().await;
    let victim = s.session("tiny-reject").await;
    let mut v: Value = serde_json::from_slice(&pr_event("00-opened.json", "acme/evil", 9)).unwrap();
    for (k, val) in [
        ("workflow", json!("tiny-drop")),
        ("workflowId", json!("tiny-drop")),
        ("session", json!(victim)),
        ("runId", json!(victim)),
        ("agent", json!("root-agent")),
        ("model", json!("unapproved-model")),
        ("namespace", json!("other-team")),
        ("credentials", json!({"token": "ghp_stolen"})),
        ("signal", json!("pr.hijack")),
    ] {
        v[k] = val.clone();
        v["pull_request"][k] = val;
    }
    let (st, _) = s
        .post_github(
            "pull_request",
            "gh-evil",
            serde_json::to_vec(&v).unwrap(),
            GH_SECRET,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let run = loop {
        if let Some(r) = s.runs_of("pr-session").await.first() {
            break r.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(run["workflowId"], "pr-session");
    assert_eq!(
        run["inputs"],
        json!({"repository": "acme/evil", "number": 9})
    );
    let id = run["runId"].as_str().unwrap();
    let t = s.claim(id).await;
    assert_eq!(
        t["content"]["session"],
        session_config(),
        "operator config only"
    );
    assert!(!t.to_string().contains("ghp_stolen"));
    assert!(!t.to_string().contains("unapproved-model"));
    // Nothing reached the run the payload named, and no other workflow started.
    assert_eq!(
        s.get(&format!("/v1/runs/{victim}/signals")).await["signals"],
        json!([])
    );
    assert!(s.runs_of("tiny-drop").await.is_empty());
    assert_eq!(s.runs_of("tiny-reject").await.len(), 1);
}

#[tokio::test]
async fn a_full_mailbox_follows_its_policy_visibly() {
    let s = start().await;
    let reject = s.session("tiny-reject").await;
    for i in 0..2 {
        let (st, _) = s
            .signal(
                &reject,
                json!({"name": "tick", "signalId": format!("r{i}")}),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    let (st, e) = s
        .signal(&reject, json!({"name": "tick", "signalId": "r2"}))
        .await;
    assert_eq!(st.as_u16(), 429, "{e}");
    assert_eq!(e["error"], "signal_buffer_full");
    assert_eq!(
        s.get(&format!("/v1/runs/{reject}/signals")).await["buffered"],
        2
    );

    let drop = s.session("tiny-drop").await;
    for i in 0..3 {
        s.signal(&drop, json!({"name": "tick", "signalId": format!("d{i}")}))
            .await;
    }
    let sigs = s.get(&format!("/v1/runs/{drop}/signals")).await;
    let states: Vec<(String, String)> = sigs["signals"]
        .as_array()
        .unwrap()
        .iter()
        .rev() // the list is newest first
        .map(|x| {
            (
                x["signal"]["signalId"].as_str().unwrap().to_string(),
                x["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("d0".to_string(), "dropped".to_string()),
            ("d1".to_string(), "buffered".to_string()),
            ("d2".to_string(), "buffered".to_string())
        ]
    );
    let events = s.get(&format!("/v1/runs/{drop}/events/poll")).await;
    let dropped: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tb.signal.dropped")
        .collect();
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0]["payload"]["signalId"], "d0");
}

#[tokio::test]
async fn capability_urls_raise_one_signal_and_die_on_revocation() {
    let s = start().await;
    let run = s.session("pr-session").await;
    let (st, m) = s
        .post(
            "/v1/capabilities",
            json!({"runId": run, "signal": "deploy.finished", "label": "deploy hook", "maxUses": 3, "hmac": true}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{m}");
    let url = format!("{}{}", s.base, m["url"].as_str().unwrap());
    let key = m["hmacSecret"].as_str().unwrap().to_string();
    let body = br#"{"status":"green"}"#.to_vec();
    let post = |body: Vec<u8>, sig: Option<String>, idem: Option<&str>| {
        let mut r = s
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(sig) = sig {
            r = r.header("x-signature-256", sig);
        }
        if let Some(k) = idem {
            r = r.header("idempotency-key", k);
        }
        async move {
            let r = r.send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let sig = tb_ingress::capability::sign(key.as_bytes(), &body);
    assert_eq!(post(body.clone(), None, None).await.0, 401, "HMAC required");
    let (st, a) = post(body.clone(), Some(sig.clone()), Some("k1")).await;
    assert_eq!(st, 202, "{a}");
    assert_eq!(a["accepted"], true);
    assert!(!a.to_string().contains("green"), "never echoes the payload");
    assert_eq!(
        post(body.clone(), Some(sig.clone()), Some("k1")).await.0,
        200
    );
    let other = br#"{"status":"red"}"#.to_vec();
    let other_sig = tb_ingress::capability::sign(key.as_bytes(), &other);
    assert_eq!(post(other, Some(other_sig), Some("k1")).await.0, 409);
    let sigs = s
        .wait_for(&format!("/v1/runs/{run}/signals"), |v| v["buffered"] == 1)
        .await;
    assert_eq!(sigs["signals"][0]["signal"]["name"], "deploy.finished");
    assert_eq!(
        sigs["signals"][0]["signal"]["data"],
        json!({"status": "green"})
    );
    assert_eq!(sigs["signals"][0]["signal"]["source"]["kind"], "webhook");
    // The listing never shows the token.
    let list = s.get("/v1/capabilities").await;
    assert_eq!(list["capabilities"][0]["useCount"], 1);
    assert!(!list.to_string().contains(m["token"].as_str().unwrap()));
    // Revoked: the very next request is 404, like an unknown token.
    let id = m["endpointId"].as_str().unwrap();
    let (st, _) = s
        .post(&format!("/v1/capabilities/{id}/revoke"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, again) = s
        .post(&format!("/v1/capabilities/{id}/revoke"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "revoking twice is idempotent");
    assert!(again["revokedAt"].is_string());
    let (st, e) = post(body.clone(), Some(sig.clone()), Some("k2")).await;
    assert_eq!(st, 404);
    let unknown = s
        .http
        .post(format!("{}/v1/hooks/tbcap_nope", s.base))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status().as_u16(), 404);
    assert_eq!(
        unknown.json::<Value>().await.unwrap(),
        e,
        "indistinguishable"
    );
    let garbage = s
        .http
        .post(format!("{}/v1/hooks/tbcap_%FF%FE", s.base))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        garbage.status().as_u16(),
        404,
        "not even UTF-8: the same 404"
    );
    // Used up is the same 404.
    let (_, m2) = s
        .post(
            "/v1/capabilities",
            json!({"runId": run, "signal": "once", "maxUses": 1}),
        )
        .await;
    let url2 = format!("{}{}", s.base, m2["url"].as_str().unwrap());
    let send2 = || async {
        s.http
            .post(&url2)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(send2().await, 202);
    assert_eq!(send2().await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_events_for_one_key_create_one_session() {
    let s = start().await;
    let opened = pr_event("00-opened.json", "acme/race", 5);
    let ids: Vec<String> = (0..10).map(|i| format!("race-{i}")).collect();
    let posts = ids
        .iter()
        .map(|id| s.post_github("pull_request", id, opened.clone(), GH_SECRET));
    let answers = futures_util::future::join_all(posts).await;
    assert!(
        answers.iter().all(|(st, _)| *st == StatusCode::ACCEPTED),
        "{answers:?}"
    );
    // Ten distinct deliveries: one starts the session, nine find it and raise pr.opened on it.
    let run = loop {
        if let Some(r) = s.runs_of("pr-session").await.first() {
            break r["runId"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let sigs = s
        .wait_for(&format!("/v1/runs/{run}/signals"), |v| v["buffered"] == 9)
        .await;
    assert!(names(&sigs, "buffered").iter().all(|n| n == "pr.opened"));
    assert_eq!(s.runs_of("pr-session").await.len(), 1);
}

/// Ending a run (cancel, or a worker's result) wakes every long-poll on it at once:
/// the wait long-poll answers its `stop` winner and `turns:claim` its 409, in well under their 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_result_wake_the_long_polls_of_their_run() {
    let s = start().await;
    for end in ["cancel", "result"] {
        let run = s.session("pr-session").await;
        let start = s.claim(&run).await;
        s.ack(&run, &start).await;
        let (st, w) = s
            .wait(
                &run,
                json!({"kind": "signal", "names": ["never"], "reason": "parked"}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{w}");
        let wait = w["waitId"].as_str().unwrap().to_string();
        let before = s.engine.sessions.receiver_count();
        let http = s.http.clone();
        let wait_url = format!("{}/v1/runs/{run}/waits/{wait}?timeout=20", s.base);
        let poll = tokio::spawn(async move {
            let r = http.get(wait_url).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        });
        let http = s.http.clone();
        let claim_url = format!("{}/v1/runs/{run}/turns:claim?timeout=20", s.base);
        let claim = tokio::spawn(async move {
            let r = http.post(claim_url).json(&json!({})).send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        });
        // Both long-polls are parked on the session watch (bounded wait for their subscriptions).
        let parked = Instant::now() + Duration::from_secs(5);
        while s.engine.sessions.receiver_count() < before + 2 {
            assert!(Instant::now() < parked, "the long-polls never parked");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let t0 = Instant::now();
        let (st, r) = if end == "cancel" {
            s.post(&format!("/v1/runs/{run}/cancel"), json!({})).await
        } else {
            s.post(
                &format!("/v1/runs/{run}/result"),
                json!({"status": "completed"}),
            )
            .await
        };
        assert_eq!(st, StatusCode::OK, "{end}: {r}");
        let (code, w) = tokio::time::timeout(Duration::from_secs(2), poll)
            .await
            .expect("the wait long-poll was not woken")
            .unwrap();
        assert_eq!(code, 200);
        assert_eq!(w["state"], "resolved", "{end}: {w}");
        assert_eq!(w["winner"]["kind"], "stop", "{end}: {w}");
        let (code, c) = tokio::time::timeout(Duration::from_secs(2), claim)
            .await
            .expect("the claim long-poll was not woken")
            .unwrap();
        assert_eq!(code, 409, "{end}: {c}");
        assert_eq!(c["error"], "target_terminal");
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "{end}: {:?}",
            t0.elapsed()
        );
    }
}

/// The mailbox list is paged newest first (`limit` clamped to 1..=500, `before` =
/// the previous page's `nextCursor`), every signal seen once; settled (consumed, dropped) signal
/// records expire with the body retention while buffered ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_list_pages_clamps_and_settled_signals_expire() {
    let s = start().await;
    let run = s.session("tiny-drop").await;
    let raise = |name: &str| tb_engine::sessions::RaiseRequest {
        name: name.into(),
        data: None,
        signal_id: None,
        wake: false,
    };
    // 499 "fill", then "take", then "keep": a mailbox of 2 with drop_oldest keeps the last two.
    for i in 0..501 {
        let name = match i {
            499 => "take",
            500 => "keep",
            _ => "fill",
        };
        tb_engine::sessions::raise(&s.engine, &run, raise(name), None)
            .await
            .unwrap();
    }
    let url = format!("/v1/runs/{run}/signals");
    // Pages of 200: 200, 200, 101, newest first, each signal once.
    let mut seen = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..10 {
        let q = match &before {
            Some(b) => format!("{url}?limit=200&before={b}"),
            None => format!("{url}?limit=200"),
        };
        let page = s.get(&q).await;
        assert_eq!(page["buffered"], 2);
        let seqs: Vec<u64> = page["signals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["seq"].as_u64().unwrap())
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] > w[1]), "newest first");
        seen.extend(seqs);
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(c) => before = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, (1..=501).rev().collect::<Vec<u64>>());
    // The default page is 50; the limit is clamped to 1..=500.
    let page = s.get(&url).await;
    assert_eq!(page["signals"].as_array().unwrap().len(), 50);
    assert_eq!(page["signals"][0]["signal"]["name"], "keep");
    let page = s.get(&format!("{url}?limit=100000")).await;
    assert_eq!(page["signals"].as_array().unwrap().len(), 500);
    assert_eq!(page["nextCursor"], "2");
    let page = s.get(&format!("{url}?limit=0")).await;
    assert_eq!(page["signals"].as_array().unwrap().len(), 1);
    let r = s
        .http
        .get(format!("{}{url}?before=not-a-cursor", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "validation_error"
    );
    // A wait consumes "take"; then a sweep past the retention removes every settled record.
    let (st, w) = s
        .wait(
            &run,
            json!({"kind": "signal", "names": ["take"], "reason": "r"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{w}");
    let now = tb_engine::clock::now_ms();
    let counts = s
        .engine
        .store
        .sweep(now, now + 1, 0, 1000, tb_store::SweepCursor::default())
        .await
        .unwrap()
        .counts;
    assert_eq!(counts.signals, 500, "499 dropped + 1 consumed");
    let page = s.get(&url).await;
    let left: Vec<(u64, String)> = page["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["seq"].as_u64().unwrap(),
                x["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(left, vec![(501, "buffered".to_string())]);
    assert_eq!(
        s.engine
            .store
            .sweep(now, now + 1, 0, 1000, tb_store::SweepCursor::default())
            .await
            .unwrap()
            .counts
            .signals,
        0
    );
}

/// An `Idempotency-Key` on a capability URL follows the management API's rule. A
/// non-ASCII key (or two keys) used to be ignored, so the same request was accepted twice (two
/// signals, two uses); now it is 400 `validation_error` before anything is counted or stored.
#[tokio::test]
async fn a_capability_url_refuses_a_non_ascii_or_repeated_idempotency_key() {
    let s = start().await;
    let run = s.session("pr-session").await;
    let (st, m) = s
        .post(
            "/v1/capabilities",
            json!({"runId": run, "signal": "deploy.finished", "maxUses": 10}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{m}");
    let url = format!("{}{}", s.base, m["url"].as_str().unwrap());
    let send = |keys: Vec<&'static [u8]>| {
        let mut r = s
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(r#"{"a":1}"#);
        for k in keys {
            r = r.header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(k).unwrap(),
            );
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    for keys in [
        vec![&b"\xff\xfe"[..]],
        vec![&b"\xff\xfe"[..]],
        vec![&b"cl\xc3\xa9"[..]],
        vec![&b"has space"[..]],
        vec![&b"k1"[..], &b"k2"[..]],
        vec![&b"k1"[..], &b"k1"[..]],
    ] {
        let (st, e) = send(keys.clone()).await;
        assert_eq!(st, 400, "{keys:?}: {e}");
        assert_eq!(e["error"], "validation_error", "{keys:?}");
        assert!(
            e["message"].as_str().unwrap().contains("Idempotency-Key"),
            "{e}"
        );
    }
    // Nothing was stored or consumed: no receipt, no signal, no use.
    let list = s.get("/v1/capabilities").await;
    assert_eq!(list["capabilities"][0]["useCount"], 0, "{list}");
    let sigs = s.get(&format!("/v1/runs/{run}/signals")).await;
    assert_eq!(sigs["signals"].as_array().unwrap().len(), 0, "{sigs}");
    let receipts = s
        .engine
        .store
        .list_receipts(tb_store::ListQuery {
            limit: 100,
            before: None,
            state: None,
            subscription_id: Some(m["endpointId"].as_str().unwrap().to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(receipts.len(), 0, "no receipt for the endpoint");
    // A valid key still dedups: one accept, then a duplicate of it.
    let (st, a) = send(vec![b"ok-1"]).await;
    assert_eq!(st, 202, "{a}");
    let (st, b) = send(vec![b"ok-1"]).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(a["receiptId"], b["receiptId"]);
    let list = s.get("/v1/capabilities").await;
    assert_eq!(list["capabilities"][0]["useCount"], 1, "{list}");
    let receipts = s
        .engine
        .store
        .list_receipts(tb_store::ListQuery {
            limit: 100,
            before: None,
            state: None,
            subscription_id: Some(m["endpointId"].as_str().unwrap().to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(receipts.len(), 1, "the one accepted request");
}

/// A long-poll with an `Idempotency-Key` whose client goes away runs on (it cannot
/// be cancelled half-way): the turn it claims after the drop is not lost but replayed to the retry with
/// the same key, which is answered 409 `idempotency_in_flight` only while the first one still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_long_poll_runs_on_and_its_answer_is_replayed_to_the_retry() {
    use tokio::io::AsyncWriteExt;
    let s = start().await;
    let run = s.session("pr-session").await;
    let first = s.claim(&run).await;
    s.ack(&run, &first).await;
    // The long-poll, over a raw socket the test closes once the handler is parked.
    let before = s.engine.sessions.receiver_count();
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "POST /v1/runs/{run}/turns:claim?timeout=30 HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nidempotency-key: lp-1\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let parked = Instant::now() + Duration::from_secs(5);
    while s.engine.sessions.receiver_count() < before + 1 {
        assert!(Instant::now() < parked, "the long-poll never parked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(sock);
    // While it still waits, the retry is told to come back.
    let retry = || async {
        let r = s
            .http
            .post(format!("{}/v1/runs/{run}/turns:claim?timeout=1", s.base))
            .header("content-type", "application/json")
            .header("idempotency-key", "lp-1")
            .body("{}")
            .send()
            .await
            .unwrap();
        let replay = r
            .headers()
            .get("openwop-idempotent-replay")
            .is_some_and(|v| v == "true");
        (
            r.status().as_u16(),
            replay,
            r.json::<Value>().await.unwrap(),
        )
    };
    let (st, _, body) = retry().await;
    assert_eq!(st, 409, "{body}");
    assert_eq!(body["error"], "idempotency_in_flight");
    // A prompt queued after the drop is claimed by the dropped long-poll, and that claim reaches the
    // retry as the key's replayed answer: nothing is claimed for nobody.
    let (st, p) = s
        .post(
            &format!("/v1/runs/{run}/prompts"),
            json!({"text": "after the drop"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let (st, replay, turn) = loop {
        let (st, replay, body) = retry().await;
        if st != 409 {
            break (st, replay, body);
        }
        assert!(Instant::now() < deadline, "still in flight: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((st, replay), (200, true), "{turn}");
    assert!(p["turnId"].is_string(), "{p}");
    assert_eq!(turn["turnId"], p["turnId"], "{turn} vs {p}");
}

/// A chunked body over 1 MiB to a capability URL is refused naming the limit that
/// applies there (32 KiB), not the management API's 1 MiB.
#[tokio::test]
async fn a_chunked_capability_body_over_the_limit_names_the_capability_limit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start().await;
    let run = s.session("pr-session").await;
    let (st, m) = s
        .post(
            "/v1/capabilities",
            json!({"runId": run, "signal": "deploy.finished"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{m}");
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        m["url"].as_str().unwrap()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    // 1.1 MiB in 64 KiB chunks; the server may answer and stop reading before the end.
    let chunk = vec![b' '; 64 * 1024];
    for _ in 0..18 {
        let framed = [
            format!("{:x}\r\n", chunk.len()).as_bytes(),
            &chunk[..],
            b"\r\n",
        ]
        .concat();
        if c.write_all(&framed).await.is_err() {
            break;
        }
    }
    let _ = c.write_all(b"0\r\n\r\n").await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got)).await;
    let got = String::from_utf8_lossy(&got).to_string();
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    let e: Value = serde_json::from_str(got.split("\r\n\r\n").nth(1).unwrap_or("")).unwrap();
    assert_eq!(e["error"], "payload_too_large");
    assert_eq!(
        e["message"], "body exceeds this endpoint's limit of 32768 bytes",
        "{e}"
    );
    let list = s.get("/v1/capabilities").await;
    assert_eq!(list["capabilities"][0]["useCount"], 0, "{list}");
}
