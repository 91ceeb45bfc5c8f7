//! The console's static files, embedded in the binary (no file is read or fetched at run time):
//! `console.css`, `console.js` and the vendored `htmx.min.js` (htmx 2.0.11, Zero-Clause BSD;
//! `assets/vendor/README.md`).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// `(name, content type, bytes)` of every asset.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/console.css"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/console.js"),
    ),
    (
        "htmx.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/vendor/htmx.min.js"),
    ),
];

/// `GET /ui/assets/{name}` (public): 404 for an unknown name. Cached for an hour.
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, ct, body)) => (
            [
                (header::CONTENT_TYPE, *ct),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
