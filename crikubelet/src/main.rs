//! `crikubelet`: kubelet's pod lifecycle against a real runtime, one command at a time, for
//! scripts (`scripts/node-e2e.sh` runs it inside a systemd node). State passes between commands
//! as the JSON `run-pod` prints.

// The crate's 60-line function limit (clippy.toml), tests aside.
#![deny(clippy::too_many_lines)]

use std::fs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crikubelet::{image, CgroupDriver, Cri, NodeCgroups, PodSpec, RunningPod};

const USAGE: &str = "\
usage: crikubelet [OPTIONS] COMMAND
  images                   build the pause and busybox images and import them with ctr
  run-pod SPEC.json        pod cgroup, RunPodSandbox, Create/StartContainer each container;
                           prints the pod's state as JSON
  restart STATE.json NAME  the container again as attempt + 1; prints the new state
  update-container STATE.json NAME REQUEST_MILLI [LIMIT_MILLI]
                           in-place resize of the container's CPU (pod cgroup, then
                           UpdateContainerResources; cgroupfs driver); prints the new state
  delete-pod STATE.json    stop and remove containers and sandbox, remove the pod cgroup
options:
  --socket PATH        the CRI socket (default /run/containerd/containerd.sock)
  --driver DRIVER      cgroupfs or systemd (default cgroupfs)
  --cgroup-root DIR    default /sys/fs/cgroup
  --kubepods REL       the cgroupfs driver's kubepods cgroup (default kubepods)
  --log-root DIR       container logs (default /var/log/pods)
  --ctr PATH           ctr, for `images` (default ctr)
  --busybox PATH       a static busybox, for `images` (default /bin/busybox)
  --work DIR           scratch space, for `images` (default /tmp/crikubelet-images)
SPEC.json: {\"name\",\"namespace\",\"uid\",\"annotations\"?,\"containers\":[{\"name\",
  \"cpu_request_milli\",\"cpu_limit_milli\",\"memory_request\",\"memory_limit\",\"command\"?}]}";

#[derive(Debug)]
struct Options {
    socket: PathBuf,
    driver: CgroupDriver,
    cgroup_root: PathBuf,
    kubepods: String,
    log_root: PathBuf,
    ctr: PathBuf,
    busybox: PathBuf,
    work: PathBuf,
    command: Vec<String>,
}

fn parse(args: Vec<String>) -> Result<Options, String> {
    let mut options = Options {
        socket: "/run/containerd/containerd.sock".into(),
        driver: CgroupDriver::Cgroupfs,
        cgroup_root: "/sys/fs/cgroup".into(),
        kubepods: "kubepods".into(),
        log_root: "/var/log/pods".into(),
        ctr: "ctr".into(),
        busybox: "/bin/busybox".into(),
        work: "/tmp/crikubelet-images".into(),
        command: Vec::new(),
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if !arg.starts_with("--") {
            options.command.push(arg);
            options.command.extend(args.by_ref());
            break;
        }
        if arg == "--help" {
            return Err(String::new());
        }
        let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--socket" => options.socket = value.into(),
            "--driver" => options.driver = value.parse()?,
            "--cgroup-root" => options.cgroup_root = value.into(),
            "--kubepods" => options.kubepods = value,
            "--log-root" => options.log_root = value.into(),
            "--ctr" => options.ctr = value.into(),
            "--busybox" => options.busybox = value.into(),
            "--work" => options.work = value.into(),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(options)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &str) -> Result<T, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
}

fn print_pod(pod: &RunningPod) -> Result<(), String> {
    let text = serde_json::to_string_pretty(pod).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}

/// `images`: builds the test images and imports them into containerd; prints their names.
fn images(options: &Options) -> Result<(), String> {
    fs::create_dir_all(&options.work).map_err(|e| format!("{}: {e}", options.work.display()))?;
    let names = image::build_and_import(
        &options.busybox,
        &options.work,
        &options.ctr,
        &options.socket,
    )
    .map_err(|e| format!("images: {e}"))?;
    for name in names {
        println!("{name}");
    }
    Ok(())
}

/// A number of millicores on the command line.
fn milli(text: &str) -> Result<u64, String> {
    text.parse::<u64>()
        .map_err(|e| format!("{text:?} is not a number of millicores: {e}"))
}

fn execute(options: Options) -> Result<(), String> {
    let node = || {
        NodeCgroups::new(options.driver, &options.cgroup_root, &options.kubepods)
            .map_err(|e| format!("cgroups: {e}"))
    };
    let cri = || {
        Cri::connect(&options.socket, &options.log_root, Duration::from_secs(30))
            .map_err(|e| e.to_string())
    };
    let command: Vec<&str> = options.command.iter().map(String::as_str).collect();
    match command[..] {
        ["images"] => images(&options),
        ["run-pod", spec] => {
            let spec: PodSpec = read_json(spec)?;
            let node = node()?;
            node.create_qos().map_err(|e| format!("QoS cgroups: {e}"))?;
            let pod = cri()?.run_pod(&node, &spec).map_err(|e| e.to_string())?;
            print_pod(&pod)
        }
        ["restart", state, name] => {
            let mut pod: RunningPod = read_json(state)?;
            cri()?
                .restart(&node()?, &mut pod, name)
                .map_err(|e| e.to_string())?;
            print_pod(&pod)
        }
        ["update-container", state, name, request, ref limit @ ..] if limit.len() <= 1 => {
            let mut pod: RunningPod = read_json(state)?;
            let request = milli(request)?;
            let limit = match limit {
                [limit] => milli(limit)?,
                _ => request,
            };
            cri()?
                .resize_cpu(&node()?, &mut pod, name, request, limit)
                .map_err(|e| e.to_string())?;
            print_pod(&pod)
        }
        ["delete-pod", state] => {
            let pod: RunningPod = read_json(state)?;
            cri()?.delete_pod(&node()?, &pod).map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "unknown command {:?}\n{USAGE}",
            options.command.join(" ")
        )),
    }
}

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1).collect()) {
        Ok(options) => options,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("crikubelet: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match execute(options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("crikubelet: {message}");
            ExitCode::FAILURE
        }
    }
}
