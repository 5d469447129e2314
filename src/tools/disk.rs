//! `disk_usage`: `df` for the filesystem, `du` for the largest entries one level down.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Ctx, Outcome, ToolResult, from_process};
use crate::config::Host;
use crate::executor::process::Argv;

/// How many of the largest entries to report.
const LARGEST: usize = 10;
/// `du` gets at most this long; a partial list is reported with `largest_truncated`.
const DU_BUDGET: Duration = Duration::from_secs(3);

pub fn argv(host: &Host, path: &Path) -> [Argv; 2] {
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
            .args(["-x", "-B1", "--max-depth=1", "--"])
            .arg(p),
    ]
}

/// The directory the gate checked, held open. The path may change after the
/// check (a component replaced by a symlink): what was opened is compared
/// with what was checked, and `df` and `du` then measure the opened
/// directory itself, through `/proc/PID/fd/N`, never the path again.
struct Opened {
    fd: std::os::fd::OwnedFd,
    /// `/proc/PID/fd/N/.`: the opened directory, for the child processes.
    via: String,
}

fn open_checked(path: &Path) -> Result<Opened, String> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;
    use std::os::fd::AsRawFd;
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("cannot tell what {} opened: {e}", path.display()))?;
    if opened != path {
        return Err(format!(
            "path {} changed after it was checked (it now opens {}); nothing was measured",
            path.display(),
            opened.display()
        ));
    }
    let via = format!("/proc/{}/fd/{}/.", std::process::id(), fd.as_raw_fd());
    Ok(Opened { fd, via })
}

pub async fn disk_usage(ctx: &Ctx<'_>, path: &Path) -> ToolResult {
    let opened = match open_checked(path) {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let [df, du] = argv(ctx.host, Path::new(&opened.via));
    let out = match ctx.run(&df).await {
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
    let du_deadline = tokio::time::Instant::now() + DU_BUDGET;
    match ctx.run_until(&du, du_deadline).await {
        Ok(out) => {
            // du names entries through the opened directory: name them by the checked path.
            let text = out
                .stdout_text()
                .replace(&format!("{}/", opened.via), &format!("{}/", path.display()));
            let (largest, cut) = parse_du(&text, Path::new(&opened.via));
            data["largest"] = json!(largest);
            data["largest_truncated"] = json!(cut || out.timed_out || out.stdout_truncated);
        }
        Err(e) => {
            data["largest"] = json!([]);
            data["largest_error"] = json!(e);
        }
    }
    drop(opened.fd);
    result.data = data;
    result
}

/// `df -B1 --output=source,fstype,size,used,avail,pcent,target`, header then one line.
pub fn parse_df(text: &str) -> Option<Value> {
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

/// `du -B1 --max-depth=1` lines `SIZE\tPATH`; the total line for `path` itself is dropped.
pub fn parse_du(text: &str, path: &Path) -> (Vec<Value>, bool) {
    let mut entries: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|l| {
            let (size, p) = l.split_once('\t')?;
            Some((size.parse().ok()?, p))
        })
        .filter(|(_, p)| Path::new(p) != path)
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    let cut = entries.len() > LARGEST;
    let list = entries
        .into_iter()
        .take(LARGEST)
        .map(|(bytes, p)| json!({ "path": p, "bytes": bytes }))
        .collect();
    (list, cut)
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
    fn du_keeps_the_largest_without_the_total() {
        let text = "4096\t/var/a\n8192\t/var/b\n12288\t/var\n";
        let (list, cut) = parse_du(text, Path::new("/var"));
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["path"], "/var/b");
        assert!(!cut);
    }
}
