//! Cutting text short for error messages, headers and tables: the one place that decides
//! how, so every shortened value reads the same (`…` where something was left out).

use std::borrow::Cow;

/// The mark where text was left out.
pub const ELLIPSIS: char = '…';

/// At most `max` characters of `text`, the last one `…` when something was cut.
pub fn truncate(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some(_) => {
            let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
            cut.push(ELLIPSIS);
            Cow::Owned(cut)
        }
    }
}

/// `text` cut to at most `max` bytes at a character boundary, ending in `...` when
/// something was cut: for limits the Kubernetes API counts in bytes (an event's note
/// may hold at most 1 kB, a condition's message 32 kB).
pub fn truncate_bytes(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub(3);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// At most `max` characters of `text`: its start and its end, with `…` between when
/// something was cut (an error's cause is often at its end).
pub fn truncate_middle(text: &str, max: usize) -> Cow<'_, str> {
    let count = text.chars().count();
    if count <= max {
        return Cow::Borrowed(text);
    }
    let head = max.saturating_sub(1) / 2;
    let tail = max.saturating_sub(1) - head;
    let start = text.chars().take(head);
    let end = text.chars().skip(count - tail);
    Cow::Owned(start.chain([ELLIPSIS]).chain(end).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_limits_cut_at_a_character_boundary() {
        let cut = truncate_bytes("é".repeat(600), 1000);
        assert!(cut.len() <= 1000 && cut.ends_with("..."));
        assert_eq!(truncate_bytes("short".into(), 1000), "short");
    }

    #[test]
    fn long_text_is_cut_with_an_ellipsis_counted_in() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abcd", 4), "abcd");
        assert_eq!(truncate("", 4), "");
        let long = "é".repeat(3000);
        let cut = truncate(&long, 1000);
        assert_eq!(cut.chars().count(), 1000);
        assert!(cut.ends_with("é…"));
    }

    #[test]
    fn the_middle_is_left_out_keeping_both_ends() {
        assert_eq!(truncate_middle("abcdefghij", 5), "ab…ij");
        assert_eq!(truncate_middle("abc", 5), "abc");
        assert_eq!(truncate_middle("abcdefghij", 6).chars().count(), 6);
    }
}
