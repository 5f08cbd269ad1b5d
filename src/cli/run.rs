//! `cpusetd run`: the agent. Configuration errors exit 78 (so systemd's
//! `RestartPreventExitStatus=78` stops restarting), runtime failures 1.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::node::{PolicyArgs, TreeArgs};
use super::CommandError;
use crate::agent::{self, AgentConfig, ControllerParts};
use crate::allocator::PolicyOptions;
use crate::logging::error_chain;
use crate::state::Assignments;

/// Exit status of `run` for a configuration error.
pub const EXIT_CONFIG: u8 = 78;

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cpusetd";

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    tree: TreeArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Where the checkpoint (state.json) and the lock live.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// How often a full read-only scan repairs drift and catches anything missed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    cpu_manager_reconcile_period: Duration,
    /// Write Prometheus metrics here after each pass (node_exporter textfile collector).
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
}

/// A Go-style duration (`10s`, `500ms`, `1m30s`, `2h`), between 10ms and 24h.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration such as 10s, 500ms or 1m30s"))?;
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
                ))
            }
        };
        total += Duration::from_secs_f64(value * seconds);
        rest = tail;
    }
    if total < Duration::from_millis(10) || total > Duration::from_secs(86_400) {
        return Err(format!("{text:?} is outside 10ms..24h"));
    }
    Ok(total)
}

fn config_error(e: CommandError) -> CommandError {
    CommandError {
        status: EXIT_CONFIG,
        ..e
    }
}

pub fn run(args: &RunArgs) -> Result<(), CommandError> {
    let node = args.tree.open().map_err(config_error)?;
    let policy = args.policy.policy(&node.topology).map_err(config_error)?;
    let options = PolicyOptions::parse(&args.policy.cpu_manager_policy_options).map_err(|e| {
        config_error(CommandError::usage(format!(
            "--cpu-manager-policy-options: {e}"
        )))
    })?;
    let scanner = node.scanner();
    let config = AgentConfig {
        parts: ControllerParts {
            hierarchy: node.hierarchy,
            scanner,
            naming: node.naming,
            runtime: node.runtime,
            topology: node.topology,
            policy,
            align_memory: args.policy.align_memory,
            keep_cfs_quota: args.policy.keep_cfs_quota,
            assignments: Assignments::new(),
            quota_lifted: Default::default(),
        },
        layout: node.layout,
        options,
        state_dir: args.state_dir.clone(),
        reconcile_period: args.cpu_manager_reconcile_period,
        metrics_file: args.metrics_file.clone(),
    };
    agent::run(config).map_err(|e| CommandError {
        status: super::EXIT_FAILURE,
        message: error_chain(&e),
        bare: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_like_kubelets() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "10", "10x", "0s", "-1s", "25h", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
