use super::*;

fn reply(code: u16, text: &str) -> Cause {
    Cause::Reply {
        code,
        text: text.to_owned(),
    }
}

fn sorted(step: Step, cause: Cause) -> (Failure, ErrorClass, bool) {
    let error = classify(step, "WHAT", cause);
    (error.failure, error.class, error.connection_usable)
}

#[test]
fn a_5xx_to_the_mail_is_for_good() {
    for step in [Step::RcptTo, Step::Data, Step::Message] {
        assert_eq!(
            sorted(step, reply(550, "5.1.1 no such user")),
            (Failure::ForGood, ErrorClass::PermanentReply, true),
            "{step:?}"
        );
    }
}

#[test]
fn a_4xx_anywhere_is_for_now() {
    for step in [Step::MailFrom, Step::RcptTo, Step::Data, Step::Message] {
        assert_eq!(
            sorted(step, reply(450, "4.2.0 mailbox busy")),
            (Failure::ForNow, ErrorClass::TemporaryReply, true),
            "{step:?}"
        );
    }
    assert_eq!(
        sorted(Step::Connect, reply(421, "too busy")),
        (Failure::ForNow, ErrorClass::TemporaryReply, false)
    );
}

#[test]
fn a_5xx_while_setting_up_the_session_is_for_now() {
    assert_eq!(
        sorted(Step::Connect, reply(554, "no service")),
        (Failure::ForNow, ErrorClass::Protocol, true)
    );
    assert_eq!(
        sorted(Step::StartTls, reply(554, "TLS not available")),
        (Failure::ForNow, ErrorClass::Protocol, true)
    );
    assert_eq!(
        sorted(Step::Auth, reply(535, "5.7.8 bad credentials")),
        (Failure::ForNow, ErrorClass::Auth, true)
    );
    assert_eq!(
        sorted(Step::MailFrom, reply(530, "5.7.0 authentication required")),
        (Failure::ForNow, ErrorClass::Auth, true)
    );
    assert_eq!(
        sorted(Step::MailFrom, reply(550, "5.7.1 relaying denied")),
        (Failure::ForNow, ErrorClass::Protocol, true)
    );
}

#[test]
fn a_5xx_recipient_then_a_closing_server_is_for_good() {
    let refusals = vec![
        classify(
            Step::RcptTo,
            "RCPT TO:<a@x>",
            reply(550, "5.1.1 no such user"),
        ),
        classify(
            Step::RcptTo,
            "RCPT TO:<b@x>",
            reply(421, "4.3.2 shutting down"),
        ),
    ];
    let error = refused_recipients(refusals);
    assert_eq!(error.failure, Failure::ForGood);
    assert_eq!(error.class, ErrorClass::PermanentReply);
    assert!(!error.connection_usable, "the server is closing it");
}

#[test]
fn a_421_means_the_connection_is_closing() {
    assert!(!classify(Step::MailFrom, "MAIL", reply(421, "bye")).connection_usable);
}

#[test]
fn failures_without_a_reply_are_for_now_and_lose_the_connection() {
    let io = || Cause::Io("network error: connection reset".into());
    let cases = [
        (Step::Connect, io(), ErrorClass::Connect),
        (
            Step::Connect,
            Cause::Timeout("timed out".into()),
            ErrorClass::Timeout,
        ),
        (
            Step::Connect,
            Cause::Tls("bad certificate".into()),
            ErrorClass::Tls,
        ),
        (Step::StartTls, io(), ErrorClass::Tls),
        (Step::Auth, io(), ErrorClass::Auth),
        (Step::RcptTo, io(), ErrorClass::Io),
        (
            Step::Message,
            Cause::Protocol("incomplete response".into()),
            ErrorClass::Protocol,
        ),
    ];
    for (step, cause, class) in cases {
        assert_eq!(
            sorted(step, cause.clone()),
            (Failure::ForNow, class, false),
            "{step:?} {cause:?}"
        );
    }
}

#[test]
fn the_detail_quotes_the_reply_code_and_text() {
    let error = classify(
        Step::RcptTo,
        "RCPT TO:<b@x.example>",
        reply(550, "5.1.1 no such user"),
    );
    assert_eq!(
        error.detail,
        "RCPT TO:<b@x.example>: 550 5.1.1 no such user"
    );
}

#[test]
fn a_4xx_then_a_5xx_recipient_is_for_good() {
    let refusals = vec![
        classify(Step::RcptTo, "RCPT TO:<a@x>", reply(450, "4.2.0 busy")),
        classify(
            Step::RcptTo,
            "RCPT TO:<b@x>",
            reply(550, "5.1.1 no such user"),
        ),
    ];
    let error = refused_recipients(refusals);
    assert_eq!(error.failure, Failure::ForGood);
    assert_eq!(error.class, ErrorClass::PermanentReply);
    assert_eq!(
        error.detail,
        "recipients refused, so the mail went to no one: RCPT TO:<a@x>: 450 4.2.0 busy; RCPT TO:<b@x>: 550 5.1.1 no such user"
    );
}

#[test]
fn only_4xx_recipients_are_for_now() {
    let refusals = vec![
        classify(Step::RcptTo, "RCPT TO:<a@x>", reply(450, "busy")),
        classify(Step::RcptTo, "RCPT TO:<b@x>", reply(451, "later")),
    ];
    let error = refused_recipients(refusals);
    assert_eq!(error.failure, Failure::ForNow);
    assert_eq!(error.class, ErrorClass::TemporaryReply);
}

#[test]
fn a_long_list_of_refusals_is_cut_short() {
    let refusals = (0..25)
        .map(|n| classify(Step::RcptTo, &format!("RCPT TO:<{n}@x>"), reply(550, "no")))
        .collect();
    let error = refused_recipients(refusals);
    assert!(error.detail.ends_with("; and 15 more"), "{}", error.detail);
    assert!(!error.detail.contains("<10@x>"), "{}", error.detail);
}

#[test]
fn an_unparsable_reply_from_lettre_is_a_protocol_cause() {
    let error = "garbage"
        .parse::<lettre::transport::smtp::response::Response>()
        .expect_err("not a reply");
    assert!(matches!(Cause::of(&error), Cause::Protocol(_)));
}

#[test]
fn a_rustls_error_inside_an_io_error_is_found() {
    let io = std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
    );
    assert!(caused_by_tls(&io));
    let plain = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    assert!(!caused_by_tls(&plain));
}
