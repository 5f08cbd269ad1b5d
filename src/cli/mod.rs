//! The command line (DESIGN.md §7): argument definitions, one module per subcommand, and the
//! mapping from outcomes to exit codes. This is the only layer that names host paths such as
//! `/sys` or `/proc`, and only as flag defaults.

mod allocate;
mod demo;
mod node;
mod plan;
mod reset;
mod run;
mod status;
mod topology;

use std::error::Error;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cpuset::CpuSet;
use crate::logging::error_chain;

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
    let _ = env_logger::Builder::from_env(env)
        .format_timestamp_millis()
        .try_init();
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topology(args) => topology::run(&args),
        Command::Allocate(args) => allocate::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Reset(args) => reset::run(&args),
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
