//! `cpusetd run`: the agent. Configuration errors exit 78 (so systemd's
//! `RestartPreventExitStatus=78` stops restarting), runtime failures 1.

use clap::Args;

use super::node::AgentArgs;
use super::CommandError;
use crate::agent::{self, AgentConfig, ControllerParts};
use crate::allocator::PolicyOptions;
use crate::logging::error_chain;
use crate::state::Assignments;

/// Exit status of `run` for a configuration error.
pub const EXIT_CONFIG: u8 = 78;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    agent: AgentArgs,
}

fn config_error(e: CommandError) -> CommandError {
    CommandError {
        status: EXIT_CONFIG,
        ..e
    }
}

pub fn run(args: &RunArgs) -> Result<(), CommandError> {
    let args = &args.agent;
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
