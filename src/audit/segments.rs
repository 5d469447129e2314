//! History in segments: what a reader opens so that its cost follows what it
//! asks for, not how long the machine has been running.
//!
//! The log a writer appends to is always the configured file (`audit.jsonl`).
//! When it reaches its size or age ([`Rotation`]), a writer closes it as a
//! segment named after its first line (`audit.jsonl.000000000001`) and
//! starts the file again with a `segment` line: it chains to the closed
//! segment's last line as any line chains to the one before, so the chain
//! runs unbroken across segments, and it carries what a daemon needs to
//! start (runs without a verdict, each (runbook, host)'s last end) so that
//! start-up reads the current file alone. Closed segments never change
//! again: archiving one is copying it. Segments older than `keep` are
//! removed by the writer that rotates, and the `segment` line names each one
//! with its last hash, so `audit verify` can tell retention from deletion.
//!
//! Every line carries its number in the whole chain (`n`): opening the log
//! reads its last line, never counts. Lines are in time order (each writer
//! stamps a line just before it takes the lock), so a reader asking "since
//! T" finds T by bisecting one segment and reads from there.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use crate::config::Rotation;

/// One file of the history.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    /// The number of its first line in the whole chain (`None`: the current
    /// file, whose first line says it, or an empty one).
    pub(crate) first: Option<u64>,
    /// When it was last written: a closed segment's last line is no newer.
    pub(crate) modified: SystemTime,
}

/// The closed segment of `log` whose first line is line `first`.
pub(crate) fn segment_path(log: &Path, first: u64) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(format!(".{first:012}"));
    PathBuf::from(p)
}

/// Every file of the history of `log`, oldest first: the closed segments,
/// then the current file (when it exists).
pub(crate) fn list(log: &Path) -> std::io::Result<Vec<Segment>> {
    // A history a newer runwarden wrote is refused, never misread.
    super::format::check(log)?;
    let mut out = closed(log)?;
    match std::fs::metadata(log) {
        Ok(m) => out.push(Segment {
            path: log.to_path_buf(),
            first: None,
            modified: m.modified()?,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(out)
}

/// The closed segments of `log`, oldest first.
pub(crate) fn closed(log: &Path) -> std::io::Result<Vec<Segment>> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Ok(Vec::new());
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let file = entry.file_name();
        let Some(first) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .filter(|n| n.len() >= 12 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let meta = entry.metadata()?;
        if meta.is_file() {
            out.push(Segment {
                path: log.with_file_name(&file),
                first: Some(first),
                modified: meta.modified()?,
            });
        }
    }
    out.sort_by_key(|s| s.first);
    Ok(out)
}

/// The segments that may hold lines stamped at or after `since`: the first
/// one written to at or after it, and every later one.
pub(crate) fn since(segments: Vec<Segment>, since: jiff::Timestamp) -> Vec<Segment> {
    // With the same slack as the lines themselves: a file's modification
    // time comes from the kernel's coarse clock (a tick behind the precise
    // one that stamps lines and run ids), so a segment whose last line was
    // stamped at `since` can say it was last written a few ms before.
    let t = SystemTime::from(since.checked_sub(SLACK).unwrap_or(since));
    let skip = segments.iter().take_while(|s| s.modified < t).count();
    // The current file is always read: it may be the one.
    let skip = skip.min(segments.len().saturating_sub(1));
    segments.into_iter().skip(skip).collect()
}

/// Every line of the history of `log` from the first stamped at or after
/// `since` (all of history when `None`), in order.
pub(crate) fn read(
    log: &Path,
    from: Option<jiff::Timestamp>,
) -> std::io::Result<impl Iterator<Item = std::io::Result<String>>> {
    let all = list(log)?;
    let segments = match from {
        Some(t) => since(all, t),
        None => all,
    };
    Ok(lines(segments, from))
}

/// How far before a wanted time a reader starts: lines are stamped before
/// their writer takes the lock, so one may land after a line stamped a
/// moment later.
const SLACK: jiff::SignedDuration = jiff::SignedDuration::from_secs(5);

/// Every line (without its newline) of `segments` from the first stamped at
/// or after `since` (all of them when `None`), in order.
pub(crate) fn lines(
    segments: Vec<Segment>,
    since: Option<jiff::Timestamp>,
) -> impl Iterator<Item = std::io::Result<String>> {
    let start = since.and_then(|t| t.checked_sub(SLACK).ok());
    let mut segments = segments.into_iter();
    let mut first = true;
    let mut current: Option<std::io::Lines<BufReader<File>>> = None;
    std::iter::from_fn(move || {
        loop {
            if let Some(lines) = current.as_mut() {
                match lines.next() {
                    Some(line) => return Some(line),
                    None => current = None,
                }
            }
            let segment = segments.next()?;
            let opened = File::open(&segment.path).and_then(|mut f| {
                if first && let Some(t) = start {
                    let at = offset_at(&f, t)?;
                    f.seek(SeekFrom::Start(at))?;
                }
                Ok(f)
            });
            first = false;
            match opened {
                Ok(f) => current = Some(BufReader::with_capacity(64 << 10, f).lines()),
                // Removed by retention since it was listed: nothing to read.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Some(Err(e)),
            }
        }
    })
}

/// The offset of a line start at or before the first line stamped at or
/// after `t`, found by bisecting on the lines' `ts`.
fn offset_at(file: &File, t: jiff::Timestamp) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let (mut lo, mut hi) = (0u64, len);
    // Narrow to a window small enough to read through.
    while hi - lo > 64 << 10 {
        let mid = lo + (hi - lo) / 2;
        match line_after(file, mid, hi)? {
            Some((start, ts)) if ts.is_none_or(|ts| ts < t) => lo = start,
            _ => hi = mid,
        }
    }
    Ok(lo)
}

/// The first whole line starting after byte `at` (and before `end`): its
/// offset and its `ts`, when it has one.
fn line_after(
    file: &File,
    at: u64,
    end: u64,
) -> std::io::Result<Option<(u64, Option<jiff::Timestamp>)>> {
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(at))?;
    let mut reader = BufReader::with_capacity(16 << 10, f.take(end - at));
    let mut skipped = Vec::new();
    let n = reader.read_until(b'\n', &mut skipped)?;
    if n == 0 || skipped.last() != Some(&b'\n') {
        return Ok(None);
    }
    let start = at + n as u64;
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Ok(None);
    }
    #[derive(serde::Deserialize)]
    struct Stamp {
        ts: String,
    }
    let ts = serde_json::from_slice::<Stamp>(&line)
        .ok()
        .and_then(|s| s.ts.parse().ok());
    Ok(Some((start, ts)))
}

/// The time a UUIDv7 run id was made (its first 48 bits, milliseconds since
/// the epoch), from the id or a prefix of it: the earliest and latest times
/// its run can have been made at.
pub(crate) fn id_time(prefix: &str) -> Option<(jiff::Timestamp, jiff::Timestamp)> {
    let hex: String = prefix.chars().filter(|&c| c != '-').take(12).collect();
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let pad = |c: char| {
        let mut h = hex.clone();
        while h.len() < 12 {
            h.push(c);
        }
        u64::from_str_radix(&h, 16).ok()
    };
    let (lo, hi) = (pad('0')?, pad('f')?);
    let ms = |v: u64| jiff::Timestamp::from_millisecond(i64::try_from(v).ok()?).ok();
    Some((ms(lo)?, ms(hi)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditLog, Phase, RunInfo, runs, verify};
    use crate::verdict::Verdict;
    use std::time::Duration;

    fn small(keep: Option<Duration>) -> Rotation {
        Rotation {
            max_bytes: 2048,
            max_age: None,
            keep,
            max_total: None,
        }
    }

    fn run(id: &str) -> RunInfo {
        RunInfo {
            run_id: id.into(),
            ..crate::audit::tests::info()
        }
    }

    fn filler(log: &AuditLog, id: &str, n: u32) {
        for i in 0..n {
            log.append(run(id).entry(Phase::Result, Some(i)), false)
                .unwrap();
        }
    }

    #[test]
    fn a_rotated_log_is_one_chain_and_a_restart_reads_only_the_current_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open_with(&path, small(None)).unwrap();
        let mut queued = run("a").entry(Phase::Queued, None);
        queued.detail = Some(serde_json::json!({ "keys": ["fp1"] }));
        log.append(queued, true).unwrap();
        log.verdict(&run("a"), Verdict::Ok, "done", None).unwrap();
        log.append(run("b").entry(Phase::Start, None), false)
            .unwrap();
        filler(&log, "c", 120);
        let closed = closed(&path).unwrap();
        assert!(closed.len() >= 3, "{closed:?}");
        assert_eq!(closed[0].first, Some(1));
        assert!(std::fs::metadata(&path).unwrap().len() < 4096);

        let v = verify(&path).unwrap();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!(v.segments, closed.len() + 1);
        // 123 lines of runs, and one `segment` line per rotation.
        assert_eq!(v.lines, 123 + closed.len());
        assert_eq!(v.last, log.head().lines);

        // What a restarted daemon needs is in the current file alone.
        let r = runs::recovery(&path).unwrap();
        let open: Vec<&str> = r
            .unfinished
            .iter()
            .map(|(e, _)| e.run_id.as_str())
            .collect();
        assert_eq!(open, ["b"]);
        let (_, keys) = &r.ends[&("rb".to_string(), "local".to_string())];
        assert_eq!(keys, &["fp1"]);
        // Runs a and b started (for `max_runs`), each counted once.
        assert_eq!(r.starts[&("rb".to_string(), "local".to_string())].len(), 2);

        // Another process goes on numbering where the chain is.
        drop(log);
        let again = AuditLog::open_with(&path, small(None)).unwrap();
        assert_eq!(again.head().lines, v.last);
        filler(&again, "d", 1);
        let after = verify(&path).unwrap();
        assert!(after.problems.is_empty(), "{:?}", after.problems);
        assert_eq!(again.head().lines, after.last);
        assert!(after.last > v.last);

        // A closed segment deleted by hand shows where it was.
        std::fs::remove_file(&closed[1].path).unwrap();
        let v = verify(&path).unwrap();
        let (line, why) = &v.problems[0];
        assert_eq!(Some(*line as u64), closed[1].first, "{why}");
        assert!(
            why.contains("where line") && why.contains("deleted"),
            "{why}"
        );
    }

    /// With shared state, a run this replica handed to the fleet's queue is
    /// the log of whichever replica took it: a restart leaves it alone (no
    /// `interrupted` verdict for a run another replica may be running), and
    /// the history says `handed`. One taken from the queue is this log's.
    #[test]
    fn a_run_handed_to_the_fleet_is_not_this_logs_to_close_and_one_taken_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        let keys = ["fp1".to_string()];
        let queued = |id: &str, queue| crate::audit::Queued {
            run: run(id),
            trigger: crate::origin::Trigger::Alert,
            keys: &keys,
            origin: crate::audit::Origin::default(),
            queue,
        };
        let lines = AuditLog::queued_lines(&[
            queued("handed", crate::audit::QueueNote::Handed),
            queued("taken", crate::audit::QueueNote::TakenFrom("b")),
        ]);
        let w = log.append_queued(lines).unwrap();
        log.sync_through_within(w, Duration::ZERO).unwrap();
        let r = runs::recovery(&path).unwrap();
        let open: Vec<&str> = r
            .unfinished
            .iter()
            .map(|(e, _)| e.run_id.as_str())
            .collect();
        assert_eq!(open, ["taken"]);
        assert_eq!(r.starts[&("rb".to_string(), "local".to_string())].len(), 1);
        let listed = runs::list(&path, &Default::default()).unwrap();
        let status = |id: &str| {
            listed
                .iter()
                .find(|s| s.run_id == id)
                .map(|s| s.status.clone())
        };
        assert_eq!(status("handed").as_deref(), Some("handed"));
        // This test's process wrote it and lives: queued, not interrupted.
        assert_eq!(status("taken").as_deref(), Some("queued"));
        let text = std::fs::read_to_string(&path).unwrap();
        let taken: serde_json::Value = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|l| l["run_id"] == "taken")
            .unwrap();
        assert_eq!(taken["detail"]["taken_from"], "b");
    }

    /// Retention decides on each segment's own last line, not its file's
    /// mtime: segments `touch`ed into 2020 stay while their lines are
    /// young, and go once their last line is older than `keep`; `verify`
    /// says how many went, which lines, and from when to when.
    #[test]
    fn retention_removes_old_segments_and_says_so_and_a_hand_deletion_still_shows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let keep = Some(Duration::from_secs(2));
        let log = AuditLog::open_with(&path, small(keep)).unwrap();
        let written = std::time::Instant::now();
        filler(&log, "a", 80);
        let old = closed(&path).unwrap();
        assert!(old.len() >= 2);
        let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_836_800);
        for s in &old {
            File::options()
                .write(true)
                .open(&s.path)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        filler(&log, "young", 20);
        // (Only while their lines are still young: a machine that stalled
        // for the whole `keep` between the two writes proves nothing here.)
        if written.elapsed() < Duration::from_millis(1500) {
            assert!(
                old.iter().all(|s| s.path.exists()),
                "an mtime of 2020 is no retention"
            );
        }
        std::thread::sleep(Duration::from_millis(2200));
        filler(&log, "b", 40);
        let now = closed(&path).unwrap();
        assert!(now.iter().all(|s| s.first > old[1].first), "{now:?}");
        let mut text = std::fs::read_to_string(&path).unwrap();
        for s in &now {
            text.push_str(&std::fs::read_to_string(&s.path).unwrap());
        }
        let retired: Vec<u64> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["phase"] == "segment")
            .flat_map(|v| {
                v["detail"]["retired"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|r| r["first"].as_u64())
            .collect();
        let olds: Vec<u64> = old.iter().map(|s| s.first.unwrap()).collect();
        assert_eq!(&retired[..olds.len()], &olds[..], "the oldest first");
        let v = verify(&path).unwrap();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!(Some(v.last + 1 - v.lines as u64), now[0].first);
        assert!(v.retired.segments >= old.len(), "{:?}", v.retired);
        assert_eq!(v.retired.lines.map(|l| l.0), old[0].first);
        assert!(
            v.retired.from.is_some() && v.retired.to.is_some(),
            "{:?}",
            v.retired
        );
        // A head for a line retention removed is not checked (the command
        // fails one that was pinned); one for a kept line is.
        let kept = crate::audit::head::Head {
            hash: v.head.clone(),
            lines: v.last,
        };
        let gone = crate::audit::head::Head {
            hash: "0".repeat(64),
            lines: 1,
        };
        let w = crate::audit::verify_against(&path, &[kept, gone]).unwrap();
        assert!(w.problems.is_empty(), "{:?}", w.problems);
        assert_eq!((w.heads_checked, w.heads_retired), (1, 1));

        // Removing the oldest kept segment by hand is not retention.
        std::fs::remove_file(&now[0].path).unwrap();
        let v = verify(&path).unwrap();
        assert!(
            v.problems[0].1.contains("does not start the chain"),
            "{:?}",
            v.problems
        );
    }

    #[test]
    fn a_writer_holding_the_closed_file_goes_on_in_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let rotating = AuditLog::open_with(&path, small(None)).unwrap();
        let holding = AuditLog::open_with(
            &path,
            Rotation {
                max_bytes: u64::MAX,
                max_age: None,
                keep: None,
                max_total: None,
            },
        )
        .unwrap();
        for i in 0..30 {
            filler(&rotating, "a", 1);
            holding
                .append(run("b").entry(Phase::Result, Some(i)), false)
                .unwrap();
        }
        assert!(closed(&path).unwrap().len() >= 2);
        let v = verify(&path).unwrap();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!(v.last, holding.head().lines);
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.contains("\"run_id\":\"b\""), "{current}");
    }

    /// Writers closing segments as their appends come due, each with its
    /// own open file (as the daemon and people's `runwarden run`s), from
    /// threads at once: every line is kept, once, in one chain. `fresh`
    /// writers open the log again for every line, as short-lived commands.
    fn writers_at_once(writers: &[&str], fresh: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let lines_each = 150;
        std::thread::scope(|s| {
            for who in writers {
                let path = path.clone();
                s.spawn(move || {
                    if fresh {
                        for i in 0..lines_each {
                            let log = AuditLog::open_with(&path, small(None)).unwrap();
                            log.append(run(who).entry(Phase::Result, Some(i)), false)
                                .unwrap();
                        }
                    } else {
                        let log = AuditLog::open_with(&path, small(None)).unwrap();
                        filler(&log, who, lines_each);
                    }
                });
            }
        });
        let v = verify(&path).unwrap();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        let closed = closed(&path).unwrap();
        assert!(closed.len() >= 5, "{}", closed.len());
        // Each writer's lines, once each, plus one `segment` line per rotation.
        assert_eq!(v.lines, writers.len() * lines_each as usize + closed.len());
        let all: Vec<String> = lines(list(&path).unwrap(), None)
            .map(Result::unwrap)
            .collect();
        for who in writers {
            let mine = all
                .iter()
                .filter(|l| l.contains(&format!("\"run_id\":\"{who}\"")))
                .count();
            assert_eq!(mine, lines_each as usize, "{who}");
        }
    }

    #[test]
    fn two_writers_closing_segments_at_once_keep_every_line_in_one_chain() {
        writers_at_once(&["a", "b"], false);
    }

    /// A writer that finds a file just swapped in as the log must not fill
    /// and close it while the writer that swapped it in still takes it for
    /// the log (that one's next line would land in a closed segment).
    #[test]
    fn four_writers_closing_segments_at_once_never_write_to_a_closed_one() {
        writers_at_once(&["a", "b", "c", "d"], false);
    }

    #[test]
    fn writers_opening_the_log_for_every_line_keep_one_chain() {
        writers_at_once(&["a", "b", "c"], true);
    }

    #[test]
    fn runs_and_one_run_s_lines_are_found_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open_with(&path, small(None)).unwrap();
        let mut ids = Vec::new();
        for _ in 0..12 {
            let id = uuid::Uuid::now_v7().to_string();
            log.append(run(&id).entry(Phase::Start, None), false)
                .unwrap();
            filler(&log, &id, 3);
            log.verdict(&run(&id), Verdict::Ok, "done", None).unwrap();
            ids.push(id);
        }
        assert!(closed(&path).unwrap().len() >= 3);
        for id in &ids {
            let lines = crate::audit::run_lines(&path, id).unwrap();
            assert_eq!(lines.len(), 5, "{id}");
            assert_eq!(lines.last().unwrap().phase, Some(Phase::Verdict));
            assert_eq!(runs::resolve(&path, &id[..32]).unwrap(), *id);
        }
        let all = runs::list(&path, &runs::Filter::default()).unwrap();
        assert_eq!(all.len(), 12);
        let newest = runs::list(
            &path,
            &runs::Filter {
                limit: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
        let got: Vec<&str> = newest.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(got, ids[9..].iter().map(String::as_str).collect::<Vec<_>>());
        let since = runs::list(
            &path,
            &runs::Filter {
                since: Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(since.len(), 12);
        assert!(since.iter().all(|r| r.status == "ok"));
    }

    #[test]
    fn a_run_id_tells_when_its_run_was_made() {
        let id = uuid::Uuid::now_v7().to_string();
        let (lo, hi) = id_time(&id).unwrap();
        assert_eq!(lo, hi);
        let now = jiff::Timestamp::now();
        assert!((now - lo).get_seconds().abs() < 5, "{lo} vs {now}");
        let (lo, hi) = id_time(&id[..4]).unwrap();
        assert!(lo <= now && now <= hi && hi > lo);
        assert!(id_time("zz").is_none());
    }

    #[test]
    fn bisecting_finds_the_first_line_of_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let base = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut text = String::new();
        for i in 0..20_000 {
            let ts = base + jiff::SignedDuration::from_secs(i * 60);
            text.push_str(&format!(
                "{{\"ts\":\"{ts}\",\"i\":{i},\"pad\":\"{}\"}}\n",
                "x".repeat(40)
            ));
        }
        std::fs::write(&path, &text).unwrap();
        let want = base + jiff::SignedDuration::from_secs(15_000 * 60);
        let at = offset_at(&File::open(&path).unwrap(), want).unwrap();
        let first_after: Vec<&str> = text[at as usize..].lines().take(2000).collect();
        assert!(at > 0 && first_after.iter().any(|l| l.contains("\"i\":15000,")));
        assert!(text[..at as usize].lines().count() > 14_000);
        let read: Vec<String> = lines(list(&path).unwrap(), Some(want))
            .map(Result::unwrap)
            .collect();
        assert!(read.len() < 6_500 && read.last().unwrap().contains("\"i\":19999,"));
    }

    /// `max_total` bounds the history's bytes: the oldest segments go first
    /// (young as they are), each recorded as retention removed it, so the
    /// chain verifies and says what went.
    #[test]
    fn the_history_stays_under_its_total_size_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut rotation = small(None);
        rotation.max_total = Some(4 * 2048);
        let log = AuditLog::open_with(&path, rotation).unwrap();
        filler(&log, "a", 400);
        let files = list(&path).unwrap();
        let total: u64 = files
            .iter()
            .map(|s| std::fs::metadata(&s.path).unwrap().len())
            .sum();
        assert!(
            total <= 4 * 2048 + 2 * 2048,
            "{total} bytes in {} files",
            files.len()
        );
        let v = verify(&path).unwrap();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert!(v.retired.segments > 0, "{:?}", v.retired);
        assert_eq!(
            v.retired.lines.map(|l| l.0),
            Some(1),
            "the oldest went first"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"why\":\"max_total\""), "{text}");
    }
}
