//! `mailer dead purge`: removes the dead letters that match, for good; without `--yes`
//! it only says what it would remove.

use std::io::Write;

use super::queue::Verdict;
use super::value::{dead_letters, one_line};
use super::{DeadError, Filter, Target, for_each_match, open_checked};

pub async fn purge(
    target: &Target,
    filter: &Filter,
    yes: bool,
    out: &mut impl Write,
) -> Result<(), DeadError> {
    let queue = open_checked(target).await?;
    let read = for_each_match(&queue, filter, async |_, letter| {
        let id = one_line(letter.message_id.as_deref().unwrap_or("-"));
        let reason = one_line(&letter.reason);
        Ok(if yes {
            let _ = writeln!(out, "removed {id} ({reason})");
            Verdict::Remove
        } else {
            let _ = writeln!(out, "would remove {id} ({reason})");
            Verdict::Keep
        })
    })
    .await;
    queue.close().await;
    let read = read?;
    let queue = &target.dead_queue;
    let _ = if yes {
        writeln!(
            out,
            "removed {} from {queue}",
            dead_letters(read.pass.removed)
        )
    } else {
        writeln!(
            out,
            "would remove {} from {queue}; nothing was removed: run again with --yes to remove them",
            dead_letters(read.matched)
        )
    };
    Ok(())
}
