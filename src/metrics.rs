//! Prometheus metrics: the shape of runwarden's activity.
//!
//! One struct of collectors, registered into the registry it is given (tests
//! use a fresh one). The metric names are part of the interface: alert rules
//! and dashboards depend on them. Label values come only from config names
//! (runbooks, hosts, tools) and fixed enums (verdicts, outcomes, reasons),
//! never from alert payloads or tool output, so the series count is bounded
//! by the config.
//!
//! One file: every collector is defined and registered in one place, in the
//! order the metrics page lists them, so the interface alert rules depend
//! on is read at once.
#![allow(
    clippy::expect_used,
    reason = "metric names, help texts and labels are constants: a bad one is a bug every test that starts the daemon catches, not a runtime condition"
)]

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// runwarden's Prometheus metrics, one field per family; the help text of
/// each is in [`Metrics::new`]. Label values come from the config and the
/// registry, never from what a run read.
pub(crate) struct Metrics {
    registry: Registry,
    /// `runwarden_runs_started_total`.
    pub(crate) runs_started: IntCounterVec,
    /// `runwarden_runs_finished_total`.
    pub(crate) runs_finished: IntCounterVec,
    /// `runwarden_run_duration_seconds`.
    pub(crate) run_duration: HistogramVec,
    /// `runwarden_runs_in_flight`.
    pub(crate) runs_in_flight: IntGauge,
    /// `runwarden_tool_calls_total`.
    pub(crate) tool_calls: IntCounterVec,
    /// `runwarden_gate_denials_total`.
    pub(crate) gate_denials: IntCounterVec,
    /// `runwarden_budget_exhausted_total`.
    pub(crate) budget_exhausted: IntCounterVec,
    /// `runwarden_kill_switch_engaged`.
    pub(crate) kill_switch_engaged: IntGaugeVec,
    /// `runwarden_runbook_demoted`.
    pub(crate) runbook_demoted: IntGaugeVec,
    /// `runwarden_rollouts_halted`.
    pub(crate) rollouts_halted: IntGaugeVec,
    /// `runwarden_rollouts_total`.
    pub(crate) rollouts: IntCounterVec,
    /// `runwarden_alerts_received_total`.
    pub(crate) alerts_received: IntCounterVec,
    /// `runwarden_alert_triggers_total`.
    pub(crate) alert_triggers: IntCounterVec,
    /// `runwarden_triggers_capped_total`.
    pub(crate) triggers_capped: IntCounterVec,
    /// `runwarden_audit_write_failures_total`.
    pub(crate) audit_write_failures: IntCounter,
    /// `runwarden_audit_syncs_total`.
    pub(crate) audit_syncs: IntCounter,
    /// Runs a panic ended (a bug in runwarden), by runbook.
    pub(crate) internal_errors: IntCounterVec,
    /// `runwarden_alert_clear_seconds`: from a run's last call to its alert's clear.
    pub(crate) alert_clear: HistogramVec,
    /// `runwarden_fixes_recurred_total`: cleared alerts back within `recurrence`.
    pub(crate) fixes_recurred: IntCounterVec,
    /// Audit heads sent to the journal as runs end, by result (`shipped`, `failed`).
    pub(crate) audit_heads: IntCounterVec,
    /// `runwarden_config_reloads_total`.
    pub(crate) config_reloads: IntCounterVec,
    /// `runwarden_config_last_reload_successful`.
    pub(crate) config_last_reload_successful: IntGauge,
    /// `runwarden_schedule_next_run_timestamp_seconds`.
    pub(crate) schedule_next: GaugeVec,
    /// `runwarden_schedule_last_run_timestamp_seconds`.
    pub(crate) schedule_last: GaugeVec,
    /// When a run of each runbook last ended with each verdict: the
    /// dashboard's "recent runs" (one series per runbook and verdict).
    pub(crate) run_last_finished: GaugeVec,
    /// Since when each kill switch is engaged (its file's time), 0 while released.
    pub(crate) kill_switch_since: GaugeVec,
    /// When each timed kill switch releases itself, 0 while released or untimed.
    pub(crate) kill_switch_until: GaugeVec,
    /// `runwarden_fleet_budget_used`: tier-2 calls in each fleet budget's window now.
    pub(crate) fleet_budget_used: GaugeVec,
    /// `runwarden_fleet_budget_limit`: what each fleet budget allows per window.
    pub(crate) fleet_budget_limit: GaugeVec,
    /// `runwarden_fleet_queued_runs{store="postgres"}`: admitted runs
    /// waiting in the fleet's queue for a replica with a free run permit.
    pub(crate) fleet_queued: GaugeVec,
    /// `runwarden_store_up{store="postgres"}`: whether the shared state
    /// answered this daemon's last round trip; absent without `state.postgres`.
    pub(crate) store_up: GaugeVec,
    /// How long the oldest pending approval request has waited, 0 when none.
    pub(crate) approval_oldest_pending: prometheus::Gauge,
    /// `runwarden_approvals_total`.
    pub(crate) approvals: IntCounterVec,
    /// `runwarden_approvals_pending`.
    pub(crate) approvals_pending: IntGauge,
    /// `runwarden_approval_wait_seconds`.
    pub(crate) approval_wait: prometheus::Histogram,
    /// `runwarden_model_requests_total`.
    pub(crate) model_requests: IntCounterVec,
    /// `runwarden_model_request_duration_seconds`.
    pub(crate) model_request_duration: prometheus::Histogram,
    /// `runwarden_model_tokens_total`.
    pub(crate) model_tokens: IntCounterVec,
    /// `runwarden_model_claims_total{runbook,supported}`: the checkable
    /// claims of model-planned runs' final answers, by whether the run's
    /// record supports them.
    pub(crate) model_claims: IntCounterVec,
    /// `runwarden_model_turn_tokens{model}`: tokens the model has written in
    /// the turn it is writing now (0 between turns).
    pub(crate) model_turn_tokens: GaugeVec,
    /// `runwarden_mcp_sessions_open`: agents' MCP sessions of `/mcp` now.
    pub(crate) mcp_sessions: IntGauge,
    /// `runwarden_mcp_sessions_refused_total{reason}`: `/mcp` requests
    /// refused before MCP (`sessions`: at `mcp_max_sessions`; `host`: a
    /// `Host` not the daemon's) and sessions ended without a call
    /// (`handshake_timeout`).
    pub(crate) mcp_refused: IntCounterVec,
    /// Requests to `/api/v1/chat/slack` refused before they were read.
    pub(crate) chat_refused: IntCounterVec,
    /// `runwarden_host_transport_errors_total`.
    pub(crate) transport_errors: IntCounterVec,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("metric definition");
    r.register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> prometheus::Histogram {
    let h = prometheus::Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("metric definition");
    r.register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

impl Metrics {
    /// Every family, registered in `registry`. Long as a table is long: one
    /// definition per family, its name, help and labels beside each other,
    /// in the order docs/observability.md lists them.
    pub(crate) fn new(registry: Registry) -> Metrics {
        let r = &registry;
        let run_duration = HistogramVec::new(
            HistogramOpts::new(
                "runwarden_run_duration_seconds",
                "Wall time of finished runs.",
            )
            .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0]),
            &["runbook"],
        )
        .expect("metric definition");
        r.register(Box::new(run_duration.clone()))
            .expect("metric registered once");
        let alert_clear = HistogramVec::new(
            HistogramOpts::new(
                "runwarden_alert_clear_seconds",
                "Seconds from a run's last call to the first of the evaluations that found its alert's series gone (done_when.alert_clears; runs that cleared only).",
            )
            .buckets(vec![1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]),
            &["runbook"],
        )
        .expect("metric definition");
        r.register(Box::new(alert_clear.clone()))
            .expect("metric registered once");
        let runs_in_flight =
            IntGauge::new("runwarden_runs_in_flight", "Runs started and not finished.")
                .expect("metric");
        r.register(Box::new(runs_in_flight.clone()))
            .expect("metric registered once");
        let kill_switch_engaged = IntGaugeVec::new(
            Opts::new(
                "runwarden_kill_switch_engaged",
                "1 while a kill switch is engaged (scope: global or a runbook; with shared state also fleet and fleet:RUNBOOK, the fleet's own switch, on every replica).",
            ),
            &["scope"],
        )
        .expect("metric");
        r.register(Box::new(kill_switch_engaged.clone()))
            .expect("metric registered once");
        let runbook_demoted = IntGaugeVec::new(
            Opts::new(
                "runwarden_runbook_demoted",
                "1 while a runbook has lost its standing approval (demote_after: its fixes kept failing) and every tier-2 call of it waits for a person; `runwarden promote` restores it. Read every 5 s.",
            ),
            &["runbook"],
        )
        .expect("metric");
        r.register(Box::new(runbook_demoted.clone()))
            .expect("metric registered once");
        let rollouts_halted = IntGaugeVec::new(
            Opts::new(
                "runwarden_rollouts_halted",
                "Rollouts of a runbook that are halted (a failure past max_failures, a guard, the kill switch) and start no host until a person resumes or aborts them (`runwarden rollout`).",
            ),
            &["runbook"],
        )
        .expect("metric");
        r.register(Box::new(rollouts_halted.clone()))
            .expect("metric registered once");
        let audit_write_failures = IntCounter::new(
            "runwarden_audit_write_failures_total",
            "Audit lines that could not be written.",
        )
        .expect("metric");
        r.register(Box::new(audit_write_failures.clone()))
            .expect("metric registered once");
        let audit_syncs = IntCounter::new(
            "runwarden_audit_syncs_total",
            "Device flushes (fdatasync) that made audit lines durable; concurrent runs share one (group commit).",
        )
        .expect("metric");
        r.register(Box::new(audit_syncs.clone()))
            .expect("metric registered once");
        let config_last_reload_successful = IntGauge::new(
            "runwarden_config_last_reload_successful",
            "1 when the last configuration reload was accepted.",
        )
        .expect("metric");
        r.register(Box::new(config_last_reload_successful.clone()))
            .expect("metric registered once");
        let build_info = IntGaugeVec::new(
            Opts::new("runwarden_build_info", "Always 1; the version as a label."),
            &["version"],
        )
        .expect("metric");
        r.register(Box::new(build_info.clone()))
            .expect("metric registered once");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        config_last_reload_successful.set(1);
        kill_switch_engaged.with_label_values(&["global"]).set(0);

        let approval_oldest_pending = prometheus::Gauge::new(
            "runwarden_approval_oldest_pending_seconds",
            "How long the oldest L2 approval request still pending has waited (0 when none); updated every 5 s.",
        )
        .expect("metric");
        r.register(Box::new(approval_oldest_pending.clone()))
            .expect("metric registered once");
        let approvals_pending = IntGauge::new(
            "runwarden_approvals_pending",
            "Approval requests waiting for a person.",
        )
        .expect("metric");
        r.register(Box::new(approvals_pending.clone()))
            .expect("metric registered once");
        let approval_wait = histogram(
            r,
            "runwarden_approval_wait_seconds",
            "How long approval requests waited for a decision.",
            vec![1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0],
        );
        let model_request_duration = histogram(
            r,
            "runwarden_model_request_duration_seconds",
            "Duration of each request to the model endpoint (each retry counts).",
            vec![0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0],
        );
        Metrics {
            transport_errors: counter(
                r,
                "runwarden_host_transport_errors_total",
                "Calls to a remote host whose connection failed (host key, authentication, unreachable, timeout, malformed reply), retried or not.",
                &["host"],
            ),
            model_requests: counter(
                r,
                "runwarden_model_requests_total",
                "Requests to the model endpoint by outcome (ok, rate_limited, server_error, client_error, timeout, unreachable, invalid_reply).",
                &["model", "outcome"],
            ),
            model_request_duration,
            model_tokens: counter(
                r,
                "runwarden_model_tokens_total",
                "Tokens the model endpoint reported using, by kind (prompt, completion).",
                &["model", "kind"],
            ),
            mcp_sessions: {
                let g = IntGauge::new(
                    "runwarden_mcp_sessions_open",
                    "MCP sessions of agents open on the daemon's /mcp now (each holds one run).",
                )
                .expect("metric definition");
                r.register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
            mcp_refused: counter(
                r,
                "runwarden_mcp_sessions_refused_total",
                "MCP sessions of /mcp refused or ended early, by reason: sessions (mcp_max_sessions open already: 429), host (a Host header not the daemon's: 403), scope (a principal that may not start the runbook, or that holds approve: 403), handshake_timeout (no tool call within mcp_handshake_timeout of the handshake).",
                &["reason"],
            ),
            chat_refused: counter(
                r,
                "runwarden_chat_requests_refused_total",
                "Requests to /api/v1/chat/slack refused (401) before anything in them was read, by reason: unsigned (no timestamp or signature), malformed, stale (a timestamp more than 5 minutes from this clock: a replay), mismatch (no signing secret made the signature).",
                &["reason"],
            ),
            model_claims: counter(
                r,
                "runwarden_model_claims_total",
                "Checkable claims (figures, names, changes) of model-planned runs' final answers, by whether a tool result of the run supports them (supported=true|false).",
                &["runbook", "supported"],
            ),
            model_turn_tokens: gauge_vec(
                r,
                "runwarden_model_turn_tokens",
                "Tokens the model has streamed so far in the turn it is writing now, by model; 0 between turns.",
                &["model"],
            ),
            approvals: counter(
                r,
                "runwarden_approvals_total",
                "Approval requests by decision (approved, denied, expired, cancelled).",
                &["runbook", "tool", "decision"],
            ),
            approvals_pending,
            approval_oldest_pending,
            approval_wait,
            runs_started: counter(
                r,
                "runwarden_runs_started_total",
                "Runs started, by runbook and trigger.",
                &["runbook", "trigger"],
            ),
            runs_finished: counter(
                r,
                "runwarden_runs_finished_total",
                "Runs finished, by runbook and verdict.",
                &["runbook", "verdict"],
            ),
            run_duration,
            runs_in_flight,
            tool_calls: counter(
                r,
                "runwarden_tool_calls_total",
                "Tool calls by outcome (ok, error, timeout, denied, proposed, dry_run) and by who planned them (steps, model, steps+model, mcp).",
                &["runbook", "host", "tool", "tier", "outcome", "planner"],
            ),
            gate_denials: counter(
                r,
                "runwarden_gate_denials_total",
                "Calls the gate refused, by reason.",
                &["runbook", "reason"],
            ),
            budget_exhausted: counter(
                r,
                "runwarden_budget_exhausted_total",
                "Runs that ran out of a budget.",
                &["runbook"],
            ),
            kill_switch_engaged,
            runbook_demoted,
            rollouts_halted,
            rollouts: counter(
                r,
                "runwarden_rollouts_total",
                "Rollouts by what happened to them: started, halted, resumed, aborted, finished, taken_over (by this replica, from one that stopped renewing it).",
                &["runbook", "event"],
            ),
            alerts_received: counter(
                r,
                "runwarden_alerts_received_total",
                "Alerts received in webhook notifications, by status.",
                &["status"],
            ),
            alert_triggers: counter(
                r,
                "runwarden_alert_triggers_total",
                "What became of each alert: started, deduplicated, cooldown, capped, out_of_scope, kill_switch, no_match, invalid.",
                &["runbook", "result"],
            ),
            triggers_capped: counter(
                r,
                "runwarden_triggers_capped_total",
                "Triggers of any kind (alert, schedule, API) refused by a runbook's max_runs on a host: a fix that keeps being needed.",
                &["runbook", "host"],
            ),
            audit_write_failures,
            audit_syncs,
            internal_errors: counter(
                r,
                "runwarden_internal_errors_total",
                "Runs a panic in runwarden ended (verdict failed, reason internal_error): a bug to report. The run's verdict line has the message and place.",
                &["runbook"],
            ),
            alert_clear,
            fixes_recurred: counter(
                r,
                "runwarden_fixes_recurred_total",
                "Alerts a run saw clear that fired again on the same host within the runbook's done_when.alert_clears.recurrence: fixes that did not hold (each counts toward demote_after).",
                &["runbook"],
            ),
            audit_heads: counter(
                r,
                "runwarden_audit_heads_total",
                "Audit heads (hash and line count) sent to the system journal as runs end, by result: shipped, failed.",
                &["result"],
            ),
            config_reloads: counter(
                r,
                "runwarden_config_reloads_total",
                "Configuration reloads, by result.",
                &["result"],
            ),
            config_last_reload_successful,
            schedule_next: gauge_vec(
                r,
                "runwarden_schedule_next_run_timestamp_seconds",
                "When a schedule fires next (Unix time).",
                &["runbook"],
            ),
            run_last_finished: gauge_vec(
                r,
                "runwarden_run_last_finished_timestamp_seconds",
                "When a run of the runbook last ended with this verdict (Unix time).",
                &["runbook", "verdict"],
            ),
            fleet_budget_used: gauge_vec(
                r,
                "runwarden_fleet_budget_used",
                "Tier-2 calls within each fleet budget's window now (scope: all, or a runbook), across every run on this machine.",
                &["scope"],
            ),
            fleet_budget_limit: gauge_vec(
                r,
                "runwarden_fleet_budget_limit",
                "Tier-2 calls each fleet budget allows per window (scope: all, or a runbook).",
                &["scope"],
            ),
            fleet_queued: gauge_vec(
                r,
                "runwarden_fleet_queued_runs",
                "Admitted runs waiting in the fleet's queue for a replica with a free run permit (the same count on every replica). Absent without state.postgres.",
                &["store"],
            ),
            // Set once: what this machine's kernel enforces does not change.
            // `runwarden_sandbox_available{kind=LAYER}`.
            store_up: {
                let g = gauge_vec(
                    r,
                    "runwarden_sandbox_available",
                    "1 when tier-1 processes start with the layer of the observer's sandbox named (landlock_fs: no file write; landlock_reads: none of runwarden's secrets, credential stores or devices; landlock_net: no TCP but declared ports; landlock_scope: no signal or abstract socket outside its own domain; seccomp: no ptrace, process_vm_*, io_uring, namespaces or undeclared socket families; observer_identity: an unprivileged user with only CAP_DAC_READ_SEARCH), 0 when this machine cannot enforce it: built-in tier-1 tools then run without it and declared ones refuse unless the host allows it.",
                    &["kind"],
                );
                for (layer, held) in crate::sandbox::layers() {
                    g.with_label_values(&[layer.as_str()])
                        .set(f64::from(u8::from(held.is_ok())));
                }
                gauge_vec(
                    r,
                    "runwarden_store_up",
                    "1 when the shared state answered this daemon's last round trip, 0 when it did not: then no trigger is accepted (503) and no call runs here. Absent without state.postgres.",
                    &["store"],
                )
            },
            kill_switch_until: gauge_vec(
                r,
                "runwarden_kill_switch_until_timestamp_seconds",
                "When a timed kill switch releases itself (Unix time); 0 while released or untimed (scope: as runwarden_kill_switch_engaged).",
                &["scope"],
            ),
            kill_switch_since: gauge_vec(
                r,
                "runwarden_kill_switch_engaged_since_timestamp_seconds",
                "Since when a kill switch is engaged (its file's modification time, Unix time); 0 while released.",
                &["scope"],
            ),
            schedule_last: gauge_vec(
                r,
                "runwarden_schedule_last_run_timestamp_seconds",
                "When a schedule last fired (Unix time).",
                &["runbook"],
            ),
            registry,
        }
    }

    /// Create every series the config can produce that the alert rules take
    /// an `increase()` of, at zero (dashboard-only series are left lazy). A counter that first appears already at 3 has
    /// no increase in Prometheus' eyes, so a burst of three tier-2 calls
    /// between two scrapes would go unseen without this. Bounded by the
    /// config: runbooks x their hosts x their tier-2 tools x outcomes, and so on.
    pub(crate) fn init_series(&self, config: &crate::config::Config) {
        use crate::gate::DenyReason;
        // The refusals that point at a broken runbook or a steered planner
        // (the budget and the kill switch have alerts of their own).
        const DENIALS: [DenyReason; 5] = [
            DenyReason::UnknownTool,
            DenyReason::ToolOutOfScope,
            DenyReason::HostOutOfScope,
            DenyReason::InvalidArguments,
            DenyReason::NotApproved,
        ];
        for rb in config.runbooks.values() {
            let name = rb.name.as_str();
            for v in crate::verdict::Verdict::ALL {
                self.runs_finished
                    .with_label_values(&[name, v.as_str()])
                    .inc_by(0);
            }
            // And those with alerts of their own that only some configs can
            // give: the first refusal must be an increase too.
            let fleet = config.settings.fleet_budget.is_some() || rb.fleet_budget.is_some();
            let shared = config.settings.postgres.is_some();
            let more = [
                fleet.then_some(DenyReason::FleetBudget),
                shared.then_some(DenyReason::LeaseLost),
            ];
            for d in DENIALS.into_iter().chain(more.into_iter().flatten()) {
                self.gate_denials
                    .with_label_values(&[name, d.as_str()])
                    .inc_by(0);
            }
            self.budget_exhausted.with_label_values(&[name]).inc_by(0);
            // Every runbook's: a dashboard's "Rollouts halted" reads 0, not "No data".
            self.rollouts_halted.with_label_values(&[name]).add(0);
            if rb.rollout.is_some() {
                for event in [
                    "started",
                    "halted",
                    "resumed",
                    "aborted",
                    "finished",
                    "taken_over",
                ] {
                    self.rollouts.with_label_values(&[name, event]).inc_by(0);
                }
            }
            // "Last failed run" has a series (0: never, kept as is where a
            // run already failed) before the first failure.
            self.run_last_finished.with_label_values(&[name, "failed"]);
            let planner = match rb.planner {
                crate::config::PlannedBy::Model
                    if rb.agent.as_ref().is_some_and(|a| a.after_steps) =>
                {
                    "steps+model"
                }
                other => other.as_str(),
            };
            for host in &rb.hosts {
                // "Capped (last hour)" reads 0, not "No data", where a cap can bite.
                if rb.max_runs.is_some() {
                    self.triggers_capped
                        .with_label_values(&[name, host])
                        .inc_by(0);
                }
                for tool in &rb.approve {
                    for outcome in ["ok", "error", "timeout"] {
                        self.tool_calls
                            .with_label_values(&[name, host, tool.name(), "2", outcome, planner])
                            .inc_by(0);
                    }
                }
            }
        }
        for outcome in ["no_match", "invalid"] {
            self.alert_triggers
                .with_label_values(&["none", outcome])
                .inc_by(0);
        }
        for status in ["firing", "resolved"] {
            self.alerts_received.with_label_values(&[status]).inc_by(0);
        }
        self.audit_write_failures.inc_by(0);
        for reason in ["sessions", "host", "scope", "handshake_timeout"] {
            self.mcp_refused.with_label_values(&[reason]).inc_by(0);
        }
        for reason in ["unsigned", "malformed", "stale", "mismatch"] {
            self.chat_refused.with_label_values(&[reason]).inc_by(0);
        }
        for runbook in config.runbooks.keys() {
            self.internal_errors.with_label_values(&[runbook]).inc_by(0);
            self.fixes_recurred.with_label_values(&[runbook]).inc_by(0);
            // A histogram's series exist once touched: none cleared yet.
            let _ = self.alert_clear.with_label_values(&[runbook]);
        }
        for result in ["success", "failure"] {
            self.config_reloads.with_label_values(&[result]).inc_by(0);
        }
        // No transport errors yet, to any host (a local one never has any).
        for host in config.hosts.values() {
            self.transport_errors
                .with_label_values(&[&host.name])
                .inc_by(0);
        }
        if config.settings.audit_head.ships() {
            for result in ["shipped", "failed"] {
                self.audit_heads.with_label_values(&[result]).inc_by(0);
            }
        }
        if let Some(m) = &config.settings.model {
            let mut models: Vec<&str> = vec![m.name.as_str()];
            models.extend(
                config
                    .runbooks
                    .values()
                    .filter_map(|rb| rb.agent.as_ref()?.model.as_deref()),
            );
            for model in models {
                for outcome in [
                    "ok",
                    "server_error",
                    "timeout",
                    "unreachable",
                    "invalid_reply",
                ] {
                    self.model_requests
                        .with_label_values(&[model, outcome])
                        .inc_by(0);
                }
            }
        }
    }

    /// A run ended: count it, and remember when for its verdict.
    pub(crate) fn run_finished(&self, runbook: &str, verdict: &str) {
        self.runs_finished
            .with_label_values(&[runbook, verdict])
            .inc();
        self.run_last_finished
            .with_label_values(&[runbook, verdict])
            .set(jiff::Timestamp::now().as_millisecond() as f64 / 1000.0);
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
