//! Kubernetes quantities (`500m`, `0.5`, `1Gi`, `1e3`) compared by value, and read as a
//! number of bytes.
//!
//! The API server stores a quantity in its canonical form: `cpu: 0.5` reads back as
//! `500m`, `memory: 1024Mi` as `1Gi`. Comparing what the operator would apply with what
//! it reads back must treat those as equal, or every pass would re-apply and report
//! drift that is not there. A size (`spec.worker.maxRequestSize`, `MAIL_MAX_REQUEST_BYTES`)
//! is a quantity too: `32Mi`, `25M` or `33554432`.

/// Whether `a` and `b` are quantities of the same value; `None` when either is not a
/// quantity this can read exactly (then compare them as text).
pub fn same_value(a: &str, b: &str) -> Option<bool> {
    Some(nanos(a)? == nanos(b)?)
}

/// The whole, non-negative number of bytes a quantity says, e.g. `32Mi` is 33554432;
/// `None` for what is not a quantity, a fraction of a byte, or a negative size.
pub fn bytes(text: &str) -> Option<u64> {
    let nanos = nanos(text)?;
    if nanos % 1_000_000_000 != 0 {
        return None;
    }
    u64::try_from(nanos / 1_000_000_000).ok()
}

/// The quantity's value in billionths (the finest unit Kubernetes keeps), when exact.
fn nanos(text: &str) -> Option<i128> {
    let text = text.trim();
    let (sign, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let (power_of_ten, power_of_two): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent => {
            let power = exponent
                .strip_prefix('e')
                .or_else(|| exponent.strip_prefix('E'))?;
            (power.parse().ok()?, 0)
        }
    };
    let fraction_digits = i32::try_from(fraction.len()).ok()?;
    let scale = power_of_ten.checked_add(9)?.checked_sub(fraction_digits)?;
    let scaled = if scale >= 0 {
        mantissa.checked_mul(10i128.checked_pow(u32::try_from(scale).ok()?)?)?
    } else {
        let divisor = 10i128.checked_pow(u32::try_from(-scale).ok()?)?;
        if mantissa % divisor != 0 {
            return None;
        }
        mantissa / divisor
    };
    scaled
        .checked_mul(2i128.checked_pow(power_of_two)?)?
        .checked_mul(sign)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_canonical_form_is_the_same_value() {
        for (written, stored) in [
            ("0.5", "500m"),
            (".5", "500m"),
            ("1", "1000m"),
            ("1024Mi", "1Gi"),
            ("1e3", "1k"),
            ("1.5Gi", "1536Mi"),
            ("100m", "100m"),
            ("+2", "2"),
            ("128974848", "123Mi"),
        ] {
            assert_eq!(
                same_value(written, stored),
                Some(true),
                "{written} {stored}"
            );
        }
    }

    #[test]
    fn sizes_are_whole_bytes() {
        assert_eq!(bytes("32Mi"), Some(32 * 1024 * 1024));
        assert_eq!(bytes("33554432"), Some(33_554_432));
        assert_eq!(bytes("25M"), Some(25_000_000));
        assert_eq!(bytes("1.5Ki"), Some(1536));
        assert_eq!(bytes("0"), Some(0));
        assert_eq!(bytes("1500m"), None, "a byte and a half");
        assert_eq!(bytes("-1Mi"), None);
        assert_eq!(bytes("10 MiB"), None);
        assert_eq!(bytes(""), None);
    }

    #[test]
    fn other_values_and_non_quantities_are_told_apart() {
        assert_eq!(same_value("0.5", "50m"), Some(false));
        assert_eq!(same_value("1G", "1Gi"), Some(false));
        assert_eq!(same_value("-1", "1"), Some(false));
        assert_eq!(same_value("abc", "abc"), None);
        assert_eq!(same_value("1Xi", "1"), None);
        assert_eq!(same_value("", "0"), None);
        assert_eq!(same_value("0.0000000001", "0"), None, "finer than a nano");
    }
}
