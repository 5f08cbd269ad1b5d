//! `cpusetd run`: the agent. Configuration errors exit 78 (so systemd's
//! `RestartPreventExitStatus=78` stops restarting), runtime failures 1.

use clap::{Args, Parser};

use super::node::{AgentArgs, NodeView};
use super::CommandError;
use crate::agent::{self, AgentConfig, Controller, ControllerParts, Hotplug, Notifier, Waited};
use crate::allocator::PolicyOptions;
use crate::checkpoint::LockError;
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
    args.validate().map_err(config_error)?;
    let mut notifier = Notifier::from_env();
    let Some(node) = open_when_kubepods_exists(args, &mut notifier)? else {
        return Ok(());
    };
    let config = agent_config(args, node, notifier)?;
    agent::run(config).map_err(|e| agent_error(args, e))
}

/// The agent's configuration from `run`'s flags on an opened node: what `run` starts, and what
/// [`controller`] builds its controller from.
fn agent_config(
    args: &AgentArgs,
    node: NodeView,
    notifier: Notifier,
) -> Result<AgentConfig, CommandError> {
    let (layout, parts) = controller_parts(args, node)?;
    let options = PolicyOptions::parse(&args.policy.cpu_manager_policy_options).map_err(|e| {
        config_error(CommandError::usage(format!(
            "--cpu-manager-policy-options: {e}"
        )))
    })?;
    let policy_reserved = parts.policy.as_ref().map(|p| p.reserved().clone());
    let hotplug = Hotplug::new(
        args.tree.sysfs_root.clone(),
        args.tree.proc_root.clone(),
        args.policy.configured_reserved(parts.policy.as_ref()),
    );
    let config = AgentConfig {
        parts,
        layout,
        options,
        state_dir: args.state_dir.clone(),
        reconcile_period: args.cpu_manager_reconcile_period,
        metrics_file: args.metrics_file.clone(),
        metrics_bind: args.metrics_bind_address,
        kubelet_state: args.kubelet_state_path(),
        proc_root: args.tree.proc_root.clone(),
        sysfs_root: args.tree.sysfs_root.clone(),
        isolate_host: args.isolate_host.then(|| policy_reserved.clone()).flatten(),
        projection_dir: args.projection_dir.clone(),
        project_all: args.project_all,
        hotplug,
        notifier,
        pod_resources: args.pod_resources(),
    };
    Ok(config)
}

/// The agent's error as the command's: a flag's fault (the state directory, the metrics
/// address, the PodResources socket) is a configuration error naming the flag; anything else
/// is a failure a restart may cure.
fn agent_error(args: &AgentArgs, e: agent::AgentError) -> CommandError {
    match e {
        // A state directory that cannot be made or cannot hold the lock (a file, /dev/null,
        // /proc/self) is the flag's fault: restarting would not help.
        agent::AgentError::Lock(
            ref lock @ (LockError::CreateDir { .. } | LockError::Open { .. }),
        ) => config_error(CommandError::usage(format!(
            "--state-dir {}: {}; pass a directory the agent may create and write, such as {}",
            args.state_dir.display(),
            error_chain(lock),
            super::node::DEFAULT_STATE_DIR
        ))),
        // An address taken, not local, or not allowed (the hardened unit's PrivateNetwork):
        // restarting would not help either.
        agent::AgentError::MetricsBind(ref bind) => config_error(CommandError::usage(format!(
            "--metrics-bind-address {}: {}; pass a free port of an address of this node \
         (such as 127.0.0.1:{}), or leave the flag out (the systemd unit has no network: \
         see README, Prometheus and Grafana)",
            bind.addr,
            error_chain(&bind.source),
            agent::http::DEFAULT_PORT
        ))),
        // A socket path that cannot be bound is the flag's fault too.
        agent::AgentError::PodResources(ref why) => config_error(CommandError::usage(format!(
            "--pod-resources-socket: {}; name another path, or none to not serve kubelet's \
         PodResources API",
            error_chain(why)
        ))),
        e => CommandError {
            status: super::EXIT_FAILURE,
            message: error_chain(&e),
            bare: false,
        },
    }
}

/// The controller's parts from `run`'s flags on an opened node (the checkpoint's assignments
/// are added by the agent), and the node's layout.
fn controller_parts(
    args: &AgentArgs,
    node: NodeView,
) -> Result<(crate::cgroupfs::CgroupLayout, ControllerParts), CommandError> {
    let policy = args.policy.policy(&node.topology).map_err(config_error)?;
    let parts = ControllerParts {
        scanner: node.scanner(),
        hierarchy: node.hierarchy,
        naming: node.naming,
        runtime: node.runtime,
        topology: node.topology,
        policy,
        align_memory: args.policy.align_memory,
        keep_cfs_quota: args.policy.keep_cfs_quota,
        respect_isolcpus: args.policy.respect_isolcpus,
        assignments: Assignments::new(),
        quota_lifted: Default::default(),
    };
    Ok((node.layout, parts))
}

/// `run`'s command line alone.
#[derive(Debug, Parser)]
#[command(name = "run")]
struct RunLine {
    #[command(flatten)]
    run: RunArgs,
}

/// The controller `cpusetd run` builds from `run`'s flags (those after `run`): the same
/// configuration, the checkpoint in `--state-dir` restored, the host effects (interrupts,
/// scheduler load balancing, power, host confinement), hotplug and projections on the flags'
/// roots (a test's fake sysfs and procfs), before its first scan and without the lock, threads
/// or watcher ([`agent::in_process`]): how tests and benchmarks drive the controller in
/// process. The node must exist (no waiting for kubepods), and `--state-dir` must be named:
/// the controller restores from it and records there the host's originals it changes.
pub fn controller(flags: &[String]) -> Result<Controller, CommandError> {
    let line =
        RunLine::try_parse_from(std::iter::once("run").chain(flags.iter().map(|f| f.as_str())))
            .map_err(|e| CommandError::usage(e.to_string()))?;
    let args = &line.run.agent;
    args.validate()?;
    if !flags
        .iter()
        .any(|f| f == "--state-dir" || f.starts_with("--state-dir="))
    {
        return Err(CommandError::usage(
            "the in-process controller restores from --state-dir and records the host's \
             originals there: pass --state-dir with a directory of its own (not the agent's \
             default)"
                .to_string(),
        ));
    }
    let config = agent_config(args, args.tree.open()?, Notifier::default())?;
    Ok(agent::in_process(config))
}

/// Opens the node once its kubepods cgroup exists. At boot the agent starts before kubelet,
/// which makes kubepods: the agent says it is ready (so units ordered after it, kubelet among
/// them, can start), says in STATUS and the log what it waits for, and waits; it never exits
/// because kubelet is late. Every other configuration error (the topology, the policy, the
/// flags) is reported at once, before any waiting. `None`: stopped by a signal while waiting.
fn open_when_kubepods_exists(
    args: &AgentArgs,
    notifier: &mut Notifier,
) -> Result<Option<NodeView>, CommandError> {
    let mut waiting = false;
    loop {
        let error = match args.tree.open() {
            Ok(node) => {
                if waiting {
                    log::info!(
                        "the kubepods cgroup {} appeared: starting",
                        node.layout.kubepods
                    );
                }
                return Ok(Some(node));
            }
            Err(e) => e,
        };
        let Some((expected, watch)) = args.tree.missing_kubepods() else {
            return Err(config_error(error));
        };
        if !waiting {
            // Everything but kubepods must be right before the agent settles down to wait.
            let topology =
                super::node::discover_topology(&args.tree.sysfs_root, &args.tree.proc_root)
                    .map_err(config_error)?;
            args.policy.policy(&topology).map_err(config_error)?;
            log::warn!(
                "the kubepods cgroup ({expected}) does not exist yet: waiting for kubelet to \
                 create it (watching {}); pass --kubepods-path if it lives elsewhere",
                watch.display()
            );
            notifier.send(&[sd_notify::NotifyState::Ready]);
            waiting = true;
        }
        notifier.status(&format!(
            "waiting for the kubepods cgroup ({expected}) that kubelet creates"
        ));
        match agent::wait_for_change(&watch, notifier) {
            Ok(Waited::Changed) => {}
            Ok(Waited::Stopped(signal)) => {
                log::info!("{signal} while waiting for the kubepods cgroup: stopping");
                notifier.send(&[sd_notify::NotifyState::Stopping]);
                return Ok(None);
            }
            Err(e) => {
                return Err(CommandError {
                    status: super::EXIT_FAILURE,
                    message: format!("cannot wait for the kubepods cgroup ({expected}): {e}"),
                    bare: false,
                })
            }
        }
    }
}
