//! `POST /v1/trigger-subscriptions/{id}/dead-letters:replay` (scope `webhooks:manage`): bulk replay of a
//! subscription's dead letters, previewed first and confirmed by echoing the previewed count
//! (rules: `tb_core::replay`; orchestration: `tb_engine::replay`).
//!
//! Body `{"filter": {"from"?: RFC 3339, "to"?: RFC 3339, "errorClass"?: "http_500"}, "dryRun"?: bool
//! (default true), "expect"?: N, "limit"?: 1..=1000}`; unknown fields are refused.
//! - Preview (`dryRun` true or absent) -> `{dryRun: true, count, sample: [deliveryId...] (oldest first,
//!   at most 20), more, limit, filter}`; nothing changes.
//! - Replay (`dryRun: false`, `expect` = the previewed `count`) -> `{dryRun: false, replayed: N,
//!   deliveryIds, skipped: [{deliveryId, reason}], remaining, more, filter}`: at most `limit` deliveries
//!   (oldest dead-lettering first), each exactly like `POST /v1/deliveries/{id}/replay`. `remaining` is
//!   the `expect` of the next call while `more` is true.
//!
//! Errors: 400 `validation_error` (bad body, time or error class, `from` not before `to`, `limit` out of
//! range, `dryRun: false` without `expect`), 404 `not_found` (unknown subscription), 409
//! `replay_count_changed` (`expect` differs from the count now; nothing replayed).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::Json;
use tb_api_types::replay::{ReplayOutcome, ReplayRequest, ReplaySkip};
use tb_core::replay::ReplayFilter;
use tb_core::ErrorCode;
use tb_engine::replay::{BulkOutcome, BulkReplay};

use crate::error::ApiError;
use crate::{wire, AppState};

fn parse_time(field: &str, v: Option<&str>) -> Result<Option<i64>, ApiError> {
    v.map(|t| {
        chrono::DateTime::parse_from_rfc3339(t)
            .map(|d| d.timestamp_millis())
            .map_err(|_| {
                ApiError::new(
                    ErrorCode::ValidationError,
                    format!("filter.{field} must be an RFC 3339 time, e.g. 2026-12-01T09:00:00Z"),
                )
            })
    })
    .transpose()
}

fn filter_view(f: &ReplayFilter) -> tb_api_types::replay::ReplayFilter {
    tb_api_types::replay::ReplayFilter {
        from: f.from_ms.map(wire::time),
        to: f.to_ms.map(wire::time),
        error_class: f.error_class.clone(),
    }
}

/// The handler (see the module docs for shapes and errors).
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/dead-letters:replay", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Subscription id")), responses((status = 200, description = "preview {dryRun: true, count, sample, more, limit, filter} or {dryRun: false, replayed, deliveryIds, skipped, remaining, more, filter}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found"), (status = 409, description = "replay_count_changed")))]
pub async fn replay_all(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<ReplayRequest>, JsonRejection>,
) -> Result<Json<ReplayOutcome>, ApiError> {
    let b = crate::error::json_body(
        body,
        "{filter?: {from?, to?, errorClass?}, dryRun?: bool, expect?: N, limit?: N}",
    )?;
    let filter = ReplayFilter {
        from_ms: parse_time("from", b.filter.from.as_deref())?,
        to_ms: parse_time("to", b.filter.to.as_deref())?,
        error_class: b.filter.error_class,
    };
    let limit = b.limit;
    let out = tb_engine::replay::replay_dead_letters(
        &st.engine,
        BulkReplay {
            subscription_id: id,
            filter: filter.clone(),
            dry_run: b.dry_run,
            expect: b.expect,
            limit,
            retention_days: st.host.dead_letter_retention_days,
        },
    )
    .await?;
    let filter = filter_view(&filter);
    Ok(Json(match out {
        BulkOutcome::Preview {
            count,
            sample,
            more,
        } => ReplayOutcome {
            count: Some(count),
            sample: Some(sample),
            more,
            limit: Some(tb_core::replay::batch_limit(limit)?.into()),
            dry_run: true,
            filter,
            ..Default::default()
        },
        BulkOutcome::Replayed {
            replayed,
            skipped,
            remaining,
        } => ReplayOutcome {
            dry_run: false,
            replayed: Some(replayed.len() as u64),
            delivery_ids: Some(replayed),
            skipped: Some(
                skipped
                    .into_iter()
                    .map(|s| ReplaySkip {
                        delivery_id: s.delivery_id,
                        reason: s.reason,
                    })
                    .collect(),
            ),
            remaining: Some(remaining),
            more: remaining > 0,
            filter,
            ..Default::default()
        },
    }))
}
