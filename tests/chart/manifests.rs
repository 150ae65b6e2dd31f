//! The manifests beside the chart: deploy/operator.yaml is the chart's render (`make
//! manifests`), so plain-manifest users get exactly what Helm users get.

use crate::render::parse_documents;
use mailer_testkit::repo_root;

#[test]
fn deploy_operator_yaml_is_the_charts_render() {
    let output = mailer_testkit::chart::render_chart(&["deploy"], "");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered = String::from_utf8(output.stdout).expect("UTF-8");
    let checked_in = std::fs::read_to_string(repo_root().join("deploy/operator.yaml"))
        .expect("deploy/operator.yaml");
    assert!(
        rendered == checked_in,
        "deploy/operator.yaml differs from the chart's render: run `make manifests`"
    );

    let objects = parse_documents(&checked_in);
    assert_eq!(objects[0]["kind"], "Namespace");
    assert_eq!(objects[0]["metadata"]["name"], "mailer-system");
    for object in &objects[1..] {
        if !object["kind"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Cluster")
        {
            assert_eq!(
                object["metadata"]["namespace"], "mailer-system",
                "{}",
                object["kind"]
            );
        }
    }
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsGroup"], 65532);
    assert_eq!(
        pod["containers"][0]["image"],
        mailer::cli::controller::DEFAULT_WORKER_IMAGE
    );
}
