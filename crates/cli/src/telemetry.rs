//! Logging and OpenTelemetry export for `serve` (docs/operations.md "Tracing").
//!
//! Log lines go to stderr as before (`RUST_LOG`, `TRIGGER_BRIDGE_LOG_FORMAT=json`). OTLP export is off
//! unless an endpoint is named: `--otlp-endpoint` / `TRIGGER_BRIDGE_OTLP_ENDPOINT` (the collector's
//! OTLP/HTTP base, e.g. `http://otel-collector:4318`; spans are posted to `<base>/v1/traces`), or the
//! standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`. Spans go out as
//! protobuf over HTTP in batches from a background thread (the SDK's `OTEL_BSP_*` settings apply, as
//! does `OTEL_EXPORTER_OTLP_HEADERS`; each request is bounded at 10 s by our client); a collector that
//! is down costs dropped spans, never a refused request. `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is used
//! as given (no `/v1/traces` appended), as the OpenTelemetry specification says. Only the bridge's own spans are exported ([`tb_engine::trace::TARGET`]).
//!
//! The exporter sends through [`OtlpClient`]: the process's own reqwest client, run on the `serve`
//! runtime (the SDK's export thread has none), so the exporter brings no HTTP stack of its own.

use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The OTLP exporter's HTTP client: each request runs on the `serve` runtime (given once it exists,
/// [`OtlpClient::runtime`]) and is awaited from the SDK's export thread. 10 s per request; a response
/// body over 1 MiB is an error (a collector answers a few bytes).
#[derive(Debug, Clone)]
pub struct OtlpClient {
    http: reqwest::Client,
    runtime: Arc<OnceLock<tokio::runtime::Handle>>,
}

/// Largest collector answer read, bytes.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

impl OtlpClient {
    fn new() -> anyhow::Result<OtlpClient> {
        Ok(OtlpClient {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            runtime: Arc::default(),
        })
    }

    /// Where requests run from now on (set once, right after the runtime is built).
    pub fn runtime(&self, handle: tokio::runtime::Handle) {
        let _ = self.runtime.set(handle);
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let handle = self
            .runtime
            .get()
            .ok_or("the runtime is not running yet")?
            .clone();
        let (parts, body) = request.into_parts();
        let req = self
            .http
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body);
        let task = handle.spawn(async move {
            let mut resp = req.send().await?;
            let mut out = http::Response::builder().status(resp.status());
            if let Some(h) = out.headers_mut() {
                *h = std::mem::take(resp.headers_mut());
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await? {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err("the collector's answer is over 1 MiB".into());
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, opentelemetry_http::HttpError>(out.body(bytes::Bytes::from(body))?)
        });
        let out = task.await?;
        let failed = match &out {
            Ok(r) if r.status().is_success() => None,
            Ok(r) => Some(format!("the collector answered {}", r.status())),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = failed {
            report_failure(&why);
        }
        out
    }
}

/// Counts a failed export (`tb_otlp_export_failures_total`) and logs it at `warn`, at most once a
/// minute (a collector that is down must not flood the log).
fn report_failure(why: &str) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST_WARN_S: AtomicI64 = AtomicI64::new(0);
    metrics::counter!("tb_otlp_export_failures_total").increment(1);
    let now = tb_engine::clock::now_ms() / 1000;
    let last = LAST_WARN_S.load(Ordering::Relaxed);
    if now - last >= 60
        && LAST_WARN_S
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(error = %why, "exporting spans over OTLP failed; spans are dropped (tb_otlp_export_failures_total counts each failed batch)");
    }
}

/// The standard variables that turn export on without `--otlp-endpoint`.
const STANDARD_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Where spans go: `Some(Some(base))` our flag, `Some(None)` a standard variable (the SDK reads it),
/// `None` export off.
fn endpoint(flag: Option<&str>) -> Option<Option<String>> {
    match flag.map(str::trim).filter(|f| !f.is_empty()) {
        Some(base) => Some(Some(format!("{}/v1/traces", base.trim_end_matches('/')))),
        None => STANDARD_ENDPOINT_VARS
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
            .then_some(None),
    }
}

/// Installs the process's subscriber: the log layer (`filter` from `RUST_LOG`), and, when an
/// endpoint is named, the OpenTelemetry layer exporting over OTLP/HTTP with resource attributes
/// `service.name = trigger-bridge`, `service.version`, and `service.instance.id = <replica>`. The
/// returned provider is shut down at exit ([`shutdown`]) so the last batch is sent; the client must be
/// given the runtime ([`OtlpClient::runtime`]) before anything is exported.
///
/// Errors: an endpoint that is not a URL, or an exporter the SDK cannot build.
pub fn init(
    filter: tracing_subscriber::EnvFilter,
    json: bool,
    ansi: bool,
    otlp_endpoint: Option<&str>,
    replica: Option<&str>,
) -> anyhow::Result<Option<(SdkTracerProvider, OtlpClient)>> {
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let Some(endpoint) = endpoint(otlp_endpoint) else {
        tracing_subscriber::registry().with(fmt).init();
        return Ok(None);
    };
    let client = OtlpClient::new()?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client.clone())
        .with_protocol(Protocol::HttpBinary);
    // What the log shows: scheme, host and port only (a URL may carry a token as user info).
    let mut shown = "(from OTEL_EXPORTER_OTLP_*)".to_string();
    if let Some(url) = &endpoint {
        let uri = url
            .parse::<http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
            .filter(|u| u.host().is_some_and(|h| !h.is_empty()))
            // `/v1/traces` is appended to the path: a query or fragment would swallow it.
            .filter(|u| u.query().is_none() && !url.contains('#'))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--otlp-endpoint: not an http(s) URL with a host and no query (e.g. http://otel-collector:4318)"
                )
            })?;
        shown = format!(
            "{}://{}{}{}",
            uri.scheme_str().unwrap_or("http"),
            uri.host().unwrap_or_default(),
            uri.port().map(|p| format!(":{p}")).unwrap_or_default(),
            uri.path()
        );
        exporter = exporter.with_endpoint(url);
    }
    let exporter = exporter
        .build()
        .map_err(|e| anyhow::anyhow!("OTLP exporter: {e}"))?;
    let mut resource = Resource::builder()
        .with_service_name("trigger-bridge")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ));
    if let Some(r) = replica {
        resource = resource.with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            r.to_string(),
        ));
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("trigger-bridge"))
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(tb_engine::trace::TARGET, tracing::Level::TRACE),
        );
    tracing_subscriber::registry().with(fmt).with(otel).init();
    tracing::info!(endpoint = %shown, "exporting spans over OTLP/HTTP");
    Ok(Some((provider, client)))
}

/// Sends the spans still buffered and stops the exporter (bounded by the SDK's export timeout). Called
/// while the runtime still runs, from outside it (the export runs on it).
pub fn shutdown(provider: Option<SdkTracerProvider>) {
    if let Some(p) = provider {
        if let Err(e) = p.shutdown() {
            eprintln!("warning: OTLP exporter shutdown: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn the_flag_names_the_collectors_base() {
        assert_eq!(
            endpoint(Some("http://c:4318")),
            Some(Some("http://c:4318/v1/traces".into()))
        );
        assert_eq!(
            endpoint(Some("http://c:4318/")),
            Some(Some("http://c:4318/v1/traces".into()))
        );
    }

    #[test]
    fn an_endpoint_that_is_not_http_is_refused_without_echoing_it() {
        for bad in [
            "ftp://c:21",
            "c:4318",
            "https://:4318",
            "http://c:4318/?token=x",
            "http://c:4318/#x",
            "not a url",
            "file:///etc/passwd",
        ] {
            let filter = tracing_subscriber::EnvFilter::new("off");
            let e = super::init(filter, false, false, Some(bad), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not an http(s) URL"), "{bad}: {e}");
            assert!(!e.contains(bad), "{bad}: {e}");
        }
    }
}
