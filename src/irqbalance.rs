//! irqbalance, kept from moving device interrupts back onto the CPUs [`crate::irq`] keeps
//! free. irqbalance (1.2 and newer, built with its UI socket, as Debian, Ubuntu, Fedora and
//! RHEL ship it) listens on `/run/irqbalance/irqbalance<pid>.sock` and takes, from root,
//! `setup` (answered with `... BANNED <mask>`: the CPUs it keeps interrupts off now) and
//! `settings cpus <list>|NULL` (replaces that set until it restarts; `NULL` goes back to its
//! own configuration: `IRQBALANCE_BANNED_CPULIST`, else `isolcpus=`/`nohz_full=`). So the
//! agent reads the daemon's own banned set once, tells it that set plus the kept-free CPUs,
//! and tells it the original set again when no pod needs it, without restarting it and
//! without editing host configuration (docs/DECISIONS.md says why).
//!
//! What was told to which daemon is recorded ([`IrqbalanceSaved`], in the checkpoint with the
//! affinities), so a restarted agent or `cpusetd reset` restores it; a daemon that restarted
//! since forgot it by itself. The socket directory is `<parent of the proc root>/run/irqbalance`
//! (`/run/irqbalance` for `/proc`), so a fake tree holds both; a daemon counts as running when
//! `<proc root>/<pid>/comm` says `irqbalance`.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// The daemon's process name (`/proc/<pid>/comm`) and its socket's name prefix.
const DAEMON: &str = "irqbalance";
/// irqbalance reads one message into a 500-byte buffer: a longer command would be cut.
const MAX_COMMAND: usize = 499;
/// How long one exchange with the daemon may take, from connecting to its last byte.
const TIMEOUT: Duration = Duration::from_secs(2);
/// The longest answer read: `setup` lists every IRQ (`IRQ <n> LOAD <l> DIFF <d> CLASS <c>`,
/// some 40 bytes each), so 1 MiB is room for tens of thousands of them.
const ANSWER_LIMIT: u64 = 1 << 20;

/// What the agent told irqbalance, to undo it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqbalanceSaved {
    /// The daemon that was told (a restarted one forgot it).
    pub pid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22, clock ticks after boot): a daemon
    /// restarted with the same pid is another one, which forgot. `None` in checkpoints that
    /// predate it, or where the stat file cannot be read (the pid alone then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// Its banned CPUs before the first change, as its `setup` answer said.
    #[serde(default)]
    pub original: CpuSet,
    /// The banned CPUs it was told.
    #[serde(default)]
    pub banned: CpuSet,
}

/// What one [`Irqbalance::apply`] found or did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum IrqbalanceOutcome {
    /// No CPUs to keep free and nothing told: not looked at.
    #[default]
    Idle,
    /// No irqbalance process runs: nothing to tell.
    NotRunning,
    /// irqbalance runs without a socket, seen for the first time: it may be starting (it
    /// makes its socket after reading the topology). Not said; the next call decides.
    NoSocketYet { pid: u32 },
    /// irqbalance runs, but without a socket the agent can reach (built without its UI, an
    /// abstract socket only, or `/run/irqbalance` not visible here), twice in a row.
    NoSocket { pid: u32 },
    /// The daemon already bans what it should.
    Unchanged { pid: u32, banned: CpuSet },
    /// Told to ban `banned` (its own set is `original`).
    Banned {
        pid: u32,
        banned: CpuSet,
        original: CpuSet,
    },
    /// Given its own banned set back.
    Restored { pid: u32, original: CpuSet },
    /// The daemon that was told is gone: nothing left to undo.
    Forgotten { pid: u32 },
    /// An exchange failed (what was recorded stays, to retry).
    Failed { pid: u32, error: String },
}

impl IrqbalanceOutcome {
    /// A line for the log, or `None` when there is nothing to say.
    pub fn describe(&self) -> Option<String> {
        Some(match self {
            IrqbalanceOutcome::Idle
            | IrqbalanceOutcome::Unchanged { .. }
            | IrqbalanceOutcome::NoSocketYet { .. } => return None,
            IrqbalanceOutcome::NotRunning => {
                "irqbalance is not running: nothing to tell it".to_string()
            }
            IrqbalanceOutcome::NoSocket { pid } => format!(
                "irqbalance (pid {pid}) runs without a socket the agent can reach: it may move \
                 interrupts back onto kept-free cpus; list them in IRQBALANCE_BANNED_CPULIST \
                 (/etc/default/irqbalance or /etc/sysconfig/irqbalance) and restart it, or run \
                 irqbalance 1.2 or newer with /run/irqbalance visible to cpusetd"
            ),
            IrqbalanceOutcome::Banned {
                pid,
                banned,
                original,
            } => format!(
                "irqbalance (pid {pid}) told to keep interrupts off cpus {banned} (its own \
                 banned cpus: {})",
                or_none(original)
            ),
            IrqbalanceOutcome::Restored { pid, original } => format!(
                "irqbalance (pid {pid}) given its own banned cpus back: {}",
                or_none(original)
            ),
            IrqbalanceOutcome::Forgotten { pid } => {
                format!("irqbalance (pid {pid}) that was told is gone: nothing to restore")
            }
            IrqbalanceOutcome::Failed { pid, error } => {
                format!("cannot tell irqbalance (pid {pid}) which cpus to keep free: {error}")
            }
        })
    }

    /// Whether the log line is a warning (the operator has something to do).
    pub fn is_warning(&self) -> bool {
        matches!(
            self,
            IrqbalanceOutcome::NoSocket { .. } | IrqbalanceOutcome::Failed { .. }
        )
    }
}

fn or_none(cpus: &CpuSet) -> String {
    if cpus.is_empty() {
        "none".to_string()
    } else {
        cpus.to_string()
    }
}

/// The irqbalance daemon of a node, found under the injected roots.
#[derive(Debug)]
pub struct Irqbalance {
    proc_root: PathBuf,
    socket_dir: PathBuf,
    /// An exchange that did not finish in time (a stuck daemon): no other starts meanwhile.
    stuck: Option<JoinHandle<()>>,
    /// The daemon last found running without a socket.
    without_socket: Option<u32>,
}

impl Irqbalance {
    pub fn new(proc_root: &Path) -> Irqbalance {
        Irqbalance {
            proc_root: proc_root.to_path_buf(),
            socket_dir: socket_dir(proc_root),
            stuck: None,
            without_socket: None,
        }
    }

    /// The daemon to talk to: the one told before while its socket is there, else the one
    /// running with a socket. Without one, what to report (a daemon without a socket is
    /// reported as lasting only when seen so twice in a row).
    fn daemon_to_tell(
        &mut self,
        saved: Option<&IrqbalanceSaved>,
    ) -> Result<Daemon, IrqbalanceOutcome> {
        let daemon = match saved {
            Some(told) => {
                let socket = self.socket_dir.join(format!("{DAEMON}{}.sock", told.pid));
                fs::symlink_metadata(&socket).is_ok().then_some(Daemon {
                    pid: told.pid,
                    started: told
                        .started
                        .or_else(|| start_time(&self.proc_root, told.pid)),
                    socket,
                })
            }
            None => find_daemon(&self.proc_root, &self.socket_dir),
        };
        let Some(daemon) = daemon else {
            let running = running_pid(&self.proc_root);
            let seen_before = running.is_some() && self.without_socket == running;
            self.without_socket = running;
            return Err(match running {
                Some(pid) if seen_before => IrqbalanceOutcome::NoSocket { pid },
                Some(pid) => IrqbalanceOutcome::NoSocketYet { pid },
                None => IrqbalanceOutcome::NotRunning,
            });
        };
        self.without_socket = None;
        Ok(daemon)
    }

    /// Nothing to keep free any more: the daemon gets back the ban it had before.
    fn restore_original(
        &mut self,
        daemon: &Daemon,
        saved: &mut Option<IrqbalanceSaved>,
    ) -> IrqbalanceOutcome {
        let pid = daemon.pid;
        let original = saved
            .as_ref()
            .map(|s| s.original.clone())
            .unwrap_or_default();
        match self.exchange(&daemon.socket, ban_command(&original)) {
            Ok(_) => {
                *saved = None;
                IrqbalanceOutcome::Restored { pid, original }
            }
            Err(error) => IrqbalanceOutcome::Failed { pid, error },
        }
    }

    /// Makes the daemon ban its own CPUs plus `keep_free` (empty: only its own, and only if
    /// the agent told it something). `saved` is what was told before; updated.
    pub fn apply(
        &mut self,
        keep_free: &CpuSet,
        saved: &mut Option<IrqbalanceSaved>,
    ) -> IrqbalanceOutcome {
        if keep_free.is_empty() && saved.is_none() {
            return IrqbalanceOutcome::Idle;
        }
        // The daemon that was told forgot only when its process is gone (a socket not found
        // for a moment is no reason to take its ban for its own later).
        if let Some(told) = saved.as_ref() {
            if !is_told_daemon(&self.proc_root, told) {
                let pid = told.pid;
                *saved = None;
                if keep_free.is_empty() {
                    return IrqbalanceOutcome::Forgotten { pid };
                }
            }
        }
        let daemon = match self.daemon_to_tell(saved.as_ref()) {
            Ok(daemon) => daemon,
            Err(outcome) => return outcome,
        };
        let pid = daemon.pid;
        if keep_free.is_empty() {
            return self.restore_original(&daemon, saved);
        }
        let original = match saved.as_ref() {
            Some(told) => told.original.clone(),
            None => match self
                .exchange(&daemon.socket, "setup".to_string())
                .and_then(|answer| parse_setup(&answer))
            {
                Ok(original) => original,
                Err(error) => return IrqbalanceOutcome::Failed { pid, error },
            },
        };
        let banned = original.union(keep_free);
        if saved.as_ref().is_some_and(|told| told.banned == banned) {
            return IrqbalanceOutcome::Unchanged { pid, banned };
        }
        let command = ban_command(&banned);
        if command.len() > MAX_COMMAND {
            return IrqbalanceOutcome::Failed {
                pid,
                error: format!(
                    "the cpu list is longer than the {MAX_COMMAND} bytes irqbalance reads"
                ),
            };
        }
        match self.exchange(&daemon.socket, command) {
            Ok(_) => {
                *saved = Some(IrqbalanceSaved {
                    pid,
                    started: daemon.started,
                    original: original.clone(),
                    banned: banned.clone(),
                });
                IrqbalanceOutcome::Banned {
                    pid,
                    banned,
                    original,
                }
            }
            Err(error) => IrqbalanceOutcome::Failed { pid, error },
        }
    }

    /// Sends one command and reads the answer until the daemon closes the connection (it
    /// closes after each command, so a `settings` command returns once it was taken). Runs on
    /// its own thread: `connect` to a daemon that stopped accepting would block for ever.
    fn exchange(&mut self, socket: &Path, command: String) -> Result<String, String> {
        if let Some(stuck) = self.stuck.take() {
            if !stuck.is_finished() {
                self.stuck = Some(stuck);
                return Err("an earlier request is still unanswered".to_string());
            }
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let socket = socket.to_path_buf();
        let thread = thread::Builder::new()
            .name("irqbalance".into())
            .spawn(move || {
                let _ = tx.send(talk(&socket, &command));
            })
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        match rx.recv_timeout(TIMEOUT + Duration::from_millis(500)) {
            Ok(answer) => {
                let _ = thread.join();
                answer.map_err(|e| e.to_string())
            }
            Err(_) => {
                self.stuck = Some(thread);
                Err(format!("no answer within {}s", TIMEOUT.as_secs()))
            }
        }
    }
}

/// irqbalance told from a thread of its own, so that no exchange with it (a daemon that
/// accepts and never answers holds one for [`TIMEOUT`]) ever waits in the agent's controller.
/// A handle with typed messages, as [`crate::systemd_slices::SlicesWorker`]: the controller
/// sends the CPUs to keep free ([`IrqbalanceWorker::request`]) and goes on; the thread takes
/// every want sent so far (the latest replaces those not yet taken), tells the daemon, says
/// what came of it in the log (each line once) and sends an answer ([`IrqbalanceAnswer`]:
/// what was told and whether that changed), signalling `told` when it did. The controller
/// takes the answers in ([`IrqbalanceWorker::take_answers`]); what was told as the latest
/// answer taken in says ([`IrqbalanceWorker::saved`]) is kept here, for the checkpoint.
#[derive(Debug)]
pub struct IrqbalanceWorker {
    wants: Option<crossbeam_channel::Sender<CpuSet>>,
    answers: crossbeam_channel::Receiver<IrqbalanceAnswer>,
    /// Never sent on: dropped when the worker is, so the thread starts no further exchange.
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// What was told, as the latest answer taken in says (at the start: an earlier run's).
    saved: Option<IrqbalanceSaved>,
    /// Wants sent whose answer is not taken in yet.
    unanswered: usize,
}

/// What the irqbalance thread answers for the wants it took at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqbalanceAnswer {
    /// The CPUs to keep free it acted on: the latest of the wants it took.
    pub keep_free: CpuSet,
    /// How many wants this answers (the older ones were replaced before they were taken).
    pub wants: usize,
    /// What came of it.
    pub outcome: IrqbalanceOutcome,
    /// What was told after it (the checkpoint's).
    pub saved: Option<IrqbalanceSaved>,
    /// Whether `saved` changed with it.
    pub changed: bool,
}

/// How long dropping the worker waits for its thread: one still in an exchange with a
/// daemon that does not answer is left to end by its own [`TIMEOUT`].
const STOP_WAIT: Duration = Duration::from_millis(100);

impl IrqbalanceWorker {
    /// Starts the thread; `saved` is what an earlier run told. `told` gets a message each time
    /// what was told changes (a full channel already says so).
    pub fn start(
        proc_root: &Path,
        saved: Option<IrqbalanceSaved>,
        told: Option<crossbeam_channel::Sender<()>>,
    ) -> IrqbalanceWorker {
        let (wants, wanted) = crossbeam_channel::unbounded::<CpuSet>();
        let (answer, answers) = crossbeam_channel::unbounded::<IrqbalanceAnswer>();
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let irqbalance = Irqbalance::new(proc_root);
        let theirs = saved.clone();
        let thread = thread::Builder::new()
            .name("irqbalance-teller".into())
            .spawn(move || tell(irqbalance, theirs, &wanted, &stopped, &answer, told));
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(e) => {
                log::warn!("cannot start the thread that tells irqbalance: {e}");
                None
            }
        };
        IrqbalanceWorker {
            wants: Some(wants),
            answers,
            stop: Some(stop),
            thread,
            saved,
            unanswered: 0,
        }
    }

    /// Sends the thread the CPUs to keep free (see [`Irqbalance::apply`]); returns at once.
    /// Nothing to keep free, nothing told and no answer still to take in: nothing is sent
    /// (the daemon is not even looked at).
    pub fn request(&mut self, keep_free: &CpuSet) {
        if keep_free.is_empty() && self.saved.is_none() && self.unanswered == 0 {
            return;
        }
        if let Some(wants) = &self.wants {
            // A thread that is gone (or never started) answers nothing: `wait_idle` says so.
            let _ = wants.send(keep_free.clone());
        }
        self.unanswered += 1;
    }

    /// The answers since the last call, in the order they came, taken in: [`Self::saved`]
    /// is what the last of them says.
    pub fn take_answers(&mut self) -> Vec<IrqbalanceAnswer> {
        let answers: Vec<IrqbalanceAnswer> = self.answers.try_iter().collect();
        for answer in &answers {
            self.take_in(answer);
        }
        answers
    }

    fn take_in(&mut self, answer: &IrqbalanceAnswer) {
        self.unanswered = self.unanswered.saturating_sub(answer.wants);
        self.saved = answer.saved.clone();
    }

    /// How many answers wait to be taken in.
    pub fn answered(&self) -> usize {
        self.answers.len()
    }

    /// What was told, as the latest answer taken in says.
    pub fn saved(&self) -> Option<&IrqbalanceSaved> {
        self.saved.as_ref()
    }

    /// Takes answers in until every want sent is answered (or `timeout`); whether it was.
    pub fn wait_idle(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.take_answers();
        while self.unanswered > 0 {
            match self.answers.recv_deadline(deadline) {
                Ok(answer) => self.take_in(&answer),
                // Out of time, or the thread is gone.
                Err(_) => return false,
            }
        }
        true
    }
}

impl Drop for IrqbalanceWorker {
    /// Stops the thread: the wants not yet taken are dropped; one still in an exchange is
    /// waited for [`STOP_WAIT`] at most, then left to end by its own timeout.
    fn drop(&mut self) {
        self.stop.take();
        self.wants.take();
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            match self.answers.recv_deadline(deadline) {
                Ok(_) => continue,
                // Its end of the answers is gone with it: it has ended.
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    let _ = thread.join();
                    return;
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => return,
            }
        }
    }
}

/// The irqbalance thread: tells the daemon each want it takes ([`next_want`]), starting from
/// what an earlier run told (`saved`), and answers; until the worker is dropped.
fn tell(
    mut irqbalance: Irqbalance,
    mut saved: Option<IrqbalanceSaved>,
    wanted: &crossbeam_channel::Receiver<CpuSet>,
    stopped: &crossbeam_channel::Receiver<()>,
    answer: &crossbeam_channel::Sender<IrqbalanceAnswer>,
    told: Option<crossbeam_channel::Sender<()>>,
) {
    let mut said: Option<String> = None;
    while let Some((keep_free, wants)) = next_want(wanted, stopped) {
        let before = saved.clone();
        let outcome = irqbalance.apply(&keep_free, &mut saved);
        if let Some(line) = outcome.describe() {
            if said.as_ref() != Some(&line) {
                if outcome.is_warning() {
                    log::warn!("{line}");
                } else {
                    log::info!("{line}");
                }
                said = Some(line);
            }
        }
        let changed = saved != before;
        let answered = answer.send(IrqbalanceAnswer {
            keep_free,
            wants,
            outcome,
            saved: saved.clone(),
            changed,
        });
        if answered.is_err() {
            return;
        }
        if let (true, Some(told)) = (changed, &told) {
            let _ = told.try_send(());
        }
    }
}

/// The next CPUs to keep free, the latest of every want sent so far, and how many wants that
/// was; waiting for one when none was sent. `None` once the worker is dropped.
fn next_want(
    wanted: &crossbeam_channel::Receiver<CpuSet>,
    stopped: &crossbeam_channel::Receiver<()>,
) -> Option<(CpuSet, usize)> {
    let mut latest = wanted.recv().ok()?;
    let mut wants = 1;
    for newer in wanted.try_iter() {
        latest = newer;
        wants += 1;
    }
    let gone = matches!(
        stopped.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected)
    );
    (!gone).then_some((latest, wants))
}

fn talk(socket: &Path, command: &str) -> io::Result<String> {
    let deadline = Instant::now() + TIMEOUT;
    let mut stream = connect_no_symlink(socket)?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    // One write: the daemon takes what one recvmsg returns.
    stream.write_all(command.as_bytes())?;
    read_answer(&mut stream, deadline)
}

/// Connects to the socket at `socket` itself, never through a symlink planted in its place
/// (that would send the daemon's commands wherever it points): the path is opened with
/// `O_PATH | O_NOFOLLOW`, checked to be a socket, and connected to through that descriptor,
/// so what is checked is what is connected to.
fn connect_no_symlink(socket: &Path) -> io::Result<UnixStream> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_PATH | OFlag::O_NOFOLLOW).bits())
        .open(socket)?;
    let kind = file.metadata()?.file_type();
    if kind.is_symlink() {
        return Err(io::Error::other(format!(
            "{} is a symbolic link, not irqbalance's socket: refused (nothing is sent through a \
             link)",
            socket.display()
        )));
    }
    if !kind.is_socket() {
        return Err(io::Error::other(format!(
            "{} is not a socket: refused",
            socket.display()
        )));
    }
    UnixStream::connect(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The answer, until the daemon closes the connection: at most [`ANSWER_LIMIT`] bytes, by
/// `deadline` (a daemon that trickles bytes does not hold the exchange for ever).
fn read_answer(stream: &mut UnixStream, deadline: Instant) -> io::Result<String> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no whole answer within {}s", TIMEOUT.as_secs()),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if (bytes.len() + n) as u64 > ANSWER_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!(
                    "its answer is larger than the {} limit",
                    crate::bounded::human(ANSWER_LIMIT)
                ),
            ));
        }
        bytes.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `settings cpus <list>`, or `NULL` for none (the daemon's own configuration again).
fn ban_command(cpus: &CpuSet) -> String {
    if cpus.is_empty() {
        "settings cpus NULL".to_string()
    } else {
        format!("settings cpus {cpus}")
    }
}

/// The banned CPUs of a `setup` answer: `SLEEP 10 [IRQ …] BANNED 00000000,00000003`.
pub fn parse_setup(answer: &str) -> Result<CpuSet, String> {
    let mut words = answer.split_whitespace();
    if words.any(|w| w == "BANNED") {
        if let Some(mask) = words.next() {
            return crate::irq::parse_mask(mask)
                .map_err(|e| format!("its answer's banned cpus: {e}"));
        }
    }
    Err(if answer.is_empty() {
        "it closed the connection without an answer (it answers root only)".to_string()
    } else {
        format!(
            "no banned cpu mask in its answer {:?}",
            answer.chars().take(80).collect::<String>()
        )
    })
}

/// `/run/irqbalance` for `/proc`; `<dir>/run/irqbalance` for `<dir>/proc`.
pub fn socket_dir(proc_root: &Path) -> PathBuf {
    proc_root
        .parent()
        .unwrap_or(Path::new("/"))
        .join("run")
        .join(DAEMON)
}

/// A running daemon and its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Daemon {
    pid: u32,
    /// Its start time, when its stat file says.
    started: Option<u64>,
    socket: PathBuf,
}

/// The daemon whose socket is in `socket_dir` and whose process runs (a socket left by one
/// killed with SIGKILL does not count). The lowest pid when several do.
fn find_daemon(proc_root: &Path, socket_dir: &Path) -> Option<Daemon> {
    let mut found: Vec<Daemon> = fs::read_dir(socket_dir)
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid = name
                .to_str()?
                .strip_prefix(DAEMON)?
                .strip_suffix(".sock")?
                .parse::<u32>()
                .ok()?;
            is_daemon(proc_root, pid).then(|| Daemon {
                pid,
                started: start_time(proc_root, pid),
                socket: entry.path(),
            })
        })
        .collect();
    found.sort_by_key(|d| d.pid);
    found.into_iter().next()
}

fn is_daemon(proc_root: &Path, pid: u32) -> bool {
    crate::bounded::read_kernel_file(&proc_root.join(pid.to_string()).join("comm"), 4096)
        .is_ok_and(|comm| comm.trim_end() == DAEMON)
}

/// Whether the daemon that was told still runs: its pid is an irqbalance, started when the
/// told one was (a restart that got the same pid back is another daemon).
fn is_told_daemon(proc_root: &Path, told: &IrqbalanceSaved) -> bool {
    if !is_daemon(proc_root, told.pid) {
        return false;
    }
    match (told.started, start_time(proc_root, told.pid)) {
        (Some(then), Some(now)) => then == now,
        _ => true,
    }
}

/// The start time of process `pid` (`<proc root>/<pid>/stat` field 22), if it can be read.
fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat =
        crate::bounded::read_kernel_file(&proc_root.join(pid.to_string()).join("stat"), 4096)
            .ok()?;
    parse_start_time(&stat).ok()
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line. The second field, the command in
/// parentheses, may hold spaces and parentheses itself: fields are counted after its last `)`.
pub fn parse_start_time(stat: &str) -> Result<u64, String> {
    let after = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .ok_or_else(|| "no command in parentheses in the stat line".to_string())?;
    // Field 3 (the state) is the first after the command; field 22 the 20th.
    let field = after
        .split_ascii_whitespace()
        .nth(19)
        .ok_or_else(|| "the stat line has fewer than 22 fields".to_string())?;
    field.parse::<u64>().map_err(|_| {
        format!(
            "start time {:?} is not a number",
            field.chars().take(40).collect::<String>()
        )
    })
}

/// The pid of a running irqbalance process, socket or not.
fn running_pid(proc_root: &Path) -> Option<u32> {
    fs::read_dir(proc_root)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| is_daemon(proc_root, *pid))
        .min()
}

/// What `status` says about irqbalance: what was told (`saved`, from the checkpoint) and, when
/// CPUs are kept free and nothing was told, why (looked up now, read-only).
pub fn status_note(
    proc_root: &Path,
    keep_free: &CpuSet,
    saved: Option<&IrqbalanceSaved>,
) -> Option<String> {
    if let Some(told) = saved {
        return Some(format!(
            "irqbalance (pid {}) told to keep interrupts off cpus {} (its own banned cpus: {})",
            told.pid,
            told.banned,
            or_none(&told.original)
        ));
    }
    if keep_free.is_empty() {
        return None;
    }
    let socket_dir = socket_dir(proc_root);
    Some(
        match (find_daemon(proc_root, &socket_dir), running_pid(proc_root)) {
            (Some(d), _) => format!(
                "irqbalance (pid {}) not told yet (see the agent log)",
                d.pid
            ),
            (None, Some(pid)) => format!(
            "irqbalance (pid {pid}) runs without a socket under {}: not told (see the agent log)",
            socket_dir.display()
        ),
            (None, None) => "irqbalance is not running".to_string(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::{Arc, Mutex};

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    /// An irqbalance stand-in under `<root>/proc` and `<root>/run/irqbalance`: answers `setup`
    /// with its banned mask, takes `settings cpus`, records every command, closes after each.
    struct FakeDaemon {
        commands: Arc<Mutex<Vec<String>>>,
    }

    impl FakeDaemon {
        fn start(root: &Path, pid: u32, own: &str, answers: bool) -> FakeDaemon {
            FakeDaemon::start_slow(root, pid, own, answers, Duration::ZERO)
        }

        /// As [`FakeDaemon::start`], each command read `delay` after its connection.
        fn start_slow(
            root: &Path,
            pid: u32,
            own: &str,
            answers: bool,
            delay: Duration,
        ) -> FakeDaemon {
            run_process(root, pid);
            let dir = root.join("run/irqbalance");
            fs::create_dir_all(&dir).unwrap();
            let listener = UnixListener::bind(dir.join(format!("irqbalance{pid}.sock"))).unwrap();
            let commands = Arc::new(Mutex::new(Vec::new()));
            let seen = commands.clone();
            let own = set(own);
            thread::spawn(move || {
                let mut banned = own.clone();
                for stream in listener.incoming() {
                    let mut stream = stream.unwrap();
                    thread::sleep(delay);
                    let mut buf = [0u8; 500];
                    let n = stream.read(&mut buf).unwrap();
                    let command = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if !answers {
                        continue;
                    }
                    if command == "setup" {
                        let mask = crate::irq::format_mask(&banned, "00000000");
                        let _ = stream.write_all(format!("SLEEP 10 BANNED {mask}").as_bytes());
                    } else if let Some(list) = command.strip_prefix("settings cpus ") {
                        banned = if list == "NULL" {
                            own.clone()
                        } else {
                            set(list)
                        };
                    }
                    seen.lock().unwrap().push(command);
                }
            });
            FakeDaemon { commands }
        }

        fn commands(&self) -> Vec<String> {
            self.commands.lock().unwrap().clone()
        }
    }

    fn run_process(root: &Path, pid: u32) {
        let dir = root.join(format!("proc/{pid}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("comm"), "irqbalance\n").unwrap();
    }

    fn proc_of(root: &tempfile::TempDir) -> PathBuf {
        let proc = root.path().join("proc");
        fs::create_dir_all(&proc).unwrap();
        proc
    }

    fn started_at(root: &Path, pid: u32, ticks: u64) {
        let stat = format!(
            "{pid} (irqbalance) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 2 0 {ticks} 0 0\n"
        );
        fs::write(root.join(format!("proc/{pid}/stat")), stat).unwrap();
    }

    /// Issue 23 item 10: `irqbalance<pid>.sock` a symlink to another socket got `setup` and
    /// `settings cpus …` sent through it.
    #[test]
    fn a_socket_that_is_a_symlink_is_refused_and_told_nothing() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let elsewhere = FakeDaemon::start(root.path(), 60, "", true);
        let dir = root.path().join("run/irqbalance");
        let target = root.path().join("elsewhere.sock");
        fs::rename(dir.join("irqbalance60.sock"), &target).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("irqbalance60.sock")).unwrap();
        let mut saved = None;
        let outcome = Irqbalance::new(&proc).apply(&set("1"), &mut saved);
        assert!(
            matches!(&outcome, IrqbalanceOutcome::Failed { pid: 60, error } if error.contains("is a symbolic link")),
            "{outcome:?}"
        );
        assert!(outcome.is_warning());
        assert_eq!(elsewhere.commands(), Vec::<String>::new());
        assert_eq!(saved, None);
    }

    /// Issue 23 item 11: a daemon restarted with the same pid (it forgot what it was told)
    /// was never told, and on release got the old daemon's set.
    #[test]
    fn a_daemon_restarted_with_the_same_pid_is_told_afresh() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let old = FakeDaemon::start(root.path(), 4242, "", true);
        started_at(root.path(), 4242, 1000);
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;
        irqbalance.apply(&set("2-3"), &mut saved);
        assert_eq!(old.commands(), ["setup", "settings cpus 2-3"]);
        // Restarted, with the same pid (pid namespaces, a small pid_max) and a ban of its own.
        fs::remove_file(root.path().join("run/irqbalance/irqbalance4242.sock")).unwrap();
        let new = FakeDaemon::start(root.path(), 4242, "5", true);
        started_at(root.path(), 4242, 2000);
        assert_eq!(
            irqbalance.apply(&set("2-3"), &mut saved),
            IrqbalanceOutcome::Banned {
                pid: 4242,
                banned: set("2-3,5"),
                original: set("5")
            }
        );
        irqbalance.apply(&CpuSet::new(), &mut saved);
        assert_eq!(
            new.commands(),
            ["setup", "settings cpus 2-3,5", "settings cpus 5"]
        );
        assert_eq!(old.commands().len(), 2);
    }

    #[test]
    fn the_start_time_is_field_22_whatever_the_command() {
        let line = "7 (a) b (c)) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0";
        assert_eq!(parse_start_time(line), Ok(99));
        assert!(parse_start_time("7 (a) S 1").is_err());
        assert!(parse_start_time("no parens").is_err());
    }

    /// Issue 23 item 7: a 1.5 GB answer was read whole (VmHWM 1.58 GB).
    #[test]
    fn an_endless_answer_is_cut_at_its_limit() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        run_process(root.path(), 12);
        let dir = root.path().join("run/irqbalance");
        fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("irqbalance12.sock")).unwrap();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut buf = [0u8; 500];
                let _ = stream.read(&mut buf);
                // 8 MiB of words, then the mask: an answer eight times the limit.
                let chunk = "IRQ 1 LOAD 0 DIFF 0 CLASS 0 ".repeat(1 << 10);
                for _ in 0..(8 << 20) / chunk.len() {
                    if stream.write_all(chunk.as_bytes()).is_err() {
                        break;
                    }
                }
                let _ = stream.write_all(b"BANNED 00000001");
            }
        });
        let mut saved = None;
        let outcome = Irqbalance::new(&proc).apply(&set("1"), &mut saved);
        assert!(
            matches!(&outcome, IrqbalanceOutcome::Failed { pid: 12, error } if error.contains("its answer is larger than the 1 MiB limit")),
            "{:?}",
            outcome
                .describe()
                .map(|l| l.chars().take(200).collect::<String>())
        );
        assert_eq!(saved, None);
    }

    #[test]
    fn the_socket_directory_sits_beside_the_proc_root() {
        assert_eq!(socket_dir(Path::new("/proc")), Path::new("/run/irqbalance"));
        assert_eq!(
            socket_dir(Path::new("/host/proc")),
            Path::new("/host/run/irqbalance")
        );
    }

    #[test]
    fn setup_answers_give_the_banned_cpus() {
        assert_eq!(parse_setup("SLEEP 10 BANNED 00000000"), Ok(CpuSet::new()));
        assert_eq!(
            parse_setup("SLEEP 10 IRQ 24 LOAD 0 DIFF 0 CLASS 0 BANNED 00000000,0000000c"),
            Ok(set("2-3"))
        );
        assert!(parse_setup("").unwrap_err().contains("root only"));
        assert!(parse_setup("SLEEP 10").unwrap_err().contains("no banned"));
        // Issue 23 item 3: a cpu past the largest id panicked (`cpu id 8192 out of range`).
        let past = format!("SLEEP 10 BANNED 1{}", "0".repeat(2048));
        let err = parse_setup(&past).unwrap_err();
        assert!(
            err.contains("cpu 8192, past the largest cpu id 8191"),
            "{err}"
        );
    }

    #[test]
    fn the_daemon_bans_its_own_cpus_plus_the_kept_free_ones_and_gets_its_own_back() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let daemon = FakeDaemon::start(root.path(), 4242, "0", true);
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;

        let outcome = irqbalance.apply(&set("2-3"), &mut saved);
        assert_eq!(
            outcome,
            IrqbalanceOutcome::Banned {
                pid: 4242,
                banned: set("0,2-3"),
                original: set("0")
            }
        );
        assert_eq!(daemon.commands(), ["setup", "settings cpus 0,2-3"]);
        // Nothing new: nothing sent.
        assert_eq!(
            irqbalance.apply(&set("2-3"), &mut saved),
            IrqbalanceOutcome::Unchanged {
                pid: 4242,
                banned: set("0,2-3")
            }
        );
        assert_eq!(daemon.commands().len(), 2);
        // A narrower set, then none: its own banned cpu stays banned throughout.
        irqbalance.apply(&set("3"), &mut saved);
        let outcome = irqbalance.apply(&CpuSet::new(), &mut saved);
        assert_eq!(
            outcome,
            IrqbalanceOutcome::Restored {
                pid: 4242,
                original: set("0")
            }
        );
        assert_eq!(
            daemon.commands(),
            [
                "setup",
                "settings cpus 0,2-3",
                "settings cpus 0,3",
                "settings cpus 0"
            ]
        );
        assert_eq!(saved, None);
        // Nothing kept free, nothing told: the daemon is not even asked.
        assert_eq!(
            irqbalance.apply(&CpuSet::new(), &mut saved),
            IrqbalanceOutcome::Idle
        );
        assert_eq!(daemon.commands().len(), 4);
    }

    #[test]
    fn a_daemon_with_no_banned_cpus_of_its_own_goes_back_to_its_configuration() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let daemon = FakeDaemon::start(root.path(), 7, "", true);
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;
        irqbalance.apply(&set("1"), &mut saved);
        irqbalance.apply(&CpuSet::new(), &mut saved);
        assert_eq!(
            daemon.commands(),
            ["setup", "settings cpus 1", "settings cpus NULL"]
        );
    }

    #[test]
    fn a_restarted_agent_keeps_the_daemons_own_set_from_the_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let daemon = FakeDaemon::start(root.path(), 4242, "5", true);
        let mut saved = None;
        Irqbalance::new(&proc).apply(&set("2"), &mut saved);
        let json = serde_json::to_string(&saved).unwrap();

        // The daemon now bans 2,5; a new agent must not take that for its own set.
        let mut saved: Option<IrqbalanceSaved> = serde_json::from_str(&json).unwrap();
        let mut irqbalance = Irqbalance::new(&proc);
        assert!(matches!(
            irqbalance.apply(&set("2"), &mut saved),
            IrqbalanceOutcome::Unchanged { .. }
        ));
        irqbalance.apply(&CpuSet::new(), &mut saved);
        assert_eq!(
            daemon.commands(),
            ["setup", "settings cpus 2,5", "settings cpus 5"]
        );
    }

    #[test]
    fn a_restarted_daemon_forgot_and_is_told_afresh() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let old = FakeDaemon::start(root.path(), 100, "", true);
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;
        irqbalance.apply(&set("1"), &mut saved);
        assert_eq!(old.commands(), ["setup", "settings cpus 1"]);
        // Killed with SIGKILL: its socket file stays, its process does not.
        fs::remove_dir_all(proc.join("100")).unwrap();
        let new = FakeDaemon::start(root.path(), 200, "3", true);
        assert_eq!(
            irqbalance.apply(&set("1"), &mut saved),
            IrqbalanceOutcome::Banned {
                pid: 200,
                banned: set("1,3"),
                original: set("3")
            }
        );
        assert_eq!(new.commands(), ["setup", "settings cpus 1,3"]);
        // And gone too: nothing to restore, nothing sent anywhere.
        fs::remove_dir_all(proc.join("200")).unwrap();
        assert_eq!(
            irqbalance.apply(&CpuSet::new(), &mut saved),
            IrqbalanceOutcome::Forgotten { pid: 200 }
        );
        assert_eq!(saved, None);
        assert_eq!(old.commands().len() + new.commands().len(), 4);
    }

    #[test]
    fn a_told_daemon_whose_socket_is_missing_for_a_while_is_not_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let daemon = FakeDaemon::start(root.path(), 50, "0", true);
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;
        irqbalance.apply(&set("2"), &mut saved);
        let socket = root.path().join("run/irqbalance/irqbalance50.sock");
        let aside = root.path().join("run/aside.sock");
        fs::rename(&socket, &aside).unwrap();
        assert!(matches!(
            irqbalance.apply(&set("2"), &mut saved),
            IrqbalanceOutcome::NoSocketYet { pid: 50 }
        ));
        assert!(saved.is_some(), "still told");
        fs::rename(&aside, &socket).unwrap();
        // Back: its own set is still the recorded one, not what it bans now (0,2).
        irqbalance.apply(&CpuSet::new(), &mut saved);
        assert_eq!(
            daemon.commands(),
            ["setup", "settings cpus 0,2", "settings cpus 0"]
        );
    }

    #[test]
    fn no_daemon_or_no_socket_is_said_and_nothing_recorded() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;
        let outcome = irqbalance.apply(&set("1"), &mut saved);
        assert_eq!(outcome, IrqbalanceOutcome::NotRunning);
        assert!(!outcome.is_warning());
        run_process(root.path(), 31);
        // Once: it may be starting. Twice: it has none.
        let outcome = irqbalance.apply(&set("1"), &mut saved);
        assert_eq!(outcome, IrqbalanceOutcome::NoSocketYet { pid: 31 });
        assert_eq!(outcome.describe(), None);
        let outcome = irqbalance.apply(&set("1"), &mut saved);
        assert_eq!(outcome, IrqbalanceOutcome::NoSocket { pid: 31 });
        assert!(outcome.is_warning());
        assert!(outcome
            .describe()
            .unwrap()
            .contains("IRQBALANCE_BANNED_CPULIST"));
        assert_eq!(saved, None);
    }

    #[test]
    fn a_daemon_that_refuses_leaves_nothing_recorded() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        // Closes without an answer, as irqbalance does for a caller that is not root.
        let _daemon = FakeDaemon::start(root.path(), 9, "", false);
        let mut saved = None;
        let outcome = Irqbalance::new(&proc).apply(&set("1"), &mut saved);
        assert!(
            matches!(&outcome, IrqbalanceOutcome::Failed { pid: 9, error } if error.contains("root only")),
            "{outcome:?}"
        );
        assert_eq!(saved, None);
    }

    #[test]
    fn a_daemon_that_never_answers_does_not_block_the_caller() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        run_process(root.path(), 11);
        let dir = root.path().join("run/irqbalance");
        fs::create_dir_all(&dir).unwrap();
        // Bound and listening, never accepting, never answering.
        let _listener = UnixListener::bind(dir.join("irqbalance11.sock")).unwrap();
        let mut irqbalance = Irqbalance::new(&proc);
        let mut saved = None;
        let started = Instant::now();
        let outcome = irqbalance.apply(&set("1"), &mut saved);
        assert!(
            matches!(&outcome, IrqbalanceOutcome::Failed { pid: 11, .. }),
            "{outcome:?}"
        );
        assert!(started.elapsed() < TIMEOUT * 2, "{:?}", started.elapsed());
        assert_eq!(saved, None);
    }

    /// Waits (10 s at most) until `until` holds.
    fn wait_for(mut until: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !until() {
            assert!(Instant::now() < deadline, "not within 10 s");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// One exchange at a time, with the latest want: one not yet taken is replaced by a
    /// newer (the daemon never hears of it), and one answer says so for both.
    #[test]
    fn a_newer_want_replaces_one_not_yet_taken() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let slow = Duration::from_millis(500);
        let daemon = FakeDaemon::start_slow(root.path(), 77, "0", true, slow);
        let mut worker = IrqbalanceWorker::start(&proc, None, None);
        worker.request(&set("1"));
        // Taken: the thread is in its exchanges for cpu 1 (one more to go, half a second).
        wait_for(|| !daemon.commands().is_empty());
        worker.request(&set("2"));
        worker.request(&set("2-3"));
        wait_for(|| worker.answered() == 2);
        let answers: Vec<(CpuSet, usize, bool)> = worker
            .take_answers()
            .into_iter()
            .map(|a| (a.keep_free, a.wants, a.changed))
            .collect();
        assert_eq!(answers, [(set("1"), 1, true), (set("2-3"), 2, true)]);
        assert_eq!(
            daemon.commands(),
            ["setup", "settings cpus 0-1", "settings cpus 0,2-3"]
        );
        assert_eq!(worker.saved().map(|s| s.banned.clone()), Some(set("0,2-3")));
        assert!(worker.wait_idle(Duration::ZERO), "every want answered");
    }

    /// What the thread told reaches the handle as an answer on its channel: `saved` (the
    /// checkpoint's) changes only once it is taken in, `told` is signalled only when what was
    /// told changed, and with nothing to keep free and nothing told nothing is sent.
    #[test]
    fn answers_come_through_the_channel_and_change_saved_only_once_taken_in() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        let daemon = FakeDaemon::start(root.path(), 88, "5", true);
        let (done, told) = crossbeam_channel::bounded(1);
        let mut worker = IrqbalanceWorker::start(&proc, None, Some(done));
        worker.request(&set("2"));
        told.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(worker.answered(), 1);
        assert_eq!(worker.saved(), None, "not taken in yet");
        let answers = worker.take_answers();
        let expected = IrqbalanceSaved {
            pid: 88,
            started: None,
            original: set("5"),
            banned: set("2,5"),
        };
        assert_eq!(answers.len(), 1);
        assert!(answers[0].changed);
        assert_eq!(answers[0].saved.as_ref(), Some(&expected));
        assert!(matches!(
            answers[0].outcome,
            IrqbalanceOutcome::Banned { .. }
        ));
        assert_eq!(worker.saved(), Some(&expected));
        // The same again: answered, unchanged, not signalled.
        worker.request(&set("2"));
        assert!(worker.wait_idle(Duration::from_secs(10)));
        assert!(told.try_recv().is_err());
        assert_eq!(worker.saved(), Some(&expected));
        // None to keep free: its own back, signalled.
        worker.request(&CpuSet::new());
        told.recv_timeout(Duration::from_secs(10)).unwrap();
        let answers = worker.take_answers();
        assert!(
            matches!(
                answers.as_slice(),
                [IrqbalanceAnswer {
                    saved: None,
                    changed: true,
                    outcome: IrqbalanceOutcome::Restored { pid: 88, .. },
                    ..
                }]
            ),
            "{answers:?}"
        );
        assert_eq!(worker.saved(), None);
        // Nothing to keep free, nothing told, nothing in flight: nothing sent.
        worker.request(&CpuSet::new());
        assert!(worker.wait_idle(Duration::ZERO));
        thread::sleep(Duration::from_millis(50));
        assert_eq!(worker.answered(), 0);
        assert_eq!(
            daemon.commands(),
            ["setup", "settings cpus 2,5", "settings cpus 5"]
        );
    }

    /// A daemon that accepts and never answers holds the thread (until [`TIMEOUT`]), never the
    /// caller: `request` returns at once, a newer want too, and dropping the worker waits
    /// [`STOP_WAIT`] at most.
    #[test]
    fn a_daemon_that_never_answers_holds_neither_request_nor_drop() {
        let root = tempfile::tempdir().unwrap();
        let proc = proc_of(&root);
        run_process(root.path(), 13);
        let dir = root.path().join("run/irqbalance");
        fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("irqbalance13.sock")).unwrap();
        let (accepted, held) = crossbeam_channel::unbounded();
        thread::spawn(move || {
            for stream in listener.incoming() {
                // Held open, never read from nor answered.
                let _ = accepted.send(stream);
            }
        });
        let mut worker = IrqbalanceWorker::start(&proc, None, None);
        let started = Instant::now();
        worker.request(&set("1"));
        let requested = started.elapsed();
        let _stalled = held.recv_timeout(Duration::from_secs(10)).unwrap();
        let started = Instant::now();
        worker.request(&set("1-2"));
        let again = started.elapsed();
        assert!(!worker.wait_idle(Duration::from_millis(50)));
        assert_eq!(worker.saved(), None);
        let started = Instant::now();
        drop(worker);
        let dropped = started.elapsed();
        // Far below the exchange's TIMEOUT, which is what a wait for the thread would take.
        let bound = Duration::from_millis(500);
        assert!(
            requested < bound && again < bound && dropped < bound,
            "request {requested:?}, again {again:?}, drop {dropped:?}"
        );
    }
}
