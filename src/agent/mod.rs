//! The long-running agent (`cpusetd run`): threads, channels and the controller loop
//! (DESIGN.md §1 and §6).
//!
//! ```text
//!  watcher thread ── TreeEvent ──────┐
//!  reconcile thread ── ReconcileScan ┤ (bounded(1): missed ticks collapse)
//!  signal thread ── Control ─────────┴──► controller loop (the one writer)
//!                                              │ snapshots (newest wins)
//!                                              ▼
//!                                   persist thread: state.json (fsync), metrics file
//! ```
//!
//! Only the controller mutates state or writes cgroupfs; the others observe and send typed
//! messages on bounded channels. Start-up: lock the state dir, load the checkpoint (names and
//! intent; the live tree wins), full scan, first pass, checkpoint (written before `READY=1`),
//! `READY=1`. Later checkpoints and metrics files are written by the persist thread, so a
//! cgroup write never waits for an `fsync`. Shutdown on SIGTERM/SIGINT: finish the current
//! pass, write the checkpoint (the persist thread is joined), exit 0. SIGHUP: reconcile now.

mod controller;
mod hotplug;
pub(crate) mod http;
pub mod metrics;
mod notify;
mod wait;

pub use controller::{Controller, ControllerParts, PassOutcome, ReconcileScan};
pub use hotplug::Hotplug;
pub use notify::Notifier;
pub use wait::{wait_for_change, Waited};

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use nix::sys::signal::{SigSet, Signal};

use crate::allocator::PolicyOptions;
use crate::cgroupfs::{CgroupLayout, CpusetSnapshot, Scanner};
use crate::checkpoint::{self, Checkpoint, LoadOutcome, Policy, QuotaLift, StateLock};
use crate::logging::error_chain;
use crate::watcher::{TreeEvent, WatchRoot, Watcher};

/// What the reconcile thread sends each tick.
#[derive(Debug)]
enum ReconcileTick {
    /// A full scan, to merge.
    Full(ReconcileScan),
    /// Every cgroup's `cpuset.cpus` read as at the last full scan, and the model has not
    /// changed since: nothing to merge.
    Unchanged { started: Instant },
}

/// Capacity of the watcher → controller channel: as many events as the kernel's default
/// inotify queue (`max_queued_events`). A pass that rewrites the shared pool on a full node
/// makes thousands of writes, each echoed by an `IN_MODIFY`; a smaller channel overflowed into
/// a full rescan. (The buffer is allocated up front: 16,384 × 32-byte events, 512 KiB.)
const EVENT_QUEUE: usize = 16384;

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
    let AgentConfig {
        layout,
        parts,
        options,
        state_dir,
        reconcile_period,
        metrics_file,
        metrics_bind,
        kubelet_state,
        proc_root,
        sysfs_root,
        isolate_host,
        projection_dir,
        project_all,
        hotplug,
        mut notifier,
        pod_resources,
    } = config;

    // Before the agent's threads allocate.
    one_malloc_arena();
    // Signals first, so every thread spawned below inherits the blocked mask.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().map_err(AgentError::Signals)?;

    let _lock = StateLock::acquire(&state_dir)?;
    // Bound before the first scan, so an address that cannot be served stops the agent at
    // once; answered with 503 until the first pass publishes its metrics.
    let snapshot = Arc::new(http::MetricsSnapshot::default());
    if let Some(addr) = metrics_bind {
        let bound = http::serve(addr, Arc::clone(&snapshot)).map_err(AgentError::MetricsBind)?;
        log::info!("metrics served at http://{bound}/metrics");
    }
    let mut parts = parts;
    let restored = restore(&state_dir, &parts, &options);
    let first_start = restored.first_start;
    parts.assignments = restored.assignments;
    parts.quota_lifted = restored.quota_lifted;
    let hierarchy = parts.hierarchy.clone();
    let kubepods = layout.kubepods.clone();

    // Watch before the first scan, so nothing created in between is missed. Without inotify
    // (a per-user limit reached) the agent still works, by full scans every period.
    let (event_tx, event_rx) = bounded::<TreeEvent>(EVENT_QUEUE);
    let watcher = match Watcher::new(WatchRoot::of_layout(&layout)) {
        Ok(watcher) => Some(watcher),
        Err(e) if e.is_limit() => {
            log::warn!(
                "{}: working without inotify, by a full scan every {} (new pods are pinned \
                 that late, drift repaired that late); raise fs.inotify.max_user_watches and \
                 fs.inotify.max_user_instances (sysctl) and restart cpusetd",
                error_chain(&e),
                humantime_like(reconcile_period)
            );
            None
        }
        Err(e) => return Err(AgentError::Watcher(e)),
    };
    let degraded = watcher.is_none();

    let host_record = match checkpoint::host::load_host_record(&state_dir) {
        Ok(record) => record,
        Err(why) => {
            log::warn!("{why}: the checkpoint's record of host changes is used instead");
            None
        }
    };
    let journal = checkpoint::host::HostJournal::new(&state_dir, host_record.as_ref());
    let mut controller = Controller::new(parts);
    // irqbalance is told by a thread of its own (nothing on the way to a pin waits for it),
    // which says here when what it was told changed, for the checkpoint.
    // A sender stays here, so the channel never reads as closed (were that thread gone).
    let (irqbalance_told_tx, irqbalance_told) = bounded::<()>(1);
    let env = crate::effects::Env {
        proc_root: &proc_root,
        sysfs_root: &sysfs_root,
        cpuset: Some((
            hierarchy.cpuset.clone(),
            hierarchy.version,
            kubepods.clone(),
        )),
        isolate_host,
        journal: Some(journal),
        irqbalance_told: Some(irqbalance_told_tx.clone()),
    };
    let recorded = crate::effects::Recorded {
        checkpoint: Some(&restored.effects),
        host: host_record.as_ref().map(|r| &r.effects),
    };
    controller.manage_effects(crate::effects::build(&env, &recorded));
    controller.follow_hotplug(hotplug);
    controller.manage_projection(
        crate::projection::Projector::new(projection_dir),
        project_all,
    );
    controller.metrics.without_inotify = degraded;
    if let Some(watcher) = &watcher {
        controller.watch_arrivals(watcher.arrivals());
    }
    let started = Instant::now();
    controller.full_scan().map_err(AgentError::FirstScan)?;
    if let (true, Some(path)) = (first_start, &kubelet_state) {
        adopt_from_kubelet(&mut controller, path);
    }
    controller.clone_cpusets_at_creation();
    let outcome = controller.pass(Instant::now());
    controller.metrics.reconcile_duration = Some(started.elapsed());
    controller.metrics.last_reconcile = Some(SystemTime::now());
    // Without a watcher the sender stays here, so the event channel never reads as closed.
    let (watcher, _idle_events) = match watcher {
        Some(w) => (Some(w.start(event_tx).map_err(AgentError::Watcher)?), None),
        None => (None, Some(event_tx)),
    };
    let (containers, exclusive) = controller.counts();
    log::info!(
        "first pass: {containers} containers, {exclusive} exclusive, {} writes ({} failed)",
        outcome.writes,
        outcome.failed_writes
    );
    let published = pod_resources
        .as_ref()
        .map(|_| Arc::new(crate::podresources::Published::default()));
    let mut persist = Persist::start(
        state_dir,
        options,
        metrics_file,
        (snapshot, published.clone()),
    );
    persist.save_now(&controller);
    // After the first pass is published, so no reader is ever told of an empty node.
    let pod_resources_server = match (pod_resources, published) {
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
    // After the first pass's writes and its checkpoint (the watcher is not started yet).
    controller.update_projections(Instant::now(), || false);
    release_free_memory();
    notifier.send(&[sd_notify::NotifyState::Ready]);
    notify_status(&mut notifier, &controller);

    let (reconcile_tx, reconcile_rx) = bounded::<ReconcileTick>(1);
    let (stop_reconcile_tx, stop_reconcile_rx) = bounded::<()>(1);
    let reconciler = spawn_reconciler(
        Scanner::new(hierarchy, kubepods),
        reconcile_period,
        degraded,
        controller.generation(),
        reconcile_tx,
        stop_reconcile_rx,
    );
    let (control_tx, control_rx) = bounded::<Control>(4);
    spawn_signal_thread(signals, control_tx);

    let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
    let mut next_ping = watchdog.map(|d| Instant::now() + d);

    let result = loop {
        let now = Instant::now();
        let wake = [
            controller.next_deadline(),
            next_ping,
            controller.projections_due(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.saturating_duration_since(now))
        .unwrap_or(Duration::from_secs(3600));
        select! {
            recv(event_rx) -> event => {
                let Ok(event) = event else { break Err(AgentError::ThreadGone("watcher")) };
                let now = Instant::now();
                let mut changed = apply(&mut controller, event, now);
                // Coalesce whatever else is queued into the same pass.
                changed |= apply_queued(&mut controller, &event_rx, now);
                if changed {
                    let outcome = controller.pass(now);
                    persist.save(&controller, outcome.assignments_changed);
                    notify_status(&mut notifier, &controller);
                }
            }
            recv(reconcile_rx) -> tick => match tick {
                Ok(ReconcileTick::Full(scan)) => {
                    reconcile(&mut controller, &mut persist, scan);
                    notify_status(&mut notifier, &controller);
                }
                Ok(ReconcileTick::Unchanged { started }) => {
                    if controller.online_cpus_changed() | controller.limits_moved() {
                        // The pools changed with them: the checkpoint says so (for `status`).
                        controller.pass(Instant::now());
                        persist.save(&controller, true);
                    }
                    let irqs_changed = controller.refresh_effects();
                    controller.metrics.reconcile_duration = Some(started.elapsed());
                    controller.metrics.last_reconcile = Some(SystemTime::now());
                    controller.metrics.quiet_reconciles += 1;
                    persist.save(&controller, irqs_changed);
                }
                Err(_) => break Err(AgentError::ThreadGone("reconcile")),
            },
            recv(irqbalance_told) -> _ => {
                let changed = controller.sync_effects();
                persist.save(&controller, changed);
            }
            recv(control_rx) -> control => match control {
                Ok(Control::Stop(signal)) => {
                    log::info!("{signal}: writing the checkpoint and stopping");
                    notifier.send(&[sd_notify::NotifyState::Stopping]);
                    controller.finish_owed(Instant::now());
                    persist.save(&controller, true);
                    break Ok(());
                }
                Ok(Control::Reconcile) => {
                    log::info!("SIGHUP: reconciling now");
                    let started = Instant::now();
                    match controller.rescan() {
                        Ok(_) => {
                            controller.metrics.reconcile_duration = Some(started.elapsed());
                            controller.metrics.last_reconcile = Some(SystemTime::now());
                            persist.save(&controller, true);
                        }
                        Err(e) => log::error!("reconcile: {}", error_chain(&e)),
                    }
                }
                Err(_) => break Err(AgentError::ThreadGone("signal")),
            },
            default(wake) => {}
        }
        let now = Instant::now();
        if controller.next_deadline().is_some_and(|t| t <= now) {
            // Whatever is queued goes into the model first (echoes of the last pass's writes
            // among it), so the pass plans from the tree as it is.
            let mut changed = apply_queued(&mut controller, &event_rx, now);
            changed |= controller.on_deadlines(now);
            if changed {
                let outcome = controller.pass(now);
                persist.save(&controller, outcome.assignments_changed);
            }
        }
        // Projection files after the pass's cgroup writes, and only while no event waits: a
        // new pod's pin waits for one file at most (what is left is owed: no wait below).
        if event_rx.is_empty() {
            controller.update_projections(Instant::now(), || !event_rx.is_empty());
        }
        if let (Some(interval), Some(due)) = (watchdog, next_ping) {
            if due <= now {
                notifier.send(&[sd_notify::NotifyState::Watchdog]);
                next_ping = Some(now + interval);
            }
        }
    };
    persist.finish();
    if let Some(server) = pod_resources_server {
        server.stop();
    }
    let _ = stop_reconcile_tx.send(());
    let _ = reconciler.join();
    if let Some(watcher) = watcher {
        if let Err(e) = watcher.stop_and_join(Duration::from_secs(2)) {
            log::warn!("watcher: {}", error_chain(&e));
        }
    }
    result
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

/// Applies every event already queued; whether the model changed.
fn apply_queued(controller: &mut Controller, events: &Receiver<TreeEvent>, now: Instant) -> bool {
    let mut changed = false;
    while let Ok(event) = events.try_recv() {
        changed |= apply(controller, event, now);
    }
    changed
}

fn reconcile(controller: &mut Controller, persist: &mut Persist, scan: ReconcileScan) {
    let started = scan.started;
    controller.reconcile(scan, Instant::now());
    release_free_memory();
    controller.metrics.reconcile_duration = Some(started.elapsed());
    controller.metrics.last_reconcile = Some(SystemTime::now());
    persist.save(controller, true);
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
                    "{}: kubelet's pod-level cpu sets not adopted ({}): cpusetd keeps pods with \
                     pod-level resources in the shared pool, as kubelet does without its \
                     pod-level resource managers",
                    path.display(),
                    pods.join(", ")
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
    quota_lifted: std::collections::BTreeMap<crate::cgroupfs::CgroupPath, String>,
    effects: checkpoint::EffectState,
    /// There was no checkpoint: a first start.
    first_start: bool,
}

/// Loads the checkpoint: its assignments fill in names and intent; anything unusable is moved
/// aside and logged, never a reason to refuse to start.
fn restore(
    state_dir: &std::path::Path,
    parts: &ControllerParts,
    options: &PolicyOptions,
) -> Restored {
    let policy_name = if parts.policy.is_some() {
        Policy::Static
    } else {
        Policy::None
    };
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
            let quota_lifted = cp
                .quota_lifted
                .into_iter()
                .filter_map(|q| {
                    crate::cgroupfs::CgroupPath::new(&q.cgroup)
                        .ok()
                        .map(|p| (p, q.original))
                })
                .collect();
            Restored {
                assignments: cp.assignments,
                quota_lifted,
                effects: cp.effects,
                first_start: false,
            }
        }
    }
}

/// Hands the checkpoint and the metrics to the persister thread after a pass. The values are
/// taken on the controller thread (so each is a consistent snapshot); the file writes and
/// `fsync`s happen on `cpusetd-persist`, off the event path: cgroup writes never wait for the
/// disk. Snapshots not yet written are replaced by newer ones (each is the whole state), and a
/// pending checkpoint is never dropped for a metrics-only snapshot.
#[derive(Debug)]
struct Persist {
    options: PolicyOptions,
    /// What `--metrics-bind-address` serves: published here, on the controller thread, as
    /// soon as a pass is rendered (not after the persist thread's `fsync`s).
    snapshot: Arc<http::MetricsSnapshot>,
    /// Where the PodResources server reads the controller's view (when it serves).
    published: Option<Arc<crate::podresources::Published>>,
    slot: Arc<PersistSlot>,
    thread: Option<thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct PersistSlot {
    pending: Mutex<PersistJob>,
    wake: Condvar,
    /// Signalled after each write; `save_now` waits on it.
    done: Condvar,
}

#[derive(Debug, Default)]
struct PersistJob {
    checkpoint: Option<Checkpoint>,
    metrics: Option<Arc<str>>,
    /// The last reconcile (Unix ms), for [`checkpoint::LAST_RECONCILE_FILE`].
    last_reconcile: Option<u64>,
    stop: bool,
    /// The thread is writing a job it took.
    busy: bool,
}

impl Persist {
    fn start(
        state_dir: PathBuf,
        options: PolicyOptions,
        metrics_file: Option<PathBuf>,
        (snapshot, published): (
            Arc<http::MetricsSnapshot>,
            Option<Arc<crate::podresources::Published>>,
        ),
    ) -> Persist {
        let slot = Arc::new(PersistSlot::default());
        let shared = Arc::clone(&slot);
        let thread = thread::Builder::new()
            .name("cpusetd-persist".into())
            .spawn(move || persist_loop(&shared, &state_dir, metrics_file.as_deref()))
            .expect("spawn the persist thread");
        Persist {
            options,
            snapshot,
            published,
            slot,
            thread: Some(thread),
        }
    }

    /// Writes the checkpoint and the metrics now, on the calling thread (the first pass's,
    /// before `READY=1`).
    fn save_now(&mut self, controller: &Controller) {
        self.save(controller, true);
        let mut pending = self.slot.pending.lock().unwrap_or_else(|e| e.into_inner());
        while pending.checkpoint.is_some() || pending.metrics.is_some() || pending.busy {
            pending = self
                .slot
                .done
                .wait(pending)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn save(&mut self, controller: &Controller, checkpoint_changed: bool) {
        let last_reconcile = controller
            .metrics
            .last_reconcile
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64);
        let checkpoint = checkpoint_changed.then(|| Checkpoint {
            policy: if controller.policy().is_some() {
                Policy::Static
            } else {
                Policy::None
            },
            options: self.options,
            reserved: controller
                .policy()
                .map(|p| p.reserved().clone())
                .unwrap_or_default(),
            online: controller.topology().all_cpus().clone(),
            shared_pool: controller.shared_pool().cloned().unwrap_or_default(),
            assignments: controller.assignments().clone(),
            quota_lifted: controller
                .quota_lifted()
                .iter()
                .map(|(cgroup, original)| QuotaLift {
                    cgroup: cgroup.to_string(),
                    original: original.clone(),
                })
                .collect(),
            effects: controller.effects_saved(),
            refused: controller.refusals().clone(),
            last_reconcile_unix_ms: last_reconcile,
        });
        let mut job = self.slot.pending.lock().unwrap_or_else(|e| e.into_inner());
        if checkpoint.is_some() {
            job.checkpoint = checkpoint;
        }
        let text: Arc<str> = controller.metrics.render().into();
        self.snapshot.publish(Arc::clone(&text));
        job.metrics = Some(text);
        job.last_reconcile = last_reconcile;
        self.slot.wake.notify_one();
        drop(job);
        if let Some(published) = &self.published {
            published.publish(controller.pod_resources());
        }
    }

    /// Writes what is pending and stops the thread (at shutdown, after the last save).
    fn finish(&mut self) {
        self.slot
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop = true;
        self.slot.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The persister thread: writes the newest snapshots until told to stop, then what is left.
fn persist_loop(
    slot: &PersistSlot,
    state_dir: &std::path::Path,
    metrics_file: Option<&std::path::Path>,
) {
    let mut failing = false;
    let mut metrics_failing = false;
    let mut reconcile_written: Option<u64> = None;
    // The lock taken again after the state directory was removed (see `relock`).
    let mut relocked: Option<StateLock> = None;
    loop {
        let job = {
            let mut pending = slot.pending.lock().unwrap_or_else(|e| e.into_inner());
            while pending.checkpoint.is_none() && pending.metrics.is_none() && !pending.stop {
                pending = slot.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
            }
            let job = std::mem::take(&mut *pending);
            pending.busy = true;
            job
        };
        if let Some(cp) = &job.checkpoint {
            match checkpoint::save(state_dir, cp) {
                Ok(()) => {
                    if failing {
                        log::info!("checkpoint written again to {}", state_dir.display());
                    }
                    failing = false;
                    relock(state_dir, &mut relocked);
                }
                Err(e) => {
                    if !failing {
                        log::error!(
                            "{} (pins stay in force; retried after the next change)",
                            error_chain(&e)
                        );
                    }
                    failing = true;
                }
            }
        }
        // Before the metrics file, so what that says `status` already reads.
        if let Some(ms) = job
            .last_reconcile
            .filter(|ms| reconcile_written != Some(*ms))
        {
            match checkpoint::write_last_reconcile(state_dir, ms) {
                Ok(()) => reconcile_written = Some(ms),
                // The checkpoint's failures are said; this file only keeps `status` current.
                Err(e) => log::debug!(
                    "cannot write {}/{}: {e}",
                    state_dir.display(),
                    checkpoint::LAST_RECONCILE_FILE
                ),
            }
        }
        if let (Some(path), Some(text)) = (metrics_file, &job.metrics) {
            // Said when it starts failing and when it works again, not on every pass.
            match metrics::write_text(path, text) {
                Ok(()) if metrics_failing => {
                    metrics_failing = false;
                    log::info!("metrics are written to {} again", path.display());
                }
                Ok(()) => {}
                Err(e) if !metrics_failing => {
                    metrics_failing = true;
                    log::warn!("cannot write metrics to {}: {e}", path.display());
                }
                Err(e) => log::debug!("cannot write metrics to {}: {e}", path.display()),
            }
        }
        slot.pending.lock().unwrap_or_else(|e| e.into_inner()).busy = false;
        slot.done.notify_all();
        if job.stop {
            return;
        }
    }
}

/// After the state directory was removed while the agent ran (and made again by the checkpoint
/// write), its lock file is gone with it: taken again, so a second agent is still refused and
/// `status` and `health` still see this one. (Also when the directory could take no lock file
/// at start and takes files now: the pid is then recorded.)
fn relock(state_dir: &std::path::Path, relocked: &mut Option<StateLock>) {
    if state_dir.join(checkpoint::LOCK_FILE).exists() {
        return;
    }
    match StateLock::acquire(state_dir) {
        Ok(lock) => {
            log::warn!(
                "{} has no lock file (the state directory was removed, or could not take one \
                 when the agent started): the lock is taken on a new one",
                state_dir.display()
            );
            *relocked = Some(lock);
        }
        Err(e) => log::warn!("cannot lock the state directory again: {}", error_chain(&e)),
    }
}

/// Every how many ticks the reconcile thread scans the whole tree even when the model has
/// not moved (new directories or CPU settings that inotify failed to report).
const FULL_SCAN_EVERY: u64 = 6;

/// The reconcile thread. A tick after which the model has changed (events, writes) scans the
/// whole tree and sends it to be merged, as does every [`FULL_SCAN_EVERY`]th tick. Otherwise
/// (a quiet node) it only reads each cgroup's `cpuset.cpus` once and compares it with its last
/// full scan: all equal → `Unchanged`; any difference (drift nobody reported) → a full scan.
fn spawn_reconciler(
    mut scanner: Scanner,
    period: Duration,
    every_tick_full: bool,
    generation: Arc<AtomicU64>,
    tx: Sender<ReconcileTick>,
    stop: Receiver<()>,
) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("cpusetd-reconcile".into())
        .spawn(move || {
            // A scan that keeps failing (the kubepods cgroup removed) is reported once, and
            // again only after a scan worked.
            let mut failing = false;
            let mut last: Option<(u64, CpusetSnapshot)> = None;
            let mut tick: u64 = 0;
            loop {
                match stop.recv_timeout(period) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                tick += 1;
                let started = Instant::now();
                let now = generation.load(AtomicOrdering::Acquire);
                if let Some((seen, snapshot)) = &last {
                    // Without inotify nothing else sees new cgroups: every tick scans.
                    if !every_tick_full
                        && *seen == now
                        && tick % FULL_SCAN_EVERY != 0
                        && scanner.cpusets_unchanged(snapshot)
                    {
                        let _ = tx.try_send(ReconcileTick::Unchanged { started });
                        continue;
                    }
                }
                match scanner.scan() {
                    // A full channel means the controller has not taken the last scan yet: this
                    // tick collapses into it.
                    Ok(scan) => {
                        if std::mem::take(&mut failing) {
                            log::info!("reconcile scans work again");
                        }
                        last = Some((now, CpusetSnapshot::of(&scan)));
                        let _ = tx.try_send(ReconcileTick::Full(ReconcileScan { started, scan }));
                    }
                    Err(e) => {
                        last = None;
                        if !failing {
                            log::error!(
                                "reconcile scan: {} (not repeated while it keeps failing)",
                                error_chain(&e)
                            );
                        }
                        failing = true;
                    }
                }
            }
        })
        .expect("spawn the reconcile thread")
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
