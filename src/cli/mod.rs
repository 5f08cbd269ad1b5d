//! The command line (DESIGN.md §7): argument definitions, one module per subcommand, and the
//! mapping from outcomes to exit codes. This is the only layer that names host paths such as
//! `/sys` or `/proc`, and only as flag defaults.

mod allocate;
mod demo;
mod health;
mod node;
pub(crate) mod oneshot;
mod plan;
mod pod_resources;
mod reset;
mod run;
mod status;
mod topology;

use std::error::Error;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cpuset::CpuSet;
use crate::logging::error_chain;

pub use run::controller;

/// Exit status of the one-shot commands for a usage or configuration error.
pub const EXIT_USAGE: u8 = 2;
/// Exit status for a runtime failure (for `allocate`: the request cannot be met).
pub const EXIT_FAILURE: u8 = 1;

#[derive(Debug, Parser)]
#[command(
    name = "cpusetd",
    version,
    about = "Exclusive, topology-aligned CPUs for latency-critical Kubernetes containers, \
             written straight into cgroupfs."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the CPU topology: sockets, NUMA nodes, L3 caches, cores, threads.
    Topology(topology::TopologyArgs),
    /// What-if: which CPUs the static policy would give a container requesting N CPUs.
    Allocate(allocate::AllocateArgs),
    /// See it work: the real agent on a fake node, with a scripted kubelet (no setup needed).
    Demo(demo::DemoArgs),
    /// Run the agent: watch the kubepods cgroups and keep every container on its CPUs.
    Run(run::RunArgs),
    /// Every container, the CPUs it should have and the CPUs it has (while the agent runs).
    Status(status::StatusArgs),
    /// Scan the cgroup tree and show (or --apply) the writes one agent pass would make.
    Plan(plan::PlanArgs),
    /// Undo: every cgroup back to all CPUs, lifted quotas restored, checkpoint removed.
    Reset(reset::ResetArgs),
    /// Exit 0 when an agent runs on the state directory and reconciled lately (a liveness probe).
    Health(health::HealthArgs),
    /// Ask a PodResources socket (the agent's, or kubelet's): list, get NAMESPACE POD,
    /// allocatable; the answer as JSON.
    PodResources(pod_resources::PodResourcesArgs),
}

/// A failed command: the message to print and the exit status.
#[derive(Debug)]
pub struct CommandError {
    pub status: u8,
    pub message: String,
    /// Print the message alone, without the `cpusetd:` prefix (kubelet's error texts).
    pub bare: bool,
}

impl CommandError {
    /// A usage or configuration error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CommandError {
            status: EXIT_USAGE,
            message: message.into(),
            bare: false,
        }
    }

    /// A runtime failure (exit 1), with the whole error chain in the message.
    pub fn failure(err: &dyn Error) -> Self {
        CommandError {
            status: EXIT_FAILURE,
            message: error_chain(err),
            bare: false,
        }
    }
}

/// clap value parser for CPU list flags (`0-3,8`).
pub fn cpuset_arg(text: &str) -> Result<CpuSet, String> {
    CpuSet::parse(text).map_err(|e| e.to_string())
}

fn init_logging() {
    let env = env_logger::Env::default().default_filter_or("info");
    // env_logger's own layout, with the message made printable: names read from runtime
    // configs (containers, pods, annotations) and cgroup directory names go into log lines,
    // and a newline or an escape sequence in one must not forge a line or drive a terminal.
    let _ = env_logger::Builder::from_env(env)
        .format(|buf, record| {
            use std::io::Write;
            writeln!(
                buf,
                "[{} {:<5} {}] {}",
                buf.timestamp_millis(),
                record.level(),
                record.target(),
                crate::logging::printable(&record.args().to_string())
            )
        })
        .try_init();
}

/// The exit status for a command line clap refuses: `run` exits 78 like for any other
/// configuration error (a unit restarted on exit 2 would be restarted for ever), the one-shot
/// commands 2. Help and version requests exit 0.
fn parse_error_status(error: &clap::Error, args: &[std::ffi::OsString]) -> u8 {
    if !error.use_stderr() {
        return 0;
    }
    // The subcommand is the first argument: `cpusetd` itself takes no flags but help/version.
    if args.get(1).is_some_and(|a| a == "run") {
        run::EXIT_CONFIG
    } else {
        EXIT_USAGE
    }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    init_logging();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(parse_error_status(&error, &args));
        }
    };
    let result = match cli.command {
        Command::Topology(args) => topology::run(&args),
        Command::Allocate(args) => allocate::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Reset(args) => reset::run(&args),
        Command::Health(args) => health::run(&args),
        Command::PodResources(args) => pod_resources::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if err.bare {
                eprintln!("{}", err.message);
            } else {
                eprintln!("cpusetd: {}", err.message);
            }
            ExitCode::from(err.status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(args: &[&str]) -> u8 {
        let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        let error = Cli::try_parse_from(&args).unwrap_err();
        parse_error_status(&error, &args)
    }

    #[test]
    fn refused_command_lines_of_run_are_configuration_errors() {
        assert_eq!(
            status_of(&["cpusetd", "run", "--cpu-manager-reconcile-period", "10x"]),
            78
        );
        assert_eq!(status_of(&["cpusetd", "run", "--no-such-flag"]), 78);
        assert_eq!(
            status_of(&["cpusetd", "run", "--placement", "tightest"]),
            78
        );
        assert_eq!(
            status_of(&["cpusetd", "plan", "--placement", "tightest"]),
            2
        );
        assert_eq!(status_of(&["cpusetd", "plan", "--no-such-flag"]), 2);
        assert_eq!(status_of(&["cpusetd", "no-such-command"]), 2);
        assert_eq!(status_of(&["cpusetd", "run", "--help"]), 0);
        assert_eq!(status_of(&["cpusetd", "--version"]), 0);
    }
}
