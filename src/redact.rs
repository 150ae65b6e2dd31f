//! Keeping passwords out of what the mailer prints.

use url::Url;

/// Shown in place of a password.
pub const MASK: &str = "***";

/// `url` with its password replaced by [`MASK`]; text that is not a URL is masked whole
/// after its scheme, since it may still hold a password.
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => redacted(&parsed),
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://{MASK}"),
            None => MASK.to_string(),
        },
    }
}

/// `url` with its password, if any, replaced by [`MASK`].
pub fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Setting a password only fails for URLs that cannot have one, and this one has one.
        let _ = shown.set_password(Some(MASK));
    }
    shown.to_string()
}

/// A URL's user name and password, percent-decoded.
pub fn credentials(url: &Url) -> (String, String) {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    (
        decode(url.username()),
        decode(url.password().unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_the_rest_kept() {
        assert_eq!(
            redact_url("http://guest:s3cret@localhost:15672/api"),
            "http://guest:***@localhost:15672/api"
        );
        assert_eq!(redact_url("amqp://u:p%40ss@h/%2f"), "amqp://u:***@h/%2f");
        assert_eq!(
            redact_url("http://localhost:15672"),
            "http://localhost:15672/"
        );
        assert_eq!(redact_url("amqp://u:p@[bad"), "amqp://***");
        assert_eq!(redact_url("nonsense"), "***");
        let url = Url::parse("smtp://user:pw@host:587?tls=required").unwrap();
        assert_eq!(redacted(&url), "smtp://user:***@host:587?tls=required");
        assert_eq!(redacted(&Url::parse("smtp://host").unwrap()), "smtp://host");
    }

    #[test]
    fn credentials_are_percent_decoded() {
        let url = Url::parse("http://us%3Aer:p%40ss@h").unwrap();
        assert_eq!(credentials(&url), ("us:er".to_string(), "p@ss".to_string()));
    }
}
