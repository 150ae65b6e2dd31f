//! Every metric the binary exports, read from the registries the controller and the
//! worker register into, so documents and dashboards can be held to them.

use std::collections::BTreeSet;

use prometheus_client::registry::Registry;

/// The metric families (`mailer_worker_deliveries`, …) the controller and the worker
/// register, whether or not they have samples yet.
///
/// The text encoding leaves out families without samples, and the registry has no other
/// public way to list what it holds, so the names are read from its `Debug` form: each
/// sub-registry's `Prefix("…")`, then its metrics' `Descriptor { name: "…", … }`.
pub fn families() -> BTreeSet<String> {
    let mut registry = Registry::default();
    let _controller = mailer::controller::metrics::Metrics::register(&mut registry);
    let _worker = mailer::worker::metrics::WorkerMetrics::register(&mut registry);
    let debug = format!("{registry:?}");
    let quoted = |rest: &str| rest.split('"').next().unwrap_or_default().to_string();
    let mut families = BTreeSet::new();
    let mut prefix = String::new();
    let mut rest = debug.as_str();
    loop {
        let next_prefix = rest.find("Prefix(\"");
        let next_name = rest.find("Descriptor { name: \"");
        match (next_prefix, next_name) {
            (Some(p), n) if n.is_none_or(|n| p < n) => {
                rest = &rest[p + "Prefix(\"".len()..];
                prefix = quoted(rest);
            }
            (_, Some(n)) => {
                rest = &rest[n + "Descriptor { name: \"".len()..];
                families.insert(format!("{prefix}_{}", quoted(rest)));
            }
            _ => break,
        }
    }
    assert!(
        families.iter().all(|f| f.starts_with("mailer_")),
        "unexpected registry layout: {families:?}"
    );
    families
}

/// The names a family's series may have: itself (a gauge), `_total` (a counter),
/// `_bucket`, `_sum` and `_count` (a histogram).
pub fn series_names(family: &str) -> Vec<String> {
    ["", "_total", "_bucket", "_sum", "_count"]
        .iter()
        .map(|suffix| format!("{family}{suffix}"))
        .collect()
}
