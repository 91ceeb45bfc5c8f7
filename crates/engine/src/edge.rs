//! The checks a webhook or capability request passes before its body is read: the
//! subscription's quarantine (403), then the global and per-source rate limits (429). Each costs a
//! cache read or a counter under one lock, no I/O; a refusal is counted ([`Engine::count_refusal`]),
//! never written on its own.

use std::net::IpAddr;

use http::HeaderMap;
use tb_core::front_door::{self, ForwardedHeader};
use tb_core::rate::{self, Scope};
use tb_core::{ErrorCode, TbError};

use crate::rate_limit::Level;
use crate::{clock, Engine};

/// The server-wide quotas (`[rate_limits]`); 0 = unlimited.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngressQuotas {
    /// Webhook and capability requests a minute over every subscription.
    pub global_per_min: u32,
    /// Requests a minute from one client address ([`rate::source_key`]).
    pub source_per_min: u32,
    /// Proxies whose forwarded client address is believed ([`front_door::client_of`]); empty = none
    /// (`[server].trusted_proxies`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The header those proxies name the client in (`[server].client_address_header`).
    pub forwarded_header: ForwardedHeader,
}

impl Engine {
    /// The server-wide quotas in force.
    pub fn ingress_quotas(&self) -> IngressQuotas {
        self.quotas.read().expect("quota lock").clone()
    }

    /// Sets the server-wide quotas (at start, from `[rate_limits]`).
    pub fn set_ingress_quotas(&self, q: IngressQuotas) {
        *self.quotas.write().expect("quota lock") = q;
    }

    /// The client address of a request from TCP peer `peer` with `headers` (docs/limits.md
    /// "Per-client limits"): the peer itself, or, when the peer is one of the trusted proxies, the
    /// rightmost untrusted address of the configured forwarded header ([`front_door::client_of`]).
    /// Rate limits, body-slot shares and failed-credential throttles count this address.
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let quotas = self.quotas.read().expect("quota lock");
        client_of(peer, headers, &quotas)
    }

    /// Counts one refused request of `subscription` (or of no known subscription: `None`) in the
    /// `ingress_counts` of this minute and in `tb_ingress_refused_total{outcome}`. Returns whether it is
    /// among the first [`rate::RECORDS_PER_MINUTE`] of its subscription this minute (then the caller
    /// may also write its own content-free record).
    pub fn count_refusal(&self, subscription: Option<&str>, outcome: &'static str) -> bool {
        metrics::counter!("tb_ingress_refused_total", "outcome" => outcome).increment(1);
        let (scope, key) = match subscription {
            Some(id) => (Scope::Subscription, id),
            None => (Scope::Global, ""),
        };
        self.rate_limits
            .refused(clock::now_ms(), scope, key, outcome)
    }

    /// The checks before the body (module docs) for a request to `subscription` (`None`: a capability
    /// endpoint, which has no quarantine) from `peer` with `headers`.
    ///
    /// Errors: `subscription_quarantined` (403); `rate_limited` (429, `Retry-After` = the seconds left in
    /// the minute) naming the full level and the key that sets it.
    pub fn admit_request(
        &self,
        subscription: Option<&str>,
        peer: Option<IpAddr>,
        headers: &HeaderMap,
    ) -> Result<(), TbError> {
        if subscription.is_some_and(|id| self.quarantined(id).is_some()) {
            self.count_refusal(subscription, "quarantined");
            // Who asks is not known yet: the operator's reason and time stay in the API.
            return Err(TbError::new(
                ErrorCode::SubscriptionQuarantined,
                "this subscription is quarantined: every request is refused until an operator releases it",
            ));
        }
        let quotas = self.quotas.read().expect("quota lock");
        if quotas.global_per_min == 0 && quotas.source_per_min == 0 {
            return Ok(());
        }
        let source = peer.map(|p| rate::source_key(client_of(p, headers, &quotas)));
        let mut levels = vec![Level {
            scope: Scope::Global,
            key: "",
            limit: quotas.global_per_min,
        }];
        if let Some(s) = &source {
            levels.push(Level {
                scope: Scope::Source,
                key: s,
                limit: quotas.source_per_min,
            });
        }
        let verdict = self.rate_limits.admit(clock::now_ms(), &levels);
        drop(quotas);
        verdict.map_err(|r| {
            // Not the subscription's own `rate_limited`: a server-wide or per-address limit says
            // nothing about the subscription, so it does not count towards its quarantine rule.
            let outcome = match r.scope {
                Scope::Source => "rate_limited_source",
                _ => "rate_limited_global",
            };
            self.count_refusal(subscription, outcome);
            r.error()
        })
    }
}

/// [`front_door::client_of`] over the configured header's values in `headers`.
fn client_of(peer: IpAddr, headers: &HeaderMap, quotas: &IngressQuotas) -> IpAddr {
    if quotas.trusted_proxies.is_empty() {
        return peer.to_canonical();
    }
    let values: Vec<&str> = headers
        .get_all(quotas.forwarded_header.name())
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    front_door::client_of(
        peer,
        quotas.forwarded_header,
        &values,
        &quotas.trusted_proxies,
    )
}
