//! Host slices confined through systemd itself (`--isolate-host` on a cgroup v2 systemd host).
//!
//! On a node where systemd owns the host's cgroups (`system.slice`, `user.slice`, `init.scope`
//! …), writing their `cpuset.cpus` behind its back lasts only until systemd writes its own idea
//! again; so there the agent asks systemd: `systemctl --no-ask-password set-property --runtime
//! <unit> AllowedCPUs=<cpus>`, a child process with a bounded wait (a stalled systemd must not
//! hold the controller: it is killed after [`DEFAULT_TIMEOUT`] and the change reported as not
//! made). `--runtime` keeps the change in `/run/systemd/system.control`, so it survives
//! `daemon-reload` and service restarts and goes with a reboot, as the confinement should. No
//! D-Bus library: systemctl as root talks to PID 1 over its private socket.
//!
//! A systemd host, as decided here ([`is_systemd_host`]): cgroup v2 (systemd's `AllowedCPUs=`
//! exists only there; on v1 it leaves cpusets alone, so the agent writes them as before),
//! `/run/systemd/system` present (what `sd_booted()` checks: PID 1 is systemd) and the root
//! holds a `system.slice`. Whether `systemctl` answers is known at its first call: an error
//! then names the slice and the fix, and nothing is written behind systemd's back instead.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::cgroupfs::{CgroupFs, CgroupPath, CgroupVersion, FileKind, InterfaceFile};
use crate::cpuset::CpuSet;

/// How long one `systemctl` call may take before it is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `systemctl` (the one on `PATH`, or the program given) with a bounded wait.
#[derive(Debug, Clone)]
pub struct Systemctl {
    program: PathBuf,
    timeout: Duration,
    /// Disconnected when the agent stops: a call still waiting is killed at once.
    cancel: Option<crossbeam_channel::Receiver<()>>,
}

impl Default for Systemctl {
    fn default() -> Self {
        Systemctl {
            program: PathBuf::from("systemctl"),
            timeout: DEFAULT_TIMEOUT,
            cancel: None,
        }
    }
}

impl Systemctl {
    /// `program` instead of `systemctl` from `PATH`, killed after `timeout`.
    pub fn with_program(program: impl Into<PathBuf>, timeout: Duration) -> Systemctl {
        Systemctl {
            program: program.into(),
            timeout,
            cancel: None,
        }
    }

    /// `systemctl --no-ask-password set-property --runtime UNIT AllowedCPUs=CPUS` (`CPUS`
    /// empty: systemd's own setting removed). `Err` names the unit, what happened and the fix.
    pub fn set_allowed_cpus(&self, unit: &str, cpus: &str) -> Result<(), String> {
        let property = format!("AllowedCPUs={cpus}");
        let args = [
            "--no-ask-password",
            "set-property",
            "--runtime",
            unit,
            property.as_str(),
        ];
        let shown = format!("systemctl set-property --runtime {unit} {property}");
        let fix = format!(
            "{unit} is left as systemd has it; check that systemd answers (`systemctl status {unit}`), or run the agent without --isolate-host"
        );
        match self.run(&args) {
            Ok((status, _)) if status.success() => Ok(()),
            Ok((status, stderr)) => Err(format!(
                "`{shown}` failed ({status}{}): {fix}",
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {stderr}")
                }
            )),
            Err(why) => Err(format!("`{shown}` {why}: {fix}")),
        }
    }

    /// Runs the program with `args` (stdin and stdout closed off, stderr kept): its exit
    /// status and the start of its stderr, or why it did not run to the end in time.
    fn run(&self, args: &[&str]) -> Result<(ExitStatus, String), String> {
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("SYSTEMD_PAGER", "")
            .spawn()
            .map_err(|e| format!("could not be run ({}: {e})", self.program.display()))?;
        let deadline = Instant::now() + self.timeout;
        let cancelled = || self.cancel.as_ref().is_some_and(is_stopped);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline && !cancelled() => {
                    thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if cancelled() {
                        return Err(format!("{STOPPED} (killed)"));
                    }
                    return Err(format!(
                        "{STALLED} {:?} (killed; systemd did not answer)",
                        self.timeout
                    ));
                }
                Err(e) => return Err(format!("could not be waited for ({e})")),
            }
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.by_ref().take(4096).read_to_string(&mut stderr);
        }
        Ok((status, stderr.trim().replace('\n', "; ")))
    }
}

/// What a [`Systemctl`] error says when the call was killed at its timeout.
const STALLED: &str = "did not finish within";

/// What a [`Systemctl`] error says when the call was killed because the agent stops.
const STOPPED: &str = "was cut short by the agent stopping";

/// Whether `error` (from [`Systemctl::set_allowed_cpus`]) is a call killed at its timeout:
/// systemd is not answering, so the other units of the same pass are not asked (a pass waits
/// one timeout at most).
pub fn is_stall(error: &str) -> bool {
    error.contains(STALLED)
}

/// What one host unit is to get from systemd: the reserved cpus (`confine`), or the cpus it
/// had before (given back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceWant {
    pub path: CgroupPath,
    pub unit: String,
    /// The `AllowedCPUs=` asked for: what its `cpuset.cpus` must read back.
    pub cpus: String,
    pub confine: bool,
}

/// What came of one [`SliceWant`]: `Ok` once the unit's `cpuset.cpus` reads what was asked.
#[derive(Debug, Clone)]
pub struct SliceDone {
    pub want: SliceWant,
    pub result: Result<(), String>,
}

/// The thread that asks systemd for the host units' cpus (`--isolate-host`, the agent): a
/// stalled systemd holds it, never the controller. A handle with typed messages: the
/// controller sends each unit's want ([`SlicesWorker::request`]) and goes on; the thread
/// takes every want sent so far (a newer one replacing its unit's older one not yet asked),
/// asks one at a time (so one call is in flight per unit), reads the unit's `cpuset.cpus`
/// back, sends the answer ([`SlicesWorker::take_done`]) and signals `done`.
#[derive(Debug)]
pub struct SlicesWorker {
    wants: Option<crossbeam_channel::Sender<SliceWant>>,
    answers: crossbeam_channel::Receiver<SliceDone>,
    /// Never sent on: dropped when the worker is (the agent stops), which kills a call in
    /// flight at once.
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl SlicesWorker {
    /// Starts the thread: `systemctl` asks, `fs` reads back; `done` gets a message after each
    /// answer (a full channel already says so). `None` when no thread can be started (the
    /// caller asks in its own thread then).
    pub fn start(
        mut systemctl: Systemctl,
        fs: CgroupFs,
        done: Option<crossbeam_channel::Sender<()>>,
    ) -> Option<SlicesWorker> {
        let (wants, wanted) = crossbeam_channel::unbounded::<SliceWant>();
        let (answer, answers) = crossbeam_channel::unbounded::<SliceDone>();
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        systemctl.cancel = Some(stopped.clone());
        let thread = thread::Builder::new()
            .name("systemd-slices".into())
            .spawn(move || {
                let mut queued: BTreeMap<String, SliceWant> = BTreeMap::new();
                while let Some(want) = next_want(&wanted, &mut queued, &stopped) {
                    let result = systemctl
                        .set_allowed_cpus(&want.unit, &want.cpus)
                        .and_then(|()| expect_cpus(&fs, &want.path, &want.unit, &want.cpus));
                    if answer.send(SliceDone { want, result }).is_err() {
                        return;
                    }
                    if let Some(done) = &done {
                        let _ = done.try_send(());
                    }
                }
            });
        match thread {
            Ok(thread) => Some(SlicesWorker {
                wants: Some(wants),
                answers,
                stop: Some(stop),
                thread: Some(thread),
            }),
            Err(e) => {
                log::warn!("cannot start the thread that asks systemd for the host units' cpus ({e}): asked on the controller's thread");
                None
            }
        }
    }

    /// Sends `want` to the thread (replacing its unit's want not yet asked); returns at once.
    pub fn request(&self, want: SliceWant) {
        if let Some(wants) = &self.wants {
            let _ = wants.send(want);
        }
    }

    /// The answers since the last call, in the order they came.
    pub fn take_done(&self) -> Vec<SliceDone> {
        self.answers.try_iter().collect()
    }

    /// How many answers wait to be taken.
    pub fn answered(&self) -> usize {
        self.answers.len()
    }
}

impl Drop for SlicesWorker {
    /// Stops the thread: a call in flight is killed (the unit stays as it is, its record kept
    /// for the next start or `reset`), the wants not asked are dropped.
    fn drop(&mut self) {
        self.wants.take();
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The next want to ask: every want sent so far taken into `queued` (each unit's latest),
/// waiting for one when none is queued; `None` once the worker is dropped.
fn next_want(
    wanted: &crossbeam_channel::Receiver<SliceWant>,
    queued: &mut BTreeMap<String, SliceWant>,
    stopped: &crossbeam_channel::Receiver<()>,
) -> Option<SliceWant> {
    if queued.is_empty() {
        let want = wanted.recv().ok()?;
        queued.insert(want.unit.clone(), want);
    }
    for want in wanted.try_iter() {
        queued.insert(want.unit.clone(), want);
    }
    if is_stopped(stopped) {
        return None;
    }
    queued.pop_first().map(|(_, want)| want)
}

/// Whether the worker holding the other end of `stopped` is gone.
fn is_stopped(stopped: &crossbeam_channel::Receiver<()>) -> bool {
    matches!(
        stopped.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected)
    )
}

/// `cpuset.cpus` of `unit` (at `path`) reads `want`: systemd did what it was asked.
pub fn expect_cpus(fs: &CgroupFs, path: &CgroupPath, unit: &str, want: &str) -> Result<(), String> {
    let now = fs
        .read(path, InterfaceFile::CpusetCpus)
        .ok()
        .map(|t| t.trim().to_string());
    match now {
        Some(now) if same_cpus(&now, want) => Ok(()),
        now => Err(format!(
            "{}: cpuset.cpus reads {:?} after systemd was asked for AllowedCPUs={want} on {unit}",
            fs.host_path(path).display(),
            now.unwrap_or_default()
        )),
    }
}

/// Two cpu lists as the kernel or systemd print them name the same cpus (empty is empty).
pub fn same_cpus(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
        || matches!((CpuSet::parse(a.trim()), CpuSet::parse(b.trim())), (Ok(x), Ok(y)) if x == y)
}

/// Whether systemd owns the host cgroups of this hierarchy (see the module's documentation);
/// `run_systemd` is `/run/systemd/system` on a real host.
pub fn is_systemd_host(fs: &CgroupFs, version: CgroupVersion, run_systemd: &Path) -> bool {
    version == CgroupVersion::V2
        && run_systemd.is_dir()
        && fs.list(&CgroupPath::root()).is_ok_and(|entries| {
            entries
                .iter()
                .any(|e| e.kind == FileKind::Directory && e.name == "system.slice")
        })
}

/// The systemd unit a cgroup directly below the root is (`system.slice`, `init.scope` …);
/// `None` for anything else.
pub fn unit_of(path: &CgroupPath) -> Option<String> {
    if path.depth() != 1 {
        return None;
    }
    let name = path.to_str()?.trim_start_matches('/');
    (name.ends_with(".slice") || name.ends_with(".scope"))
        .then(|| name.to_string())
        .filter(|n| n != "-.slice")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// A fake `systemctl`: a shell script that logs its arguments and runs `body`.
    fn fake(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("systemctl");
        let log = dir.join("calls");
        fs::write(
            &path,
            format!("#!/bin/sh\necho \"$@\" >>{}\n{body}\n", log.display()),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn set_property_runtime_is_what_systemctl_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let systemctl = Systemctl::with_program(fake(dir.path(), "exit 0"), DEFAULT_TIMEOUT);
        systemctl.set_allowed_cpus("system.slice", "0-1").unwrap();
        systemctl.set_allowed_cpus("user.slice", "").unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("calls")).unwrap(),
            "--no-ask-password set-property --runtime system.slice AllowedCPUs=0-1\n\
             --no-ask-password set-property --runtime user.slice AllowedCPUs=\n"
        );
    }

    #[test]
    fn a_failing_systemctl_is_a_clear_error_naming_the_slice_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let body = "echo 'Failed to set unit properties: Access denied' >&2; exit 1";
        let systemctl = Systemctl::with_program(fake(dir.path(), body), DEFAULT_TIMEOUT);
        let err = systemctl.set_allowed_cpus("system.slice", "0").unwrap_err();
        assert!(
            err.contains("systemctl set-property --runtime system.slice AllowedCPUs=0")
                && err.contains("exit status: 1")
                && err.contains("Access denied")
                && err.contains("system.slice is left as systemd has it")
                && err.contains("--isolate-host"),
            "{err}"
        );
    }

    #[test]
    fn a_stalled_systemctl_is_killed_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(300);
        let systemctl = Systemctl::with_program(fake(dir.path(), "exec sleep 30"), timeout);
        let started = Instant::now();
        let err = systemctl.set_allowed_cpus("user.slice", "0").unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.contains("did not finish within") && err.contains("user.slice is left"),
            "{err}"
        );
    }

    /// One call at a time, each unit's latest want: one not yet taken is replaced by a newer.
    #[test]
    fn a_newer_want_replaces_one_not_yet_taken() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cg");
        for unit in ["system.slice", "user.slice"] {
            fs::create_dir_all(root.join(unit)).unwrap();
            fs::write(root.join(unit).join("cpuset.cpus"), "0-7\n").unwrap();
        }
        let body = format!(
            "sleep 0.3; echo \"${{5#AllowedCPUs=}}\" >{}/$4/cpuset.cpus",
            root.display()
        );
        let systemctl = Systemctl::with_program(fake(dir.path(), &body), DEFAULT_TIMEOUT);
        let (done, answered) = crossbeam_channel::bounded(1);
        let fs_ = CgroupFs::open(&root).unwrap();
        let worker = SlicesWorker::start(systemctl, fs_, Some(done)).unwrap();
        let want = |unit: &str, cpus: &str| SliceWant {
            path: CgroupPath::new(unit).unwrap(),
            unit: unit.to_string(),
            cpus: cpus.to_string(),
            confine: true,
        };
        worker.request(want("system.slice", "0-1"));
        while !dir.path().join("calls").exists() {
            thread::sleep(Duration::from_millis(5));
        }
        worker.request(want("user.slice", "0-1"));
        worker.request(want("user.slice", "0-3"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while worker.answered() < 2 {
            assert!(Instant::now() < deadline);
            thread::sleep(Duration::from_millis(5));
        }
        assert!(answered.try_recv().is_ok());
        let done = worker.take_done();
        let answers: Vec<(&str, &str, bool)> = done
            .iter()
            .map(|d| (d.want.unit.as_str(), d.want.cpus.as_str(), d.result.is_ok()))
            .collect();
        assert_eq!(
            answers,
            [("system.slice", "0-1", true), ("user.slice", "0-3", true)]
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("calls")).unwrap(),
            "--no-ask-password set-property --runtime system.slice AllowedCPUs=0-1\n\
             --no-ask-password set-property --runtime user.slice AllowedCPUs=0-3\n"
        );
        assert!(worker.take_done().is_empty());
    }

    #[test]
    fn a_missing_systemctl_says_so() {
        let systemctl = Systemctl::with_program("/nonexistent/systemctl", DEFAULT_TIMEOUT);
        let err = systemctl.set_allowed_cpus("system.slice", "0").unwrap_err();
        assert!(
            err.contains("could not be run (/nonexistent/systemctl")
                && err.contains("system.slice"),
            "{err}"
        );
    }

    #[test]
    fn units_are_the_root_s_slices_and_scopes() {
        let unit = |p: &str| unit_of(&CgroupPath::new(p).unwrap());
        assert_eq!(unit("system.slice").as_deref(), Some("system.slice"));
        assert_eq!(unit("init.scope").as_deref(), Some("init.scope"));
        assert_eq!(unit("system.slice/cron.service"), None);
        assert_eq!(unit("kubepods"), None);
        assert_eq!(unit(""), None);
    }
}
