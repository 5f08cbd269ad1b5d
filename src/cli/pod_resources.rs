//! `cpusetd pod-resources`: asks a PodResources v1 socket (`cpusetd run`'s, or kubelet's) with
//! the client generated from the same proto the server is, and prints the answer as JSON with
//! the proto's field names: what NFD's topology-updater or the resource-topology-exporter
//! would read there. For operators, and for node-e2e to check what the agent serves.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::node::{parse_duration, DEFAULT_STATE_DIR, POD_RESOURCES_SOCKET};
use super::{CommandError, EXIT_FAILURE};
use crate::podresources::{ask, Answer, Ask, AskError};

#[derive(Debug, Args)]
pub struct PodResourcesArgs {
    #[command(subcommand)]
    call: Call,
    /// The socket asked. Default: `run`'s (pod-resources.sock in --state-dir); kubelet's is
    /// /var/lib/kubelet/pod-resources/kubelet.sock.
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
    /// The agent's state directory, where its socket is by default.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR, global = true)]
    state_dir: PathBuf,
    /// How long to wait for the connection and the answer together.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, global = true)]
    timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum Call {
    /// `List`: every pod, each container with its exclusive cpu_ids (and devices, memory).
    List,
    /// `Get`: one pod; kubelet's error when it does not know it.
    Get {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
    },
    /// `GetAllocatableResources`: the cpus exclusive containers may get (online minus reserved).
    Allocatable,
}

pub fn run(args: &PodResourcesArgs) -> Result<(), CommandError> {
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| args.state_dir.join(POD_RESOURCES_SOCKET));
    let what = match &args.call {
        Call::List => Ask::List,
        Call::Get { namespace, pod } => Ask::Get {
            namespace: namespace.clone(),
            pod: pod.clone(),
        },
        Call::Allocatable => Ask::Allocatable,
    };
    let answer = ask(&socket, what, args.timeout).map_err(|e| failed(&e, &socket))?;
    let json = match &answer {
        Answer::List(list) => serde_json::to_string_pretty(list),
        Answer::Get(one) => serde_json::to_string_pretty(one),
        Answer::Allocatable(allocatable) => serde_json::to_string_pretty(allocatable),
    }
    .map_err(|e| CommandError::failure(&e))?;
    println!("{json}");
    Ok(())
}

/// The error to print: what went wrong and, where it is the socket, what to do.
fn failed(error: &AskError, socket: &std::path::Path) -> CommandError {
    let hint = match error {
        AskError::Connect { .. } if !socket.exists() => format!(
            "; nothing listens there: is `cpusetd run` serving it (its --pod-resources-socket, \
             default {DEFAULT_STATE_DIR}/{POD_RESOURCES_SOCKET})? name it with --socket"
        ),
        AskError::Connect { .. } => {
            "; is it a PodResources socket this user may connect to?".to_string()
        }
        AskError::Timeout { .. } => "; a longer --timeout may help".to_string(),
        AskError::Status { .. } | AskError::Runtime(_) => String::new(),
    };
    CommandError {
        status: EXIT_FAILURE,
        message: format!(
            "pod-resources: {}{hint}",
            crate::logging::error_chain(error)
        ),
        bare: false,
    }
}
