use std::time::Duration;

use super::smtp::{Security, SmtpSettings};
use super::*;

fn smtp(url: &str) -> Result<SmtpSettings, ProviderUrlError> {
    SmtpSettings::from_url(&url::Url::parse(url).expect("a URL"))
}

fn refused(url: &str) -> String {
    from_url(url).expect_err("the URL is refused").to_string()
}

#[test]
fn smtp_urls_default_to_port_25_with_starttls_required() {
    let settings = smtp("smtp://mail.example.com").expect("valid");
    assert_eq!(settings.host, "mail.example.com");
    assert_eq!(settings.port, 25);
    assert_eq!(settings.security, Security::StartTlsRequired);
    assert_eq!(settings.username, None);
    assert_eq!(settings.timeout, smtp::DEFAULT_TIMEOUT);
    assert_eq!(settings.connections, smtp::DEFAULT_CONNECTIONS);
}

#[test]
fn smtps_urls_default_to_port_465_with_implicit_tls() {
    let settings = smtp("smtps://mail.example.com").expect("valid");
    assert_eq!(settings.port, 465);
    assert_eq!(settings.security, Security::ImplicitTls);
}

#[test]
fn every_smtp_option_is_read() {
    let settings = smtp(
        "smtp://u%40shop:p%2Fw%3Ard@mail.example.com:587?tls=opportunistic&timeout=10s&connections=8&hello=worker.shop.example",
    )
    .expect("valid");
    assert_eq!(settings.port, 587);
    assert_eq!(settings.security, Security::StartTlsOpportunistic);
    assert_eq!(settings.username.as_deref(), Some("u@shop"));
    assert_eq!(settings.password(), Some("p/w:rd"));
    assert_eq!(settings.timeout, Duration::from_secs(10));
    assert_eq!(settings.connections, 8);
    assert_eq!(settings.hello.as_deref(), Some("worker.shop.example"));
    assert_eq!(
        smtp("smtp://h?tls=none").expect("valid").security,
        Security::Plaintext
    );
    assert_eq!(
        smtp("smtp://h?tls=required").expect("valid").security,
        Security::StartTlsRequired
    );
}

#[test]
fn ip_addresses_are_hosts_too() {
    let v6 = smtp("smtp://[::1]:2525").expect("valid");
    assert_eq!(v6.host, "::1");
    assert_eq!(v6.server(), "[::1]:2525");
    assert_eq!(smtp("smtp://127.0.0.1").expect("valid").host, "127.0.0.1");
}

#[test]
fn a_provider_shows_its_url_without_the_password() {
    let provider = from_url("smtp://user:s3cret@host:587?tls=required").expect("valid");
    assert_eq!(
        provider.to_string(),
        "smtp://user:***@host:587?tls=required"
    );
    let debug = format!("{provider:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(debug.contains("user:***@host:587"), "{debug}");

    let smtps = from_url("smtps://user:s3cret@host").expect("valid");
    assert_eq!(smtps.to_string(), "smtps://user:***@host:465");
    assert_eq!(
        from_url("smtp://host?tls=none").expect("valid").to_string(),
        "smtp://host:25?tls=none"
    );
}

#[test]
fn errors_about_a_url_never_show_its_password() {
    for url in [
        "smtp://user:s3cret@host?tls=maybe",
        "smtp://user:s3cret@host?timeout=forever",
        "smtp://user:s3cret@host?colour=blue",
        "smtp://user:s3cret@host/path",
        "smtps://user:s3cret@host?tls=none",
        "http://user:s3cret@host",
        "smtp://user:s3cret@host:99999",
        "smtp://user:s3cret@",
    ] {
        let message = refused(url);
        assert!(!message.contains("s3cret"), "{url}: {message}");
        assert!(!message.contains('\n'), "{url}: {message}");
    }
}

#[test]
fn bad_urls_say_what_is_wrong() {
    assert_eq!(
        refused("smtp://user:pw@host?tls=maybe"),
        "the provider URL smtp://user:***@host?tls=maybe is unusable: tls=\"maybe\" is not one of required, opportunistic or none"
    );
    assert_eq!(
        refused("http://host"),
        "the provider URL http://host/ has the unknown scheme \"http\"; use smtp://, smtps://, ses://, sendgrid://, postmark://, mailgun://, file:// or discard://"
    );
    assert!(refused("not a url").starts_with("the provider URL is not a URL ("));
    assert!(
        refused("smtp://host?colour=blue").ends_with(
            "unknown option \"colour\"; the options are tls, timeout, connections, hello"
        )
    );
    assert!(refused("smtps://host?tls=none").ends_with("tls= is an option of smtp://"));
    assert!(refused("smtp://host?timeout=0s").ends_with("is not between 1s and 10m"));
    assert!(refused("smtp://host?timeout=ten").contains("is not a duration"));
    assert!(refused("smtp://host?connections=0").contains("is not a number from 1 to 100"));
    assert!(refused("smtp://host?hello=a%20b").contains("is not a host name"));
    assert!(refused("smtp://:pw@host").ends_with("it has a password but no user name"));
    assert!(refused("smtp://host/inbox").ends_with("an SMTP URL has no path"));
    assert!(refused("smtp:///").ends_with("it names no host"));
    assert!(refused("discard://x").ends_with("discard:// takes no host or path"));
    assert!(refused("discard://?fast=yes").contains("it takes no options"));
    assert!(refused("file://host/dir").contains("absolute directory"));
}

#[test]
fn discard_and_file_urls_make_their_providers() {
    assert_eq!(
        from_url("discard://").expect("valid").to_string(),
        "discard://"
    );
    let dir = std::env::temp_dir().join(format!("mailer-file-url-{}", std::process::id()));
    let url = url::Url::from_directory_path(&dir).expect("an absolute path");
    let provider = from_url(url.as_str()).expect("valid");
    assert!(dir.is_dir(), "the directory is created");
    assert!(provider.to_string().starts_with("file://"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn send_errors_keep_their_failure_and_class() {
    let error = SendError::for_good(ErrorClass::PermanentReply, "550 no such user");
    assert!(error.is_for_good());
    assert_eq!(error.failure(), Failure::ForGood);
    assert_eq!(error.class().as_str(), "permanent-reply");
    assert_eq!(error.to_string(), "550 no such user");
    let error = SendError::for_now(ErrorClass::Connect, "refused");
    assert!(!error.is_for_good());
}

#[test]
fn error_classes_have_distinct_labels() {
    let labels: std::collections::BTreeSet<&str> =
        ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(labels.len(), ErrorClass::ALL.len());
    for label in labels {
        assert!(
            label.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
            "{label}"
        );
    }
}
