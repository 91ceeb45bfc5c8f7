//! The route table: every route is added with its [`Access`] (public, or the OpenWOP §12 scope it
//! needs) and, for a guarded mutating route, the idempotency layer and (for an operator action) the
//! audit layer, both as per-route layers, so the
//! guard is decided by the route that matched, never by matching strings on the path.
//! Adding a route is one line:
//!
//! ```text
//! routes.scoped(Method::POST, "/v1/dead-letters:replay", "webhooks:manage", handler)
//! routes.public(Method::GET, "/ready", handler)
//! ```
//!
//! [`Routes::table`] lists every (method, path template, access) so a test can check that no route
//! forgot its scope.

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use crate::auth::{self, Access};
use crate::{audit, idempotency, AppState};

/// One entry of the route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    /// The HTTP method.
    pub method: Method,
    /// The axum path template, e.g. `/v1/runs/{id}/signals`.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

/// A router under construction together with its table.
pub struct Routes {
    state: AppState,
    router: Router<AppState>,
    table: Vec<RouteInfo>,
}

fn filter(m: &Method) -> MethodFilter {
    MethodFilter::try_from(m.clone()).expect("a standard HTTP method")
}

fn mutating(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

impl Routes {
    /// An empty table over `state`.
    pub fn new(state: AppState) -> Routes {
        Routes {
            state,
            router: Router::new(),
            table: Vec::new(),
        }
    }

    /// Adds a public route (no credential, no Layer-1 idempotency: ingest and capability URLs dedup by
    /// their own keys).
    pub fn public<H, T>(self, method: Method, path: &'static str, handler: H) -> Routes
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let mr: MethodRouter<AppState> = on(filter(&method), handler);
        self.add(method, path, Access::Public, mr)
    }

    /// Adds a route that needs an API key with `scope` (one of [`auth::SCOPES`]); a mutating one also
    /// honours `Idempotency-Key`, scoped by (principal, method, `path` template + path params).
    /// Panics (at start-up) on a scope that is not in [`auth::SCOPES`].
    pub fn scoped<H, T>(
        self,
        method: Method,
        path: &'static str,
        scope: &'static str,
        handler: H,
    ) -> Routes
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        assert!(
            auth::SCOPES.contains(&scope),
            "{method} {path}: unknown scope {scope}"
        );
        let mut mr: MethodRouter<AppState> = on(filter(&method), handler);
        if mutating(&method) {
            mr = mr.route_layer(axum::middleware::from_fn_with_state(
                (self.state.clone(), path),
                idempotency::layer,
            ));
        }
        if let Some(action) = audit::action_of(&method, path) {
            mr = mr.route_layer(axum::middleware::from_fn_with_state(
                (self.state.clone(), action),
                audit::layer,
            ));
        }
        mr = mr.route_layer(axum::middleware::from_fn_with_state(
            (self.state.clone(), Access::Scope(scope)),
            auth::require,
        ));
        self.add(method, path, Access::Scope(scope), mr)
    }

    /// Adds the route a run's executor reports on ([`Access::RunExecutor`], only
    /// `POST /v1/runs/{id}/result`): the idempotency layer inside [`crate::runs::require_executor`],
    /// which admits the run's result token or a key holding [`auth::RESULT_SCOPE`] and records every
    /// report made with a credential, refusals included, under the route's [`audit::action_of`].
    /// Panics (at start-up) when the route has no audited action.
    pub fn executor<H, T>(self, method: Method, path: &'static str, handler: H) -> Routes
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let action = audit::action_of(&method, path)
            .unwrap_or_else(|| panic!("{method} {path}: an executor route is audited"));
        let mr: MethodRouter<AppState> = on(filter(&method), handler)
            .route_layer(axum::middleware::from_fn_with_state(
                (self.state.clone(), path),
                idempotency::layer,
            ))
            .route_layer(axum::middleware::from_fn_with_state(
                (self.state.clone(), action),
                crate::runs::require_executor,
            ));
        self.add(method, path, Access::RunExecutor, mr)
    }

    /// Adds a `GET` route any known API key may call ([`Access::AnyKey`]); never mutating.
    pub fn keyed<H, T>(self, path: &'static str, handler: H) -> Routes
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let mr: MethodRouter<AppState> =
            on(MethodFilter::GET, handler).route_layer(axum::middleware::from_fn_with_state(
                (self.state.clone(), Access::AnyKey),
                auth::require,
            ));
        self.add(Method::GET, path, Access::AnyKey, mr)
    }

    fn add(
        mut self,
        method: Method,
        path: &'static str,
        access: Access,
        mr: MethodRouter<AppState>,
    ) -> Routes {
        self.router = self.router.route(path, mr);
        self.table.push(RouteInfo {
            method,
            path,
            access,
        });
        self
    }

    /// Every route added so far.
    pub fn table(&self) -> &[RouteInfo] {
        &self.table
    }

    /// The router (still to be given the global layers and the state).
    pub fn into_router(self) -> Router<AppState> {
        self.router
    }
}
