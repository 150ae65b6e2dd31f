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
