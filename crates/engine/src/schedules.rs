//! Schedules made through the API: `POST /v1/schedules` creates a `schedule` subscription
//! with one binding that starts `workflowId` on every tick; `DELETE` retires it. Like a registration,
//! the record is a subscription row (config `{"connector": {"connector": "schedule", ...spec},
//! "registration": {"workflowId"}}`) written with a `registration` change row, so every replica loads
//! it within the sync interval ([`crate::sync`]); schedules have no secret. A retired schedule keeps
//! its row, receipts and runs (history stays); it is paused and no replica loads it.

use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::ids::{new_id, IdKind};
use tb_core::schedule::{Schedule, ScheduleSpec};
use tb_core::subscription::{Source, SubscriptionInput};
use tb_core::{ErrorCode, TbError};
use tb_store::SubscriptionRecord;

use crate::catalog::{Registration, SubscriptionConfig};
use crate::{clock, store_err, Engine};

/// The subscription and binding of an API-made schedule.
pub(crate) fn config_of(
    id: &str,
    spec: ScheduleSpec,
    workflow_id: &str,
) -> (SubscriptionConfig, Binding) {
    let mut sub = SubscriptionConfig::schedule(id, spec);
    sub.registration = Some(Registration {
        workflow_id: workflow_id.to_string(),
        secret_file: None,
        previous_secret_until: None,
    });
    let binding = Binding {
        rate_limit_per_min: 0,
        id: id.to_string(),
        subscription: id.to_string(),
        event_types: vec!["*".into()],
        filter: Default::default(),
        action: BindingAction::start_run(workflow_id.to_string()),
        inputs: Default::default(),
    };
    (sub, binding)
}

/// Creates a schedule that starts `workflow_id` on every tick; `id` is minted (`sch_...`) when
/// `None`. Errors: `validation_error` (a spec that does not compile, an unknown workflow, a bad or
/// taken id), `unavailable` (the store).
pub async fn create(
    engine: &Engine,
    id: Option<String>,
    spec: ScheduleSpec,
    workflow_id: &str,
) -> Result<SubscriptionRecord, TbError> {
    Schedule::new(spec.clone())
        .and_then(|s| s.check_fires_after(clock::now_ms()))
        .map_err(|e| TbError::new(ErrorCode::ValidationError, e))?;
    if engine.catalog().workflow(workflow_id).is_none() {
        return Err(TbError::new(
            ErrorCode::ValidationError,
            format!("workflowId {workflow_id:?} does not name a workflow this host can start (GET /v1/workflows/ID, or the config's [[workflows]])"),
        ));
    }
    let id = id.unwrap_or_else(|| format!("sch_{}", &new_id(IdKind::Event)[4..]));
    tb_core::ids::validate_subscription_id(&id)
        .map_err(|m| TbError::new(ErrorCode::ValidationError, m))?;
    let (sub, binding) = config_of(&id, spec, workflow_id);
    let Some(rec) = engine
        .store
        .register_new_subscription(sub.store_def(), clock::now_ms())
        .await
        .map_err(store_err)?
    else {
        return Err(TbError::new(
            ErrorCode::Conflict,
            format!(
                "a subscription {id:?} exists (ids are never reused, so history stays readable)"
            ),
        ));
    };
    engine.add_to_catalog(sub, binding, rec.state);
    tracing::info!(subscription = %id, workflow = %workflow_id, "schedule created");
    Ok(rec)
}

/// Retires an API-made schedule: pauses it, marks its config `retired`, and removes it from every
/// replica's catalog; its receipts and runs stay. Errors: `not_found` (no such schedule, or one from
/// the config file: remove it there), `unavailable` (the store).
pub async fn retire(engine: &Engine, id: &str) -> Result<(), TbError> {
    let rec = engine.store.get_subscription(id).await.map_err(store_err)?;
    if rec.source != Source::Schedule || rec.config.get("registration").is_none_or(|r| r.is_null())
    {
        return Err(TbError::new(
            ErrorCode::NotFound,
            "no schedule made through the API has this id (a schedule from the config file is removed there)",
        ));
    }
    ensure_loaded(engine, &rec);
    engine.operate(id, SubscriptionInput::OperatorPause).await?;
    let mut def = tb_store::SubscriptionDef {
        id: rec.id.clone(),
        source: rec.source,
        connector: rec.connector.clone(),
        config: rec.config.clone(),
        failure_threshold: rec.failure_threshold,
    };
    def.config["retired"] = true.into();
    engine
        .store
        .register_subscription(def, Vec::new(), clock::now_ms())
        .await
        .map_err(store_err)?;
    engine.remove_from_catalog(id);
    tracing::info!(subscription = %id, "schedule retired");
    Ok(())
}

/// Loads an API-made schedule this replica has not picked up yet (made through another replica
/// within the last sync interval), so an operator's pause or resume through this replica works at
/// once.
pub fn ensure_loaded(engine: &Engine, rec: &SubscriptionRecord) {
    if engine.subscription_state(&rec.id).is_none() {
        load(engine, rec);
    }
}

/// Loads an API-made schedule record into the catalog (start, or a `registration` change); a
/// retired one is removed. Returns false when `rec` is not one.
pub(crate) fn load(engine: &Engine, rec: &SubscriptionRecord) -> bool {
    if rec.source != Source::Schedule {
        return false;
    }
    let Ok(reg) = serde_json::from_value::<Registration>(rec.config["registration"].clone()) else {
        return false;
    };
    if rec.config["retired"].as_bool() == Some(true) {
        engine.remove_from_catalog(&rec.id);
        return true;
    }
    let spec = match serde_json::from_value::<ConnectorSpec>(rec.config["connector"].clone()) {
        Ok(ConnectorSpec::Schedule(spec)) => spec,
        _ => {
            tracing::error!(subscription = %rec.id, "stored schedule has no schedule spec: not loaded");
            return false;
        }
    };
    let (mut sub, binding) = config_of(&rec.id, spec, &reg.workflow_id);
    if let Ok(retry) = serde_json::from_value(rec.config["retryPolicy"].clone()) {
        sub.retry = retry;
    }
    engine.add_to_catalog(sub, binding, rec.state);
    true
}
