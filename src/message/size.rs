//! The size limit of a request: how it is given (`MAIL_MAX_REQUEST_BYTES`,
//! `spec.worker.maxRequestSize`, `mailer send --max-request-bytes`) and checked.

use std::fmt;
use std::ops::RangeInclusive;

/// The limits that may be set: 1 KiB (a valid request is rarely much smaller) to 512 MiB
/// (the largest `max_message_size` RabbitMQ takes).
pub const LIMIT_RANGE: RangeInclusive<usize> = 1024..=512 * 1024 * 1024;

/// A request body larger than the limit: the worker dead-letters it as `too-large`, and
/// `mailer send` refuses to publish it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the request is {size} bytes ({}), over the limit of {max} bytes ({})", Bytes::of(*size), Bytes::of(*max))]
pub struct TooLarge {
    pub size: usize,
    pub max: usize,
}

/// A size limit that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("{0:?} is not a size: give bytes (33554432) or a quantity (32Mi, 25M)")]
    NotASize(String),
    #[error("{given:?} is {bytes} bytes ({}); the limit must be from 1Ki to 512Mi", Bytes(*bytes))]
    OutOfRange { given: String, bytes: u64 },
}

/// Whether a request of `size` bytes is within `max`.
pub fn check(size: usize, max: usize) -> Result<(), TooLarge> {
    if size > max {
        return Err(TooLarge { size, max });
    }
    Ok(())
}

/// A limit given as bytes or as a Kubernetes quantity (`32Mi`), within [`LIMIT_RANGE`].
pub fn parse_limit(text: &str) -> Result<usize, LimitError> {
    let bytes =
        crate::quantity::bytes(text).ok_or_else(|| LimitError::NotASize(text.to_string()))?;
    usize::try_from(bytes)
        .ok()
        .filter(|limit| LIMIT_RANGE.contains(limit))
        .ok_or_else(|| LimitError::OutOfRange {
            given: text.to_string(),
            bytes,
        })
}

/// The default limit, as `--max-request-bytes` shows it.
pub const DEFAULT_LIMIT: &str = "10Mi";

/// A number of bytes for people: `25 MiB`, `1.5 KiB`, `300 B`.
struct Bytes(u64);

impl Bytes {
    fn of(bytes: usize) -> Self {
        Self(u64::try_from(bytes).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
        let mut value = self.0 as f64;
        let mut unit = "B";
        for next in UNITS {
            if value < 1024.0 {
                break;
            }
            value /= 1024.0;
            unit = next;
        }
        if unit == "B" || value.fract() == 0.0 {
            write!(f, "{value} {unit}")
        } else {
            write!(f, "{value:.1} {unit}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail;

    #[test]
    fn a_request_over_the_limit_says_both_sizes() {
        assert_eq!(check(10, 10), Ok(()));
        let error = check(26_214_401, 25 * 1024 * 1024).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the request is 26214401 bytes (25.0 MiB), over the limit of 26214400 bytes (25 MiB)"
        );
    }

    #[test]
    fn limits_are_bytes_or_quantities_within_the_range() {
        assert_eq!(parse_limit("32Mi"), Ok(32 * 1024 * 1024));
        assert_eq!(parse_limit("33554432"), Ok(33_554_432));
        assert_eq!(
            parse_limit(DEFAULT_LIMIT),
            Ok(mail::DEFAULT_MAX_REQUEST_BYTES)
        );
        assert_eq!(parse_limit("1Ki"), Ok(1024));
        assert_eq!(parse_limit("512Mi"), Ok(512 * 1024 * 1024));
        assert_eq!(
            parse_limit("32 MiB").unwrap_err().to_string(),
            "\"32 MiB\" is not a size: give bytes (33554432) or a quantity (32Mi, 25M)"
        );
        assert_eq!(
            parse_limit("1Gi").unwrap_err().to_string(),
            "\"1Gi\" is 1073741824 bytes (1 GiB); the limit must be from 1Ki to 512Mi"
        );
        assert!(matches!(
            parse_limit("1000"),
            Err(LimitError::OutOfRange { bytes: 1000, .. })
        ));
    }
}
