//! `mailer dead list|stats|show`: reading only. Every dead letter read is put back where
//! it was (see [`super::queue`]).

use std::io::Write;

use super::letter::DeadLetter;
use super::queue::Verdict;
use super::render::{Stats, json_line, table};
use super::value::dead_letters;
use super::{DeadError, Filter, Matched, Target, for_each_match, open_checked, show};

/// How `list` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// An aligned table with a header and a count.
    #[default]
    Text,
    /// One JSON object per line, nothing else.
    Json,
}

/// Reads the dead queue once, handing every dead letter that matches `filter` (up to its
/// limit) to `each` with its delivery's properties and body.
async fn read_matches(
    target: &Target,
    filter: &Filter,
    mut each: impl FnMut(&lapin::BasicProperties, &[u8], DeadLetter),
) -> Result<Matched, DeadError> {
    let queue = open_checked(target).await?;
    let read = for_each_match(&queue, filter, async |delivery, letter| {
        each(&delivery.properties, &delivery.data, letter);
        Ok(Verdict::Keep)
    })
    .await;
    queue.close().await;
    read
}

/// `mailer dead list`.
pub async fn list(
    target: &Target,
    filter: &Filter,
    format: Format,
    out: &mut impl Write,
) -> Result<(), DeadError> {
    let mut letters = Vec::new();
    let read = read_matches(target, filter, |_, _, letter| match format {
        Format::Json => {
            let _ = writeln!(out, "{}", json_line(&letter));
        }
        Format::Text => letters.push(letter),
    })
    .await?;
    if format == Format::Text {
        if !letters.is_empty() {
            let _ = write!(out, "{}", table(&letters));
        }
        let _ = writeln!(
            out,
            "{} of {} in {} listed",
            letters.len(),
            dead_letters(read.pass.depth.ready as usize),
            target.dead_queue
        );
    }
    Ok(())
}

/// `mailer dead stats`.
pub async fn stats(
    target: &Target,
    filter: &Filter,
    out: &mut impl Write,
) -> Result<(), DeadError> {
    let mut stats = Stats::default();
    let read = read_matches(target, filter, |_, _, letter| stats.add(&letter)).await?;
    let _ = writeln!(
        out,
        "{}: {}, {} matching",
        target.dead_queue,
        dead_letters(read.pass.depth.ready as usize),
        read.matched
    );
    let _ = write!(out, "{stats}");
    Ok(())
}

/// `mailer dead show ID`: every dead letter with that message id (a replayed request
/// that died again is there once more).
pub async fn show(
    target: &Target,
    message_id: &str,
    filter: &Filter,
    out: &mut impl Write,
) -> Result<(), DeadError> {
    let filter = Filter {
        message_ids: vec![message_id.to_string()],
        ..filter.clone()
    };
    let mut shown = 0;
    let read = read_matches(target, &filter, |properties, body, letter| {
        if shown > 0 {
            let _ = writeln!(out);
        }
        shown += 1;
        let _ = write!(out, "{}", show::render(properties, body, &letter));
    })
    .await?;
    if read.matched == 0 {
        return Err(DeadError::NotFound {
            queue: target.dead_queue.clone(),
            message_id: message_id.to_string(),
            read: read.pass.read,
        });
    }
    Ok(())
}
