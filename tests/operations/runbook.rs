//! The runbook, docs/operations.md, against the code: every condition reason the
//! operator can set, every event, every metric and dead-letter reason is in it.
//! (tests/chart.rs holds its alert sections to the chart's PrometheusRule.)

use mailer::controller::reasons::{self, condition_reasons};
use mailer::mail::DeadReason;

use mailer_testkit::metrics::{families, series_names};
use mailer_testkit::repo_root;

pub fn runbook() -> String {
    std::fs::read_to_string(repo_root().join("docs/operations.md")).expect("docs/operations.md")
}

/// The rows of the runbook's reason tables: (reason, its Argo CD health column).
pub fn reason_rows(runbook: &str) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut argo_column = None;
    for line in runbook.lines() {
        let cells: Vec<_> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if !line.starts_with('|') {
            argo_column = None;
            continue;
        }
        if cells.first() == Some(&"Reason") {
            argo_column = cells.iter().position(|c| *c == "Argo CD");
            continue;
        }
        let (Some(column), Some(reason)) = (
            argo_column,
            cells
                .first()
                .and_then(|c| c.strip_prefix('`'))
                .and_then(|c| c.strip_suffix('`')),
        ) else {
            continue;
        };
        rows.push((reason.to_string(), cells[column].to_string()));
    }
    rows
}

#[test]
fn the_runbook_names_every_condition_reason_once() {
    let rows = reason_rows(&runbook());
    for reason in condition_reasons() {
        let found = rows.iter().filter(|(r, _)| *r == reason).count();
        assert_eq!(
            found, 1,
            "docs/operations.md must have one row for the condition reason {reason} (what it means, what to do, its Argo CD health)"
        );
    }
}

#[test]
fn the_runbook_names_every_event_metric_and_dead_letter_reason() {
    let text = runbook();
    let events = [
        reasons::event::TOPOLOGY_CREATED,
        reasons::event::TOPOLOGY_UPDATED,
        reasons::event::TOPOLOGY_REPAIRED,
        reasons::event::DEAD_LETTERS_GREW,
        reasons::event::CLEANED_UP,
        reasons::event::RETRY_TIER_REMOVED,
        reasons::event::CLEANUP_INCOMPLETE,
        reasons::event::ACCESS_REVOKED,
        reasons::POLICY_SHADOWED,
    ];
    for event in events {
        assert!(
            text.contains(&format!("| `{event}` |")),
            "the event {event}"
        );
    }
    let failed = format!("| `{}<Reason>` |", reasons::event::RECONCILE_FAILED_PREFIX);
    assert!(text.contains(&failed), "{failed}");

    let families = families();
    assert!(families.len() >= 11, "{families:?}");
    for family in &families {
        // A gauge or histogram is named by its family, a counter by its `_total` series.
        assert!(
            series_names(family)
                .iter()
                .any(|name| text.contains(&format!("| `{name}` |"))),
            "docs/operations.md has no row for the metric {family}"
        );
    }

    for reason in DeadReason::ALL {
        assert!(
            text.contains(&format!("`{reason}`")),
            "dead-letter reason {reason}"
        );
    }
    for header in [
        mailer::mail::DEAD_REASON_HEADER,
        mailer::mail::DEAD_ATTEMPTS_HEADER,
        mailer::mail::DEAD_ERROR_HEADER,
        mailer::mail::DEAD_AT_HEADER,
        mailer::mail::REPLAYS_HEADER,
        mailer::mail::DEATH_HEADER,
    ] {
        assert!(text.contains(&format!("| `{header}` |")), "{header}");
    }
    // Every `mailer dead` subcommand is shown, and the guide it links to exists.
    for subcommand in ["stats", "list", "show", "replay", "purge"] {
        assert!(
            text.contains(&format!("mailer dead {subcommand}")),
            "mailer dead {subcommand}"
        );
    }
    assert!(text.contains("(dead-letters.md)"));
    assert!(repo_root().join("docs/dead-letters.md").exists());
}

/// Every Rust source file under `dir`, read.
fn sources(dir: &std::path::Path, found: &mut Vec<(std::path::PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("a source file");
            found.push((path, text));
        }
    }
}

#[test]
fn every_test_the_security_page_names_exists() {
    let page =
        std::fs::read_to_string(repo_root().join("docs/security.md")).expect("docs/security.md");
    let mut code = Vec::new();
    sources(&repo_root().join("tests"), &mut code);
    sources(&repo_root().join("src"), &mut code);
    sources(&repo_root().join("testkit/src"), &mut code);
    let mut named = 0;
    for row in page
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("::"))
    {
        let tests = row.rsplit('|').nth(1).unwrap_or_default();
        for name in tests.split('`').skip(1).step_by(2) {
            let Some((module, function)) = name.rsplit_once("::") else {
                continue;
            };
            named += 1;
            let module = module.rsplit("::").next().unwrap_or(module);
            let in_module = |(path, _): &&(std::path::PathBuf, String)| {
                path.file_stem().is_some_and(|stem| stem == module)
                    || path.to_string_lossy().contains(&format!("/{module}/"))
            };
            let found = if function == "*" {
                code.iter().any(|file| in_module(&file))
            } else {
                code.iter()
                    .filter(in_module)
                    .any(|(_, text)| text.contains(&format!("fn {function}(")))
            };
            assert!(found, "docs/security.md names {name}, which does not exist");
        }
    }
    assert!(named >= 15, "the promises name their tests ({named} found)");
}
