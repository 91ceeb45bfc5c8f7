//! Model of the configuration change log (DESIGN §9): what one replica committed that the
//! others must see. Written by the store in the same transaction as the change; read by the engine's
//! sync task (`tb_engine::sync`).

/// What a [`ConfigChange`] names: the cache a replica refreshes when it reads the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangeKind {
    /// A subscription's state changed by an operator (pause / resume); `record_id` is the subscription.
    Subscription,
    /// A binding was revoked or restored; `record_id` is the binding.
    Binding,
    /// A trigger subscription was registered (or removed) through the API; `record_id` is the
    /// subscription, whose sealed secret is in the store under the same id.
    Registration,
    /// An outbound webhook was created or deleted; `record_id` is the webhook.
    Webhook,
    /// A capability endpoint was revoked; `record_id` is the capability (looked up in the store on
    /// every request, so no replica caches it: recorded for audit and completeness).
    Capability,
    /// A subscription was quarantined or released; `record_id` is the subscription.
    Quarantine,
}

impl ChangeKind {
    /// The stored name (`subscription`, `binding`, `registration`, `webhook`, `capability`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Subscription => "subscription",
            ChangeKind::Binding => "binding",
            ChangeKind::Registration => "registration",
            ChangeKind::Webhook => "webhook",
            ChangeKind::Capability => "capability",
            ChangeKind::Quarantine => "quarantine",
        }
    }

    /// The kind of a stored name; `None` for a name this build does not know (a newer replica's kind,
    /// which an older one skips).
    pub fn parse(s: &str) -> Option<ChangeKind> {
        Some(match s {
            "subscription" => ChangeKind::Subscription,
            "binding" => ChangeKind::Binding,
            "registration" => ChangeKind::Registration,
            "webhook" => ChangeKind::Webhook,
            "capability" => ChangeKind::Capability,
            "quarantine" => ChangeKind::Quarantine,
            _ => return None,
        })
    }
}

/// One row of `config_changes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChange {
    /// Increasing, handed out in commit order (1, 2, 3, ...): a reader that saw id N has seen every
    /// change below N.
    pub id: i64,
    /// What changed; `None` for a kind this build does not know.
    pub kind: Option<ChangeKind>,
    /// The id of the changed record (subscription, binding, webhook or capability id).
    pub record_id: String,
    /// When it was committed, Unix ms.
    pub at: i64,
}

/// A cross-replica wake-up channel (DESIGN §9 change stream): what kind of committed change
/// a hint is about, so a replica wakes the right sleepers instead of waiting for its next poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wake {
    /// Deliveries became due (a receipt committed pending deliveries, a dead letter was replayed, a
    /// lease was released): idle delivery workers should lease now.
    Work,
    /// A session changed (a signal raised, a wait armed / cancelled / resolved, a prompt enqueued or
    /// a turn acknowledged, a run ended): long-polls and the timer loop should read again.
    Sessions,
}

impl Wake {
    /// Both channels.
    pub const ALL: [Wake; 2] = [Wake::Work, Wake::Sessions];

    /// The PostgreSQL `NOTIFY` channel of this wake-up.
    pub fn channel(self) -> &'static str {
        match self {
            Wake::Work => "trigger_bridge_work",
            Wake::Sessions => "trigger_bridge_sessions",
        }
    }
}
