use super::super::from_url;

const KEY: &str = "s3cr3t-K3y";

#[test]
fn each_api_is_built_from_its_url_and_never_shows_its_key() {
    let cases = [
        (
            "ses://AKIDEXAMPLE:s3cr3t-K3y@eu-west-1",
            "ses://eu-west-1",
            "https://email.eu-west-1.amazonaws.com/v2/email/outbound-emails",
        ),
        (
            "sendgrid://:s3cr3t-K3y@api.sendgrid.com",
            "sendgrid://",
            "https://api.sendgrid.com/v3/mail/send",
        ),
        (
            "postmark://:s3cr3t-K3y@api.postmarkapp.com?stream=outbound",
            "postmark://",
            "https://api.postmarkapp.com/email",
        ),
        (
            "mailgun://:s3cr3t-K3y@mg.shop.example",
            "mailgun://mg.shop.example",
            "https://api.mailgun.net/v3/mg.shop.example/messages.mime",
        ),
        (
            "mailgun://api:s3cr3t-K3y@mg.shop.example?region=eu",
            "mailgun://mg.shop.example",
            "https://api.eu.mailgun.net/v3/mg.shop.example/messages.mime",
        ),
        (
            "sendgrid://:s3cr3t-K3y@api.eu.sendgrid.com?endpoint=http://127.0.0.1:8025/",
            "sendgrid://",
            "http://127.0.0.1:8025/v3/mail/send",
        ),
        (
            "ses://AKIDEXAMPLE:s3cr3t-K3y@us-east-1?endpoint=http://127.0.0.1:9&configuration-set=tx",
            "ses://us-east-1",
            "http://127.0.0.1:9/v2/email/outbound-emails",
        ),
    ];
    for (url, shown, api) in cases {
        let provider = from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(provider.to_string(), shown, "{url}");
        let debug = format!("{provider:?}");
        assert!(debug.contains(api), "{url}: {debug}");
        assert!(!debug.contains(KEY), "{url}: {debug}");
        assert!(provider.concurrency().is_none());
    }
}

#[test]
fn a_secret_with_a_slash_is_percent_encoded_and_decoded() {
    let provider = from_url("ses://AKID:ab%2Fcd%2Bef@us-east-1");
    assert!(provider.is_ok());
    let (_, secret) = crate::redact::credentials(
        &url::Url::parse("ses://AKID:ab%2Fcd%2Bef@us-east-1").expect("a URL"),
    );
    assert_eq!(secret, "ab/cd+ef");
}

#[test]
fn unusable_urls_are_refused_without_showing_the_key() {
    let cases = [
        ("ses://:s3cr3t-K3y@us-east-1", "access key id is missing"),
        ("ses://AKID@us-east-1", "secret access key is missing"),
        (
            "ses://AKID:s3cr3t-K3y@US_East",
            "the host must be the AWS region",
        ),
        (
            "ses://AKID:s3cr3t-K3y@us-east-1?region=x",
            "unknown option \"region\"",
        ),
        (
            "sendgrid://s3cr3t-K3y@api.sendgrid.com",
            "takes no user name",
        ),
        (
            "sendgrid://:s3cr3t-K3y@api.sendgrid.com/v3",
            "the host must be the API's host",
        ),
        ("sendgrid://api.sendgrid.com", "API key is missing"),
        (
            "postmark://:s3cr3t-K3y@h?endpoint=ftp://h",
            "endpoint= must be",
        ),
        (
            "postmark://:s3cr3t-K3y@h?endpoint=http://u:p@h",
            "endpoint= must be",
        ),
        (
            "mailgun://:s3cr3t-K3y@mg.shop.example?region=mars",
            "region= must be us or eu",
        ),
        (
            "mailgun://:s3cr3t-K3y@mg.shop.example/v3",
            "the host must be the sending domain",
        ),
        ("mailgun://:s3cr3t-K3y@", "not a URL (empty host)"),
    ];
    for (url, problem) in cases {
        let error = from_url(url)
            .map(|p| p.to_string())
            .unwrap_err()
            .to_string();
        assert!(error.contains(problem), "{url}: {error}");
        assert!(!error.contains(KEY), "{url}: {error}");
    }
}

#[test]
fn masking_hides_user_and_password_alike() {
    let url = url::Url::parse("sendgrid://s3cr3t-K3y@a.example?endpoint=http://h").expect("a URL");
    assert_eq!(
        super::masked(&url),
        "sendgrid://***@a.example?endpoint=http://h"
    );
    let url = url::Url::parse("mailgun://:k@mg.example").expect("a URL");
    assert_eq!(super::masked(&url), "mailgun://***@mg.example");
    let url = url::Url::parse("mailgun://mg.example").expect("a URL");
    assert_eq!(super::masked(&url), "mailgun://mg.example");
}
