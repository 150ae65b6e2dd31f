//! Releasing (the README's "Releasing"): the crate, the chart and the image are one
//! version, CHANGELOG.md has its section, `.github/workflows/release.yml` holds a tag to
//! them (`.ci/release-version.sh`) before it builds anything, and every workflow passes
//! jactionlint, a maintained fork of actionlint (its PyPI wheel carries the binary),
//! with shellcheck checking the workflows' scripts through it (.ci/run installs both).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use mailer::cli::controller::{DEFAULT_WORKER_IMAGE, IMAGE_REPOSITORY};
use serde_json::Value;

use crate::render::chart_dir;
use mailer_testkit::repo_root;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The repository's files, as git knows them (what a clone has).
fn tracked_files() -> Vec<String> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo_root())
        .output()
        .expect("git runs");
    assert!(output.status.success(), "{}", text(&output));
    String::from_utf8(output.stdout)
        .expect("UTF-8 paths")
        .split('\0')
        .filter(|path| !path.is_empty())
        .map(String::from)
        .collect()
}

/// Every tag given to the release image in `text` that is a version (it starts with a
/// digit, or a "v" and a digit): placeholders such as `<version>` and `$(VERSION)` are
/// not, nor is a reference built in code.
fn image_versions(text: &str) -> Vec<(usize, String)> {
    let prefix = format!("{IMAGE_REPOSITORY}:");
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices(&prefix) {
            let tag: String = line[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || ".-+_".contains(*c))
                .collect();
            let tag = tag.trim_end_matches('.');
            let digits = tag.strip_prefix('v').unwrap_or(tag);
            if digits.starts_with(|c: char| c.is_ascii_digit()) {
                found.push((number + 1, tag.to_string()));
            }
        }
    }
    found
}

#[test]
fn the_crate_the_chart_and_the_image_are_one_version() {
    // The chart ships only with the operator, so its version is the crate's too.
    let chart = yaml("charts/mailer-operator/Chart.yaml");
    assert_eq!(chart["version"], VERSION, "Chart.yaml's version");
    assert_eq!(chart["appVersion"], VERSION, "Chart.yaml's appVersion");

    // The chart's image is the release image, its tag the appVersion unless set.
    let values = yaml("charts/mailer-operator/values.yaml");
    assert_eq!(values["image"]["repository"], IMAGE_REPOSITORY);
    assert_eq!(
        values["image"]["tag"], "",
        "values.yaml's image.tag: empty, so the tag is the appVersion"
    );
    let helpers =
        std::fs::read_to_string(chart_dir().join("templates/_helpers.tpl")).expect("helpers");
    assert!(
        helpers.contains(".Values.image.tag | default .Chart.AppVersion"),
        "_helpers.tpl no longer defaults the tag to the appVersion"
    );

    // `make image` tags what it builds with the crate's version.
    let make = Command::new("make")
        .args(["--no-print-directory", "-n", "image"])
        .current_dir(repo_root())
        .output()
        .expect("make runs");
    assert!(make.status.success(), "{}", text(&make));
    assert!(
        text(&make).contains(&format!("target/release/mailer {DEFAULT_WORKER_IMAGE}\n")),
        "make image does not build {DEFAULT_WORKER_IMAGE}:\n{}",
        text(&make)
    );

    // The Dockerfile's label for builds that pass no VERSION.
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|line| line == format!("ARG VERSION={VERSION}")),
        "the Dockerfile's ARG VERSION is not {VERSION}"
    );

    // Every release image named with a version anywhere (deploy/operator.yaml, the
    // README, docs, examples) is this one; the changelog names past ones.
    let mut stale = Vec::new();
    for path in tracked_files() {
        if path == "CHANGELOG.md" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(repo_root().join(&path)) else {
            continue; // not text
        };
        for (line, tag) in image_versions(&text) {
            if tag != VERSION {
                stale.push(format!("{path}:{line}: {IMAGE_REPOSITORY}:{tag}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the crate is {VERSION}, but these name another release image:\n{}",
        stale.join("\n")
    );
    assert!(
        image_versions(&read("deploy/operator.yaml")).len() >= 2,
        "deploy/operator.yaml names the release image (controller and workers)"
    );
}

#[test]
fn the_changelog_has_a_section_for_this_version() {
    let changelog = read("CHANGELOG.md");
    let headings: Vec<&str> = changelog
        .lines()
        .filter(|line| line.starts_with("## "))
        .collect();
    assert_eq!(
        headings.first(),
        Some(&"## [Unreleased]"),
        "CHANGELOG.md begins with ## [Unreleased]"
    );
    let heading = format!("## [{VERSION}] - ");
    let section = headings
        .iter()
        .find_map(|line| line.strip_prefix(&heading))
        .unwrap_or_else(|| {
            panic!("CHANGELOG.md has no section \"{heading}YYYY-MM-DD\" for the crate's version")
        });
    let date: Vec<&str> = section.split('-').collect();
    assert!(
        date.len() == 3
            && [4, 2, 2]
                .iter()
                .zip(&date)
                .all(|(n, part)| part.len() == *n && part.bytes().all(|b| b.is_ascii_digit())),
        "{heading}{section}: the date is not YYYY-MM-DD"
    );
}

fn release_version(dir: &Path, tag: &str) -> Output {
    Command::new(dir.join(".ci/release-version.sh"))
        .arg(tag)
        .output()
        .expect(".ci/release-version.sh runs")
}

#[test]
fn a_tag_is_released_only_at_the_version_of_the_crate_the_chart_and_the_changelog() {
    let tag = format!("v{VERSION}");
    let output = release_version(&repo_root(), &tag);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{VERSION}\n")
    );

    let output = release_version(&repo_root(), VERSION);
    assert!(!output.status.success(), "a tag without its v");
    assert!(text(&output).contains("is not vX.Y.Z"), "{}", text(&output));

    // The next version: nothing says it yet.
    let mut parts: Vec<u64> = VERSION
        .split(['.', '-'])
        .take(3)
        .map(|part| part.parse().expect("a numeric version"))
        .collect();
    parts[2] += 1;
    let next = format!("v{}.{}.{}", parts[0], parts[1], parts[2]);
    let output = release_version(&repo_root(), &next);
    assert!(!output.status.success(), "{next} was accepted");
    for file in [
        "Cargo.toml version",
        "Cargo.lock mailer",
        "Chart.yaml version",
        "Chart.yaml appVersion",
        "CHANGELOG.md",
    ] {
        assert!(
            text(&output).contains(file),
            "{file} not named:\n{}",
            text(&output)
        );
    }

    // A copy of the tree whose chart alone is at another version.
    let copy = std::env::temp_dir().join(format!("mailer-release-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    for file in [
        ".ci/release-version.sh",
        "Cargo.toml",
        "Cargo.lock",
        "CHANGELOG.md",
        "charts/mailer-operator/Chart.yaml",
    ] {
        let to = copy.join(file);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(repo_root().join(file), &to).expect("copy");
    }
    let chart = copy.join("charts/mailer-operator/Chart.yaml");
    let bumped = std::fs::read_to_string(&chart)
        .expect("Chart.yaml")
        .replace(&format!("\nversion: {VERSION}\n"), "\nversion: 9.9.9\n");
    std::fs::write(&chart, bumped).expect("write");
    let output = release_version(&copy, &tag);
    std::fs::remove_dir_all(&copy).ok();
    assert!(!output.status.success(), "a chart at 9.9.9 was released");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        format!(
            "the tag {tag} is version {VERSION}, but charts/mailer-operator/Chart.yaml version is '9.9.9'"
        )
    );

    // The workflow runs the check on its tag before the image and the chart.
    let workflow = yaml(".github/workflows/release.yml");
    assert_eq!(
        workflow["on"],
        serde_json::json!({"push": {"tags": ["v*"]}})
    );
    let jobs = &workflow["jobs"];
    let runs: Vec<&str> = jobs["version"]["steps"]
        .as_array()
        .expect("the version job's steps")
        .iter()
        .filter_map(|step| step["run"].as_str())
        .collect();
    assert!(
        runs.iter()
            .any(|run| run.contains(".ci/release-version.sh \"$TAG\"")),
        "{runs:?}"
    );
    assert_eq!(
        jobs["version"]["steps"][1]["env"]["TAG"],
        "${{ github.ref_name }}"
    );
    let needs = |job: &str| -> Vec<String> {
        match &jobs[job]["needs"] {
            Value::String(one) => vec![one.clone()],
            Value::Array(many) => many
                .iter()
                .map(|n| n.as_str().expect("a job").to_string())
                .collect(),
            other => panic!("{job} needs {other}"),
        }
    };
    assert_eq!(needs("image"), ["version"]);
    assert_eq!(needs("chart"), ["version", "image"]);
}

/// jactionlint, as CI runs it: every rule (the pedantic profile), any finding fails, no
/// network.
fn jactionlint(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new("jactionlint")
        .args([
            "--no-online",
            "--profile",
            "pedantic",
            "--strict-exit",
            "--no-color",
        ])
        .args(args)
        .current_dir(repo_root())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("jactionlint: {e} (.ci/run installs it)"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("written");
    }
    child.wait_with_output().expect("jactionlint finished")
}

#[test]
fn every_workflow_passes_jactionlint() {
    let shellcheck = Command::new("shellcheck").arg("--version").output();
    assert!(
        shellcheck.is_ok_and(|o| o.status.success()),
        "shellcheck checks the workflows' scripts; .ci/run installs it"
    );

    // It does find what is wrong: an unknown key, a job that needs one that is not there,
    // an unpinned action, and a script that reads an outsider's text.
    let broken = "\
name: broken
on: {pull_request: {}}
permissions: {}
jobs:
  test:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    needs: build
    permissions: {contents: read}
    stepz: []
    steps:
      - uses: actions/checkout@v7
      - run: echo '${{ github.event.pull_request.title }}'
        shell: bash
";
    let output = jactionlint(&["--stdin-filename", "broken.yml", "-"], Some(broken));
    assert!(!output.status.success(), "{}", text(&output));
    for rule in [
        "workflow-syntax",
        "undefined-job-needs",
        "unpinned-uses",
        "template-injection",
    ] {
        assert!(
            text(&output).contains(&format!("[{rule}]")),
            "[{rule}] not reported:\n{}",
            text(&output)
        );
    }

    let mut workflows: Vec<String> = std::fs::read_dir(repo_root().join(".github/workflows"))
        .expect(".github/workflows")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yml") || name.ends_with(".yaml"))
        .map(|name| format!(".github/workflows/{name}"))
        .collect();
    workflows.sort();
    assert!(
        workflows.contains(&".github/workflows/release.yml".to_string()),
        "{workflows:?}"
    );
    for workflow in &workflows {
        let output = jactionlint(&[workflow], None);
        assert!(
            output.status.success() && text(&output).trim().is_empty(),
            "jactionlint finds something in {workflow}:\n{}",
            text(&output)
        );
    }
}
