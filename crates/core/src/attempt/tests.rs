use serde_json::json;

use super::*;
use crate::delivery::AttemptDecision as Dec;
use crate::subscription::StateChangeReason;
use DeliveryState as D;
use SubscriptionState as S;

const NOW: i64 = 1_000_000;
const STARTED: i64 = 999_000;

fn snapshot() -> AttemptSnapshot {
    AttemptSnapshot {
        delivery: DeliveryRow {
            id: "dlv_1".into(),
            receipt_id: "rcpt_1".into(),
            subscription_id: "github".into(),
            dedup_key: "dk_1".into(),
            lease: LeaseRow {
                state: D::Pending,
                attempts: 0,
                token: Some("lse_a".into()),
                until: Some(NOW + 30_000),
            },
            run_id: None,
            first_attempt_at: None,
        },
        receipt: Some(ReceiptRow {
            state: ReceiptState::Routed,
            others: vec![],
        }),
        subscription: Some(SubscriptionRow {
            id: "github".into(),
            source: Source::Webhook,
            state: S::Active,
            failure_threshold: 3,
            last_success_at: Some(1_000),
            consecutive_failures: 0,
            first_failure_at: None,
        }),
        run_exists: false,
    }
}

fn run(status: RunStatus) -> RunStart {
    RunStart {
        id: "run_1".into(),
        workflow_id: "wf".into(),
        inputs: json!({"pr": 7}),
        status,
        dead_letter: None,
        session: false,
    }
}

fn report(decision: Dec) -> AttemptReport {
    AttemptReport {
        lease: Completion {
            token: "lse_a".into(),
            attempt: 1,
        },
        event_id: "evt_att".into(),
        decision,
        failure: None,
        started_at: STARTED,
        duration_ms: 120,
        run: None,
        effect: None,
        failure_policy: FailurePolicy {
            failure_window_ms: 60_000,
            dead_letter_after_ms: 3_600_000,
            dead_letter_min_failures: 5,
        },
    }
}

fn failing(decision: Dec, class: &str, permanent: bool) -> AttemptReport {
    AttemptReport {
        failure: Some(AttemptFailure {
            error_class: class.into(),
            message: Some("HTTP 500: db down".into()),
            permanent,
        }),
        ..report(decision)
    }
}

fn sibling(state: D, reason: Option<&str>, consumed: bool) -> SiblingDelivery {
    SiblingDelivery {
        state,
        dead_letter_reason: reason.map(str::to_string),
        consumed,
    }
}

fn types(w: &AttemptWrites) -> Vec<&'static str> {
    w.events.iter().map(|e| e.event_type).collect()
}

#[test]
fn a_completion_without_the_lease_writes_nothing() {
    let s = snapshot();
    let mut r = report(Dec::Delivered);
    r.lease.token = "lse_old".into();
    assert_eq!(after_attempt(&s, &r, NOW), Err(LeaseLost::NotHeld));
    let mut r = report(Dec::Delivered);
    r.lease.attempt = 2;
    assert_eq!(
        after_attempt(&s, &r, NOW),
        Err(LeaseLost::NotNextAttempt {
            expected: 1,
            got: 2
        })
    );
    let mut ended = snapshot();
    ended.delivery.lease.state = D::Delivered;
    assert_eq!(
        after_attempt(&ended, &report(Dec::Delivered), NOW),
        Err(LeaseLost::Ended(D::Delivered))
    );
}

#[test]
fn a_delivered_start_writes_the_run_its_log_and_settles_the_receipt() {
    let mut s = snapshot();
    s.receipt.as_mut().unwrap().others = vec![sibling(D::Delivered, None, true)];
    let r = AttemptReport {
        run: Some(run(RunStatus::Completed)),
        ..report(Dec::Delivered)
    };
    let w = after_attempt(&s, &r, NOW).unwrap();
    assert_eq!(
        w.attempt,
        AttemptRow {
            delivery_id: "dlv_1".into(),
            attempt: 1,
            event_id: "evt_att".into(),
            outcome: AttemptOutcome::Delivered,
            error_class: None,
            message: None,
            started_at: STARTED,
            duration_ms: 120,
            next_due_at: None,
        }
    );
    assert_eq!(
        w.delivery,
        DeliveryUpdate {
            state: D::Delivered,
            attempts: 1,
            due_at: None,
            first_attempt_at: STARTED,
            last_error: None,
            dead_letter_reason: None,
            updated_at: NOW,
            run_id: Some("run_1".into()),
            consumed_at: Some(NOW),
        }
    );
    assert_eq!(types(&w), vec![events::DELIVERY_ATTEMPTED]);
    let attempted = json!({"subscriptionId": "github", "dedupKey": "dk_1", "attempt": 1,
        "outcome": "delivered", "runId": "run_1"});
    assert_eq!(w.events[0].payload, attempted);
    assert_eq!(
        (
            w.events[0].event_id.as_str(),
            w.events[0].delivery_id.as_deref(),
            w.events[0].timestamp
        ),
        ("evt_att", Some("dlv_1"), NOW)
    );

    let run = w.run.as_ref().expect("a run");
    assert_eq!(
        (
            run.id.as_str(),
            run.status,
            run.delivery_id.as_str(),
            run.receipt_id.as_str(),
            run.subscription_id.as_str(),
            run.causation_id.as_str(),
            run.next_sequence,
            run.created_at,
            run.start_session
        ),
        (
            "run_1",
            RunStatus::Completed,
            "dlv_1",
            "rcpt_1",
            "github",
            "evt_att",
            3,
            NOW,
            false
        )
    );
    let log: Vec<(u64, &str, Option<&str>)> = run
        .events
        .iter()
        .map(|e| (e.sequence, e.event_type, e.causation_id.as_deref()))
        .collect();
    assert_eq!(
        log,
        vec![
            (0, "run.started", Some("evt_att")),
            (1, "trigger.delivery.attempted", None),
            (2, "run.completed", None)
        ]
    );
    assert_eq!(
        run.events[0].payload,
        json!({"workflowId": "wf", "inputs": {"pr": 7}})
    );
    assert_eq!(
        run.events[1].event_id, "evt_att",
        "the attempt keeps its id on the run log"
    );
    assert_eq!(run.events[1].payload, attempted);
    assert_eq!(run.events[2].payload, json!({}));
    assert!(run.events[0].event_id.starts_with("evt_"));
    assert_ne!(run.events[0].event_id, run.events[2].event_id);

    assert_eq!(w.receipt_state, Some(ReceiptState::Consumed));
    assert_eq!(
        w.subscription,
        Some(SubscriptionUpdate {
            id: "github".into(),
            streak: StreakUpdate::Reset {
                last_success_at: NOW
            },
            state: None,
        })
    );
    assert_eq!((w.run_id.as_deref(), w.transition), (Some("run_1"), None));
}

#[test]
fn a_running_run_has_no_terminal_event_and_next_sequence_two() {
    let r = AttemptReport {
        run: Some(run(RunStatus::Running)),
        ..report(Dec::Delivered)
    };
    let w = after_attempt(&snapshot(), &r, NOW).unwrap();
    let run = w.run.unwrap();
    assert_eq!(run.next_sequence, 2);
    assert_eq!(
        run.events.iter().map(|e| e.event_type).collect::<Vec<_>>(),
        vec!["run.started", "trigger.delivery.attempted"]
    );
}

#[test]
fn a_retry_is_due_after_its_delay_and_settles_nothing() {
    let mut s = snapshot();
    s.receipt.as_mut().unwrap().others = vec![sibling(D::Delivered, None, true)];
    let w = after_attempt(
        &s,
        &failing(Dec::Retry { delay_ms: 5_000 }, "http_500", false),
        NOW,
    )
    .unwrap();
    assert_eq!(w.attempt.outcome, AttemptOutcome::Retrying);
    assert_eq!(w.attempt.next_due_at, Some(NOW + 5_000));
    assert_eq!(w.attempt.message.as_deref(), Some("HTTP 500: db down"));
    assert_eq!(
        (
            w.delivery.state,
            w.delivery.due_at,
            w.delivery.last_error.as_deref(),
            w.delivery.dead_letter_reason.as_deref(),
            w.delivery.consumed_at,
            w.delivery.run_id.as_deref()
        ),
        (
            D::Retrying,
            Some(NOW + 5_000),
            Some("http_500"),
            None,
            None,
            None
        )
    );
    assert_eq!(
        w.events[0].payload,
        json!({"subscriptionId": "github", "dedupKey": "dk_1", "attempt": 1, "outcome": "retrying"})
    );
    assert_eq!(w.receipt_state, None, "an open delivery settles nothing");
    assert_eq!(
        w.subscription.unwrap().streak,
        StreakUpdate::Failed {
            consecutive_failures: 1,
            first_failure_at: STARTED,
            last_error: Some("http_500: HTTP 500: db down".into()),
        }
    );
    assert_eq!(w.transition, None);
}

#[test]
fn the_breaker_trips_after_threshold_failures_over_the_window() {
    let mut s = snapshot();
    s.delivery.lease.attempts = 2;
    s.delivery.first_attempt_at = Some(STARTED - 120_000);
    let sub = s.subscription.as_mut().unwrap();
    sub.consecutive_failures = 2;
    sub.first_failure_at = Some(STARTED - 120_000);
    let mut r = failing(Dec::Retry { delay_ms: 1 }, "timeout", false);
    r.failure.as_mut().unwrap().message = None;
    r.lease.attempt = 3;
    let w = after_attempt(&s, &r, NOW).unwrap();
    assert_eq!(w.delivery.first_attempt_at, STARTED - 120_000, "kept");
    let u = w.subscription.clone().unwrap();
    assert_eq!(
        u.streak,
        StreakUpdate::Failed {
            consecutive_failures: 3,
            first_failure_at: STARTED - 120_000,
            last_error: Some("timeout".into()),
        }
    );
    assert_eq!(u.state, Some(S::Failed));
    assert_eq!(
        types(&w),
        vec![
            events::DELIVERY_ATTEMPTED,
            events::SUBSCRIPTION_STATE_CHANGED
        ]
    );
    assert_eq!(
        w.events[1].payload,
        json!({"subscriptionId": "github", "source": "webhook", "fromState": "active", "toState": "failed"})
    );
    assert_eq!(w.events[1].delivery_id.as_deref(), Some("dlv_1"));
    assert_eq!(
        w.transition,
        Some(Transition {
            from: S::Active,
            to: S::Failed,
            reason: None
        })
    );
}

#[test]
fn a_delivered_attempt_closes_the_breaker() {
    let mut s = snapshot();
    s.subscription.as_mut().unwrap().state = S::Failed;
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert_eq!(w.subscription.unwrap().state, Some(S::Active));
    assert_eq!(
        w.transition,
        Some(Transition {
            from: S::Failed,
            to: S::Active,
            reason: None
        })
    );
    assert_eq!(
        w.delivery.consumed_at, None,
        "no run, no effect: nothing consumed"
    );
    assert_eq!(w.receipt_state, Some(ReceiptState::Queued));
}

#[test]
fn an_exhausted_delivery_after_days_of_failure_trips_and_dead_letters_in_one_attempt() {
    let mut s = snapshot();
    s.delivery.lease.attempts = 7;
    s.receipt.as_mut().unwrap().others = vec![sibling(D::Delivered, None, true)];
    let sub = s.subscription.as_mut().unwrap();
    sub.consecutive_failures = 9;
    sub.first_failure_at = Some(STARTED - 7_200_000);
    let mut r = failing(Dec::DeadLetter, "http_503", false);
    r.lease.attempt = 8;
    let w = after_attempt(&s, &r, NOW).unwrap();
    assert_eq!(
        (
            w.delivery.state,
            w.delivery.due_at,
            w.delivery.dead_letter_reason.as_deref()
        ),
        (D::DeadLettered, None, Some("retries_exhausted"))
    );
    assert_eq!(w.attempt.outcome, AttemptOutcome::DeadLettered);
    assert_eq!(w.receipt_state, Some(ReceiptState::DeadLettered));
    let states: Vec<(&str, &str)> = w.events[1..]
        .iter()
        .map(|e| {
            (
                e.payload["fromState"].as_str().unwrap(),
                e.payload["toState"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![("active", "failed"), ("failed", "dead-lettered")]
    );
    assert_eq!(w.events[2].payload["reason"], "retry-exhausted");
    assert_ne!(w.events[1].event_id, w.events[2].event_id);
    assert_eq!(w.subscription.unwrap().state, Some(S::DeadLettered));
    assert_eq!(
        w.transition,
        Some(Transition {
            from: S::Active,
            to: S::DeadLettered,
            reason: Some(StateChangeReason::RetryExhausted)
        })
    );
}

#[test]
fn a_policy_refusal_settles_the_receipt_but_leaves_the_subscription_alone() {
    let mut s = snapshot();
    s.subscription.as_mut().unwrap().consecutive_failures = 50;
    let w = after_attempt(&s, &failing(Dec::DeadLetter, "target_terminal", true), NOW).unwrap();
    assert_eq!(
        w.delivery.dead_letter_reason.as_deref(),
        Some("target_terminal"),
        "a permanent failure keeps its class"
    );
    assert_eq!(w.receipt_state, Some(ReceiptState::TargetTerminal));
    assert_eq!(types(&w), vec![events::DELIVERY_ATTEMPTED]);
    assert_eq!((w.subscription, w.transition), (None, None));
}

#[test]
fn a_permanent_delivery_failure_counts_against_the_subscription() {
    let w = after_attempt(
        &snapshot(),
        &failing(Dec::DeadLetter, "http_410", true),
        NOW,
    )
    .unwrap();
    assert_eq!(w.delivery.dead_letter_reason.as_deref(), Some("http_410"));
    assert_eq!(w.receipt_state, Some(ReceiptState::DeadLettered));
    assert!(matches!(
        w.subscription.unwrap().streak,
        StreakUpdate::Failed {
            consecutive_failures: 1,
            ..
        }
    ));
}

#[test]
fn a_dead_lettered_api_run_is_kept_failed_with_its_dead_letter_log() {
    let mut s = snapshot();
    s.delivery.subscription_id = "api".into();
    s.subscription = None;
    s.delivery.lease.attempts = 7;
    let mut r = failing(Dec::DeadLetter, "http_500", false);
    r.lease.attempt = 8;
    r.run = Some(RunStart {
        status: RunStatus::Failed,
        dead_letter: Some(("retries_exhausted".into(), 8)),
        session: true,
        ..run(RunStatus::Failed)
    });
    let w = after_attempt(&s, &r, NOW).unwrap();
    let run = w.run.as_ref().unwrap();
    assert_eq!(
        (run.status, run.next_sequence, run.start_session),
        (RunStatus::Failed, 2, false)
    );
    let log: Vec<(u64, &str, Option<&str>)> = run
        .events
        .iter()
        .map(|e| (e.sequence, e.event_type, e.causation_id.as_deref()))
        .collect();
    assert_eq!(
        log,
        vec![
            (0, "run.dead_lettered", Some("evt_att")),
            (1, "run.failed", None)
        ]
    );
    assert_eq!(
        run.events[0].payload,
        json!({"runId": "run_1", "reason": "retries_exhausted", "attempts": 8})
    );
    assert_eq!(
        run.events[1].payload,
        json!({"error": {"code": "retries_exhausted", "message": "the run could not be started; its retries are exhausted"}})
    );
    assert_eq!(
        w.events[0].payload,
        json!({"subscriptionId": "api", "dedupKey": "dk_1", "attempt": 8, "outcome": "dead-lettered"}),
        "no runId unless delivered"
    );
    assert_eq!(w.run_id.as_deref(), Some("run_1"));
    assert_eq!(w.delivery.run_id.as_deref(), Some("run_1"));
    assert_eq!(w.delivery.consumed_at, None);
    assert_eq!((w.subscription, w.transition), (None, None));
}

#[test]
fn an_api_start_keeps_its_attempt_event_in_the_run_log_only() {
    let mut s = snapshot();
    s.subscription = None;
    let mut r = report(Dec::Delivered);
    r.run = Some(run(RunStatus::Running));
    let w = after_attempt(&s, &r, NOW).unwrap();
    assert!(w.events.is_empty(), "{:?}", w.events);
    let run = w.run.unwrap();
    assert_eq!(
        (run.events[1].event_type, run.events[1].event_id.as_str()),
        ("trigger.delivery.attempted", run.causation_id.as_str())
    );
    assert_eq!(run.events[1].payload["outcome"], "delivered");
}

#[test]
fn an_existing_run_is_never_written_again() {
    let mut s = snapshot();
    s.run_exists = true;
    let r = AttemptReport {
        run: Some(run(RunStatus::Running)),
        ..report(Dec::Delivered)
    };
    let w = after_attempt(&s, &r, NOW).unwrap();
    assert_eq!(w.run, None);
    assert_eq!(w.run_id.as_deref(), Some("run_1"));
    assert_eq!(w.delivery.consumed_at, Some(NOW));
    // A backend that learns of the run only from its insert's conflict asks again: only `run` differs.
    s.run_exists = false;
    let fresh = after_attempt(&s, &r, NOW).unwrap();
    assert_eq!(fresh.run.as_ref().map(|r| r.id.as_str()), Some("run_1"));
    assert_eq!(AttemptWrites { run: None, ..fresh }, w);
}

#[test]
fn a_started_session_is_the_run_to_write_and_the_effect_says_what_was_consumed() {
    let session = RunStart {
        id: "run_s".into(),
        session: true,
        ..run(RunStatus::Running)
    };
    let r = AttemptReport {
        effect: Some(EffectDone {
            run_id: "run_s".into(),
            started: Some(session),
            consumed: true,
        }),
        ..report(Dec::Delivered)
    };
    let w = after_attempt(&snapshot(), &r, NOW).unwrap();
    let run = w.run.as_ref().unwrap();
    assert_eq!((run.id.as_str(), run.start_session), ("run_s", true));
    assert_eq!(w.events[0].payload["runId"], "run_s");
    assert_eq!(
        (w.delivery.run_id.as_deref(), w.delivery.consumed_at),
        (Some("run_s"), Some(NOW))
    );
}

#[test]
fn a_signal_to_a_live_session_targets_its_run_and_waits_to_be_consumed() {
    let mut s = snapshot();
    s.delivery.run_id = Some("run_first".into());
    let r = AttemptReport {
        effect: Some(EffectDone {
            run_id: "run_live".into(),
            started: None,
            consumed: false,
        }),
        ..report(Dec::Delivered)
    };
    let w = after_attempt(&s, &r, NOW).unwrap();
    assert_eq!(w.run, None);
    assert_eq!(w.run_id.as_deref(), Some("run_live"));
    assert_eq!(w.events[0].payload["runId"], "run_live");
    assert_eq!(
        w.delivery.run_id.as_deref(),
        Some("run_first"),
        "a stored run id is kept"
    );
    assert_eq!(w.delivery.consumed_at, None);
    assert_eq!(w.receipt_state, Some(ReceiptState::Queued));
}

#[test]
fn an_expired_receipt_keeps_its_state() {
    let mut s = snapshot();
    s.receipt.as_mut().unwrap().state = ReceiptState::Expired;
    let w = after_attempt(&s, &failing(Dec::DeadLetter, "http_500", false), NOW).unwrap();
    assert_eq!(w.receipt_state, None);
}

#[test]
fn the_receipt_waits_for_its_other_deliveries() {
    let mut s = snapshot();
    s.receipt.as_mut().unwrap().others = vec![
        sibling(D::Retrying, None, false),
        sibling(D::DeadLettered, Some("binding_revoked"), false),
    ];
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert_eq!(w.receipt_state, None);
    s.receipt.as_mut().unwrap().others[0] = sibling(D::Delivered, None, true);
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert_eq!(w.receipt_state, Some(ReceiptState::Disabled));
}

/// Every combination of decision, failure kind, subscription state, run and effect keeps the
/// invariants the store relies on (a table in place of a property test: `proptest` is not a
/// dependency).
#[test]
fn invariants_hold_for_every_combination() {
    let decisions = [
        Dec::Delivered,
        Dec::Retry { delay_ms: 250 },
        Dec::DeadLetter,
    ];
    let failures = [
        None,
        Some(("http_500", false)),
        Some(("target_missing", true)),
    ];
    let states = [S::Active, S::Paused, S::Failed, S::DeadLettered];
    let mut n = 0;
    for decision in decisions {
        for failure in failures {
            for sub_state in states {
                for with_sub in [true, false] {
                    for with_run in [true, false] {
                        for effect in [None, Some(false), Some(true)] {
                            for streak in [0u32, 4, 40] {
                                n += 1;
                                let mut s = snapshot();
                                s.receipt.as_mut().unwrap().others =
                                    vec![sibling(D::Delivered, None, true)];
                                match &mut s.subscription {
                                    Some(sub) if with_sub => {
                                        sub.state = sub_state;
                                        sub.consecutive_failures = streak;
                                        sub.first_failure_at =
                                            (streak > 0).then_some(STARTED - 86_400_000);
                                    }
                                    _ => s.subscription = None,
                                }
                                let mut r = report(decision);
                                r.failure = failure.map(|(c, p)| AttemptFailure {
                                    error_class: c.into(),
                                    message: None,
                                    permanent: p,
                                });
                                r.run = with_run.then(|| run(RunStatus::Running));
                                r.effect = effect.map(|started| EffectDone {
                                    run_id: "run_e".into(),
                                    started: started.then(|| RunStart {
                                        id: "run_e".into(),
                                        ..run(RunStatus::Running)
                                    }),
                                    consumed: started,
                                });
                                let w = after_attempt(&s, &r, NOW).unwrap();
                                let ctx = format!("{decision:?} {failure:?} {sub_state:?} sub={with_sub} run={with_run} effect={effect:?} streak={streak}");
                                let terminal = w.delivery.state.is_terminal();
                                assert_eq!(w.delivery.due_at.is_none(), terminal, "{ctx}");
                                assert_eq!(w.attempt.next_due_at, w.delivery.due_at, "{ctx}");
                                assert!(w.receipt_state.is_none() || terminal, "{ctx}");
                                assert_eq!(
                                    w.delivery.dead_letter_reason.is_some(),
                                    w.delivery.state == D::DeadLettered,
                                    "{ctx}"
                                );
                                // The attempt's event: a subscription event, or (an API start
                                // without a subscription row) only in the log of the run it starts.
                                let logged = w.run.as_ref().and_then(|r| {
                                    r.events.iter().find(|e| e.event_id == r.causation_id)
                                });
                                let only_in_log = !with_sub && logged.is_some();
                                let attempted = match (only_in_log, logged) {
                                    (true, Some(e)) => &e.payload,
                                    _ => &w.events[0].payload,
                                };
                                assert_eq!(
                                    attempted.get("runId").is_some(),
                                    decision == Dec::Delivered && w.run_id.is_some(),
                                    "{ctx}"
                                );
                                assert_eq!(
                                    w.events.len(),
                                    usize::from(!only_in_log)
                                        + w.transition.map_or(0, |t| {
                                            if t.from == S::Active && t.to == S::DeadLettered {
                                                2
                                            } else {
                                                1
                                            }
                                        }),
                                    "{ctx}"
                                );
                                if let Some(t) = w.transition {
                                    assert_eq!(t.from, sub_state, "{ctx}");
                                    assert_ne!(t.from, t.to, "{ctx}");
                                    assert_ne!(
                                        sub_state,
                                        S::Paused,
                                        "paused ignores outcomes: {ctx}"
                                    );
                                }
                                if let Some(run) = &w.run {
                                    let seqs: Vec<u64> =
                                        run.events.iter().map(|e| e.sequence).collect();
                                    assert_eq!(
                                        seqs,
                                        (0..run.next_sequence).collect::<Vec<_>>(),
                                        "{ctx}"
                                    );
                                }
                                assert_eq!(w.delivery.attempts, 1, "{ctx}");
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(n, 3 * 3 * 4 * 2 * 2 * 3 * 3);
}

#[test]
fn a_delivered_attempt_of_a_healthy_subscription_leaves_its_row_alone() {
    let mut s = snapshot();
    let sub = s.subscription.as_mut().unwrap();
    sub.last_success_at = Some(NOW - 999);
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert_eq!(types(&w), vec!["trigger.delivery.attempted"]);
    assert_eq!((w.subscription, w.transition), (None, None));

    // A success one resolution (1 s) older is refreshed; a streak to reset is always written.
    s.subscription.as_mut().unwrap().last_success_at = Some(NOW - 1_000);
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert_eq!(
        w.subscription.map(|u| u.streak),
        Some(StreakUpdate::Reset {
            last_success_at: NOW
        })
    );
    let sub = s.subscription.as_mut().unwrap();
    (
        sub.last_success_at,
        sub.consecutive_failures,
        sub.first_failure_at,
    ) = (Some(NOW - 10), 1, Some(NOW - 50));
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert!(w.subscription.is_some(), "the streak is reset");

    // Not active (the breaker is open): a delivered attempt closes it, so the row is written.
    let sub = s.subscription.as_mut().unwrap();
    (sub.state, sub.consecutive_failures, sub.first_failure_at) = (S::Failed, 0, None);
    let w = after_attempt(&s, &report(Dec::Delivered), NOW).unwrap();
    assert_eq!(w.subscription.and_then(|u| u.state), Some(S::Active));

    // A failure always writes.
    let mut s = snapshot();
    s.subscription.as_mut().unwrap().last_success_at = Some(NOW - 1);
    let w = after_attempt(
        &s,
        &failing(Dec::Retry { delay_ms: 5 }, "http_500", false),
        NOW,
    )
    .unwrap();
    assert!(matches!(
        w.subscription.map(|u| u.streak),
        Some(StreakUpdate::Failed {
            consecutive_failures: 1,
            ..
        })
    ));
}
