//! Reconciles counted in the controller's metrics text, read by the controller tests and
//! by `benches/controller`.

/// `(successful, failed)` from `mailer_controller_reconciles_total` in `metrics`, the
/// Prometheus text exposition; zeros when it has none.
pub fn reconciles_in(metrics: &str) -> (u64, u64) {
    let (mut ok, mut failed) = (0, 0);
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("mailer_controller_reconciles_total{") else {
            continue;
        };
        let count = rest
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        if rest.contains("result=\"success\"") {
            ok += count;
        } else {
            failed += count;
        }
    }
    (ok, failed)
}

/// `mailer_controller_policies_ahead_total` in `metrics`: the reconciles that stopped
/// after a new pipeline's policies, each followed by a second for the rest; 0 when none.
pub fn policies_ahead_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("mailer_controller_policies_ahead_total "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}
