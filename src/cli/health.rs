//! `cpusetd health`: whether an agent runs on this state directory and has reconciled lately,
//! from its own state: a cpusetd holds `<state-dir>/lock` (the lock tested, the pid in it a
//! cpusetd), and its last reconcile (`<state-dir>/last-reconcile`, else the checkpoint's). The
//! DaemonSet's liveness probe; needs no port.

use std::time::{Duration, UNIX_EPOCH};

use clap::Args;

use super::node::{parse_duration, AgentArgs};
use super::{CommandError, EXIT_FAILURE};
use crate::checkpoint::{self, lock_holder, LoadOutcome, LockHolder};

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The agent's flags (only --state-dir and --cpu-manager-reconcile-period matter here).
    #[command(flatten)]
    agent: AgentArgs,
    /// Unhealthy when the last reconcile is older than this. Default: ten reconcile periods
    /// plus 30 s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    max_age: Option<Duration>,
}

pub fn run(args: &HealthArgs) -> Result<(), CommandError> {
    let dir = &args.agent.state_dir;
    let max_age = args
        .max_age
        .unwrap_or(args.agent.cpu_manager_reconcile_period * 10 + Duration::from_secs(30));
    let unhealthy = |why: String| CommandError {
        status: EXIT_FAILURE,
        message: format!("unhealthy: {why}"),
        bare: true,
    };
    let pid = match lock_holder(dir) {
        LockHolder::Agent(pid) => pid,
        LockHolder::NotRunning(why) => return Err(unhealthy(why)),
    };
    let who = pid.map_or_else(
        || "the agent (pid not recorded)".to_string(),
        |p| format!("pid {p}"),
    );
    let last = match checkpoint::load(dir) {
        LoadOutcome::Loaded(cp) => cp
            .last_reconcile_unix_ms
            .max(checkpoint::read_last_reconcile(dir)),
        LoadOutcome::Missing => None,
        LoadOutcome::Unusable { path, reason } => {
            return Err(unhealthy(reason.describe(&path)));
        }
    };
    let Some(ms) = last else {
        return Err(unhealthy(format!(
            "{who} has not finished its first pass (no checkpoint in {})",
            dir.display()
        )));
    };
    let age = (UNIX_EPOCH + Duration::from_millis(ms))
        .elapsed()
        .unwrap_or_default();
    if age > max_age {
        return Err(unhealthy(format!(
            "{who} last reconciled {}s ago (more than {}s)",
            age.as_secs(),
            max_age.as_secs()
        )));
    }
    println!("healthy: {who}, last reconcile {}s ago", age.as_secs());
    Ok(())
}
