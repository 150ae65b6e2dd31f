//! Which attempt a delivery is on, from its `x-mail-attempt` header.

use lapin::types::{AMQPValue, FieldTable};

use crate::mail::ATTEMPT_HEADER;

/// Why an attempt header cannot be read; the request is dead-lettered as `malformed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedAttempt {
    #[error("its {ATTEMPT_HEADER} header is a {0}, not an integer")]
    NotAnInteger(&'static str),
    #[error("its {ATTEMPT_HEADER} header is {0}, not positive")]
    NotPositive(i64),
    #[error("its {ATTEMPT_HEADER} header is {0}, more attempts than anyone allows")]
    TooLarge(i64),
}

/// The attempt of a delivery with these headers: 1 without the header, else the header's
/// value, which must be a positive integer of any AMQP integer type the broker carries
/// (signed 8 to 64 bits, unsigned 8 to 32 bits).
pub fn attempt_of(headers: Option<&FieldTable>) -> Result<u32, MalformedAttempt> {
    let Some(value) = headers.and_then(|h| h.inner().get(ATTEMPT_HEADER)) else {
        return Ok(1);
    };
    let n: i64 = match value {
        AMQPValue::ShortShortInt(v) => (*v).into(),
        AMQPValue::ShortInt(v) => (*v).into(),
        AMQPValue::LongInt(v) => (*v).into(),
        AMQPValue::LongLongInt(v) => *v,
        AMQPValue::ShortShortUInt(v) => (*v).into(),
        AMQPValue::ShortUInt(v) => (*v).into(),
        AMQPValue::LongUInt(v) => (*v).into(),
        other => return Err(MalformedAttempt::NotAnInteger(type_name(other))),
    };
    if n < 1 {
        return Err(MalformedAttempt::NotPositive(n));
    }
    u32::try_from(n).map_err(|_| MalformedAttempt::TooLarge(n))
}

fn type_name(value: &AMQPValue) -> &'static str {
    match value {
        AMQPValue::Boolean(_) => "boolean",
        AMQPValue::Float(_) | AMQPValue::Double(_) => "floating-point number",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => "string",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "byte array",
        AMQPValue::Void => "void",
        _ => "integer",
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{DecimalValue, FieldArray, LongString, ShortString};

    use super::*;

    fn with(value: AMQPValue) -> FieldTable {
        let mut table = FieldTable::default();
        table.insert(ShortString::from(ATTEMPT_HEADER), value);
        table
    }

    #[test]
    fn no_header_is_the_first_attempt() {
        assert_eq!(attempt_of(None), Ok(1));
        assert_eq!(attempt_of(Some(&FieldTable::default())), Ok(1));
    }

    #[test]
    fn every_amqp_integer_type_counts() {
        let values = [
            AMQPValue::ShortShortInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(3),
            AMQPValue::ShortUInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(3),
        ];
        for value in values {
            assert_eq!(attempt_of(Some(&with(value.clone()))), Ok(3), "{value:?}");
        }
        assert_eq!(
            attempt_of(Some(&with(AMQPValue::LongUInt(u32::MAX)))),
            Ok(u32::MAX)
        );
    }

    #[test]
    fn zero_and_negatives_are_malformed() {
        for value in [
            AMQPValue::LongLongInt(0),
            AMQPValue::ShortShortInt(-1),
            AMQPValue::LongInt(i32::MIN),
        ] {
            assert!(matches!(
                attempt_of(Some(&with(value))),
                Err(MalformedAttempt::NotPositive(_))
            ));
        }
        assert_eq!(
            attempt_of(Some(&with(AMQPValue::LongLongInt(0))))
                .unwrap_err()
                .to_string(),
            "its x-mail-attempt header is 0, not positive"
        );
        assert!(matches!(
            attempt_of(Some(&with(AMQPValue::LongLongInt(i64::MAX)))),
            Err(MalformedAttempt::TooLarge(_))
        ));
    }

    #[test]
    fn other_types_are_malformed_and_named() {
        let cases = [
            (AMQPValue::LongString(LongString::from("2")), "string"),
            (AMQPValue::ShortString(ShortString::from("2")), "string"),
            (AMQPValue::Float(2.0), "floating-point number"),
            (AMQPValue::Double(2.0), "floating-point number"),
            (AMQPValue::Boolean(true), "boolean"),
            (AMQPValue::Timestamp(2), "timestamp"),
            (
                AMQPValue::DecimalValue(DecimalValue { scale: 0, value: 2 }),
                "decimal",
            ),
            (AMQPValue::FieldArray(FieldArray::default()), "array"),
            (AMQPValue::FieldTable(FieldTable::default()), "table"),
            (AMQPValue::Void, "void"),
        ];
        for (value, name) in cases {
            assert_eq!(
                attempt_of(Some(&with(value.clone()))),
                Err(MalformedAttempt::NotAnInteger(name)),
                "{value:?}"
            );
        }
    }
}
