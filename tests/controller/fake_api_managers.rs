//! The field managers of the test API server's server-side apply (`fake_api/managers.rs`).

use serde_json::json;

use mailer_testkit::fake_api::managers::Managers;

const KEY: &str = "/apis/apps/v1/namespaces/prod/deployments/w";

#[test]
fn fields_another_manager_set_are_kept_and_a_dropped_field_of_ones_own_goes() {
    let mut m = Managers::default();
    let live = json!({"spec": {"replicas": 2, "paused": false}});
    let patch = m
        .apply(
            KEY,
            "op",
            false,
            None,
            &json!({"spec": {"replicas": 2, "paused": false}}),
        )
        .unwrap();
    assert_eq!(patch, live);
    m.updated(
        KEY,
        "hpa",
        Some(&live),
        &json!({"spec": {"replicas": 4, "paused": false}}),
    );
    assert_eq!(m.owners_of(KEY, &["spec", "replicas"]), ["hpa"]);
    let live = json!({"spec": {"replicas": 4, "paused": false}});
    // The operator leaves replicas out now: the autoscaler's value stays.
    let patch = m
        .apply(
            KEY,
            "op",
            false,
            Some(&live),
            &json!({"spec": {"paused": false}}),
        )
        .unwrap();
    assert_eq!(patch, json!({"spec": {"paused": false}}));
    // And a field only it set, left out, is removed.
    let patch = m
        .apply(KEY, "op", false, Some(&live), &json!({"spec": {}}))
        .unwrap();
    assert_eq!(patch, json!({"spec": {"paused": null}}));
}

#[test]
fn changing_anothers_field_conflicts_unless_forced() {
    let mut m = Managers::default();
    let live = json!({"spec": {"replicas": 4}});
    m.updated(KEY, "hpa", None, &live);
    let error = m
        .apply(
            KEY,
            "op",
            false,
            Some(&live),
            &json!({"spec": {"replicas": 2}}),
        )
        .unwrap_err();
    assert_eq!(error.code, 409);
    // The same value is shared, not a conflict.
    m.apply(
        KEY,
        "op",
        false,
        Some(&live),
        &json!({"spec": {"replicas": 4}}),
    )
    .unwrap();
    m.apply(
        KEY,
        "op",
        true,
        Some(&live),
        &json!({"spec": {"replicas": 2}}),
    )
    .unwrap();
    assert_eq!(m.owners_of(KEY, &["spec", "replicas"]), ["op"]);
}
