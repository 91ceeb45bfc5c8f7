//! Summary lines: throughput and latency percentiles from an HDR histogram (microseconds).

use std::time::Duration;

use hdrhistogram::Histogram;

/// What a load run measured.
pub struct LoadResult {
    /// Latency of answered requests, µs.
    pub hist: Histogram<u64>,
    /// Requests answered with 2xx.
    pub answered: u64,
    /// 202 answers (new receipts).
    pub accepted: u64,
    /// 200 duplicate answers.
    pub duplicates: u64,
    /// Non-2xx answers and transport errors.
    pub errors: u64,
    pub elapsed: Duration,
    /// `(runId, send time in Unix µs)` of accepted requests that started a run.
    pub runs: Vec<(String, u64)>,
}

/// A new histogram of latencies in µs, 1 µs to 120 s, 3 significant figures.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

/// `name: p50 .., p90 .., p99 .., max .. (n samples)`.
pub fn latency_line(name: &str, h: &Histogram<u64>) -> String {
    format!(
        "{name}: p50 {}, p90 {}, p99 {}, max {} ({} samples)",
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    )
}

/// The one parseable summary line of a load run.
pub fn summary(name: &str, r: &LoadResult, baseline: Option<f64>) -> String {
    let rate = r.answered as f64 / r.elapsed.as_secs_f64();
    let ratio = baseline
        .map(|b| format!(", {:.0} % of storage baseline", 100.0 * rate / b))
        .unwrap_or_default();
    format!(
        "{name}: {:.0} req/s, p50 {}, p90 {}, p99 {}, max {}, errors {}, accepted {}, duplicates {}{ratio}",
        rate,
        ms(r.hist.value_at_quantile(0.5)),
        ms(r.hist.value_at_quantile(0.9)),
        ms(r.hist.value_at_quantile(0.99)),
        ms(r.hist.max()),
        r.errors,
        r.accepted,
        r.duplicates,
    )
}
