//! The runs other processes record in the log while a daemon runs.
//!
//! A daemon decides cooldown and `max_runs` from slots it keeps in memory,
//! read back from the log when it starts. A person's `runwarden run` on the
//! same machine appends to the same log but not to those slots, so without
//! this a daemon would start a fourth run where `max_runs: 3` and `alerts
//! test` already say capped. The log stays the one record: the daemon reads
//! the lines appended since it last looked (from where start-up's read
//! stopped, across rotations) and takes from them the runs it did not
//! start itself, as start-up would have.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Entry, Phase};

/// A place in the log: the file (device, inode) and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Through {
    id: (u64, u64),
    pub(super) offset: u64,
}

impl Through {
    /// The start of `file`.
    pub(super) fn of(file: &File) -> std::io::Result<Through> {
        let m = file.metadata()?;
        Ok(Through {
            id: (m.dev(), m.ino()),
            offset: 0,
        })
    }
}

/// What another process's lines say about its runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A run of (runbook, host) started at `at`.
    Started {
        runbook: String,
        host: String,
        at: jiff::Timestamp,
    },
    /// A run of (runbook, host) ended at `at`, started by `keys`.
    Ended {
        runbook: String,
        host: String,
        at: jiff::Timestamp,
        keys: Vec<String>,
    },
}

/// The runs other processes record, followed from a [`Through`].
#[derive(Debug)]
pub(crate) struct Others {
    lines: Follower,
    /// Runs of other processes still open: run id -> their trigger keys.
    open: HashMap<String, Vec<String>>,
}

impl Others {
    /// Follow `path` from where start-up's read stopped; `open` are the
    /// runs that read found without a verdict (one a person started before
    /// the daemon may end after it).
    pub(crate) fn from(
        path: &Path,
        through: Option<Through>,
        open: impl IntoIterator<Item = (String, Vec<String>)>,
    ) -> Others {
        Others {
            lines: Follower::new(path, through),
            open: open.into_iter().collect(),
        }
    }

    /// What other processes recorded since the last read. A log that cannot
    /// be read is an error for the caller to say; the next read tries again
    /// from the same place.
    pub(crate) fn read(&mut self) -> std::io::Result<Vec<Seen>> {
        let mut seen = Vec::new();
        let open = &mut self.open;
        self.lines.read(|bytes| seen.extend(line(open, bytes)))?;
        Ok(seen)
    }
}

/// The log's record of demotions, followed as it grows (see
/// [`Record`](crate::gate::demotion::Record)).
#[derive(Debug)]
struct DemotionRecord {
    path: PathBuf,
    read: std::sync::Mutex<(Follower, super::runs::Demoted)>,
}

impl crate::gate::demotion::Record for DemotionRecord {
    fn demoted(&self) -> std::io::Result<super::runs::Demoted> {
        let mut held = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let (lines, demoted) = &mut *held;
        lines.read(|bytes| {
            let Ok(text) = std::str::from_utf8(bytes) else {
                return;
            };
            if super::runs::says_demoted(text)
                && let Ok(e) = serde_json::from_str::<Entry>(text)
            {
                super::runs::fold_demoted(demoted, &e);
            }
        })?;
        Ok(demoted.clone())
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// This machine's demotions: the files under `settings`' state directory,
/// held to its audit log's record.
pub(crate) fn demotions(settings: &crate::config::Settings) -> crate::gate::Demotions {
    demotions_held_to(&settings.state_dir, &settings.audit_log)
}

/// The demotion files under `state_dir`, held to the log at `log`.
pub(crate) fn demotions_held_to(state_dir: &Path, log: &Path) -> crate::gate::Demotions {
    let record = DemotionRecord {
        path: log.to_path_buf(),
        read: std::sync::Mutex::new((Follower::new(log, None), Default::default())),
    };
    crate::gate::Demotions::new(state_dir).with_record(std::sync::Arc::new(record))
}

/// Whole lines of the log from a [`Through`] (the start of the current
/// file when none), across rotations: each is read once.
#[derive(Debug)]
pub(crate) struct Follower {
    path: PathBuf,
    reader: Option<BufReader<File>>,
    at: Through,
}

impl Follower {
    /// Follow `path` from `through`.
    pub(crate) fn new(path: &Path, through: Option<Through>) -> Follower {
        Follower {
            path: path.to_path_buf(),
            reader: None,
            at: through.unwrap_or(Through {
                id: (0, 0),
                offset: 0,
            }),
        }
    }

    /// Hand each whole line written since the last read to `each`. A log
    /// that cannot be read is an error; the next read tries again from the
    /// same place.
    pub(crate) fn read(&mut self, mut each: impl FnMut(&[u8])) -> std::io::Result<()> {
        loop {
            if self.reader.is_none() {
                match self.open_at()? {
                    Some(r) => self.reader = Some(r),
                    None => return Ok(()),
                }
            }
            self.read_lines(&mut each)?;
            // A rotation closed the file this follows: its last lines are
            // read, now the new file from its start.
            let now = match std::fs::metadata(&self.path) {
                Ok(m) => Some((m.dev(), m.ino())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            match now {
                Some(id) if id != self.at.id => {
                    self.reader = None;
                    self.at = Through { id, offset: 0 };
                }
                _ => return Ok(()),
            }
        }
    }

    /// The file at `path`, at `self.at` when it is that file (else from its start).
    fn open_at(&mut self) -> std::io::Result<Option<BufReader<File>>> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let id = Through::of(&file)?.id;
        if id != self.at.id {
            self.at = Through { id, offset: 0 };
        }
        file.seek(SeekFrom::Start(self.at.offset))?;
        Ok(Some(BufReader::new(file)))
    }

    fn read_lines(&mut self, each: &mut impl FnMut(&[u8])) -> std::io::Result<()> {
        let Follower { reader, at, .. } = self;
        let Some(reader) = reader.as_mut() else {
            return Ok(());
        };
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf)?;
            if n == 0 {
                return Ok(());
            }
            if buf.last() != Some(&b'\n') {
                // Being written now: read whole next time.
                reader.seek(SeekFrom::Start(at.offset))?;
                return Ok(());
            }
            at.offset += n as u64;
            each(&buf);
        }
    }
}

/// One line: a start of another process's run, or the verdict of one;
/// `open` are the runs of other processes without a verdict yet.
fn line(open: &mut HashMap<String, Vec<String>>, bytes: &[u8]) -> Option<Seen> {
    let text = std::str::from_utf8(bytes).ok()?;
    let phase = text.split_once("\"phase\":\"")?.1;
    if !["queued\"", "start\"", "verdict\""]
        .iter()
        .any(|p| phase.starts_with(p))
    {
        return None;
    }
    let e: Entry = serde_json::from_str(text).ok()?;
    let at = e.ts.parse::<jiff::Timestamp>().ok()?;
    match e.phase? {
        Phase::Queued | Phase::Start => {
            let d = e.detail.as_ref()?;
            if d["process"] == super::this_process() || super::handed(&e) {
                return None;
            }
            let first = !open.contains_key(&e.run_id);
            let keys = d["keys"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|k| k.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            open.entry(e.run_id.clone()).or_insert(keys);
            first.then_some(Seen::Started {
                runbook: e.runbook,
                host: e.host,
                at,
            })
        }
        Phase::Verdict => {
            let keys = super::lines::keys_after(&e, open.remove(&e.run_id)?);
            let handed = e.detail.as_ref().is_some_and(|d| d["handed_back"] == true);
            (!handed).then_some(Seen::Ended {
                runbook: e.runbook,
                host: e.host,
                at,
                keys,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn line(phase: &str, run: &str, process: serde_json::Value) -> String {
        let e = serde_json::json!({
            "ts": jiff::Timestamp::now().to_string(), "run_id": run, "phase": phase,
            "runbook": "rb", "runbook_version": "v", "host": "web", "planner": "steps", "prev": "0",
            "detail": { "trigger": "cli", "process": process },
        });
        format!("{e}\n")
    }

    /// Another process's run is seen once it is whole on disk: its start,
    /// then its end; this process's own lines and a line still being
    /// written are not taken (the latter is, once whole).
    #[test]
    fn another_process_s_run_is_taken_line_by_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut f = File::create(&path).unwrap();
        let other = serde_json::json!({ "pid": 1, "start": 1, "boot": "b" });
        let mut follow = Others::from(&path, None, []);
        f.write_all(line("start", "mine", super::super::this_process()).as_bytes())
            .unwrap();
        let start = line("start", "theirs", other.clone());
        let (head, tail) = start.split_at(40);
        f.write_all(head.as_bytes()).unwrap();
        assert_eq!(follow.read().unwrap(), [], "nothing whole of theirs yet");
        f.write_all(tail.as_bytes()).unwrap();
        let seen = follow.read().unwrap();
        assert!(
            matches!(seen.as_slice(), [Seen::Started { runbook, .. }] if runbook == "rb"),
            "{seen:?}"
        );
        f.write_all(line("verdict", "mine", other.clone()).as_bytes())
            .unwrap();
        f.write_all(line("verdict", "theirs", other).as_bytes())
            .unwrap();
        let seen = follow.read().unwrap();
        assert!(
            matches!(seen.as_slice(), [Seen::Ended { host, .. }] if host == "web"),
            "only their run's end: {seen:?}"
        );
        assert_eq!(follow.read().unwrap(), [], "each line is read once");
    }
}
