//! `disk_usage`: `df` for the filesystem, `du` for the directory's own
//! total and its largest entries one level down, files among them (a
//! directory of logs is its files, and "22% used of 252 GiB" says nothing
//! of them).

use std::path::Path;

use serde_json::{Value, json};

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::registry::{Allowed, Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process};
use crate::host::Host;
use crate::process::Argv;

/// How many of the largest entries to report.
const LARGEST: usize = 10;

pub(crate) fn argv(host: &Host, path: &Path) -> [Argv; 2] {
    let p = path.to_string_lossy().into_owned();
    [
        Argv::new(&host.binaries.df)
            .args([
                "-B1",
                "--output=source,fstype,size,used,avail,pcent,target",
                "--",
            ])
            .arg(p.clone()),
        Argv::new(&host.binaries.du)
            .args(["-x", "-a", "-B1", "--max-depth=1", "--"])
            .arg(p),
    ]
}

/// `du` without `-a`: subdirectories only, for a directory of so many
/// files that their list passes the output cap.
fn du_directories(host: &Host, path: &Path) -> Argv {
    Argv::new(&host.binaries.du)
        .args(["-x", "-B1", "--max-depth=1", "--"])
        .arg(path.to_string_lossy().into_owned())
}

/// The directory the gate checked, held open. The path may change after the
/// check (a component replaced by a symlink): what was opened is compared
/// with what was checked, and `df` and `du` then measure the opened
/// directory itself, handed to them as their stdin and named
/// `/proc/self/fd/0`, never the path again. (Their own fd, not this
/// process's through `/proc/PID/fd`: a tier-1 process runs as the observer,
/// which may not look into the daemon's `/proc`.)
struct Opened {
    fd: std::sync::Arc<std::os::fd::OwnedFd>,
    /// `/proc/self/fd/0/.`: the opened directory, as the child names it.
    via: String,
}

/// How `df` and `du` name the directory they are handed.
const VIA: &str = "/proc/self/fd/0/.";

fn open_checked(path: &Path) -> Result<Opened, ToolResult> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;
    use std::os::fd::AsRawFd;
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ToolResult::failed(format!("cannot open {}: {e}", path.display())))?;
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| {
        ToolResult::failed(format!("cannot tell what {} opened: {e}", path.display()))
    })?;
    if opened != path {
        return Err(ToolResult::failed(format!(
            "path {} changed after it was checked (it now opens {}); nothing was measured",
            path.display(),
            opened.display()
        )));
    }
    Ok(Opened {
        fd: std::sync::Arc::new(fd),
        via: VIA.to_string(),
    })
}

pub(crate) async fn disk_usage(ctx: &Ctx<'_>, path: &Path) -> ToolResult {
    let opened = match open_checked(path) {
        Ok(o) => o,
        Err(failed) => return failed,
    };
    let [df, du] = argv(ctx.host, Path::new(&opened.via));
    let out = match ctx.run_on(&df, &opened.fd, ctx.deadline).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let mut result = from_process(&out, Value::Null);
    if result.outcome != Outcome::Ok {
        return result;
    }
    let Some(mut data) = parse_df(&out.stdout_text()) else {
        return ToolResult::failed(format!(
            "unexpected df output: {:?}",
            out.stdout_text().chars().take(200).collect::<String>()
        ));
    };
    data["path"] = json!(path);
    let du_deadline = tokio::time::Instant::now() + ctx.host.du_budget;
    // du reports a directory when it has finished it, so an answer cut
    // short (by the budget or the output cap) lists whatever happened to
    // finish first, small directories often: it is never ranked as the
    // largest.
    let mut measured = ctx.run_on(&du, &opened.fd, du_deadline).await;
    // Too many files to list them all: their directories, at least.
    if matches!(&measured, Ok(out) if out.stdout_truncated && !out.timed_out) {
        let dirs = du_directories(ctx.host, Path::new(&opened.via));
        measured = ctx.run_on(&dirs, &opened.fd, du_deadline).await;
        data["files_listed"] = json!(false);
    }
    let partial = match measured {
        Ok(out) if out.timed_out => Some(format!(
            "du did not finish within the host's du_budget ({}); the largest entries are unknown (raise du_budget in the host file)",
            humantime::format_duration(ctx.host.du_budget)
        )),
        Ok(out) if out.stdout_truncated => Some(
            "du's output was cut at the output cap; the largest entries are unknown (measure a directory further down)".to_string(),
        ),
        Ok(out) => {
            let text = named_by(&out.stdout_text(), &opened.via, path);
            let (largest, cut, total) = parse_du(&text, Path::new(&opened.via));
            data["largest"] = json!(largest);
            data["largest_truncated"] = json!(cut);
            data["dir_bytes"] = json!(total);
            None
        }
        Err(e) => Some(e.to_string()),
    };
    data["partial"] = json!(partial.is_some());
    if let Some(why) = partial {
        data["largest"] = json!([]);
        data["largest_truncated"] = json!(false);
        data["partial_reason"] = json!(why);
    }
    drop(opened.fd);
    result.data = data;
    result
}

/// du names entries through the opened directory (`via`): name them by the
/// checked path instead, with one `/` between (`/etc`, never `//etc`).
fn named_by(du: &str, via: &str, path: &Path) -> String {
    let base = path.display().to_string();
    du.replace(
        &format!("{via}/"),
        &format!("{}/", base.trim_end_matches('/')),
    )
}

/// `df -B1 --output=source,fstype,size,used,avail,pcent,target`, header then one line.
pub(crate) fn parse_df(text: &str) -> Option<Value> {
    let line = text.lines().nth(1)?;
    let mut f = line.split_whitespace();
    let filesystem = f.next()?;
    let fstype = f.next()?;
    let size: u64 = f.next()?.parse().ok()?;
    let used: u64 = f.next()?.parse().ok()?;
    let avail: u64 = f.next()?.parse().ok()?;
    let pcent = f.next()?;
    let use_pct: u64 = pcent.trim_end_matches('%').parse().unwrap_or(0);
    let mount_point = f.collect::<Vec<_>>().join(" ");
    Some(json!({
        "filesystem": filesystem,
        "fstype": fstype,
        "size_bytes": size,
        "used_bytes": used,
        "avail_bytes": avail,
        "use_pct": use_pct,
        "mount_point": mount_point,
    }))
}

/// `du -B1 --max-depth=1` lines `SIZE\tPATH`: the largest entries (the
/// line for `path` itself aside), whether there were more, and `path`'s
/// own total.
pub(crate) fn parse_du(text: &str, path: &Path) -> (Vec<Value>, bool, Option<u64>) {
    let mut total = None;
    let mut entries: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|l| {
            let (size, p) = l.split_once('\t')?;
            Some((size.parse().ok()?, p))
        })
        .filter(|(size, p)| {
            let own = Path::new(p) == path;
            if own {
                total = Some(*size);
            }
            !own
        })
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    let cut = entries.len() > LARGEST;
    let list = entries
        .into_iter()
        .take(LARGEST)
        .map(|(bytes, p)| json!({ "path": p, "bytes": bytes }))
        .collect();
    (list, cut, total)
}

/// What a `disk_usage` result said, in a person's words.
pub(super) fn said(data: &Value) -> String {
    let bytes = |k: &str| data[k].as_u64().map_or("?".into(), super::human_bytes);
    let mut t = format!(
        "{}% used of {} ({} free) on {} {} mounted at {}",
        data["use_pct"],
        bytes("size_bytes"),
        bytes("avail_bytes"),
        data["fstype"].as_str().unwrap_or("?"),
        data["filesystem"].as_str().unwrap_or("?"),
        data["mount_point"].as_str().unwrap_or("?")
    );
    if let Some(total) = data["dir_bytes"].as_u64() {
        t += &format!(
            "; {} holds {}",
            data["path"].as_str().unwrap_or("the directory"),
            super::human_bytes(total)
        );
    }
    if data["partial"] == true {
        t += &format!(
            "; PARTIAL: {}",
            data["partial_reason"].as_str().unwrap_or("?")
        );
    } else if let Some(top) = data["largest"].as_array().filter(|l| !l.is_empty()) {
        let shown: Vec<String> = top
            .iter()
            .take(3)
            .map(|e| {
                format!(
                    "{} {}",
                    e["path"].as_str().unwrap_or("?"),
                    e["bytes"]
                        .as_u64()
                        .map(super::human_bytes)
                        .unwrap_or_default()
                )
            })
            .collect();
        t += &format!("; largest: {}", shown.join(", "));
    }
    t
}

/// `disk_usage`: how full a filesystem is and what fills it.
pub(crate) struct DiskUsage;

impl Tool for DiskUsage {
    const NAME: &'static str = "disk_usage";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str = "Filesystem use of an allowed path: use_pct, size/used/avail bytes, mount point; the directory's own total (dir_bytes) and its 10 largest entries one level down, files included (partial when du ran out of time).";
    type Args = DiskUsageArgs;
    type Resolved = std::path::PathBuf;

    fn allowed(host: &Host) -> Vec<(&'static str, Allowed)> {
        let dirs = host.paths.iter().map(|p| p.display().to_string());
        vec![("path", Allowed::Under(dirs.collect()))]
    }

    fn resolve(a: DiskUsageArgs, host: &Host, mode: PathMode) -> Result<Self::Resolved, ArgError> {
        allowed_path(a.path.as_str(), &host.paths, mode, "paths")
    }

    fn args_json(path: &Self::Resolved) -> Value {
        json!({ "path": path })
    }

    fn argv(path: &Self::Resolved, host: &Host) -> Vec<Argv> {
        argv(host, path).into()
    }

    async fn run(ctx: &Ctx<'_>, path: &Self::Resolved) -> ToolResult {
        disk_usage(ctx, path).await
    }

    fn said(data: &Value) -> Option<String> {
        // A call that failed measured nothing: its error says why, and no
        // "null% used of ?" stands in for figures it never had.
        data["use_pct"].is_number().then(|| said(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_df_output() {
        // Recorded from `df -B1 --output=... /srv/data` on a 16 MiB tmpfs filled to 97%.
        let text = "Filesystem     Type   1B-blocks     Used  Avail Use% Mounted on\ntmpfs          tmpfs   16777216 16261120 516096  97% /srv/data\n";
        let v = parse_df(text).unwrap();
        assert_eq!(v["use_pct"], 97);
        assert_eq!(v["avail_bytes"], 516096);
        assert_eq!(v["mount_point"], "/srv/data");
        assert!(parse_df("garbage").is_none());
    }

    #[test]
    fn entries_are_named_by_the_checked_path_with_one_slash() {
        let via = "/proc/7/fd/9/.";
        let du = format!("4096\t{via}/etc\n8192\t{via}/usr\n12288\t{via}\n");
        let root = named_by(&du, via, Path::new("/"));
        assert!(
            root.contains("\t/etc\n") && root.contains("\t/usr\n"),
            "{root}"
        );
        assert!(!root.contains("//"), "{root}");
        let var = named_by(&du, via, Path::new("/var"));
        assert!(var.contains("\t/var/etc\n"), "{var}");
    }

    #[test]
    fn du_keeps_the_largest_without_the_total() {
        let text = "4096\t/var/a\n8192\t/var/b.log\n12288\t/var\n";
        let (list, cut, total) = parse_du(text, Path::new("/var"));
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["path"], "/var/b.log");
        assert!(!cut);
        assert_eq!(total, Some(12288));
    }

    /// A result without figures (the call failed) says nothing in
    /// figures: no `null%`, no `?` sizes.
    #[test]
    fn a_failed_measure_says_no_figures() {
        assert_eq!(<DiskUsage as Tool>::said(&json!({ "path": "/gone" })), None);
        let said = crate::tools::said(
            "disk_usage",
            &json!({ "path": "/gone", "stderr": "du: cannot access" }),
        )
        .unwrap();
        assert!(
            !said.contains("null%") && !said.contains("? free"),
            "{said}"
        );
        let ok = json!({ "use_pct": 93, "size_bytes": 16u64 << 20, "avail_bytes": 1u64 << 20, "fstype": "tmpfs", "filesystem": "tmpfs", "mount_point": "/x" });
        assert!(
            <DiskUsage as Tool>::said(&ok)
                .unwrap()
                .starts_with("93% used of 16.0 MiB")
        );
    }
}
