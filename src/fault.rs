//! Where a run can be made to panic on cue, to prove that a panic in any
//! stage of a run ends that run with its verdict line and frees its host
//! (see `run::internal`).
//!
//! Each stage a run passes through calls [`point`]. In a release build the
//! call is empty and compiles to nothing: the hook exists only in a build
//! with the `fault-injection` feature (which `estate`, the root tier's
//! feature, turns on, so the test build's binary has it and the shipped one
//! does not). There, `RUNWARDEN_FAULT=<stage>` in the process's environment
//! makes the first run to reach that stage panic there, once per process:
//! the run after it, on the same host, shows the host was freed. Only the
//! environment arms it, never a unit test: the unit tests share a process.
//!
//! A leaf.

/// A stage of a run a panic can be injected at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The planner is asked for the next step.
    Planner,
    /// A tool's output is read into its result.
    ToolResult,
    /// A tier-2 change is verified.
    Verify,
    /// The run's report is put together.
    Report,
    /// The run's verdict line is written.
    Audit,
}

impl Stage {
    /// As `RUNWARDEN_FAULT` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Planner => "planner",
            Stage::ToolResult => "tool_result",
            Stage::Verify => "verify",
            Stage::Report => "report",
            Stage::Audit => "audit",
        }
    }

    /// Every stage, in the order a run reaches them.
    pub const ALL: [Stage; 5] = [
        Stage::Planner,
        Stage::ToolResult,
        Stage::Verify,
        Stage::Report,
        Stage::Audit,
    ];
}

/// A run reached `stage`: in a `fault-injection` build, panic if it is the
/// armed one (once per process).
#[inline(always)]
pub(crate) fn point(stage: Stage) {
    #[cfg(feature = "fault-injection")]
    hook::reached(stage);
    #[cfg(not(feature = "fault-injection"))]
    let _ = stage;
}

#[cfg(feature = "fault-injection")]
mod hook {
    use std::sync::LazyLock;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::Stage;

    /// The armed stage, from the environment.
    static ARMED: LazyLock<Option<Stage>> = LazyLock::new(|| {
        let named = std::env::var("RUNWARDEN_FAULT").ok()?;
        Stage::ALL.into_iter().find(|s| s.as_str() == named)
    });
    /// Whether it fired already (once per process).
    static FIRED: AtomicBool = AtomicBool::new(false);

    pub(super) fn reached(stage: Stage) {
        if *ARMED == Some(stage) && !FIRED.swap(true, Ordering::SeqCst) {
            panic!(
                "a fault injected at stage {} (RUNWARDEN_FAULT)",
                stage.as_str()
            );
        }
    }
}
