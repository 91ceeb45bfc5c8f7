//! Helpers shared by the store's integration tests (`mod support;` in a test file).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;

/// How long one racing task may take before the test fails.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f(i)` for `i in 0..n` as `n` tasks that start together behind a barrier, so they really
/// race; returns their results in `i` order. Panics when a task panics or takes longer than 60 s.
pub async fn race<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let b = barrier.clone();
            let fut = f(i);
            tokio::spawn(async move {
                b.wait().await;
                fut.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        let r = tokio::time::timeout(LIMIT, t)
            .await
            .expect("a racing task took too long");
        out.push(r.expect("a racing task panicked"));
    }
    out
}
