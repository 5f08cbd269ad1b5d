//! `cpusetd demo`: the embedded default a newcomer runs first. It makes a fake node (a cgroup
//! tree on tmpfs when root, else in a temporary directory, and a compiled-in 2-socket,
//! hyper-threaded, 2-NUMA-node, 16-CPU topology), starts the real agent on it as a child
//! process, then plays a scripted kubelet and shows, after each step, what happened and the
//! `status` table. It cleans up and exits 0; `--keep` leaves the agent running until Ctrl-C.

use std::fs;
use std::io::{BufRead, BufReader, IsTerminal, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;

use super::node::TreeArgs;
use super::status::{collect, StatusView};
use super::{CommandError, EXIT_FAILURE};
use crate::cgroupfs::CgroupVersion;
use crate::cpuset::CpuSet;
use crate::kubesim::{new_pod_uid, ContainerSpec, FakeNode, PodSpec, Qos};
use crate::report::CgroupRow;
use crate::topology::{write_fake_sysfs, MapStyle, RegularShape, Topology};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Leave the agent running at the end (until Ctrl-C) so you can poke at the tree.
    #[arg(long)]
    keep: bool,
    /// Use a cgroup v2 tree instead of v1.
    #[arg(long)]
    cgroup_v2: bool,
}

/// How long one step may take before the demo gives up.
const STEP_DEADLINE: Duration = Duration::from_secs(15);

/// The demo's workspace, agent and mount; torn down on drop, whatever happened.
struct Workspace {
    dir: PathBuf,
    mounted: bool,
    agent: Option<Child>,
}

impl Workspace {
    /// The agent's exit status, if it has stopped.
    fn agent_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.agent
            .as_mut()
            .and_then(|a| a.try_wait().ok().flatten())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = agent.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = agent.kill();
            let _ = agent.wait();
        }
        if self.mounted {
            let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory under `tmp` that nobody else can have made or planted anything in: an
/// unpredictable name created atomically with mode 0700 (mkdtemp), never a name someone could
/// have made first (`cpusetd-demo-<pid>` was one, and as root the demo then followed the
/// symlinks in it).
fn private_workspace(tmp: &Path) -> std::io::Result<PathBuf> {
    nix::unistd::mkdtemp(&tmp.join("cpusetd-demo-XXXXXX")).map_err(std::io::Error::from)
}

fn failure(message: impl Into<String>) -> CommandError {
    CommandError {
        status: EXIT_FAILURE,
        message: message.into(),
        bare: false,
    }
}

fn io_failure(what: &str) -> impl Fn(std::io::Error) -> CommandError + '_ {
    move |e| failure(format!("{what}: {e}"))
}

/// The demo's node: 2 sockets × 4 cores × 2 threads, one NUMA node and L3 per socket.
fn demo_topology() -> Topology {
    Topology::regular(RegularShape {
        sockets: 2,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 4,
        threads_per_core: 2,
    })
    .expect("the built-in topology is valid")
}

pub fn run(args: &DemoArgs) -> Result<(), CommandError> {
    // The demo prints its own story; the agent's log goes to a file.
    log::set_max_level(log::LevelFilter::Error);
    let started = Instant::now();
    let mut ws = open_workspace()?;
    let dir = ws.dir.clone();
    let topo = demo_topology();
    let (sysfs, proc) = (dir.join("sys"), dir.join("proc"));
    let node = fake_node(&dir, &topo, args.cgroup_v2)?;
    let state_dir = dir.join("state");
    let log_path = dir.join("agent.log");
    print_intro(&dir, &topo, args.cgroup_v2, ws.mounted);
    let tree_flags: Vec<String> = vec![
        "--cgroup-root".into(),
        node.cgroup_root().display().to_string(),
        "--sysfs-root".into(),
        sysfs.display().to_string(),
        "--proc-root".into(),
        proc.display().to_string(),
        "--runtime-config-path".into(),
        node.runtime_template(),
    ];
    let exe = start_agent(&mut ws, &tree_flags, &state_dir, &log_path)?;
    let mut show = Show {
        tree: TreeArgs {
            cgroup_root: Some(node.cgroup_root().to_path_buf()),
            kubepods_path: None,
            cgroup_driver: None,
            sysfs_root: sysfs.clone(),
            proc_root: proc.clone(),
            runtime_config_path: vec![node.runtime_template()],
        },
        state_dir: state_dir.clone(),
        log_path,
        log_offset: 0,
        step: 0,
    };
    show.wait(&mut ws, "the agent's first pass", |_| true)?;
    let (db, db_cpus) = pods_arrive(&node, &mut show, &mut ws)?;
    if args.keep {
        wait_for_ctrl_c(&exe, &tree_flags, &state_dir, &node, &show.log_path)?;
    }
    db_leaves(&node, &mut show, &mut ws, &db, &db_cpus)?;
    println!(
        "demo finished in {:.1} s; stopping the agent and removing {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    drop(ws);
    Ok(())
}

/// The fake node in `dir`: its sysfs and /proc (`sys`, `proc`), its cgroup tree and runtime
/// configs.
fn fake_node(dir: &Path, topo: &Topology, cgroup_v2: bool) -> Result<FakeNode, CommandError> {
    let (sysfs, proc) = (dir.join("sys"), dir.join("proc"));
    write_fake_sysfs(topo, &sysfs, &proc).map_err(io_failure("cannot write the fake sysfs"))?;
    let version = if cgroup_v2 {
        CgroupVersion::V2
    } else {
        CgroupVersion::V1
    };
    FakeNode::create(
        &dir.join("cgroup"),
        version,
        topo.all_cpus().clone(),
        topo.memory_nodes().clone(),
        &dir.join("runtime"),
    )
    .map_err(io_failure("cannot create the fake cgroup tree"))
}

/// The demo's private directory, on its own tmpfs where it runs as root.
fn open_workspace() -> Result<Workspace, CommandError> {
    let mut ws = Workspace {
        dir: private_workspace(&std::env::temp_dir())
            .map_err(io_failure("cannot create the demo directory"))?,
        mounted: false,
        agent: None,
    };
    if nix::unistd::Uid::effective().is_root() {
        ws.mounted = nix::mount::mount(
            Some("tmpfs"),
            &ws.dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64m,mode=0700"),
        )
        .is_ok();
    }
    Ok(ws)
}

/// What the fake node is.
fn print_intro(dir: &Path, topo: &Topology, cgroup_v2: bool, mounted: bool) {
    println!("cpusetd demo: a fake node in {}", dir.display());
    println!(
        "  {} CPUs: 2 sockets × 4 cores × 2 threads, NUMA node 0 = cpus {}, node 1 = cpus {}",
        topo.all_cpus().len(),
        topo.numa_cpus(&CpuSet::range(0, 0)),
        topo.numa_cpus(&CpuSet::range(1, 1))
    );
    println!(
        "  cgroup {} tree on {} (kubelet cgroupfs driver), CPUs 0,8 (core 0) reserved for the system\n",
        if cgroup_v2 { "v2" } else { "v1" },
        if mounted { "tmpfs" } else { "a temporary directory" }
    );
}

/// Starts the agent on the fake node (its log to `log_path`), kept in `ws` to be stopped;
/// returns the binary's path.
fn start_agent(
    ws: &mut Workspace,
    tree_flags: &[String],
    state_dir: &Path,
    log_path: &Path,
) -> Result<PathBuf, CommandError> {
    let exe = std::env::current_exe().map_err(io_failure("cannot find the cpusetd binary"))?;
    let log_file = fs::File::create(log_path).map_err(io_failure("cannot create the agent log"))?;
    let mut command = Command::new(&exe);
    command
        .arg("run")
        .args(tree_flags)
        .args([
            "--reserved-cpus",
            "0,8",
            "--cpu-manager-reconcile-period",
            "2s",
            // The fake node has no kubelet; this machine's kubelet (if any) is not its.
            "--kubelet-state",
            "none",
        ])
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--metrics-file")
        .arg(ws.dir.join("metrics.prom"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        // Its own process group: Ctrl-C reaches the demo, which stops the agent cleanly.
        .process_group(0);
    let agent = command
        .spawn()
        .map_err(io_failure("cannot start the agent"))?;
    println!(
        "started the agent: {} run {} (pid {})\n",
        exe.display(),
        tree_flags.join(" "),
        agent.id()
    );
    ws.agent = Some(agent);
    Ok(exe)
}

/// Pods arrive one by one (BestEffort, Burstable, Guaranteed with an exclusive container,
/// Guaranteed with a fractional request), then a foreign write to `db`'s cpuset is repaired.
/// Returns the pod `db` and its exclusive cpus.
fn pods_arrive(
    node: &FakeNode,
    show: &mut Show,
    ws: &mut Workspace,
) -> Result<(PodSpec, String), CommandError> {
    let pod = |name: &str, qos, containers| PodSpec {
        uid: new_pod_uid(),
        name: name.into(),
        qos,
        containers,
    };
    let web = pod(
        "web",
        Qos::BestEffort,
        vec![ContainerSpec::best_effort("web")],
    );
    let api = pod(
        "api",
        Qos::Burstable,
        vec![ContainerSpec::burstable("api", 500, Some(1000))],
    );
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("db", 2000),
            ContainerSpec::guaranteed("log-shipper", 500),
        ],
    );
    let cache = pod(
        "cache",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("cache", 1500)],
    );
    let start = |p: &PodSpec| node.start_pod(p).map_err(io_failure("kubelet simulator"));

    start(&web)?;
    show.step(
        ws,
        "A BestEffort pod `web` arrives: it runs on the shared pool.",
        |rows| settled(rows, "web"),
    )?;
    start(&api)?;
    show.step(
        ws,
        "A Burstable pod `api` (500m request, 1 CPU limit) arrives: shared pool too.",
        |rows| settled(rows, "api"),
    )?;
    let db_ids = start(&db)?;
    let db_view = show.step(
        ws,
        "A Guaranteed pod `db` arrives: container `db` asks for 2 whole CPUs and gets a full \
         core to itself; its 500m sidecar `log-shipper` stays on the shared pool, which shrinks.",
        |rows| settled(rows, "db") && exclusive(rows, "db") && settled(rows, "log-shipper"),
    )?;
    start(&cache)?;
    show.step(
        ws,
        "A Guaranteed pod `cache` asks for 1.5 CPUs: not a whole number, so it shares (kubelet's rule).",
        |rows| settled(rows, "cache"),
    )?;
    let db_cpus = row(db_view.rows(), "db")
        .and_then(|r| r.desired.clone())
        .unwrap_or_default();
    foreign_write_repaired(node, show, ws, &db, &db_ids[0], &db_cpus)?;
    Ok((db, db_cpus))
}

/// Someone else writes `db`'s cpuset.cpus: the agent repairs it to `db_cpus`.
fn foreign_write_repaired(
    node: &FakeNode,
    show: &mut Show,
    ws: &mut Workspace,
    db: &PodSpec,
    db_id: &str,
    db_cpus: &str,
) -> Result<(), CommandError> {
    let db_file = node.file(&format!("{}/{}", node.pod_dir(db), db_id), "cpuset.cpus");
    fs::write(&db_file, "0-15\n").map_err(io_failure("foreign write"))?;
    let foreign = Instant::now();
    show.step(
        ws,
        &format!(
            "Someone writes 0-15 into `db`'s cpuset.cpus behind the agent's back: repaired to {db_cpus}."
        ),
        |rows| row(rows, "db").is_some_and(|r| r.current.as_deref() == Some(db_cpus)),
    )?;
    println!(
        "   (repaired {} ms after the foreign write)\n",
        foreign.elapsed().as_millis()
    );
    Ok(())
}

/// --keep: the agent runs until Ctrl-C (or SIGTERM), with how to look at it.
fn wait_for_ctrl_c(
    exe: &Path,
    tree_flags: &[String],
    state_dir: &Path,
    node: &FakeNode,
    log_path: &Path,
) -> Result<(), CommandError> {
    println!(
        "--keep: the agent keeps running. Poke at it from another terminal:\n  \
         {} status {} --state-dir {}\n  the tree: {}\n  the agent's log: {}\nCtrl-C here stops it and cleans up.",
        exe.display(),
        tree_flags.join(" "),
        state_dir.display(),
        node.cgroup_root().display(),
        log_path.display()
    );
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals
        .thread_block()
        .map_err(|e| failure(format!("cannot wait for Ctrl-C: {e}")))?;
    let _ = signals.wait();
    println!();
    Ok(())
}

/// Pod `db` is deleted: its cpus go back to the shared pool.
fn db_leaves(
    node: &FakeNode,
    show: &mut Show,
    ws: &mut Workspace,
    db: &PodSpec,
    db_cpus: &str,
) -> Result<(), CommandError> {
    node.remove_pod(db)
        .map_err(io_failure("kubelet simulator"))?;
    show.step(
        ws,
        "Pod `db` is deleted: its CPUs go back to the shared pool.",
        |rows| {
            row(rows, "db").is_none()
                && row(rows, "web")
                    .and_then(|r| r.current.as_deref().map(CpuSet::parse))
                    .and_then(Result::ok)
                    .is_some_and(|shared| {
                        CpuSet::parse(db_cpus).is_ok_and(|d| d.is_subset(&shared))
                    })
        },
    )?;
    Ok(())
}

fn row<'a>(rows: &'a [CgroupRow], container: &str) -> Option<&'a CgroupRow> {
    rows.iter()
        .find(|r| r.container.as_deref() == Some(container))
}

/// The container exists and its cpuset is what the agent wants.
fn settled(rows: &[CgroupRow], container: &str) -> bool {
    row(rows, container).is_some_and(|r| r.current.is_some() && !r.differs())
}

fn exclusive(rows: &[CgroupRow], container: &str) -> bool {
    row(rows, container).is_some_and(|r| r.exclusive)
}

/// Prints steps: what happened, what the agent logged, and the status table.
struct Show {
    tree: TreeArgs,
    state_dir: PathBuf,
    log_path: PathBuf,
    log_offset: u64,
    step: usize,
}

impl Show {
    /// Waits (with a deadline) until `done` holds for the status rows; returns the view.
    fn wait(
        &mut self,
        ws: &mut Workspace,
        what: &str,
        done: impl Fn(&[CgroupRow]) -> bool,
    ) -> Result<StatusView, CommandError> {
        let deadline = Instant::now() + STEP_DEADLINE;
        let mut last_error = String::new();
        loop {
            if let Some(status) = ws.agent_exit() {
                return Err(failure(format!(
                    "the agent stopped ({status}) while the demo waited for {what}; its log:\n{}",
                    tail(&self.log_path, 30)
                )));
            }
            match self
                .tree
                .open()
                .and_then(|mut n| collect(&mut n, &self.state_dir))
            {
                // Settled: the step's condition holds and nothing differs from the plan.
                Ok(view) if done(view.rows()) && view.rows().iter().all(|r| !r.differs()) => {
                    return Ok(view)
                }
                Ok(_) => {}
                Err(e) => last_error = e.message,
            }
            if Instant::now() > deadline {
                return Err(failure(format!(
                    "the demo waited {}s for {what} and gave up ({last_error}); the agent's log:\n{}",
                    STEP_DEADLINE.as_secs(),
                    tail(&self.log_path, 30)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn step(
        &mut self,
        ws: &mut Workspace,
        title: &str,
        done: impl Fn(&[CgroupRow]) -> bool,
    ) -> Result<StatusView, CommandError> {
        self.step += 1;
        println!("== {}. {title}", self.step);
        let view = self.wait(ws, title, done)?;
        for line in self.new_log_lines() {
            println!("   agent: {line}");
        }
        println!();
        for line in view.render(false).lines() {
            println!("   {line}");
        }
        println!();
        let style = MapStyle::for_output(std::io::stdout().is_terminal());
        for line in view.render_map(style).lines() {
            println!("   {line}");
        }
        println!();
        Ok(view)
    }

    /// The agent's log lines about assignments since the last call.
    fn new_log_lines(&mut self) -> Vec<String> {
        let Ok(mut file) = fs::File::open(&self.log_path) else {
            return Vec::new();
        };
        let _ = file.seek(SeekFrom::Start(self.log_offset));
        let mut lines = Vec::new();
        let mut reader = BufReader::new(file);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            self.log_offset += line.len() as u64;
            // The controller's lines (its module's and its submodules' targets).
            if let Some(at) = line.find(" cpusetd::agent::controller") {
                if let Some(end) = line[at..].find("] ") {
                    lines.push(line[at + end + 2..].trim().to_string());
                }
            }
            line.clear();
        }
        lines
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::private_workspace;
    use std::os::unix::fs::PermissionsExt;

    /// Issue 17, item 15: each demo gets a fresh private directory, never one a name that
    /// someone else could have created first.
    #[test]
    fn the_demo_workspace_is_fresh_private_and_unpredictable() {
        let tmp = tempfile::tempdir().unwrap();
        let a = private_workspace(tmp.path()).unwrap();
        let b = private_workspace(tmp.path()).unwrap();
        assert_ne!(a, b);
        for dir in [&a, &b] {
            let meta = std::fs::symlink_metadata(dir).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
            assert!(std::fs::read_dir(dir).unwrap().next().is_none());
        }
        // The old predictable name, planted as a symlink, is not what the demo uses.
        let planted = tmp
            .path()
            .join(format!("cpusetd-demo-{}", std::process::id()));
        std::os::unix::fs::symlink("/", &planted).unwrap();
        let c = private_workspace(tmp.path()).unwrap();
        assert_ne!(c, planted);
    }
}
