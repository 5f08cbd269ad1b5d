//! irqbalance told which CPUs to keep interrupts off, for pods with
//! `irq-load-balancing.crio.io: "disable"`: the agent against a stand-in daemon on the fake
//! node's socket (`<base>/run/irqbalance`, beside the fake `/proc`), the exact commands it
//! gets; and the real Debian daemon where it is installed and this runs as root.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::cpuset::CpuSet;
use cpusetd::irq::{format_mask, parse_mask};
use cpusetd::irqbalance::{Irqbalance, IrqbalanceOutcome};

use cpusetd::kubesim::{ContainerSpec, Qos};

use crate::agent_util::{pod, poll_until, TestNode, DEADLINE};
use crate::isolation::{fake_proc, irq_file, reset_with_proc, start_irq_pod, start_with_proc};
use crate::util::{stderr, stdout};

/// A stand-in irqbalance: process `pid` in the fake `/proc` (its `comm`), its socket in
/// `<proc>/../run/irqbalance`; answers `setup` with its banned mask, takes `settings cpus`,
/// records every command, closes after each (as irqbalance 1.9 does).
struct FakeIrqbalance {
    commands: Arc<Mutex<Vec<String>>>,
}

impl FakeIrqbalance {
    fn start(proc: &Path, pid: u32, own: &str) -> FakeIrqbalance {
        FakeIrqbalance::start_slow(proc, pid, own, Duration::ZERO)
    }

    /// One that holds each `settings` exchange open for `hold` after taking the command (the
    /// command is recorded at once).
    fn start_slow(proc: &Path, pid: u32, own: &str, hold: Duration) -> FakeIrqbalance {
        fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        fs::write(proc.join(format!("{pid}/comm")), "irqbalance\n").unwrap();
        let dir = proc.parent().unwrap().join("run/irqbalance");
        fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join(format!("irqbalance{pid}.sock"))).unwrap();
        let commands = Arc::new(Mutex::new(Vec::new()));
        let seen = commands.clone();
        let own = CpuSet::parse(own).unwrap();
        thread::spawn(move || {
            let mut banned = own.clone();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut buf = [0u8; 500];
                let n = stream.read(&mut buf).unwrap_or(0);
                let command = String::from_utf8_lossy(&buf[..n]).into_owned();
                if command == "setup" {
                    let mask = format_mask(&banned, "00000000");
                    let _ = stream.write_all(format!("SLEEP 10 BANNED {mask}").as_bytes());
                } else if let Some(list) = command.strip_prefix("settings cpus ") {
                    banned = match list {
                        "NULL" => own.clone(),
                        list => CpuSet::parse(list).unwrap(),
                    };
                }
                let settings = command.starts_with("settings");
                seen.lock().unwrap().push(command);
                if settings {
                    thread::sleep(hold);
                }
            }
        });
        FakeIrqbalance { commands }
    }

    fn commands(&self) -> Vec<String> {
        self.commands.lock().unwrap().clone()
    }

    /// Waits until the daemon got `n` commands; returns them.
    fn wait_commands(&self, n: usize) -> Vec<String> {
        poll_until(DEADLINE, || (self.commands().len() >= n).then_some(()));
        self.commands()
    }
}

/// `cpusetd status` (the table) with `proc` as its proc root.
fn status_with_proc(node: &TestNode, proc: &Path) -> String {
    let mut args = node.tree_args();
    let at = args.iter().position(|a| a == "--proc-root").unwrap();
    args[at + 1] = proc.display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_cpusetd"))
        .arg("status")
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn irqbalance_is_told_while_the_pod_runs_across_an_agent_kill_and_given_its_own_back() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    // The operator's own ban: cpu 15.
    let daemon = FakeIrqbalance::start(&proc, 4242, "15");
    let mut agent = start_with_proc(&node, &proc);
    let (rt, id) = start_irq_pod(&node, &proc, &agent, 2000, "0,2-8,10-15");
    node.wait_cpus(&id, "1,9");
    assert_eq!(
        daemon.wait_commands(2),
        ["setup", "settings cpus 1,9,15"],
        "{}",
        agent.log()
    );
    assert_eq!(
        agent
            .log_lines("irqbalance (pid 4242) told to keep interrupts off cpus 1,9,15")
            .len(),
        1,
        "{}",
        agent.log()
    );
    let told = poll_until(DEADLINE, || {
        (node.metric("cpusetd_irqbalance_banned_cpus") == 3.0).then_some(())
    });
    assert!(told.is_some(), "{:?}", node.metrics());
    let table = status_with_proc(&node, &proc);
    assert!(
        table.contains("irqbalance (pid 4242) told to keep interrupts off cpus 1,9,15 (its own banned cpus: 15)"),
        "{table}"
    );

    // kill -9 and a new agent: the checkpoint says what was told; nothing is re-read or re-sent
    // (re-reading now would take the pod's cpus for the operator's).
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let mut agent = start_with_proc(&node, &proc);
    let reconciles = || {
        node.metric("cpusetd_passes_total")
            + node.metric("cpusetd_reconciles_without_pass_total")
            + node.metric("cpusetd_quiet_reconciles_total")
    };
    let later = poll_until(DEADLINE, || (reconciles() >= 3.0).then_some(()));
    assert!(later.is_some(), "{:?}", node.metrics());
    assert_eq!(daemon.commands().len(), 2, "{:?}", daemon.commands());
    node.fake.remove_pod(&rt).unwrap();
    assert_eq!(
        daemon.wait_commands(3),
        ["setup", "settings cpus 1,9,15", "settings cpus 15"],
        "{}",
        agent.log()
    );
    let back = poll_until(DEADLINE, || {
        (irq_file(&proc, "24/smp_affinity_list") == "0-15").then_some(())
    });
    assert!(back.is_some(), "{}", agent.log());
    let forgotten = poll_until(DEADLINE, || {
        (node.metric("cpusetd_irqbalance_banned_cpus") == 0.0).then_some(())
    });
    assert!(forgotten.is_some(), "{:?}", node.metrics());
    assert!(agent.stop().success());
    assert_eq!(daemon.commands().len(), 3, "nothing more once restored");
    node.assert_clean();
}

/// The agent stopped (SIGTERM) while irqbalance's answer to `settings cpus` is in flight: the
/// stop waits for it (bounded) and the last checkpoint says what was told, so the next agent
/// gives the daemon its own banned cpus back, not the pod's as if they were the operator's.
#[test]
fn a_stop_while_irqbalance_answers_keeps_what_was_told() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    let daemon = FakeIrqbalance::start_slow(&proc, 4242, "15", Duration::from_millis(800));
    let mut agent = start_with_proc(&node, &proc);
    let (rt, id) = start_irq_pod(&node, &proc, &agent, 2000, "0,2-8,10-15");
    node.wait_cpus(&id, "1,9");
    assert_eq!(daemon.wait_commands(2), ["setup", "settings cpus 1,9,15"]);
    // The exchange is held open now: stop.
    let started = std::time::Instant::now();
    assert!(agent.stop().success(), "{}", agent.log());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let mut agent = start_with_proc(&node, &proc);
    node.fake.remove_pod(&rt).unwrap();
    let back = poll_until(DEADLINE, || {
        daemon
            .commands()
            .iter()
            .skip(2)
            .any(|c| c.starts_with("settings"))
            .then_some(())
    });
    assert!(back.is_some(), "{:?} {}", daemon.commands(), agent.log());
    let settings: Vec<String> = daemon
        .commands()
        .into_iter()
        .filter(|c| c.starts_with("settings"))
        .collect();
    assert_eq!(
        settings,
        ["settings cpus 1,9,15", "settings cpus 15"],
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
}

/// irqbalance restarted (a new pid, which forgot) while nothing else changes on the node: the
/// agent's next reconcile tick tells the new one, and the checkpoint (read by `status`) names it.
#[test]
fn a_restarted_irqbalance_is_told_again_on_a_quiet_node() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    let old = FakeIrqbalance::start(&proc, 4242, "");
    let mut agent = start_with_proc(&node, &proc);
    let (_rt, id) = start_irq_pod(&node, &proc, &agent, 2000, "0,2-8,10-15");
    node.wait_cpus(&id, "1,9");
    assert_eq!(old.wait_commands(2), ["setup", "settings cpus 1,9"]);
    // A quiet node: reconcile ticks that only compare cpusets (every sixth scans in full).
    let quiet = || node.metric("cpusetd_quiet_reconciles_total");
    let settled = poll_until(DEADLINE, || (quiet() >= 1.0).then_some(()));
    assert!(settled.is_some(), "{:?}", node.metrics());
    let ticks = || {
        quiet()
            + node.metric("cpusetd_passes_total")
            + node.metric("cpusetd_reconciles_without_pass_total")
    };
    fs::remove_dir_all(proc.join("4242")).unwrap();
    let new = FakeIrqbalance::start(&proc, 4343, "3");
    let before = ticks();
    assert_eq!(
        new.wait_commands(2),
        ["setup", "settings cpus 1,3,9"],
        "{}",
        agent.log()
    );
    // Told on the next tick or the one after, quiet or not (not only on a full scan).
    assert!(ticks() - before <= 2.0, "{} ticks", ticks() - before);
    let noted = poll_until(DEADLINE, || {
        status_with_proc(&node, &proc)
            .contains("irqbalance (pid 4343) told to keep interrupts off cpus 1,3,9")
            .then_some(())
    });
    assert!(noted.is_some(), "{}", status_with_proc(&node, &proc));
    assert_eq!(
        old.commands().len(),
        2,
        "the old one is gone: nothing more to it"
    );
    assert!(agent.stop().success());
}

#[test]
fn reset_gives_irqbalance_its_own_banned_cpus_back() {
    let node = TestNode::new(CgroupVersion::V2);
    let proc = fake_proc(&node);
    let daemon = FakeIrqbalance::start(&proc, 31337, "");
    let mut agent = start_with_proc(&node, &proc);
    let (_rt, id) = start_irq_pod(&node, &proc, &agent, 1000, "0-7,9-15");
    node.wait_cpus(&id, "8");
    assert_eq!(daemon.wait_commands(2), ["setup", "settings cpus 8"]);
    assert!(agent.stop().success());
    let out = reset_with_proc(&node, &proc);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("irqbalance (pid 31337) given its own banned cpus back: none"),
        "{}",
        stdout(&out)
    );
    // No ban of its own: back to its own configuration.
    assert_eq!(
        daemon.commands(),
        ["setup", "settings cpus 8", "settings cpus NULL"]
    );
}

#[test]
fn irqbalance_without_a_socket_is_warned_about_once() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    fs::create_dir_all(proc.join("555")).unwrap();
    fs::write(proc.join("555/comm"), "irqbalance\n").unwrap();
    let mut agent = start_with_proc(&node, &proc);
    let (_rt, _id) = start_irq_pod(&node, &proc, &agent, 1000, "0-7,9-15");
    let warned = poll_until(DEADLINE, || {
        (!agent
            .log_lines("irqbalance (pid 555) runs without a socket")
            .is_empty())
        .then_some(())
    });
    assert!(warned.is_some(), "{}", agent.log());
    // Several full reconciles later (one a second, each looks again), still once.
    let reconciles = || {
        node.metric("cpusetd_passes_total")
            + node.metric("cpusetd_reconciles_without_pass_total")
            + node.metric("cpusetd_quiet_reconciles_total")
    };
    let before = reconciles();
    let later = poll_until(DEADLINE, || (reconciles() >= before + 3.0).then_some(()));
    assert!(later.is_some(), "{:?}", node.metrics());
    assert_eq!(
        agent
            .log_lines("irqbalance (pid 555) runs without a socket")
            .len(),
        1,
        "{}",
        agent.log()
    );
    let table = status_with_proc(&node, &proc);
    assert!(
        table.contains("irqbalance (pid 555) runs without a socket"),
        "{table}"
    );
    assert!(agent.stop().success());
}

/// Why the real irqbalance cannot be tried here, if it cannot.
fn real_skip_reason(online: &CpuSet) -> Option<String> {
    if !Path::new(REAL_DAEMON).exists() {
        return Some(format!(
            "{REAL_DAEMON} is not installed (apt-get install irqbalance)"
        ));
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (irqbalance answers root only)".into());
    }
    if online.len() < 2 {
        return Some(format!(
            "irqbalance needs two cpus or more, online: {online}"
        ));
    }
    let running = fs::read_dir("/proc").ok()?.flatten().any(|e| {
        fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == "irqbalance")
    });
    if running {
        return Some("an irqbalance already runs here (the host's: left alone)".into());
    }
    None
}

const REAL_DAEMON: &str = "/usr/sbin/irqbalance";

/// The banned cpus the daemon behind `socket` reports (`setup`).
fn real_banned(socket: &Path) -> Option<CpuSet> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"setup").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let mut words = answer.split_whitespace();
    words.find(|w| *w == "BANNED")?;
    parse_mask(words.next()?).ok()
}

/// Kills the daemon (and removes the socket directory made for it) whatever happens.
struct RealDaemon {
    child: Child,
    made_dir: Option<PathBuf>,
}

impl Drop for RealDaemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            Signal::SIGTERM,
        );
        let _ = self.child.wait();
        if let Some(dir) = &self.made_dir {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// The Debian irqbalance (1.9) itself, on this machine's `/proc` and `/run/irqbalance`: told
/// a cpu over its socket, it bans that cpu besides its own configured ones
/// (`IRQBALANCE_BANNED_CPULIST`) at its next rescan, and bans only its own again once given
/// them back. Skipped with a reason without the daemon, without root, with one cpu, or when
/// the host runs its own irqbalance.
#[test]
fn the_real_irqbalance_takes_the_cpus_and_gives_them_back() {
    let online = fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| CpuSet::parse(t.trim()).ok())
        .unwrap_or_default();
    if let Some(reason) = real_skip_reason(&online) {
        println!("skipped: {reason}");
        return;
    }
    let last = online.last().unwrap();
    // Its own ban (from the environment, as /etc/default/irqbalance gives it) where there
    // are cpus enough to keep one balanced.
    let own = if online.len() >= 3 {
        CpuSet::parse(&last.to_string()).unwrap()
    } else {
        CpuSet::new()
    };
    let keep_free = CpuSet::parse(&online.difference(&own).last().unwrap().to_string()).unwrap();
    let dir = Path::new("/run/irqbalance");
    let made_dir = (!dir.exists()).then(|| {
        fs::create_dir_all(dir).unwrap();
        dir.to_path_buf()
    });
    let mut command = Command::new(REAL_DAEMON);
    command
        .args(["--foreground", "--interval=1"])
        .env_remove("IRQBALANCE_BANNED_CPUS")
        .env_remove("INVOCATION_ID")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !own.is_empty() {
        command.env("IRQBALANCE_BANNED_CPULIST", own.to_string());
    } else {
        command.env_remove("IRQBALANCE_BANNED_CPULIST");
    }
    let daemon = RealDaemon {
        child: command.spawn().unwrap(),
        made_dir,
    };
    let pid = daemon.child.id();
    let socket = dir.join(format!("irqbalance{pid}.sock"));
    let up = poll_until(DEADLINE, || real_banned(&socket));
    assert_eq!(
        up,
        Some(own.clone()),
        "irqbalance {pid} never answered on {}",
        socket.display()
    );

    let mut irqbalance = Irqbalance::new(Path::new("/proc"));
    let mut saved = None;
    let banned = own.union(&keep_free);
    assert_eq!(
        irqbalance.apply(&keep_free, &mut saved),
        IrqbalanceOutcome::Banned {
            pid,
            banned: banned.clone(),
            original: own.clone()
        }
    );
    let taken = poll_until(DEADLINE, || {
        (real_banned(&socket).as_ref() == Some(&banned)).then_some(())
    });
    assert!(
        taken.is_some(),
        "irqbalance reports {:?}",
        real_banned(&socket)
    );

    assert_eq!(
        irqbalance.apply(&CpuSet::new(), &mut saved),
        IrqbalanceOutcome::Restored {
            pid,
            original: own.clone()
        }
    );
    let back = poll_until(DEADLINE, || {
        (real_banned(&socket).as_ref() == Some(&own)).then_some(())
    });
    assert!(
        back.is_some(),
        "irqbalance reports {:?}",
        real_banned(&socket)
    );
    println!(
        "real irqbalance {pid}: bans {banned} while told, its own ({}) after",
        if own.is_empty() {
            "none".to_string()
        } else {
            own.to_string()
        }
    );
    drop(daemon);
}

/// An irqbalance that accepts and never answers: each connection is held until the agent
/// gives up on it. `accepted` gets each connection's number as it is accepted.
struct StalledIrqbalance {
    accepted: std::sync::mpsc::Receiver<usize>,
    closed: Arc<Mutex<Vec<bool>>>,
}

impl StalledIrqbalance {
    fn start(proc: &Path, pid: u32) -> StalledIrqbalance {
        fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        fs::write(proc.join(format!("{pid}/comm")), "irqbalance\n").unwrap();
        let dir = proc.parent().unwrap().join("run/irqbalance");
        fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join(format!("irqbalance{pid}.sock"))).unwrap();
        let (tx, accepted) = std::sync::mpsc::channel();
        let closed = Arc::new(Mutex::new(Vec::new()));
        let theirs = closed.clone();
        thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { return };
                theirs.lock().unwrap().push(false);
                let _ = tx.send(n);
                let closed = theirs.clone();
                thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                    closed.lock().unwrap()[n] = true;
                });
            }
        });
        StalledIrqbalance { accepted, closed }
    }

    /// Whether the agent still holds connection `n` open, unanswered.
    fn still_open(&self, n: usize) -> bool {
        !self.closed.lock().unwrap()[n]
    }
}

/// Issue 23 item 6: an irqbalance that accepts and never answers held the controller for each
/// exchange (an unrelated pod's pin took 1.31 s instead of ~0.02 s). The pin of a pod that
/// arrives while the agent waits for the daemon is written while that wait goes on: the
/// unanswered connection is still open when the pin is seen.
#[test]
fn a_stalled_irqbalance_does_not_hold_back_an_unrelated_pin() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    let daemon = StalledIrqbalance::start(&proc, 4545);
    let agent = start_with_proc(&node, &proc);
    let (_rt, id) = start_irq_pod(&node, &proc, &agent, 2000, "0,2-8,10-15");
    node.wait_cpus(&id, "1,9");
    // A connection the agent holds now, unanswered (the first, or a reconcile's retry).
    let held = loop {
        let n = daemon.accepted.recv_timeout(DEADLINE).unwrap();
        if daemon.still_open(n) {
            break n;
        }
    };
    let other = pod(
        "other",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 2000)],
    );
    let other_id = node.fake.start_pod(&other).unwrap().remove(0);
    let pinned = poll_until(DEADLINE, || {
        (CpuSet::parse(&node.cpus_of(&other, &other_id)).ok()?.len() == 2).then_some(())
    });
    assert!(pinned.is_some(), "{}", agent.log());
    assert!(
        daemon.still_open(held),
        "the pin waited until the agent gave up on irqbalance:\n{}",
        agent.log()
    );
}
