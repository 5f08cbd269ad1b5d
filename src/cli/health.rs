//! `cpusetd health`: whether an agent runs on this state directory and has reconciled lately,
//! from its own state (the pid in `<state-dir>/lock`, the checkpoint's last reconcile). The
//! DaemonSet's liveness probe; needs no port.

use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use super::node::{parse_duration, AgentArgs};
use super::{CommandError, EXIT_FAILURE};
use crate::checkpoint::{self, recorded_holder, LoadOutcome};

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The agent's flags (only --state-dir and --cpu-manager-reconcile-period matter here).
    #[command(flatten)]
    agent: AgentArgs,
    /// Unhealthy when the last reconcile is older than this. Default: ten reconcile periods
    /// plus 30 s (the agent writes its checkpoint at least every sixth period).
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
    let pid = recorded_holder(dir).ok_or_else(|| {
        unhealthy(format!(
            "no agent holds {}/lock (not started, or stopped)",
            dir.display()
        ))
    })?;
    let pid_value =
        i32::try_from(pid).map_err(|_| unhealthy(format!("bad pid {pid} in the lock")))?;
    // A zombie (killed, not yet reaped by its parent) is gone too.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.trim_start().starts_with('Z')))
        .unwrap_or(false);
    match kill(Pid::from_raw(pid_value), None) {
        Ok(()) | Err(Errno::EPERM) if !zombie => {}
        _ => {
            return Err(unhealthy(format!(
                "the agent recorded in {}/lock (pid {pid}) is gone",
                dir.display()
            )))
        }
    }
    let last = match checkpoint::load(dir) {
        LoadOutcome::Loaded(cp) => cp.last_reconcile_unix_ms,
        LoadOutcome::Missing => None,
        LoadOutcome::Unusable { path, reason } => {
            return Err(unhealthy(reason.describe(&path)));
        }
    };
    let Some(ms) = last else {
        return Err(unhealthy(format!(
            "pid {pid} has not finished its first pass (no checkpoint in {})",
            dir.display()
        )));
    };
    let age = (UNIX_EPOCH + Duration::from_millis(ms))
        .elapsed()
        .unwrap_or_default();
    if age > max_age {
        return Err(unhealthy(format!(
            "pid {pid} last reconciled {}s ago (more than {}s)",
            age.as_secs(),
            max_age.as_secs()
        )));
    }
    println!("healthy: pid {pid}, last reconcile {}s ago", age.as_secs());
    Ok(())
}
