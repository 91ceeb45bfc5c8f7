//! The audit log's HTTP side: every operator action on the API and the console is recorded
//! with its actor, target and outcome ([`layer`], [`record`]); `GET /v1/audit` lists the log and
//! `GET /v1/audit/verify` checks its chain (scope `audit:read`). The chain rules are
//! `tb_core::audit`'s; the store appends.
//!
//! Which routes are operator actions is decided here, once, in [`action_of`]: configuration
//! (webhooks, registrations, schedules), capability mint / revoke, pause / resume, binding revoke /
//! restore, replays (single and bulk), manual signals, prompts, run start / fork / cancel, a wait
//! resolved by hand, and every report of a run's result (`run.result`, accepted or refused: it ends a
//! run like a cancel, so who tried is recorded; [`crate::runs::require_executor`]). The rest of the
//! worker protocol (`turns:claim`, turn `ack`, a run arming its own wait) is not: it is the run's own
//! traffic, visible in its events. A test checks that every mutating route is in exactly one of the
//! two lists.

use axum::extract::{Query, RawPathParams, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use axum::RequestPartsExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tb_core::audit::{Break, Checkpoint, Entry, NewEntry, Verifier};
use tb_core::ErrorCode;
use tb_store::AuditQuery;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::AppState;

/// The audited action of a mutating route, or `None` for the worker protocol ([`NOT_AUDITED`]).
pub fn action_of(method: &Method, path: &str) -> Option<&'static str> {
    let m = method.as_str();
    Some(match (m, path) {
        ("POST", "/v1/runs") => "run.create",
        ("POST", "/v1/runs/{id}") => "run.fork",
        ("POST", "/v1/runs/{id}/cancel") => "run.cancel",
        ("POST", "/v1/runs/{id}/result") => "run.result",
        ("POST", "/v1/runs/{id}/signals") => "signal.raise",
        ("POST", "/v1/runs/{id}/waits/{wait}") => "wait.action",
        ("POST", "/v1/runs/{id}/prompts") => "prompt.enqueue",
        ("POST", "/v1/webhooks") => "webhook.create",
        ("DELETE", "/v1/webhooks/{id}") => "webhook.delete",
        ("POST", "/v1/trigger-subscriptions") => "subscription.register",
        ("POST", "/v1/trigger-subscriptions/{id}/pause") => "subscription.pause",
        ("POST", "/v1/trigger-subscriptions/{id}/resume") => "subscription.resume",
        ("POST", "/v1/trigger-subscriptions/{id}/quarantine") => "subscription.quarantine",
        ("POST", "/v1/trigger-subscriptions/{id}/release") => "subscription.release",
        ("POST", "/v1/trigger-subscriptions/{id}/rotate-secret") => "subscription.rotate_secret",
        ("POST", "/v1/trigger-subscriptions/{id}/dead-letters:replay") => "dead_letters.replay",
        ("POST", "/v1/deliveries/{id}/replay") => "delivery.replay",
        ("POST", "/v1/capabilities") => "capability.mint",
        ("POST", "/v1/capabilities/{id}/revoke") => "capability.revoke",
        ("POST", "/v1/schedules") => "schedule.create",
        ("DELETE", "/v1/schedules/{id}") => "schedule.delete",
        ("POST", "/v1/schedules/{id}/pause") => "schedule.pause",
        ("POST", "/v1/schedules/{id}/resume") => "schedule.resume",
        ("POST", "/v1/bindings/{id}/revoke") => "binding.revoke",
        ("POST", "/v1/bindings/{id}/restore") => "binding.restore",
        // Not mutating, but reading a body is an operator action worth a record.
        ("GET", "/v1/receipts/{id}/redacted-body") => "receipt.body_view",
        _ => return None,
    })
}

/// Mutating routes that are the worker protocol, not operator actions (see the module docs).
pub const NOT_AUDITED: &[(&str, &str)] = &[
    ("POST", "/v1/runs/{id}/waits"),
    ("POST", "/v1/runs/{id}/turns:claim"),
    ("POST", "/v1/runs/{id}/turns/{turn}/ack"),
];

/// Largest answer the audit layer reads to find the outcome and the new record's id, in bytes; a
/// larger one (or one of unknown size) is passed on untouched and recorded with its status only.
const MAX_READ: usize = 64 * 1024;

/// The outcome of an answer: `ok` for 2xx and 3xx (an action answered with a redirect, the console's
/// login and logout, was done), else the envelope's `error` code (or `http_<status>`).
fn outcome(status: StatusCode, body: &Value) -> String {
    if status.is_success() || status.is_redirection() {
        return "ok".into();
    }
    body["error"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("http_{}", status.as_u16()))
}

/// The detail of an answer: its status, and its top-level counts (`replayed`, `count`, ...: integers
/// only, so no content is copied), and the bulk replay's `dryRun`.
fn detail(status: StatusCode, body: &Value, extra: Option<&Value>) -> String {
    let mut d = serde_json::Map::new();
    d.insert("status".into(), status.as_u16().into());
    if let Some(o) = body.as_object() {
        for (k, v) in o {
            if v.is_u64() || v.is_i64() || (k == "dryRun" && v.is_boolean()) {
                d.insert(k.clone(), v.clone());
            }
        }
    }
    // A quarantine's reason (the operator's own words, one line, at most 500 bytes).
    if let Some(r) = body.pointer("/quarantine/reason").and_then(Value::as_str) {
        d.insert("reason".into(), r.into());
    }
    if let Some(Value::Object(x)) = extra {
        for (k, v) in x {
            d.insert(k.clone(), v.clone());
        }
    }
    Value::Object(d).to_string()
}

/// Where the answers of the creating routes (no id in the path) carry the new record's id:
/// `/v1/capabilities` (`endpointId`, before the `runId` it signals), `POST /v1/runs` (`runId`),
/// `/v1/webhooks` (`webhookId`),
/// `/v1/trigger-subscriptions` (`subscription.subscriptionId`), `/v1/schedules` (`id`).
const CREATED_ID: &[&str] = &[
    "/endpointId",
    "/runId",
    "/webhookId",
    "/subscription/subscriptionId",
    "/schedule/id",
    "/id",
];

/// The id of the record an answer created, if it names one.
pub(crate) fn created_id(body: &Value) -> Option<&str> {
    CREATED_ID
        .iter()
        .find_map(|p| body.pointer(p).and_then(Value::as_str))
}

/// Records one action. `target` is the path's ids joined by `/`, or else the new record's id from
/// the answer (`CREATED_ID`). A failed append is logged and counted (`tb_audit_append_failed_total`,
/// by [`tb_engine::Engine::append_audit`]); the answer is not changed: the action already happened.
pub async fn record(
    st: &AppState,
    actor: &str,
    action: &str,
    target: String,
    status: StatusCode,
    body: &Value,
    extra: Option<&Value>,
) {
    let target = if target.is_empty() {
        created_id(body).unwrap_or_default().to_string()
    } else {
        target
    };
    let e = NewEntry {
        at: tb_engine::clock::now_ms(),
        actor: actor.to_string(),
        action: action.to_string(),
        target,
        outcome: outcome(status, body),
        detail: detail(status, body, extra),
    };
    if let Err(err) = st.engine.append_audit(e.clone()).await {
        tracing::error!(action = %e.action, actor = %e.actor, target = %e.target, error = %err,
            "the audit entry of this action was not recorded");
    }
}

/// The per-route layer of an audited route (added by [`crate::routes::Routes::scoped`] inside the auth
/// layer, so the [`Principal`] is known): runs the handler, then records the action with the answer's
/// outcome. Requests that never reach it (401, 403) are not operator actions.
pub async fn layer(
    State((st, action)): State<(AppState, &'static str)>,
    req: Request,
    next: Next,
) -> Response {
    let actor = req
        .extensions()
        .get::<Principal>()
        .map(|p| p.0.clone())
        .unwrap_or_else(|| "anonymous".into());
    let (mut parts, body) = req.into_parts();
    let target = match parts.extract::<RawPathParams>().await {
        Ok(p) => p.iter().map(|(_, v)| v).collect::<Vec<_>>().join("/"),
        Err(_) => String::new(),
    };
    let res = next.run(Request::from_parts(parts, body)).await;
    record_answer(&st, &actor, action, target, res, None).await
}

/// Records `action` with the outcome of its answer `res` (read when small, [`MAX_READ`]) and hands
/// the answer back unchanged: the second half of [`layer`], also used by a guard that records refusals
/// ([`crate::runs::require_executor`]). `extra` joins the detail (facts of the request the server
/// checked, never its content).
pub(crate) async fn record_answer(
    st: &AppState,
    actor: &str,
    action: &str,
    target: String,
    res: Response,
    extra: Option<Value>,
) -> Response {
    let (parts, body) = res.into_parts();
    let status = parts.status;
    // A repeated `Idempotency-Key` answered from the record did nothing new: say so.
    let replayed = parts
        .headers
        .get("openwop-idempotent-replay")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let mut extra = extra.unwrap_or_else(|| serde_json::json!({}));
    if replayed {
        extra["idempotentReplay"] = true.into();
    }
    // Only an answer known to be small is read (to find the outcome and a new record's id); any
    // other passes through untouched and is recorded with its status.
    let small = http_body::Body::size_hint(&body)
        .upper()
        .is_some_and(|n| n <= MAX_READ as u64);
    let (seen, body) = if !small {
        (Value::Null, body)
    } else {
        match axum::body::to_bytes(body, MAX_READ).await {
            Ok(bytes) => (
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                axum::body::Body::from(bytes),
            ),
            Err(e) => {
                tracing::error!(error = %e, "an answer's body failed while the audit layer read it");
                (Value::Null, axum::body::Body::empty())
            }
        }
    };
    record(st, actor, action, target, status, &seen, Some(&extra)).await;
    Response::from_parts(parts, body)
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListParams {
    /// Oldest first after this seq (for reading the whole log in order).
    pub after_seq: Option<i64>,
    /// Newest first before this seq (the default order, for paging back).
    pub before_seq: Option<i64>,
    /// Only this actor (an API key's name).
    pub actor: Option<String>,
    /// Only this action or the actions under it (`dead_letters`, `subscription.pause`).
    pub action: Option<String>,
    /// Only this target id.
    pub target: Option<String>,
    /// 1..=500, default 100.
    pub limit: Option<u32>,
}

/// One entry on the wire.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntryView {
    /// Position in the log, from 1, without gaps.
    pub seq: i64,
    /// RFC 3339 UTC, ms.
    pub at: String,
    pub actor: String,
    /// Dotted action name, e.g. `dead_letters.replay`.
    pub action: String,
    pub target: String,
    /// `ok` or the answer's error code.
    pub outcome: String,
    /// The action's facts (status, counts).
    #[schema(value_type = Object)]
    pub detail: Value,
    /// `hash` of the previous entry in the chain, hex.
    pub prev_hash: String,
    /// HMAC-SHA256 of this entry under the audit key (plain SHA-256 for entries written before the
    /// chain was keyed), hex.
    pub hash: String,
}

impl From<Entry> for AuditEntryView {
    fn from(e: Entry) -> Self {
        AuditEntryView {
            seq: e.seq,
            at: crate::wire::time(e.entry.at),
            actor: e.entry.actor,
            action: e.entry.action,
            target: e.entry.target,
            outcome: e.entry.outcome,
            detail: serde_json::from_str(&e.entry.detail).unwrap_or(Value::Null),
            prev_hash: e.prev_hash,
            hash: e.hash,
        }
    }
}

/// A page of `GET /v1/audit`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    pub entries: Vec<AuditEntryView>,
    /// The `beforeSeq` (newest-first paging) or `afterSeq` (oldest-first) of the next page; absent at
    /// the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<i64>,
}

/// Reads a page of the log (shared by the API and the console).
pub async fn page(st: &AppState, p: ListParams) -> Result<AuditPage, ApiError> {
    let limit = p.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "limit must be 1..=500",
        ));
    }
    let oldest_first = p.after_seq.is_some();
    let entries = st
        .engine
        .store
        .audit_entries(AuditQuery {
            after_seq: p.after_seq,
            before_seq: p.before_seq,
            newest_first: !oldest_first,
            actor: p.actor.filter(|s| !s.is_empty()),
            action: p.action.filter(|s| !s.is_empty()),
            target: p.target.filter(|s| !s.is_empty()),
            from: None,
            to: None,
            limit,
        })
        .await?;
    let next = (entries.len() == limit as usize)
        .then(|| entries.last().map(|e| e.seq))
        .flatten();
    Ok(AuditPage {
        entries: entries.into_iter().map(AuditEntryView::from).collect(),
        next,
    })
}

/// `GET /v1/audit?actor&action&target&beforeSeq|afterSeq&limit` -> `{entries: [...], next?}`: newest
/// first (or oldest first after `afterSeq`). Errors: 400 `validation_error`.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", params(ListParams), responses((status = 200, body = AuditPage), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden")))]
pub async fn list(
    State(st): State<AppState>,
    q: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditPage>, ApiError> {
    let p = crate::error::query(q)?;
    Ok(Json(page(&st, p).await?))
}

/// Query of `GET /v1/audit/verify`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifyParams {
    /// A checkpoint exported earlier (`SEQ:MAC`, from the log line `audit checkpoint seq=.. mac=..`):
    /// the chain must still reach that entry, and it must be the one the checkpoint was made of.
    pub checkpoint: Option<String>,
}

/// The result of checking the chain.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// True when every entry up to the head authenticates (its MAC under the audit key; its plain hash
    /// only before the first keyed entry) and links correctly, nothing lies past the head, the
    /// checkpoint (if given) is reached and matches, and no break is recorded.
    pub ok: bool,
    /// Entries checked.
    pub checked: u64,
    /// Of those, entries written before the chain was keyed (checked by their plain SHA-256).
    pub unkeyed: u64,
    /// Recorded breaks (`audit.break` entries: rows written past the head by hand, stepped over).
    pub breaks: u64,
    /// Whether this server holds the audit key (without it keyed entries cannot be checked).
    pub keyed: bool,
    /// The head's seq when the check began (entries appended during it are not checked).
    pub head_seq: i64,
    /// The checkpoint of that head (`SEQ:MAC`), when the chain verified and this server has the key:
    /// keep it to check later that the log still holds this head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The first problem: `{problem: edited|keyNeeded|forged|forgedHead|relinked|gap|headMismatch|
    /// beforeFirst|beyondHead|truncated|checkpointMismatch|recorded, ...}` with its seqs (`forgedHead`: this server
    /// holds the key but the log's newest entry is not keyed).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub problem: Option<Value>,
    /// The problem in a sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Entries read per page by [`verify_chain`].
const VERIFY_PAGE: u32 = 1000;

/// Checks the whole chain up to the head read first ([`verify_chain_at`] without a checkpoint).
pub async fn verify_chain(st: &AppState) -> Result<Verification, ApiError> {
    verify_chain_at(st, None).await
}

/// Checks the whole chain up to the head read first, under this server's audit key, one page of
/// `VERIFY_PAGE` entries at a time (memory: one page), so appends made during the check do not count
/// against it; and, given a checkpoint, that the chain still reaches it (`tb_core::audit::Verifier`).
pub async fn verify_chain_at(
    st: &AppState,
    checkpoint: Option<Checkpoint>,
) -> Result<Verification, ApiError> {
    let store = &st.engine.store;
    let key = st.engine.audit_key();
    let head = store.audit_head().await?;
    let (head_seq, head_hash) = (head.seq, head.hash.clone());
    let mut v = Verifier::new(key.clone(), checkpoint);
    // Paged by the last row read: after a problem the verifier only looks for a recorded break.
    let mut after = 0;
    'pages: while after < head_seq {
        let page = store
            .audit_entries(AuditQuery {
                after_seq: Some(after),
                limit: VERIFY_PAGE,
                ..AuditQuery::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for e in &page {
            if e.seq > head_seq {
                break 'pages;
            }
            v.feed(e);
        }
    }
    // Rows past the head, and rows below seq 1 (which the chain read from seq 1 never reaches), are
    // judged by a second snapshot taken now: appends made during the check moved the head with them,
    // so only rows added by hand lie there (`tb_core::audit::bounds`).
    let now = store.audit_head().await?;
    let result = match v.finish(head_seq, &head_hash, head_seq) {
        Err(b) if !matches!(b, Break::Recorded { .. }) => Err(b),
        r => match tb_core::audit::bounds(now.seq, now.max_seq, now.below_one) {
            Some(b) => Err(b),
            None => r,
        },
    };
    let verified = result.is_ok() || matches!(result, Err(Break::Recorded { .. }));
    Ok(Verification {
        ok: result.is_ok(),
        checked: v.checked(),
        unkeyed: v.unkeyed(),
        breaks: v.breaks(),
        keyed: key.is_some(),
        head_seq,
        checkpoint: key
            .filter(|_| verified && head_seq > 0)
            .map(|k| Checkpoint::of(&k, head_seq, &head_hash).to_string()),
        message: result.as_ref().err().map(|b| b.to_string()),
        problem: result.err().and_then(|b| serde_json::to_value(&b).ok()),
    })
}

/// `GET /v1/audit/verify[?checkpoint=SEQ:MAC]` -> `{ok, checked, unkeyed, breaks, keyed, headSeq,
/// checkpoint?, problem?, message?}`: checks every entry's MAC and link, that the log ends at its head,
/// and that it still reaches the checkpoint. 200 either way; `ok` says. Errors: 400
/// `validation_error` (a malformed checkpoint), 503 `unavailable` (a checkpoint given to a server
/// without the audit key, which cannot check it).
#[utoipa::path(get, path = "/v1/audit/verify", tag = "audit", params(VerifyParams), responses((status = 200, body = Verification), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 503, description = "unavailable")))]
pub async fn verify(
    State(st): State<AppState>,
    q: Result<Query<VerifyParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Verification>, ApiError> {
    let p = crate::error::query(q)?;
    let checkpoint = match p.checkpoint.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(text) => {
            if st.engine.audit_key().is_none() {
                return Err(ApiError::new(
                    ErrorCode::Unavailable,
                    "this server has no audit key (TRIGGER_BRIDGE_SECRET_KEY is not set), so it cannot check a checkpoint",
                ));
            }
            Some(
                Checkpoint::parse(text)
                    .map_err(|m| ApiError::new(ErrorCode::ValidationError, m))?,
            )
        }
    };
    Ok(Json(verify_chain_at(&st, checkpoint).await?))
}

/// What `GET /ready` says of a replica without an audit key (`warnings.auditLog.message`).
pub const UNKEYED: &str = "TRIGGER_BRIDGE_SECRET_KEY is not set: new audit entries are hashed without a key, so whoever can write the database can forge them";

/// The audit log's part of `GET /ready` (a warning, never a 503: appends go on after a break, and a
/// load balancer must not take replicas out for what only an operator can look into):
/// `{"status": "ok"|"broken"|"unkeyed"|"unknown", "keyed": bool, "breaks": n, "lastBreakSeq": seq,
/// "rowsPastHead": n, "rowsBeforeFirst": n, "message": "..."}` (`breaks`, `lastBreakSeq` only when
/// broken by a recorded break; `rowsPastHead` only when rows lie past the head now, as the span of
/// seqs from the head to the largest; `rowsBeforeFirst` only when rows are stored with seq below 1). Read at most once a second
/// ([`tb_engine::Engine::audit_status`]).
pub async fn ready_status(st: &AppState) -> Value {
    let s = st.engine.audit_status().await;
    let mut out = serde_json::json!({"status": "ok", "keyed": s.keyed});
    match &s.head {
        Err(e) => {
            out["status"] = "unknown".into();
            out["message"] = format!("reading the audit log's head failed: {e}").into();
        }
        Ok(h) if s.broken() => {
            out["status"] = "broken".into();
            let mut why = Vec::new();
            if h.below_one > 0 {
                out["rowsBeforeFirst"] = h.below_one.into();
                why.push(format!(
                    "{} entries are stored with a seq below 1, before the first entry: written by hand",
                    h.below_one
                ));
            }
            if h.max_seq > h.seq {
                out["rowsPastHead"] = h.max_seq.saturating_sub(h.seq).into();
                why.push(format!(
                    "entries {}..{} lie past the head (entry {}): written by hand; the next append records a break",
                    h.seq + 1,
                    h.max_seq,
                    h.seq
                ));
            }
            if h.breaks > 0 {
                out["breaks"] = h.breaks.into();
                out["lastBreakSeq"] = h.last_break_seq.into();
                why.push(format!(
                    "{} break(s) recorded, the newest at entry {}: rows were written into the log by hand",
                    h.breaks, h.last_break_seq
                ));
            }
            out["message"] = format!(
                "{}; run `trigger-bridge audit list --verify` (docs/operations.md, \"The audit log\")",
                why.join("; ")
            )
            .into();
        }
        Ok(_) if !s.keyed => {
            out["status"] = "unkeyed".into();
            out["message"] = UNKEYED.into();
        }
        Ok(_) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_created_record_is_found_in_each_creating_answer() {
        assert_eq!(
            created_id(&json!({"runId": "run_1", "status": "running"})),
            Some("run_1")
        );
        assert_eq!(
            created_id(&json!({"webhookId": "wh_1", "secret": "s"})),
            Some("wh_1")
        );
        assert_eq!(
            created_id(&json!({"endpointId": "sgep_1", "runId": "run_2"})),
            Some("sgep_1"),
            "a capability, not the run it signals"
        );
        assert_eq!(
            created_id(&json!({"subscription": {"subscriptionId": "gh"}, "binding": {}})),
            Some("gh")
        );
        assert_eq!(
            created_id(&json!({"id": "nightly", "state": "active"})),
            Some("nightly")
        );
        assert_eq!(created_id(&json!({"error": "conflict"})), None);
    }
}
