//! SMTP over TLS for real: STARTTLS and implicit TLS (`smtps://`) through the test SMTP
//! server with certificates of a CA made for the test run (`tests/test_ca.py`), trusted
//! through `MAIL_PROVIDER_CA_FILE`; and what the worker says about a certificate it
//! cannot trust.

use std::path::Path;
use std::sync::Arc;

use mailer::provider::{self, ErrorClass, Provider};

use crate::mail;
use mailer_testkit::smtp::TempDir;
use mailer_testkit::tls::TestCa;

fn provider(url: &str, ca: Option<&Path>) -> Arc<dyn Provider> {
    provider::from_url_with(url, ca).expect("a valid provider")
}

#[tokio::test]
async fn starttls_and_implicit_tls_deliver_with_the_relays_ca() {
    let ca = TestCa::generate();
    let ca_file = ca.file("ca.pem");
    for (mode, scheme) in [("starttls", "smtp"), ("implicit", "smtps")] {
        let server = ca.server(mode, "server");
        // smtp:// requires STARTTLS by default.
        let url = format!("{scheme}://127.0.0.1:{}", server.port);
        provider(&url, Some(&ca_file))
            .send(mail(&["ok@example.com"], &format!("tls-{mode}")))
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert_eq!(server.message_ids(), [format!("tls-{mode}@shop.example")]);
    }
}

#[tokio::test]
async fn a_certificate_the_worker_cannot_trust_fails_for_now_saying_what_to_fix() {
    let ca = TestCa::generate();
    let ca_file = ca.file("ca.pem");
    let cases = [
        ("server", None, "MAIL_PROVIDER_CA_FILE"),
        ("expired", Some(ca_file.as_path()), "has expired"),
        ("wrong-name", Some(ca_file.as_path()), "not for the host"),
    ];
    for mode in ["starttls", "implicit"] {
        for (leaf, trusted, advice) in cases {
            let server = ca.server(mode, leaf);
            let scheme = if mode == "starttls" { "smtp" } else { "smtps" };
            let url = format!("{scheme}://127.0.0.1:{}", server.port);
            let error = provider(&url, trusted)
                .send(mail(&["ok@example.com"], "untrusted"))
                .await
                .expect_err("refused");
            assert!(!error.is_for_good(), "{mode} {leaf}: {error}");
            assert_eq!(error.class(), ErrorClass::Tls, "{mode} {leaf}: {error}");
            assert!(error.to_string().contains(advice), "{mode} {leaf}: {error}");
            assert!(server.mails().is_empty());
        }
    }
}

#[tokio::test]
async fn a_ca_file_that_is_not_a_certificate_is_refused_at_start() {
    let dir = TempDir::new("not-a-ca");
    let bogus = dir.0.join("ca.pem");
    std::fs::write(&bogus, "not a certificate").unwrap();
    let error = provider::from_url_with("smtp://127.0.0.1:25", Some(&bogus))
        .expect_err("refused")
        .to_string();
    assert!(error.contains("MAIL_PROVIDER_CA_FILE"), "{error}");
    let error = provider::from_url_with("smtp://127.0.0.1:25", Some(&dir.0.join("missing.pem")))
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("MAIL_PROVIDER_CA_FILE: cannot read"),
        "{error}"
    );
}
