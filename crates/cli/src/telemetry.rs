//! Logging and OpenTelemetry export for `serve` (issue #14; docs/operations.md "Tracing").
//!
//! Log lines go to stderr as before (`RUST_LOG`, `TRIGGER_BRIDGE_LOG_FORMAT=json`). OTLP export is off
//! unless an endpoint is named: `--otlp-endpoint` / `TRIGGER_BRIDGE_OTLP_ENDPOINT` (the collector's
//! OTLP/HTTP base, e.g. `http://otel-collector:4318`; spans are posted to `<base>/v1/traces`), or the
//! standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`. Spans go out as
//! protobuf over HTTP in batches from a background thread (the SDK's `OTEL_BSP_*` settings apply, as
//! do `OTEL_EXPORTER_OTLP_HEADERS` and `_TIMEOUT`); a collector that is down costs dropped spans, never
//! a refused request. Only the bridge's own spans are exported ([`tb_engine::trace::TARGET`]).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

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
/// returned provider is shut down at exit ([`shutdown`]) so the last batch is sent.
///
/// Errors: an endpoint that is not a URL, or an exporter the SDK cannot build.
pub fn init(
    filter: tracing_subscriber::EnvFilter,
    json: bool,
    ansi: bool,
    otlp_endpoint: Option<&str>,
    replica: Option<&str>,
) -> anyhow::Result<Option<SdkTracerProvider>> {
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
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Some(url) = &endpoint {
        url.parse::<http::Uri>()
            .ok()
            .filter(|u| u.scheme().is_some() && u.authority().is_some())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--otlp-endpoint: {url:?} is not an http(s) URL (e.g. http://otel-collector:4318)"
                )
            })?;
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
    tracing::info!(
        endpoint = endpoint.as_deref().unwrap_or("(from OTEL_EXPORTER_OTLP_*)"),
        "exporting spans over OTLP/HTTP"
    );
    Ok(Some(provider))
}

/// Sends the spans still buffered and stops the exporter (bounded by the SDK's export timeout).
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
}
