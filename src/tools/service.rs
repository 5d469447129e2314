//! `service_status`, `restart_service`, `reload_service`: systemd units via `systemctl`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::registry::{Allowed, Change, Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process, poll, privileged};
use crate::host::Host;
use crate::process::Argv;

const PROPERTIES: &str = "Id,Type,LoadState,ActiveState,SubState,MainPID,ActiveEnterTimestamp,ActiveEnterTimestampMonotonic,InactiveExitTimestampMonotonic,Result,ExecMainStatus,NRestarts,UnitFileState";
/// How long a changed unit must stay active before the change counts as verified.
const SETTLE: Duration = Duration::from_millis(500);
/// Longest wait for a unit to come back after a restart or reload.
const VERIFY_WAIT: Duration = Duration::from_secs(15);

pub(crate) fn show_argv(host: &Host, unit: &str) -> Argv {
    Argv::new(&host.binaries.systemctl)
        .arg("show")
        .arg(format!("--property={PROPERTIES}"))
        .arg(unit)
}

pub(crate) fn change_argv(host: &Host, verb: &str, unit: &str) -> Argv {
    privileged(
        host,
        Argv::new(&host.binaries.systemctl).arg(verb).arg(unit),
    )
}

/// The state of one unit, parsed from `systemctl show`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UnitState(BTreeMap<String, String>);

impl UnitState {
    pub(crate) fn parse(text: &str) -> UnitState {
        UnitState(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
    fn get(&self, k: &str) -> &str {
        self.0.get(k).map(String::as_str).unwrap_or("")
    }
    pub(crate) fn active(&self) -> bool {
        self.get("ActiveState") == "active"
    }
    pub(crate) fn main_pid(&self) -> u64 {
        self.get("MainPID").parse().unwrap_or(0)
    }
    /// A monotonic timestamp property (µs since boot; 0 when never).
    fn monotonic(&self, k: &str) -> u64 {
        self.get(k).parse().unwrap_or(0)
    }
    pub(crate) fn found(&self) -> bool {
        !matches!(self.get("LoadState"), "not-found" | "")
    }
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "unit": self.get("Id"),
            "load_state": self.get("LoadState"),
            "active_state": self.get("ActiveState"),
            "sub_state": self.get("SubState"),
            "main_pid": self.main_pid(),
            "since": self.get("ActiveEnterTimestamp"),
            "result": self.get("Result"),
            "exec_main_status": self.get("ExecMainStatus").parse::<i64>().unwrap_or(0),
            "n_restarts": self.get("NRestarts").parse::<u64>().unwrap_or(0),
            "unit_file_state": self.get("UnitFileState"),
            "type": self.get("Type"),
            // When it last entered its active state and last left its
            // inactive one, i.e. started (µs since boot): a restart of a
            // unit with no main pid is told by these.
            "active_enter_monotonic_us": self.monotonic("ActiveEnterTimestampMonotonic"),
            "inactive_exit_monotonic_us": self.monotonic("InactiveExitTimestampMonotonic"),
        })
    }
}

async fn show(ctx: &Ctx<'_>, unit: &str) -> Result<UnitState, ToolResult> {
    let out = ctx
        .run(&show_argv(ctx.host, unit))
        .await
        .map_err(ToolResult::failed)?;
    let r = from_process(&out, Value::Null);
    if r.outcome != Outcome::Ok {
        return Err(r);
    }
    let state = UnitState::parse(&out.stdout_text());
    if !state.found() {
        return Err(ToolResult::failed(format!(
            "unit {unit} is not loaded on this host (LoadState={})",
            state.get("LoadState")
        )));
    }
    Ok(state)
}

pub(crate) async fn status(ctx: &Ctx<'_>, unit: &str) -> ToolResult {
    match show(ctx, unit).await {
        Ok(state) => ToolResult::observed(state.to_json()),
        Err(r) => r,
    }
}

/// Run the change, then watch the unit until it is active (and stays so) or the wait runs out.
async fn change(ctx: &Ctx<'_>, unit: &str, verb: &str) -> ToolResult {
    let before = match show(ctx, unit).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let out = match ctx.run(&change_argv(ctx.host, verb, unit)).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let mut result = from_process(&out, json!({ "unit": unit, "before": before.to_json() }));
    if result.outcome != Outcome::Ok {
        result.verified = Some(false);
        return result;
    }
    let restart = verb == "restart";
    let expect = |s: &UnitState| {
        if restart {
            restarted(&before, s).is_some()
        } else {
            s.active() && s.main_pid() == before.main_pid()
        }
    };
    let until = (tokio::time::Instant::now() + VERIFY_WAIT).min(ctx.deadline);
    let settled = poll(until, Duration::from_millis(100), || async {
        let s = show(ctx, unit).await.ok()?;
        expect(&s).then_some(s)
    })
    .await;
    let after = match settled {
        Some(first) => {
            tokio::time::sleep(SETTLE).await;
            match show(ctx, unit).await {
                Ok(s) if expect(&s) && s.main_pid() == first.main_pid() => Ok(s),
                Ok(s) => Err(s),
                Err(_) => Err(first),
            }
        }
        None => show(ctx, unit)
            .await
            .map_err(|_| before.clone())
            .and_then(Err),
    };
    let (verified, after) = match after {
        Ok(s) => (true, s),
        Err(s) => (false, s),
    };
    result.data["after"] = after.to_json();
    result.data["evidence"] = json!(match (verified, restart) {
        (true, true) => restarted(&before, &after).unwrap_or_default(),
        (true, false) if after.main_pid() == 0 => {
            "active (it has no main pid to compare; a reload proves no more than that)".to_string()
        }
        (true, false) => format!("active, main pid {} unchanged", after.main_pid()),
        (false, _) => format!(
            "not verified: ActiveState={} MainPID={} (was {}), Result={}",
            after.get("ActiveState"),
            after.main_pid(),
            before.main_pid(),
            after.get("Result")
        ),
    });
    result.verified = Some(verified);
    if !verified {
        result.outcome = Outcome::Error;
        result.error = Some(format!(
            "{verb} of {unit} ran but the unit did not come back as expected"
        ));
    }
    result
}

/// Whether `after` shows the unit restarted since `before` (asked once
/// `systemctl restart` has exited 0), and how: a unit with a main process
/// has a new one; a unit with none entered its active state anew; a
/// oneshot that does not stay active is forgotten by systemd once it ends,
/// so its evidence is the restart's own job, which for a oneshot completes
/// only when its command has exited 0 (and it is not `failed` since). An
/// unchanged pid of 0 proves nothing and is no restart.
fn restarted(before: &UnitState, after: &UnitState) -> Option<String> {
    let (was, now) = (before.main_pid(), after.main_pid());
    if now != 0 {
        return (after.active() && now != was)
            .then(|| format!("active with a new main pid ({was} -> {now})"));
    }
    let entered = |s: &UnitState| s.monotonic("ActiveEnterTimestampMonotonic");
    if after.active() && entered(after) > entered(before) {
        return Some(format!(
            "active again since {} (it has no main pid: it entered its active state anew)",
            after.get("ActiveEnterTimestamp")
        ));
    }
    (after.get("Type") == "oneshot"
        && matches!(after.get("ActiveState"), "inactive")
        && after.get("Result") == "success")
        .then(|| {
            "ran again and exited 0 (a oneshot that does not stay active: its restart job completes only when its command exits 0)".to_string()
        })
}

/// What a `service_status` result said, in a person's words.
pub(super) fn said(data: &Value) -> String {
    let s = |k: &str| data[k].as_str().unwrap_or("?").to_string();
    format!(
        "{} {}/{} (load {}), main pid {}, {} restart(s), result {}",
        s("unit"),
        s("active_state"),
        s("sub_state"),
        s("load_state"),
        data["main_pid"],
        data["n_restarts"],
        s("result")
    )
}

/// `service_status`: what systemd says of a unit.
pub(crate) struct ServiceStatus;

impl Tool for ServiceStatus {
    const NAME: &'static str = "service_status";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str = "State of an allowed systemd unit: load/active/sub state, main pid, since when, last result, restarts.";
    type Args = UnitArgs;
    type Resolved = String;

    fn allowed(host: &Host) -> Vec<(&'static str, Allowed)> {
        vec![("unit", Allowed::OneOf(host.units.iter().cloned().collect()))]
    }

    fn resolve(a: UnitArgs, host: &Host, _: PathMode) -> Result<String, ArgError> {
        allowed_unit(&a.unit, host, false)
    }

    fn args_json(unit: &String) -> Value {
        json!({ "unit": unit })
    }

    fn argv(unit: &String, host: &Host) -> Vec<Argv> {
        vec![show_argv(host, unit)]
    }

    async fn run(ctx: &Ctx<'_>, unit: &String) -> ToolResult {
        status(ctx, unit).await
    }

    fn said(data: &Value) -> Option<String> {
        Some(said(data))
    }
}

/// `restart_service` and `reload_service`: one change of an allowed unit,
/// `systemctl VERB`, then its own verification (see `change`).
pub(crate) struct UnitChange<const RELOAD: bool>;

/// `restart_service`
pub(crate) type RestartService = UnitChange<false>;
/// `reload_service`
pub(crate) type ReloadService = UnitChange<true>;

impl<const RELOAD: bool> UnitChange<RELOAD> {
    const VERB: &'static str = if RELOAD { "reload" } else { "restart" };
}

impl<const RELOAD: bool> Tool for UnitChange<RELOAD> {
    const NAME: &'static str = if RELOAD {
        "reload_service"
    } else {
        "restart_service"
    };
    const TIER: Tier = Tier::Change;
    const DESCRIPTION: &'static str = if RELOAD {
        "Reload an allowed systemd unit, then verify it is still active with the same main pid."
    } else {
        "Restart an allowed systemd unit, then verify it is active again with a new main pid."
    };
    type Args = UnitChangeArgs;
    type Resolved = Change<String>;

    fn resolve(a: UnitChangeArgs, host: &Host, _: PathMode) -> Result<Change<String>, ArgError> {
        Ok(Change::new(allowed_unit(&a.unit, host, false)?, &a.reason))
    }

    fn args_json(c: &Change<String>) -> Value {
        json!({ "unit": c.target })
    }

    fn reason(c: &Change<String>) -> Option<&str> {
        Some(&c.reason)
    }

    fn argv(c: &Change<String>, host: &Host) -> Vec<Argv> {
        vec![change_argv(host, Self::VERB, &c.target)]
    }

    async fn run(ctx: &Ctx<'_>, c: &Change<String>) -> ToolResult {
        change(ctx, &c.target, Self::VERB).await
    }

    fn targets(host: &Host) -> Option<(&'static str, Vec<String>)> {
        Some(("unit", host.units.iter().cloned().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_systemctl_show() {
        // Recorded from `systemctl show nginx.service` in a Debian 12 systemd host.
        let s = UnitState::parse(
            "Id=nginx.service\nLoadState=loaded\nActiveState=active\nSubState=running\nMainPID=312\nResult=success\nNRestarts=0\n",
        );
        assert!(s.active() && s.found());
        assert_eq!(s.main_pid(), 312);
        assert_eq!(s.to_json()["sub_state"], "running");
        let missing = UnitState::parse(
            "Id=no-such.service\nLoadState=not-found\nActiveState=inactive\nMainPID=0\n",
        );
        assert!(!missing.found());
    }

    /// A restart is verified by what changed, never by an unchanged pid of
    /// 0 (in the form `systemctl show` prints; the root tier restarts real
    /// oneshots under systemd): a service's new main
    /// pid; a oneshot's new activation; a oneshot that does not stay
    /// active, run again to success (its restart job exited 0).
    #[test]
    fn a_restart_is_verified_only_by_what_changed() {
        let state = |text: &str| UnitState::parse(text);
        let simple = "Id=demo.service\nType=simple\nLoadState=loaded\nActiveState=active\nSubState=running\nMainPID=312\nActiveEnterTimestamp=Fri 2026-12-04 01:00:00 UTC\nActiveEnterTimestampMonotonic=5000000\nInactiveExitTimestampMonotonic=4990000\nResult=success\nExecMainStatus=0\n";
        let remain = "Id=once.service\nType=oneshot\nLoadState=loaded\nActiveState=active\nSubState=exited\nMainPID=0\nActiveEnterTimestamp=Fri 2026-12-04 01:00:00 UTC\nActiveEnterTimestampMonotonic=5000000\nInactiveExitTimestampMonotonic=4990000\nResult=success\nExecMainStatus=0\n";
        let gone = "Id=flush.service\nType=oneshot\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nMainPID=0\nActiveEnterTimestamp=\nActiveEnterTimestampMonotonic=0\nInactiveExitTimestampMonotonic=4990000\nResult=success\nExecMainStatus=0\n";
        let cases: [(&str, &str, String, bool); 7] = [
            (
                "a service's new pid",
                simple,
                simple.replace("MainPID=312", "MainPID=400"),
                true,
            ),
            ("a service's same pid", simple, simple.to_string(), false),
            (
                "a oneshot 0 -> 0, not entered anew",
                remain,
                remain.to_string(),
                false,
            ),
            (
                "a oneshot entered anew",
                remain,
                remain.replace("=5000000", "=9000000"),
                true,
            ),
            (
                "a oneshot that failed",
                remain,
                remain
                    .replace("ActiveState=active", "ActiveState=failed")
                    .replace("=5000000", "=9000000"),
                false,
            ),
            (
                "a oneshot run again to success",
                gone,
                gone.replace("=4990000", "=8990000"),
                true,
            ),
            (
                "a oneshot run again, exit 1",
                gone,
                gone.replace("=4990000", "=8990000")
                    .replace("ExecMainStatus=0", "ExecMainStatus=1")
                    .replace("Result=success", "Result=exit-code"),
                false,
            ),
        ];
        for (what, before, after, ok) in cases {
            let said = restarted(&state(before), &state(&after));
            assert_eq!(said.is_some(), ok, "{what}: {said:?}");
        }
        assert!(
            restarted(
                &state(remain),
                &state(&remain.replace("=5000000", "=9000000"))
            )
            .unwrap()
            .contains("entered its active state anew")
        );
    }
}
