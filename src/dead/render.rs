//! How `list` and `stats` print dead letters: a table or JSON lines, and counts. Every
//! value from a request is escaped to one harmless line.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::SystemTime;

use serde::Serialize;

use super::letter::DeadLetter;
use super::value::{one_line, rfc3339};
use crate::text::{truncate, truncate_middle};

/// The widest a table column that holds a request's text may be, in characters.
const MAX_TO: usize = 40;
const MAX_SUBJECT: usize = 40;
const MAX_ERROR: usize = 100;

/// `list --output json`: one object per dead letter.
#[derive(Serialize)]
struct JsonLetter<'a> {
    message_id: Option<&'a str>,
    reason: &'a str,
    attempts: Option<u32>,
    dead_at: Option<String>,
    to: &'a [String],
    subject: Option<&'a str>,
    error: Option<&'a str>,
}

/// One JSON object, on one line.
pub fn json_line(letter: &DeadLetter) -> String {
    let json = JsonLetter {
        message_id: letter.message_id.as_deref(),
        reason: &letter.reason,
        attempts: letter.attempts,
        dead_at: letter.dead_at.map(rfc3339),
        to: &letter.to,
        subject: letter.subject.as_deref(),
        error: letter.error.as_deref(),
    };
    serde_json::to_string(&json).unwrap_or_default()
}

/// A table of dead letters with a header line, columns aligned.
pub fn table(letters: &[DeadLetter]) -> String {
    let header = [
        "MESSAGE-ID",
        "REASON",
        "ATTEMPTS",
        "DEAD-AT",
        "TO",
        "SUBJECT",
        "ERROR",
    ]
    .map(String::from);
    let rows: Vec<[String; 7]> = std::iter::once(header)
        .chain(letters.iter().map(row))
        .collect();
    let mut widths = [0; 7];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(letter: &DeadLetter) -> [String; 7] {
    let recipients: Vec<&String> = letter
        .to
        .iter()
        .chain(&letter.cc)
        .chain(&letter.bcc)
        .collect();
    let to = match recipients.as_slice() {
        [] => "-".to_string(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first} (+{})", rest.len()),
    };
    [
        one_line(letter.message_id.as_deref().unwrap_or("-")),
        one_line(&letter.reason),
        letter.attempts.map_or("-".to_string(), |n| n.to_string()),
        letter.dead_at.map_or("-".to_string(), rfc3339),
        truncate(&one_line(&to), MAX_TO).into_owned(),
        truncate(
            &one_line(letter.subject.as_deref().unwrap_or("-")),
            MAX_SUBJECT,
        )
        .into_owned(),
        truncate_middle(&one_line(letter.error.as_deref().unwrap_or("-")), MAX_ERROR).into_owned(),
    ]
}

/// Counts of dead letters by reason and by recipient domain, and the oldest and newest.
#[derive(Debug, Default)]
pub struct Stats {
    pub total: usize,
    by_reason: BTreeMap<String, usize>,
    by_domain: BTreeMap<String, usize>,
    oldest: Option<(SystemTime, String)>,
    newest: Option<(SystemTime, String)>,
    undated: usize,
}

impl Stats {
    pub fn add(&mut self, letter: &DeadLetter) {
        self.total += 1;
        *self.by_reason.entry(letter.reason.clone()).or_default() += 1;
        let domains = letter.domains();
        if domains.is_empty() {
            *self.by_domain.entry("(none)".into()).or_default() += 1;
        }
        for domain in domains {
            *self.by_domain.entry(domain).or_default() += 1;
        }
        let id = letter.message_id.clone().unwrap_or_else(|| "-".into());
        match letter.dead_at {
            None => self.undated += 1,
            Some(at) => {
                if self.oldest.as_ref().is_none_or(|(oldest, _)| at < *oldest) {
                    self.oldest = Some((at, id.clone()));
                }
                if self.newest.as_ref().is_none_or(|(newest, _)| at > *newest) {
                    self.newest = Some((at, id));
                }
            }
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_counts(f, "by reason", &self.by_reason)?;
        write_counts(f, "by recipient domain", &self.by_domain)?;
        for (label, end) in [("oldest", &self.oldest), ("newest", &self.newest)] {
            match end {
                Some((at, id)) => writeln!(f, "{label}: {} ({})", rfc3339(*at), one_line(id))?,
                None => writeln!(f, "{label}: -")?,
            }
        }
        if self.undated > 0 {
            writeln!(f, "without a time of death: {}", self.undated)?;
        }
        Ok(())
    }
}

/// `title:` then one line per key, the largest count first.
fn write_counts(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    counts: &BTreeMap<String, usize>,
) -> fmt::Result {
    writeln!(f, "{title}:")?;
    let mut sorted: Vec<(&String, &usize)> = counts.iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let width = sorted
        .iter()
        .map(|(key, _)| one_line(key).chars().count())
        .max()
        .unwrap_or(0);
    for (key, count) in sorted {
        writeln!(f, "  {:<width$}  {count}", one_line(key))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::dead::letter::DeadBy;
    use crate::dead::value::timestamp;

    fn letter(id: &str, reason: &str, at: Option<u64>, to: &[&str]) -> DeadLetter {
        DeadLetter {
            message_id: Some(id.into()),
            reason: reason.into(),
            by: DeadBy::Worker,
            attempts: Some(3),
            dead_at: at.map(timestamp),
            to: to.iter().map(|s| s.to_string()).collect(),
            cc: vec![],
            bcc: vec![],
            subject: Some("Your\norder".into()),
            error: Some("smtp: 450\r\nlater".into()),
            replays: 0,
        }
    }

    #[test]
    fn a_table_has_one_aligned_line_per_letter() {
        let text = table(&[
            letter(
                "a-1",
                "gave-up",
                Some(1_700_000_000),
                &["x@example.com", "y@example.org"],
            ),
            letter("bb-22", "malformed", None, &[]),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("MESSAGE-ID  REASON     ATTEMPTS  DEAD-AT"),
            "{text}"
        );
        assert_eq!(
            lines[1],
            r"a-1         gave-up    3         2023-11-14T22:13:20Z  x@example.com (+1)  Your\norder  smtp: 450\r\nlater"
        );
        assert!(
            lines[2].starts_with("bb-22       malformed  3         -     "),
            "{text}"
        );
    }

    #[test]
    fn json_has_the_documented_fields_in_order() {
        let line = json_line(&letter(
            "a-1",
            "rejected",
            Some(1_700_000_000),
            &["x@example.com"],
        ));
        assert_eq!(
            line,
            r#"{"message_id":"a-1","reason":"rejected","attempts":3,"dead_at":"2023-11-14T22:13:20Z","to":["x@example.com"],"subject":"Your\norder","error":"smtp: 450\r\nlater"}"#
        );
    }

    #[test]
    fn stats_count_reasons_and_domains_and_find_the_ends() {
        let mut stats = Stats::default();
        stats.add(&letter("old", "gave-up", Some(100), &["a@example.com"]));
        stats.add(&letter(
            "new",
            "gave-up",
            Some(300),
            &["b@example.com", "c@example.org"],
        ));
        stats.add(&letter("mid", "rejected", Some(200), &[]));
        stats.add(&letter("undated", "malformed", None, &["d@example.org"]));
        let text = stats.to_string();
        assert_eq!(
            text,
            "by reason:\n  gave-up    2\n  malformed  1\n  rejected   1\n\
             by recipient domain:\n  example.com  2\n  example.org  2\n  (none)       1\n\
             oldest: 1970-01-01T00:01:40Z (old)\nnewest: 1970-01-01T00:05:00Z (new)\n\
             without a time of death: 1\n"
        );
        assert_eq!(stats.total, 4);
        let _ = Duration::ZERO;
    }
}
