//! The long-running agent (`cpusetd run`): threads, channels and the controller loop
//! (DESIGN.md §1 and §6).
//!
//! ```text
//!  watcher thread ── TreeEvent ──────────────┐ (+ an arrivals token: see `watcher::Arrivals`)
//!  reconcile thread ── ReconcileTick ────────┤ ◄── ReconcileRequest (bounded(1) each way)
//!  signal thread ── Control ─────────────────┤
//!  persist thread ── PersistReply ───────────┴──► controller loop (the one writer)
//!        ▲                                              │
//!        └──────── PersistRequest (a snapshot per burst) ┘
//! ```
//!
//! Only the controller mutates state or writes cgroupfs; the others observe and send typed
//! messages on bounded channels, and the persist and reconcile threads are handles
//! ([`persist::Persister`], [`reconciler::Reconciler`]: the join handle, a sender of typed
//! requests, a receiver of typed replies). Nothing else is shared between them: no atomics,
//! no locks. Start-up: lock the state dir, load the checkpoint (names and intent; the live
//! tree wins), full scan, first pass, checkpoint (written on this thread before `READY=1`),
//! `READY=1`. Later checkpoints and metrics files are written by the persist thread, once per
//! burst of events, so a cgroup write never waits for an `fsync`. Shutdown on SIGTERM/SIGINT:
//! finish the current pass and the owed writes, join the persist thread, write the last
//! checkpoint on this thread, exit 0. SIGHUP: reconcile now.

mod controller;
pub(crate) mod deadlines;
mod hotplug;
pub(crate) mod http;
pub mod metrics;
pub(crate) mod model;
mod notify;
mod persist;
mod reconciler;
pub(crate) mod said;
mod wait;

pub use controller::{Controller, ControllerParts, PassOutcome, ReconcileScan};
pub use hotplug::Hotplug;
pub use notify::Notifier;
pub use wait::{wait_for_change, Waited};

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use nix::sys::signal::{SigSet, Signal};

use crate::allocator::PolicyOptions;
use crate::cgroupfs::{CgroupLayout, Scanner};
use crate::checkpoint::{self, LoadOutcome, Policy, StateLock};
use crate::logging::error_chain;
use crate::watcher::{Arrivals, TreeEvent, WatchRoot, Watcher, WatcherHandle};
use persist::{PersistTargets, Persister};
use reconciler::{ReconcileTick, Reconciler};

/// Capacity of the watcher → controller channel: as many events as the kernel's default
/// inotify queue (`max_queued_events`). A pass that rewrites the shared pool on a full node
/// makes thousands of writes, each echoed by an `IN_MODIFY`; a smaller channel overflowed into
/// a full rescan. (The buffer is allocated up front: 16,384 × 32-byte events, 512 KiB.)
const EVENT_QUEUE: usize = 16384;

/// How long a stop waits, at most, for the effects' threads to answer what they were asked
/// (see [`Controller::settle_effects`]): longer than one irqbalance exchange may take
/// (`irqbalance::TIMEOUT`), far shorter than systemd's stop timeout.
const EFFECTS_SETTLE_AT_STOP: Duration = Duration::from_secs(3);

/// Everything `run` needs, built by the command line.
#[derive(Debug)]
pub struct AgentConfig {
    pub layout: CgroupLayout,
    pub parts: ControllerParts,
    pub options: PolicyOptions,
    pub state_dir: PathBuf,
    pub reconcile_period: Duration,
    pub metrics_file: Option<PathBuf>,
    /// `--metrics-bind-address`: where `/metrics` is served over HTTP (off when `None`).
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// kubelet's `cpu_manager_state`, read on a first start (no checkpoint of our own).
    pub kubelet_state: Option<PathBuf>,
    /// Where procfs is (`/proc/irq` for interrupt affinities).
    pub proc_root: PathBuf,
    /// Where sysfs is (each cpu's `power/` and `cpufreq/` files).
    pub sysfs_root: PathBuf,
    /// `--isolate-host`: the CPUs host cgroups are confined to while a pod asks for
    /// `cpu-load-balancing.crio.io` (the reserved ones); `None`: they are left alone.
    pub isolate_host: Option<crate::cpuset::CpuSet>,
    /// Where the projection files are kept, and whether for every pod (`--project-all`).
    pub projection_dir: PathBuf,
    pub project_all: bool,
    /// Where the topology is read again when cpus go offline or come online.
    pub hotplug: Hotplug,
    /// sd_notify, already used while waiting for kubepods.
    pub notifier: Notifier,
    /// Where kubelet's PodResources API is served (`None`: not served).
    pub pod_resources: Option<PodResourcesConfig>,
}

/// `--pod-resources-socket` and `--kubelet-pod-resources-socket`.
#[derive(Debug, Clone)]
pub struct PodResourcesConfig {
    /// cpusetd's socket.
    pub socket: PathBuf,
    /// kubelet's, asked for devices, memory and the pod list (`None`: never asked).
    pub kubelet: Option<PathBuf>,
}

/// Why the agent stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Lock(#[from] checkpoint::LockError),
    #[error("cannot watch the kubepods cgroups")]
    Watcher(#[source] crate::watcher::WatchError),
    #[error("cannot scan the kubepods cgroup at start")]
    FirstScan(#[source] crate::cgroupfs::CgroupError),
    #[error("cannot block signals for the signal thread")]
    Signals(#[source] nix::Error),
    #[error("cannot serve the PodResources API")]
    PodResources(#[source] crate::podresources::ServeError),
    #[error("the {0} thread stopped unexpectedly")]
    ThreadGone(&'static str),
    #[error("--metrics-bind-address")]
    MetricsBind(#[source] http::BindError),
}

/// Messages from the signal thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Stop(Signal),
    Reconcile,
}

/// Runs the agent until SIGTERM/SIGINT.
pub fn run(config: AgentConfig) -> Result<(), AgentError> {
    // Before the agent's threads allocate.
    one_malloc_arena();
    // Signals first, so every thread spawned below inherits the blocked mask.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().map_err(AgentError::Signals)?;

    let _lock = StateLock::acquire(&config.state_dir)?;
    // Bound before the first scan, so an address that cannot be served stops the agent at
    // once; answered with 503 until the first pass publishes its metrics.
    let served = Arc::new(http::MetricsSnapshot::default());
    if let Some(addr) = config.metrics_bind {
        let bound = http::serve(addr, Arc::clone(&served)).map_err(AgentError::MetricsBind)?;
        log::info!("metrics served at http://{bound}/metrics");
    }
    let (control_tx, control) = bounded::<Control>(4);
    let (mut agent, threads) = Agent::start(config, served, control)?;
    spawn_signal_thread(signals, control_tx);
    let result = agent.run_loop();
    agent.finish(threads);
    result
}

/// The controller loop and the handles it talks to.
struct Agent {
    controller: Controller,
    events: Receiver<TreeEvent>,
    persist: Persister,
    reconciler: Reconciler,
    control: Receiver<Control>,
    /// The watcher's arrival tokens, forgotten each time the event channel is drained (see
    /// [`forget`]): a token left means an event waits, and a pass's long rewrite stops for it.
    arrivals: Option<Arrivals>,
    /// Effects that wait on something outside the kernel do so on a thread of their own
    /// (irqbalance's socket, systemd's `systemctl`: nothing on the way to a pin waits for
    /// them), which says here when it has something new, taken in by `sync_effects`.
    effect_done: Receiver<()>,
    notifier: Notifier,
    /// systemd's watchdog: half its period, and the next ping.
    watchdog: Option<(Duration, Instant)>,
}

/// What `run` stops when the loop ends, besides the handles the loop uses.
struct Threads {
    watcher: Option<WatcherHandle>,
    pod_resources: Option<crate::podresources::PodResourcesServer>,
    /// Kept here, so the event channel never reads as closed without a watcher, nor the
    /// effects' channel were their threads gone.
    _senders: (Option<Sender<TreeEvent>>, Sender<()>),
}

/// The parts of [`AgentConfig`] that build the controller's host effects.
struct HostConfig {
    proc_root: PathBuf,
    sysfs_root: PathBuf,
    isolate_host: Option<crate::cpuset::CpuSet>,
    projection_dir: PathBuf,
    project_all: bool,
    hotplug: Hotplug,
}

impl Agent {
    /// Everything up to `READY=1`: the controller and its first pass, the watcher, the first
    /// checkpoint, the reconcile thread.
    fn start(
        config: AgentConfig,
        served: Arc<http::MetricsSnapshot>,
        control: Receiver<Control>,
    ) -> Result<(Agent, Threads), AgentError> {
        let host = HostConfig {
            proc_root: config.proc_root,
            sysfs_root: config.sysfs_root,
            isolate_host: config.isolate_host,
            projection_dir: config.projection_dir,
            project_all: config.project_all,
            hotplug: config.hotplug,
        };
        let restored = restore(&config.state_dir, &config.parts, &config.options);
        let kubelet_state = config.kubelet_state.filter(|_| restored.first_start);
        let scanner = Scanner::new(
            config.parts.hierarchy.clone(),
            config.layout.kubepods.clone(),
        );
        // Watch before the first scan, so nothing created in between is missed.
        let mut watcher = open_watcher(&config.layout, config.reconcile_period)?;
        let (done_tx, effect_done) = bounded::<()>(1);
        let mut controller = build_controller(
            config.parts,
            restored,
            &config.state_dir,
            host,
            done_tx.clone(),
        );
        controller.metrics.without_inotify = watcher.is_none();
        let arrivals = watcher.as_mut().map(Watcher::arrivals);
        if let Some(arrivals) = &arrivals {
            controller.watch_arrivals(arrivals.clone());
        }
        first_pass(&mut controller, kubelet_state.as_deref())?;
        let every_tick_full = watcher.is_none();
        let (event_tx, events) = bounded::<TreeEvent>(EVENT_QUEUE);
        let (watcher, idle_events) = match watcher {
            Some(w) => (Some(w.start(event_tx).map_err(AgentError::Watcher)?), None),
            None => (None, Some(event_tx)),
        };
        let targets = PersistTargets {
            state_dir: config.state_dir,
            options: config.options,
            metrics_file: config.metrics_file,
            served,
            published: None,
        };
        let (persist, pod_resources) = start_persist(&controller, targets, config.pod_resources)?;
        let agent = Agent {
            controller,
            events,
            persist,
            reconciler: Reconciler::spawn(scanner, config.reconcile_period, every_tick_full),
            control,
            arrivals,
            effect_done,
            notifier: config.notifier,
            watchdog: None,
        };
        let threads = Threads {
            watcher,
            pod_resources,
            _senders: (idle_events, done_tx),
        };
        Ok((agent.ready(), threads))
    }

    /// After the first pass's writes and its checkpoint: the projection files, `READY=1`.
    fn ready(mut self) -> Agent {
        // The watcher is started, but its events wait: the first files are written in full.
        self.controller.update_projections(Instant::now(), || false);
        release_free_memory();
        self.notifier.send(&[sd_notify::NotifyState::Ready]);
        notify_status(&mut self.notifier, &self.controller);
        self.watchdog = sd_notify::watchdog_enabled().map(|d| (d / 2, Instant::now() + d / 2));
        self
    }

    /// Takes messages until told to stop or a thread is gone.
    fn run_loop(&mut self) -> Result<(), AgentError> {
        // Clones of the receivers (cheap), so the arms can borrow `self` mutably.
        let (events, control) = (self.events.clone(), self.control.clone());
        let ticks = self.reconciler.ticks().clone();
        let (replies, effect_done) = (self.persist.replies().clone(), self.effect_done.clone());
        loop {
            let wake = self.wake_in();
            select! {
                recv(events) -> event => {
                    let Ok(event) = event else { return Err(AgentError::ThreadGone("watcher")) };
                    self.on_events(event);
                }
                recv(ticks) -> tick => {
                    let Ok(tick) = tick else { return Err(AgentError::ThreadGone("reconcile")) };
                    self.on_tick(tick);
                }
                recv(effect_done) -> _ => {
                    let changed = self.controller.sync_effects();
                    self.persist.owe(changed);
                }
                recv(replies) -> reply => {
                    let Ok(reply) = reply else { return Err(AgentError::ThreadGone("persist")) };
                    self.persist.on_reply(reply);
                }
                recv(control) -> control => match control {
                    Ok(Control::Stop(signal)) => {
                        self.stopping(signal);
                        return Ok(());
                    }
                    Ok(Control::Reconcile) => self.on_sighup(),
                    Err(_) => return Err(AgentError::ThreadGone("signal")),
                },
                default(wake) => {}
            }
            self.after_wake();
        }
    }

    /// How long the loop may sleep: until the next deadline, watchdog ping or projection.
    fn wake_in(&self) -> Duration {
        let now = Instant::now();
        [
            self.controller.next_deadline(),
            self.watchdog.map(|(_, next)| next),
            self.controller.projections_due(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.saturating_duration_since(now))
        .unwrap_or(Duration::from_secs(3600))
    }

    /// A watcher event and every one queued behind it: one pass.
    fn on_events(&mut self, event: TreeEvent) {
        let now = Instant::now();
        // The arrivals first: a token sent from now on is for an event not taken here.
        forget(self.arrivals.as_ref());
        let mut changed = apply(&mut self.controller, event, now);
        // Coalesce whatever else is queued into the same pass.
        changed |= apply_queued(&mut self.controller, &self.events, now);
        if changed {
            let outcome = self.controller.pass(now);
            self.persist.owe(outcome.assignments_changed);
            notify_status(&mut self.notifier, &self.controller);
        }
    }

    fn on_tick(&mut self, tick: ReconcileTick) {
        match tick {
            ReconcileTick::Full(scan) => {
                let started = scan.started;
                self.controller.reconcile(scan, Instant::now());
                release_free_memory();
                self.reconciled(started);
                self.persist.owe(true);
                notify_status(&mut self.notifier, &self.controller);
            }
            ReconcileTick::Unchanged { started } => {
                if self.controller.online_cpus_changed() | self.controller.limits_moved() {
                    // The pools changed with them: the checkpoint says so (for `status`).
                    self.controller.pass(Instant::now());
                    self.persist.owe(true);
                }
                let irqs_changed = self.controller.refresh_effects();
                self.reconciled(started);
                self.controller.metrics.quiet_reconciles += 1;
                self.persist.owe(irqs_changed);
            }
        }
    }

    /// A reconcile that started at `started` is done.
    fn reconciled(&mut self, started: Instant) {
        self.controller.metrics.reconcile_duration = Some(started.elapsed());
        self.controller.metrics.last_reconcile = Some(SystemTime::now());
    }

    fn on_sighup(&mut self) {
        log::info!("SIGHUP: reconciling now");
        let started = Instant::now();
        match self.controller.rescan() {
            Ok(_) => {
                self.reconciled(started);
                self.persist.owe(true);
            }
            Err(e) => log::error!("reconcile: {}", error_chain(&e)),
        }
    }

    fn stopping(&mut self, signal: Signal) {
        log::info!("{signal}: writing the checkpoint and stopping");
        self.notifier.send(&[sd_notify::NotifyState::Stopping]);
        self.controller.finish_owed(Instant::now());
        if self.controller.update_owed_effects() {
            self.persist.owe(true);
        }
        // An effect's thread may be in an exchange whose answer is the only record of what it
        // changed (irqbalance's own banned cpus): the last checkpoint waits for it, bounded.
        self.controller.settle_effects(EFFECTS_SETTLE_AT_STOP);
    }

    /// After each message or timeout: the deadlines that fell due, the projection files, the
    /// burst's one save and the reconcile thread told of a model change, the watchdog.
    fn after_wake(&mut self) {
        let now = Instant::now();
        if self.controller.next_deadline().is_some_and(|t| t <= now) {
            // Whatever is queued goes into the model first (echoes of the last pass's writes
            // among it), so the pass plans from the tree as it is.
            forget(self.arrivals.as_ref());
            let mut changed = apply_queued(&mut self.controller, &self.events, now);
            changed |= self.controller.on_deadlines(now);
            if changed {
                let outcome = self.controller.pass(now);
                self.persist.owe(outcome.assignments_changed);
            }
        }
        // Effects a pass left for a pin that arrived, once no event waits.
        if self.events.is_empty() && self.controller.update_owed_effects() {
            self.persist.owe(true);
        }
        // Projection files after the pass's cgroup writes, and only while no event waits: a
        // new pod's pin waits for one file at most (what is left is owed: no wait below).
        if self.events.is_empty() {
            let events = &self.events;
            self.controller
                .update_projections(Instant::now(), || !events.is_empty());
        }
        if self.controller.take_model_changed() {
            self.reconciler.model_changed();
        }
        // Once the burst is over (no event waits), or has gone on too long.
        let burst_over = self.events.is_empty();
        self.persist.save_owed(&self.controller, burst_over);
        if let Some((interval, due)) = self.watchdog {
            if due <= now {
                self.notifier.send(&[sd_notify::NotifyState::Watchdog]);
                self.watchdog = Some((interval, now + interval));
            }
        }
    }

    /// Stops the threads and writes the last checkpoint (after the persist thread is joined).
    fn finish(self, threads: Threads) {
        self.persist.finish(&self.controller);
        if let Some(server) = threads.pod_resources {
            server.stop();
        }
        self.reconciler.stop();
        if let Some(watcher) = threads.watcher {
            if let Err(e) = watcher.stop_and_join(Duration::from_secs(2)) {
                log::warn!("watcher: {}", error_chain(&e));
            }
        }
    }
}

/// Watches the kubepods trees (silently: the first scan follows). Without inotify (a per-user
/// limit reached) the agent still works, by full scans every period: `None`.
fn open_watcher(layout: &CgroupLayout, period: Duration) -> Result<Option<Watcher>, AgentError> {
    match Watcher::new(WatchRoot::of_layout(layout)) {
        Ok(watcher) => Ok(Some(watcher)),
        Err(e) if e.is_limit() => {
            log::warn!(
                "{}: working without inotify, by a full scan every {} (new pods are pinned \
                 that late, drift repaired that late); raise fs.inotify.max_user_watches and \
                 fs.inotify.max_user_instances (sysctl) and restart cpusetd",
                error_chain(&e),
                humantime_like(period)
            );
            Ok(None)
        }
        Err(e) => Err(AgentError::Watcher(e)),
    }
}

/// The controller `run` builds from `config`, with what the checkpoint and the host record
/// restored, its host effects, hotplug and projections ([`build_controller`]), before its first
/// scan and without the lock, threads or watcher: how tests and benchmarks drive it in
/// process, on `config`'s roots (a test's fake sysfs and procfs). With no watcher there are no
/// arrivals, as in `run` without inotify ([`Controller::watch_arrivals`] takes a test's own);
/// the effects' threads (irqbalance, systemd) tell a channel nobody reads.
pub fn in_process(config: AgentConfig) -> Controller {
    let host = HostConfig {
        proc_root: config.proc_root,
        sysfs_root: config.sysfs_root,
        isolate_host: config.isolate_host,
        projection_dir: config.projection_dir,
        project_all: config.project_all,
        hotplug: config.hotplug,
    };
    let restored = restore(&config.state_dir, &config.parts, &config.options);
    let (effect_done, _) = bounded::<()>(1);
    build_controller(config.parts, restored, &config.state_dir, host, effect_done)
}

/// The controller, with what the checkpoint and the host record restored, and its host
/// effects: interrupts, scheduler load balancing, power, hotplug, projections.
fn build_controller(
    mut parts: ControllerParts,
    restored: Restored,
    state_dir: &std::path::Path,
    host: HostConfig,
    effect_done: Sender<()>,
) -> Controller {
    parts.assignments = restored.assignments;
    let (hierarchy, kubepods) = (parts.hierarchy.clone(), parts.scanner.kubepods().clone());
    let host_record = match checkpoint::host::load_host_record(state_dir) {
        Ok(record) => record,
        Err(why) => {
            log::warn!("{why}: the checkpoint's record of host changes is used instead");
            None
        }
    };
    let journal = checkpoint::host::HostJournal::new(state_dir, host_record.as_ref());
    let mut controller = Controller::new(parts);
    let env = crate::effects::Env {
        proc_root: &host.proc_root,
        sysfs_root: &host.sysfs_root,
        cpuset: Some((hierarchy.cpuset.clone(), hierarchy.version, kubepods)),
        cpu: Some(hierarchy.cpu.clone()),
        isolate_host: host.isolate_host,
        journal: Some(journal),
        effect_done: Some(effect_done),
    };
    let recorded = crate::effects::Recorded {
        checkpoint: Some(&restored.effects),
        host: host_record.as_ref().map(|r| &r.effects),
    };
    controller.manage_effects(crate::effects::build(&env, &recorded));
    controller.follow_hotplug(host.hotplug);
    controller.manage_projection(
        crate::projection::Projector::new(host.projection_dir),
        host.project_all,
    );
    controller
}

/// The full scan, the pins adopted from kubelet's checkpoint (`kubelet_state`, on a first
/// start), and the first pass.
fn first_pass(
    controller: &mut Controller,
    kubelet_state: Option<&std::path::Path>,
) -> Result<(), AgentError> {
    let started = Instant::now();
    controller.full_scan().map_err(AgentError::FirstScan)?;
    if let Some(path) = kubelet_state {
        adopt_from_kubelet(controller, path);
    }
    controller.clone_cpusets_at_creation();
    let outcome = controller.pass(Instant::now());
    controller.metrics.reconcile_duration = Some(started.elapsed());
    controller.metrics.last_reconcile = Some(SystemTime::now());
    let (containers, exclusive) = controller.counts();
    log::info!(
        "first pass: {containers} containers, {exclusive} exclusive, {} writes ({} failed)",
        outcome.writes,
        outcome.failed_writes
    );
    Ok(())
}

/// The persist thread, after the first checkpoint written here; then the PodResources server
/// (after the first pass is published, so no reader is ever told of an empty node).
fn start_persist(
    controller: &Controller,
    mut targets: PersistTargets,
    pod_resources: Option<PodResourcesConfig>,
) -> Result<(Persister, Option<crate::podresources::PodResourcesServer>), AgentError> {
    let published = pod_resources
        .as_ref()
        .map(|_| Arc::new(crate::podresources::Published::default()));
    targets.published = published.clone();
    let persist = Persister::start(targets, controller);
    let server = match (pod_resources, published) {
        (Some(config), Some(published)) => Some(
            crate::podresources::PodResourcesServer::start(
                &config.socket,
                config.kubelet,
                published,
            )
            .map_err(AgentError::PodResources)?,
        ),
        _ => None,
    };
    Ok((persist, server))
}

fn apply(controller: &mut Controller, event: TreeEvent, now: Instant) -> bool {
    match controller.apply_event(event, now) {
        Ok(changed) => changed,
        Err(e) => {
            log::error!("{}", error_chain(&e));
            false
        }
    }
}

/// Forgets the arrival tokens: called just before the event channel is drained, so that a
/// token left at a pass's writes is an event still queued (one taken and then told of is a
/// spurious token at worst: that pass's rewrite stops early and the held-back writes are owed,
/// made by the next pass, which drains and forgets first). A pass that did not drain the
/// channel (a reconcile's, SIGHUP's) keeps the tokens: its rewrite stops for what waits.
fn forget(arrivals: Option<&Arrivals>) {
    arrivals.iter().for_each(|a| a.forget());
}

/// Applies every event already queued; whether the model changed.
fn apply_queued(controller: &mut Controller, events: &Receiver<TreeEvent>, now: Instant) -> bool {
    let mut changed = false;
    while let Ok(event) = events.try_recv() {
        changed |= apply(controller, event, now);
    }
    changed
}
/// Migration from kubelet's static policy: on a first start, the pins kubelet's checkpoint
/// names are adopted where the live tree agrees. Nothing here stops the agent: a missing,
/// unreadable or corrupt file, or another policy's, is said once and the live tree is used.
fn adopt_from_kubelet(controller: &mut Controller, path: &std::path::Path) {
    use crate::checkpoint::kubelet_state;
    match kubelet_state::read(path) {
        Ok(None) => {}
        Ok(Some(state)) if state.policy_name != "static" => log::info!(
            "{}: kubelet ran the {:?} policy: no pins to adopt from it",
            path.display(),
            state.policy_name
        ),
        Ok(Some(state)) => {
            if !state.pod_entries.is_empty() {
                let pods: Vec<String> = state
                    .pod_entries
                    .iter()
                    .map(|(uid, cpus)| format!("pod{uid} cpus {cpus}"))
                    .collect();
                log::info!(
                    "{}: kubelet's pod-level cpu sets not adopted ({}): {}",
                    path.display(),
                    pods.join(", "),
                    crate::classify::POD_LEVEL_POLICY
                );
            }
            let adopted = controller.adopt_kubelet_pins(&state);
            // Counted and named; each entry not adopted was said with its reason.
            log::info!(
                "{}: adopted {} of kubelet's {} pin(s) (format {:?}{}){}{}",
                path.display(),
                adopted.len(),
                state.entries.len() + state.legacy_entries.len(),
                state.format,
                if state.checksum_verified {
                    ""
                } else {
                    ", checksum 0: not verified"
                },
                if adopted.is_empty() { "" } else { ": " },
                adopted.join(", ")
            );
        }
        Err(e) => log::warn!(
            "kubelet's checkpoint not used ({}); pins are adopted from the live tree",
            error_chain(&e)
        ),
    }
}

/// What a checkpoint gives a starting agent.
#[derive(Debug, Default)]
struct Restored {
    assignments: crate::state::Assignments,
    effects: checkpoint::EffectState,
    /// There was no checkpoint: a first start.
    first_start: bool,
}

/// Says what differs between the checkpoint and this start (policy, options, reserved or
/// online cpus).
fn say_what_changed(cp: &checkpoint::Checkpoint, parts: &ControllerParts, options: &PolicyOptions) {
    let policy_name = if parts.policy.is_some() {
        Policy::Static
    } else {
        Policy::None
    };
    if cp.policy != policy_name {
        log::warn!(
            "checkpoint was written under policy {}, now {policy_name}: re-planning",
            cp.policy
        );
    }
    if &cp.options != options {
        log::warn!(
            "policy options changed ({} → {options}): existing pins are kept where they still fit",
            cp.options
        );
    }
    if let Some(policy) = &parts.policy {
        if &cp.reserved != policy.reserved() {
            log::warn!(
                "reserved cpus changed ({} → {}): pins on reserved cpus are released",
                cp.reserved,
                policy.reserved()
            );
        }
    }
    let gone = cp.cpus_outside(parts.topology.all_cpus());
    if !gone.is_empty() {
        log::warn!(
            "cpus {gone} of the checkpoint are no longer online: the pins that held them \
             keep the rest and get replacements"
        );
    }
}

/// Loads the checkpoint: its assignments fill in names and intent; anything unusable is moved
/// aside and logged, never a reason to refuse to start.
fn restore(
    state_dir: &std::path::Path,
    parts: &ControllerParts,
    options: &PolicyOptions,
) -> Restored {
    match checkpoint::load(state_dir) {
        LoadOutcome::Missing => Restored {
            first_start: true,
            ..Default::default()
        },
        LoadOutcome::Unusable { path, reason } => {
            log::warn!("{}; starting from the live tree", reason.describe(&path));
            match checkpoint::quarantine(state_dir, &reason) {
                Ok(moved) => log::warn!("the unusable checkpoint was moved to {}", moved.display()),
                Err(e) => log::warn!(
                    "cannot move the unusable checkpoint aside: {}",
                    error_chain(&e)
                ),
            }
            Restored::default()
        }
        LoadOutcome::Loaded(cp) => {
            say_what_changed(&cp, parts, options);
            Restored {
                assignments: cp.assignments,
                effects: cp.effects,
                first_start: false,
            }
        }
    }
}

fn spawn_signal_thread(signals: SigSet, tx: Sender<Control>) {
    let spawned = thread::Builder::new()
        .name("cpusetd-signals".into())
        .spawn(move || loop {
            match signals.wait() {
                Ok(Signal::SIGHUP) => {
                    let _ = tx.try_send(Control::Reconcile);
                }
                Ok(signal) => {
                    let _ = tx.send(Control::Stop(signal));
                    return;
                }
                Err(e) => {
                    log::error!("waiting for signals: {e}");
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        log::error!("cannot start the signal thread: {e}");
    }
}

/// `10s`, `1m30s`: a period as the flags take it.
fn humantime_like(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        format!("{ms}ms")
    } else if ms % 60_000 == 0 && ms >= 60_000 {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
}

fn notify_status(notifier: &mut Notifier, controller: &Controller) {
    if !notifier.enabled() {
        return;
    }
    let (containers, exclusive) = controller.counts();
    let shared = controller
        .shared_pool()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "-".into());
    let degraded = if controller.metrics.without_inotify {
        " (no inotify: scanning every period)"
    } else {
        ""
    };
    // Only a changed status is sent (a pass runs for every batch of events).
    notifier.status(&format!(
        "{containers} containers, {exclusive} with exclusive cpus, shared pool {shared}{degraded}"
    ));
}

/// Gives the heap's free pages back to the kernel. glibc keeps what a full scan and the first
/// pass freed (the model's copies, the plan's writes, the scan itself) mapped, so the agent's
/// resident memory stayed at its start-up peak: about 80 MiB with 10,000 containers against
/// the ~30 MiB it held then. Called after the first pass and after each full reconcile.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn release_free_memory() {
    // SAFETY: `malloc_trim` has no preconditions: it only walks glibc's own free lists and
    // `madvise`s free pages away; no pointer the program holds is touched.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

/// One malloc arena for all the agent's threads. glibc gives each thread that allocates its
/// own (up to eight per CPU): at 10,000 containers a second arena kept about 2 MiB resident at
/// rest, and with a 10 s tick the reconcile thread's, where its full scans are made, 7 MiB; in
/// the one heap the same work reuses the free space the first pass left. The threads allocate
/// little and seldom at once (the controller, the watcher's events, a reconcile scan), and
/// glibc's per-thread cache serves most small allocations without the arena's lock.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn one_malloc_arena() {
    // SAFETY: `mallopt` only sets a tunable of glibc's allocator; any value is valid for
    // `M_ARENA_MAX`, and arenas already made are kept (there are none: the agent calls it
    // before it starts its threads).
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn one_malloc_arena() {}
