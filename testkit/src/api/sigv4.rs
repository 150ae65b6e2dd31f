//! SigV4 verified as AWS verifies it, by hand (ring's SHA-256 and HMAC), independently of
//! the `aws-sigv4` crate the provider signs with: the canonical request of what arrived,
//! the string to sign, the key derived from the test's secret, and the request's time
//! against the test's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, Method, Uri};
use ring::{digest, hmac};

/// How far a request's `x-amz-date` may be from the clock: AWS refuses a request signed
/// more than 5 minutes before or after its own time.
pub const MAX_SKEW: Duration = Duration::from_secs(5 * 60);

/// What a request must be signed with.
pub struct Expected<'a> {
    pub key_id: &'a str,
    pub secret: &'a str,
    pub region: &'a str,
    pub service: &'a str,
    /// The test's clock.
    pub now: SystemTime,
}

/// Checks the request's `Authorization` against its headers and body; the error says
/// what AWS would complain of.
pub fn verify(
    expected: &Expected<'_>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| format!("the request has no {name} header"))
    };
    let authorization = header("authorization")?;
    let amz_date = header("x-amz-date")?;
    let fields = authorization
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or("the Authorization is not AWS4-HMAC-SHA256")?;
    let mut credential = None;
    let mut signed_headers = None;
    let mut signature = None;
    for field in fields.split(',') {
        match field.trim().split_once('=') {
            Some(("Credential", value)) => credential = Some(value),
            Some(("SignedHeaders", value)) => signed_headers = Some(value),
            Some(("Signature", value)) => signature = Some(value),
            _ => return Err(format!("unknown Authorization field {field:?}")),
        }
    }
    let (credential, signed_headers, signature) = match (credential, signed_headers, signature) {
        (Some(c), Some(h), Some(s)) => (c, h, s),
        _ => return Err("Authorization lacks Credential, SignedHeaders or Signature".into()),
    };
    let date = amz_date.get(..8).ok_or("x-amz-date is too short")?;
    let scope = format!(
        "{date}/{}/{}/aws4_request",
        expected.region, expected.service
    );
    if credential != format!("{}/{scope}", expected.key_id) {
        return Err(format!(
            "the credential {credential:?} is not {}/{scope}",
            expected.key_id
        ));
    }
    let signed_at = parse_amz_date(amz_date)?;
    let skew = match expected.now.duration_since(signed_at) {
        Ok(ago) => ago,
        Err(ahead) => ahead.duration(),
    };
    if skew > MAX_SKEW {
        return Err(format!(
            "the request was signed at {amz_date}, {skew:?} from the clock"
        ));
    }
    let names: Vec<&str> = signed_headers.split(';').collect();
    for required in ["host", "x-amz-date"] {
        if !names.contains(&required) {
            return Err(format!("SignedHeaders lacks {required}"));
        }
    }
    let mut canonical_headers = String::new();
    for name in &names {
        let values: Vec<String> = headers
            .get_all(*name)
            .iter()
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        if values.is_empty() {
            return Err(format!("the signed header {name} is missing"));
        }
        canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    let canonical_request = format!(
        "{method}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        uri.path(),
        canonical_query(uri.query().unwrap_or_default()),
        hex(digest::digest(&digest::SHA256, body).as_ref()),
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical_request.as_bytes()).as_ref())
    );
    let mut key = format!("AWS4{}", expected.secret).into_bytes();
    for part in [date, expected.region, expected.service, "aws4_request"] {
        key = sign(&key, part.as_bytes());
    }
    let computed = hex(&sign(&key, string_to_sign.as_bytes()));
    if computed != signature {
        return Err(format!(
            "the signature does not match: the canonical request was\n{canonical_request}"
        ));
    }
    Ok(())
}

fn sign(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
        .as_ref()
        .to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The query's pairs sorted (the requests here have none).
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.sort_unstable();
    pairs.join("&")
}

/// `20261204T134500Z` as a time.
fn parse_amz_date(text: &str) -> Result<SystemTime, String> {
    let bad = || format!("x-amz-date {text:?} is not YYYYMMDDTHHMMSSZ");
    if text.len() != 16 || &text[8..9] != "T" || !text.ends_with('Z') {
        return Err(bad());
    }
    let number = |range: std::ops::Range<usize>| text[range].parse::<i64>().map_err(|_| bad());
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    let seconds = u64::try_from(seconds).map_err(|_| bad())?;
    Ok(UNIX_EPOCH + Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's own example of a signed request (IAM ListUsers, in the SigV4 guide).
    #[test]
    fn the_example_of_aws_documentation_verifies() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "iam.amazonaws.com".parse().unwrap());
        headers.insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        headers.insert("x-amz-date", "20150830T123600Z".parse().unwrap());
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
                .parse()
                .unwrap(),
        );
        let uri: Uri = "/?Action=ListUsers&Version=2010-05-08".parse().unwrap();
        let mut expected = Expected {
            key_id: "AKIDEXAMPLE",
            secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            region: "us-east-1",
            service: "iam",
            now: parse_amz_date("20150830T123900Z").unwrap(),
        };
        verify(&expected, &Method::GET, &uri, &headers, b"").expect("AWS's example verifies");
        expected.secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEz";
        assert!(verify(&expected, &Method::GET, &uri, &headers, b"").is_err());
        expected.secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        expected.now = parse_amz_date("20150830T124200Z").unwrap();
        let late = verify(&expected, &Method::GET, &uri, &headers, b"").unwrap_err();
        assert!(late.contains("from the clock"), "{late}");
    }

    #[test]
    fn amz_dates_are_read_as_utc() {
        let t = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_440_938_160
        );
    }
}
