//! `list_processes`: the top processes via `ps`.

use serde_json::{Value, json};

use super::PathMode;
use super::args::ProcessSort;
use super::args::*;
use super::registry::{Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process};
use crate::host::Host;
use crate::process::Argv;

pub(crate) fn argv(host: &Host, sort: ProcessSort) -> Argv {
    let key = match sort {
        ProcessSort::Cpu => "-pcpu",
        ProcessSort::Memory => "-rss",
        ProcessSort::Oldest => "-etimes",
        ProcessSort::Newest => "etimes",
    };
    Argv::new(&host.binaries.ps)
        .args([
            "-e",
            "--no-headers",
            "-o",
            "pid=,ppid=,user:32=,stat=,etimes=,pcpu=,rss=,comm=",
        ])
        .arg(format!("--sort={key}"))
}

pub(crate) async fn list(ctx: &Ctx<'_>, sort: ProcessSort, limit: usize) -> ToolResult {
    let out = match ctx.run(&argv(ctx.host, sort)).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let mut result = from_process(&out, Value::Null);
    if result.outcome != Outcome::Ok {
        return result;
    }
    // Not the `ps` that made the list (it is busiest at the moment it looks).
    let all: Vec<Value> = parse(&out.stdout_text())
        .into_iter()
        .filter(|p| p["pid"].as_u64() != Some(u64::from(out.pid)))
        .collect();
    let total = all.len();
    result.truncated |= total > limit;
    result.data = json!({ "sort": sort, "total": total, "processes": all.into_iter().take(limit).collect::<Vec<_>>() });
    result
}

pub(crate) fn parse(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let pid: u64 = f.next()?.parse().ok()?;
            let ppid: u64 = f.next()?.parse().ok()?;
            let user = f.next()?;
            let stat = f.next()?;
            let etimes: u64 = f.next()?.parse().ok()?;
            let pcpu: f64 = f.next()?.parse().ok()?;
            let rss: u64 = f.next()?.parse().ok()?;
            let comm = f.collect::<Vec<_>>().join(" ");
            Some(json!({
                "pid": pid, "ppid": ppid, "user": user, "state": stat,
                "elapsed_s": etimes, "cpu_pct": pcpu, "rss_kb": rss, "command": comm,
            }))
        })
        .collect()
}

/// What a `list_processes` result said, in a person's words.
pub(super) fn said(data: &Value) -> String {
    let top: Vec<String> = data["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .take(3)
        .map(|p| {
            format!(
                "{} (pid {}, {}% cpu, {})",
                p["command"].as_str().unwrap_or("?"),
                p["pid"],
                p["cpu_pct"],
                p["rss_kb"]
                    .as_u64()
                    .map(|k| super::human_bytes(k * 1024))
                    .unwrap_or_default()
            )
        })
        .collect();
    format!("{} processes; top: {}", data["total"], top.join(", "))
}

/// `list_processes`: the busiest, largest or oldest processes.
pub(crate) struct ListProcesses;

impl Tool for ListProcesses {
    const NAME: &'static str = "list_processes";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str = "The top processes by cpu, memory or age: pid, ppid, user, state, cpu%, rss, elapsed seconds, command name.";
    type Args = ProcessArgs;
    type Resolved = (ProcessSort, usize);

    fn resolve(a: ProcessArgs, _: &Host, _: PathMode) -> Result<(ProcessSort, usize), ArgError> {
        Ok((a.sort, a.limit.get()))
    }

    fn args_json((sort, limit): &(ProcessSort, usize)) -> Value {
        json!({ "sort": sort, "limit": limit })
    }

    fn argv((sort, _): &(ProcessSort, usize), host: &Host) -> Vec<Argv> {
        vec![argv(host, *sort)]
    }

    async fn run(ctx: &Ctx<'_>, (sort, limit): &(ProcessSort, usize)) -> ToolResult {
        list(ctx, *sort, *limit).await
    }

    fn said(data: &Value) -> Option<String> {
        Some(said(data))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_ps_lines() {
        let v = super::parse(
            "    1     0 root     Ss   86400  0.0  11800 systemd\n  312     1 www-data S    60  1.5  5200 nginx: worker\n",
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v[1]["command"], "nginx: worker");
        assert_eq!(v[1]["cpu_pct"], 1.5);
    }
}
