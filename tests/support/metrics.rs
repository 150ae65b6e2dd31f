//! Every metric the binary exports, read from the registries the controller and the
//! worker register into, so documents and dashboards can be held to them.

use std::collections::BTreeMap;

use prometheus_client::registry::Registry;

/// Metric families (`# TYPE` names) of the controller and the worker, with their type
/// (`counter`, `gauge`, `histogram`).
pub fn families() -> BTreeMap<String, String> {
    let mut registry = Registry::default();
    let _controller = mailer::controller::metrics::Metrics::register(&mut registry);
    let _worker = mailer::worker::metrics::WorkerMetrics::register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// The names of the series a family's samples carry, e.g. `…_total` for a counter.
pub fn series_names(family: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{family}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|suffix| format!("{family}{suffix}"))
            .collect(),
        _ => vec![family.to_string()],
    }
}
