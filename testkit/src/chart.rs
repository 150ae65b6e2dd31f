//! The chart rendered by Helm's own engine: `tests/render_chart.py`, which drives the
//! Helm v4 SDK inside PyPI's `helm-python-sdk` (there is no `helm` binary here).

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `tests/render_chart.py` with `args` (`template …`, `lint`, `deploy`, …) and
/// `values` (YAML) on its standard input, and returns what it printed and how it ended.
/// Panics when a Python package it needs is missing (its exit status 3), saying so.
pub fn render_chart(args: &[&str], values: &str) -> Output {
    let mut child = Command::new("python3")
        .arg(crate::repo_root().join("tests/render_chart.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs tests/render_chart.py");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(values.as_bytes())
        .expect("values written");
    let output = child.wait_with_output().expect("render_chart.py finished");
    assert_ne!(
        output.status.code(),
        Some(3),
        "a package is missing (python3 -m pip install helm-python-sdk==0.2.2): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}
