//! Replay: only what the filters name, as fresh requests a running worker sends; killed
//! mid-way and run again, nothing lost and at most the one in flight sent twice.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use lapin::types::FieldTable;

use crate::harness::{DEAD_QUEUE, Pipeline, SEND_QUEUE, ids, request, smtp_url};
use mailer_testkit::process::{eventually, exit_within, signal, start_worker, stop_worker};
use mailer_testkit::smtp::SmtpServer;

/// Makes `n` requests that are given up at once (one attempt allowed), their provider
/// refusing every mail for now. (One that cannot be reached gives nothing up.)
async fn gave_up_in_an_outage(
    p: &Pipeline,
    busy: &SmtpServer,
    prefix: &str,
    n: usize,
    dead_before: u32,
) -> Vec<String> {
    let ids = ids(prefix, n);
    for id in &ids {
        p.send(id, &request(&["ok@example.com"]), FieldTable::default())
            .await;
    }
    p.work_until_dead(&smtp_url(busy), 1, dead_before + n as u32)
        .await;
    ids
}

/// The SMTP server's Message-IDs without the domain the worker adds.
fn delivered(smtp: &SmtpServer) -> Vec<String> {
    smtp.message_ids()
        .into_iter()
        .map(|id| id.trim_end_matches("@shop.example").to_string())
        .collect()
}

#[tokio::test]
async fn replay_sends_only_the_gave_up_ones_through_a_running_worker() {
    let smtp = SmtpServer::start();
    let p = Pipeline::new("replay").await;
    p.send("m-1", b"{not json", FieldTable::default()).await;
    p.send(
        "r-1",
        &request(&["nobody+550@example.com"]),
        FieldTable::default(),
    )
    .await;
    p.work_until_dead(&smtp_url(&smtp), 5, 2).await;
    let busy = SmtpServer::start_busy();
    let gave_up = gave_up_in_an_outage(&p, &busy, "g", 5, 2).await;
    let before = p.listed(&[]);
    assert_eq!(before.len(), 7);

    let (code, out, err) = p.dead(&["replay", "--reason", "gave-up", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("would replay g-"))
            .count(),
        5,
        "{out}"
    );
    assert!(out.ends_with("would replay 5 dead letters to exchange mail with key mail.send; nothing was published (dry run)\n"), "{out}");
    assert_eq!(p.listed(&[]), before, "a dry run changes nothing");
    assert_eq!(p.ready(SEND_QUEUE).await, 0);

    // Replayed while the outage lasts, a request is taken as new (attempt 1 of 1) and
    // dies again, one replay more.
    let worker = start_worker(&p.vhost.amqp_url(), &smtp_url(&busy), 1);
    let (code, out, err) = p.dead(&["replay", "--message-id", "g-000"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "replayed g-000 (gave-up) to exchange mail with key mail.send\n\
         replayed 1 dead letter to exchange mail with key mail.send; 6 left in mail.send.dead\n"
    );
    eventually(30, "g-000 dead again", || async {
        p.listed(&["--message-id", "g-000"]).last().cloned()
    })
    .await;
    stop_worker(worker);
    let (_, shown, _) = p.dead(&["show", "g-000"]);
    assert!(
        shown.contains("\nattempts: 1\n"),
        "a fresh request: {shown}"
    );
    assert!(shown.contains("\nreplays: 1\n"), "{shown}");
    assert!(!shown.contains("x-death"), "{shown}");

    let worker = start_worker(&p.vhost.amqp_url(), &smtp_url(&smtp), 5);
    let (code, out, err) = p.dead(&["replay", "--reason", "gave-up"]);
    assert_eq!(code, 0, "{err}");
    let replayed: BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("replayed "))
        .filter_map(|l| l.split_once(' ').map(|(id, _)| id))
        .filter(|id| id.starts_with("g-"))
        .collect();
    assert_eq!(replayed.len(), 5, "{out}");
    assert!(out.ends_with("; 2 left in mail.send.dead\n"), "{out}");
    let sent = eventually(30, "the replayed requests sent", || async {
        let sent: BTreeSet<String> = delivered(&smtp).into_iter().collect();
        (sent.len() >= gave_up.len()).then_some(sent)
    })
    .await;
    stop_worker(worker);
    assert_eq!(
        sent,
        gave_up.iter().cloned().collect(),
        "only the gave-up ones"
    );
    assert_eq!(delivered(&smtp).len(), 5, "each once");
    let left = p.listed(&[]);
    let expected: Vec<String> = before
        .into_iter()
        .filter(|id| !id.starts_with("g-"))
        .collect();
    assert_eq!(left, expected, "the rest stay, in their order");
}

#[tokio::test]
async fn replay_killed_mid_way_and_run_again_loses_nothing() {
    const N: usize = 200;
    let smtp = SmtpServer::start();
    let p = Pipeline::new("replay-kill").await;
    let busy = SmtpServer::start_busy();
    let published = gave_up_in_an_outage(&p, &busy, "k", N, 0).await;
    let worker = start_worker(&p.vhost.amqp_url(), &smtp_url(&smtp), 5);

    let mut replay = p
        .dead_command(&["replay"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(replay.stdout.take().unwrap()).lines();
    let mut first_run = 0;
    while first_run < N / 4 {
        let line = lines.next().expect("replay output").unwrap();
        first_run += usize::from(line.starts_with("replayed k-"));
    }
    replay.kill().expect("SIGKILL");
    let _ = replay.wait();
    first_run += lines
        .map_while(Result::ok)
        .filter(|l| l.starts_with("replayed k-"))
        .count();
    assert!(first_run < N, "the replay should be killed mid-way");
    // The broker puts back what the killed replay held once it sees its connection go.
    eventually(10, "the killed replay's consumer gone", || async {
        (p.consumers(DEAD_QUEUE).await == 0).then_some(())
    })
    .await;

    let (code, out, err) = p.dead(&["replay"]);
    assert_eq!(code, 0, "{err}");
    let second_run = out.lines().filter(|l| l.starts_with("replayed k-")).count();

    let unique = eventually(60, "every request delivered", || async {
        let unique: BTreeSet<String> = delivered(&smtp).into_iter().collect();
        (unique.len() == N).then_some(unique)
    })
    .await;
    stop_worker(worker);
    let delivered = delivered(&smtp).len();
    let still_dead = p.ready(DEAD_QUEUE).await as usize;
    let lost = published
        .iter()
        .filter(|id| !unique.contains(*id))
        .count()
        .saturating_sub(still_dead);
    let duplicates = delivered - unique.len();
    println!(
        "replay killed mid-way: published {N}, replayed {first_run} + {second_run}, \
         delivered {} ({duplicates} duplicates), still dead {still_dead}, lost {lost}",
        unique.len()
    );
    assert_eq!(lost, 0);
    assert_eq!(still_dead, 0);
    assert!(duplicates <= 1, "only the one in flight may be sent twice");
    // A replay prints a request once the broker has confirmed its copy and before it
    // acks the dead letter. Killed after the print, the request is printed by both runs
    // and sent twice; killed between the confirm and the print, it is sent twice and
    // printed once. So every request is printed at least once, and no print is without
    // its copy.
    let printed = first_run + second_run;
    assert!(
        (N..=N + duplicates).contains(&printed),
        "{printed} replays printed for {N} requests and {duplicates} duplicates"
    );
    assert_eq!(p.ready(SEND_QUEUE).await, 0);
}

#[tokio::test]
async fn sigint_stops_a_replay_after_the_one_in_flight() {
    const N: usize = 40;
    let p = Pipeline::new("replay-sigint").await;
    for id in ids("s", N) {
        p.publish_dead(&id, "gave-up", "ok@example.com").await;
    }
    let mut replay = p
        .dead_command(&["replay", "--rate", "20/s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(replay.stdout.take().unwrap()).lines();
    for _ in 0..5 {
        lines.next().expect("replay output").unwrap();
    }
    signal(&replay, "INT");
    let status = exit_within(&mut replay, Duration::from_secs(30));
    let replayed = 5 + lines
        .map_while(Result::ok)
        .filter(|l| l.starts_with("replayed s-"))
        .count();
    let err = std::io::read_to_string(replay.stderr.take().unwrap()).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "interrupted: replayed {replayed} dead letters; the rest are still in mail.send.dead"
        )),
        "{err}"
    );
    assert!(replayed < N, "interrupted mid-way");
    println!("SIGINT: replayed {replayed} of {N}, no duplicate, no loss");
    assert_eq!(p.ready(SEND_QUEUE).await as usize, replayed);
    assert_eq!(p.listed(&[]), ids("s", N)[replayed..]);
}
