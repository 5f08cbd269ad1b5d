//! Device interrupts kept off the CPUs of containers whose pod says
//! `irq-load-balancing.crio.io: "disable"`: those CPUs leave `/proc/irq/default_smp_affinity`
//! (the mask new IRQs start with) and every `/proc/irq/<n>/smp_affinity_list` the kernel lets
//! one change, while the container holds them, and come back afterwards.
//!
//! What the agent changed is recorded ([`IrqSaved`], kept in the checkpoint, and written ahead
//! of each change to `host.json`: [`crate::checkpoint::host`]), so a restart (or `cpusetd
//! reset`) restores each IRQ to what it was before the first change. An IRQ whose
//! every CPU is to be kept free keeps its affinity (an IRQ with no CPU would be lost), and one
//! the kernel will not move (per-CPU and managed interrupts refuse with EIO) is left alone and
//! counted. A running irqbalance is told the same CPUs ([`crate::irqbalance`]), so it does not
//! move interrupts back. Everything is under the injected proc root.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use crate::checkpoint::host::HostJournal;
use crate::cpuset::{CpuSet, MAX_CPU_ID};
use crate::irqbalance::{Irqbalance, IrqbalanceOutcome, IrqbalanceSaved, IrqbalanceWorker};

/// What to restore: the CPUs kept free now and each changed affinity as it was before.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqSaved {
    /// The CPUs interrupts are to be kept off now.
    #[serde(default)]
    pub banned: CpuSet,
    /// Those of `banned` that interrupts are off as read back after the writes: no affinity
    /// that was to lose them still has them (an IRQ the kernel will not move, or with no other
    /// cpu, aside). What `status` and the metrics call in force.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub in_force: CpuSet,
    /// `default_smp_affinity` before the first change, as the kernel printed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_affinity: Option<String>,
    /// Each changed IRQ's `smp_affinity_list` before the first change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub irqs: BTreeMap<u32, CpuSet>,
    /// What irqbalance was told, to give it back its own banned CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irqbalance: Option<IrqbalanceSaved>,
}

impl IrqSaved {
    /// Only what is to be restored (what `host.json` keeps; `Null` when nothing).
    pub fn originals(&self) -> serde_json::Value {
        let originals = IrqSaved {
            banned: CpuSet::new(),
            in_force: CpuSet::new(),
            ..self.clone()
        };
        crate::effects::to_saved(&originals, originals.is_empty())
    }

    /// Nothing changed, nothing to restore.
    pub fn is_empty(&self) -> bool {
        self.banned.is_empty()
            && self.default_affinity.is_none()
            && self.irqs.is_empty()
            && self.irqbalance.is_none()
    }
}

/// What one [`IrqAffinity::apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IrqOutcome {
    /// Affinity files written.
    pub written: usize,
    /// IRQs the kernel refused to move (left as they are).
    pub unchangeable: usize,
    /// IRQs left on kept-free CPUs because they had no other CPU.
    pub no_other_cpu: usize,
    /// Failures other than the kernel's refusals (the first few), for the log.
    pub errors: Vec<String>,
    /// CPUs of `banned` that an affinity still has, read back (a write refused by a read-only
    /// `/proc`, or not taken): not in force.
    pub not_in_force: CpuSet,
    /// What irqbalance was told, or why not.
    pub irqbalance: IrqbalanceOutcome,
    /// A line about irqbalance to log (`true`: a warning), when it says something new.
    pub irqbalance_news: Option<(bool, String)>,
}

/// The interrupt affinities under `<proc root>/irq`.
#[derive(Debug)]
pub struct IrqAffinity {
    dir: PathBuf,
    saved: IrqSaved,
    irqbalance: Teller,
    /// The last irqbalance line said (each is said once).
    irqbalance_said: Option<String>,
    /// Where each original is recorded before it is changed (`None`: only in `saved`).
    journal: Option<HostJournal>,
}

/// How irqbalance is told: in the caller's thread (`cpusetd reset`, which waits for it), or by
/// a thread of its own (the agent: nothing on the way to a pin waits for the daemon).
#[derive(Debug)]
enum Teller {
    Inline(Irqbalance),
    Background(IrqbalanceWorker),
}

impl IrqAffinity {
    /// `saved` is what an earlier run recorded (from the checkpoint), or the default.
    pub fn new(proc_root: &Path, saved: IrqSaved) -> IrqAffinity {
        IrqAffinity {
            dir: proc_root.join("irq"),
            saved,
            irqbalance: Teller::Inline(Irqbalance::new(proc_root)),
            irqbalance_said: None,
            journal: None,
        }
    }

    /// Records every original in `journal` (synced) before changing it, and again after each
    /// call: see [`crate::checkpoint::host`].
    pub fn with_journal(mut self, journal: HostJournal) -> IrqAffinity {
        self.journal = Some(journal);
        self
    }

    /// Makes what `saved` records durable.
    fn record(&self) -> Result<(), String> {
        match &self.journal {
            Some(journal) => journal
                .record(crate::effects::irq::NAME, self.saved.originals())
                .map_err(|e| {
                    format!(
                    "{}: interrupt affinities left alone while their originals cannot be recorded",
                    crate::logging::error_chain(&e)
                )
                }),
            None => Ok(()),
        }
    }

    /// Write-ahead: the default mask and each IRQ affinity that keeping `banned` free would
    /// change get their current value recorded (where none is yet), durably, before any write.
    fn record_originals(&mut self, banned: &CpuSet) -> Result<(), String> {
        if self.journal.is_none() || banned.is_empty() {
            return Ok(());
        }
        if self.saved.default_affinity.is_none() {
            if let Ok(text) = read_affinity_file(&self.dir.join("default_smp_affinity")) {
                let text = text.trim();
                if parse_mask(text).is_ok() {
                    self.saved.default_affinity = Some(text.to_string());
                }
            }
        }
        for irq in irq_numbers(&self.dir) {
            if self.saved.irqs.contains_key(&irq) {
                continue;
            }
            let path = self.dir.join(irq.to_string()).join("smp_affinity_list");
            if fixed_by_kernel(&path) {
                continue;
            }
            let Some(current) = read_affinity_file(&path)
                .ok()
                .and_then(|t| CpuSet::parse(t.trim()).ok())
            else {
                continue;
            };
            if without(&current, banned) != current {
                self.saved.irqs.insert(irq, current);
            }
        }
        self.record()
    }

    /// As [`IrqAffinity::new`], irqbalance told by a thread of its own, which says in the log
    /// what came of it; `told` is signalled when what it was told changed.
    pub fn with_irqbalance_in_background(
        proc_root: &Path,
        saved: IrqSaved,
        told: Option<crossbeam_channel::Sender<()>>,
    ) -> IrqAffinity {
        let worker = IrqbalanceWorker::start(proc_root, saved.irqbalance.clone(), told);
        IrqAffinity {
            irqbalance: Teller::Background(worker),
            ..IrqAffinity::new(proc_root, saved)
        }
    }

    /// Takes in what the irqbalance thread answered since (for the checkpoint); whether what
    /// was told changed.
    pub fn sync_irqbalance(&mut self) -> bool {
        let Teller::Background(worker) = &mut self.irqbalance else {
            return false;
        };
        worker.take_answers();
        let told = worker.saved().cloned();
        let changed = told != self.saved.irqbalance;
        self.saved.irqbalance = told;
        if changed {
            // The host record too: restart and `reset` take their originals from it.
            if let Err(e) = self.record() {
                log::warn!("{e}");
            }
        }
        changed
    }

    /// Waits, at most `within`, until irqbalance's thread answered every request (the agent's
    /// stop; [`IrqAffinity::sync_irqbalance`] takes the answers in). Whether it did.
    pub fn settle_irqbalance(&mut self, within: Duration) -> bool {
        match &mut self.irqbalance {
            Teller::Background(worker) => worker.wait_idle(within),
            _ => true,
        }
    }

    pub fn saved(&self) -> &IrqSaved {
        &self.saved
    }

    /// Keeps interrupts off `banned` (empty: restores everything recorded). Each IRQ's
    /// affinity becomes its original minus `banned` (or the original where that is empty), the
    /// default mask likewise; IRQs registered since are taken in too. Idempotent: a second
    /// call with the same set writes only what someone changed meanwhile. A running
    /// irqbalance is told first, so it does not undo the writes.
    pub fn apply(&mut self, banned: &CpuSet) -> IrqOutcome {
        let mut outcome = IrqOutcome::default();
        if banned.is_empty() && self.saved.is_empty() {
            return outcome;
        }
        // Write-ahead: nothing changes, irqbalance included, before the originals are durable.
        if let Err(e) = self.record_originals(banned) {
            outcome.errors.push(e);
            return outcome;
        }
        outcome.irqbalance = match &mut self.irqbalance {
            Teller::Inline(irqbalance) => irqbalance.apply(banned, &mut self.saved.irqbalance),
            Teller::Background(worker) => {
                worker.request(banned);
                self.sync_irqbalance();
                IrqbalanceOutcome::Idle
            }
        };
        if let Some(line) = outcome.irqbalance.describe() {
            if self.irqbalance_said.as_ref() != Some(&line) {
                self.irqbalance_said = Some(line.clone());
                outcome.irqbalance_news = Some((outcome.irqbalance.is_warning(), line));
            }
        }
        self.apply_default(banned, &mut outcome);
        let seen = irq_numbers(&self.dir);
        for &irq in &seen {
            self.apply_irq(irq, banned, &mut outcome);
        }
        // IRQs that went away (their device did) have nothing left to restore.
        self.saved.irqs.retain(|irq, _| seen.contains(irq));
        self.saved.banned = banned.clone();
        self.saved.in_force = banned.difference(&outcome.not_in_force);
        if let Err(e) = self.record() {
            outcome.errors.push(e);
        }
        outcome
    }

    fn apply_default(&mut self, banned: &CpuSet, outcome: &mut IrqOutcome) {
        let path = self.dir.join("default_smp_affinity");
        let Ok(text) = read_affinity_file(&path) else {
            return;
        };
        let current_text = text.trim().to_string();
        let current = match parse_mask(&current_text) {
            Ok(current) => current,
            Err(e) => {
                outcome.errors.push(format!("{}: {e}", path.display()));
                // Nothing read back: nothing known to be in force.
                outcome.not_in_force.extend_from(banned);
                return;
            }
        };
        let original_text = self
            .saved
            .default_affinity
            .clone()
            .unwrap_or_else(|| current_text.clone());
        let original = parse_mask(&original_text).unwrap_or_else(|_| current.clone());
        let desired = without(&original, banned);
        if desired != current {
            let written = write_existing(&path, &format_mask(&desired, &current_text));
            let now = match written {
                Ok(()) => {
                    outcome.written += 1;
                    read_affinity_file(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|t| parse_mask(t.trim()).map_err(|e| e.to_string()))
                }
                Err(e) => Err(e.to_string()),
            };
            let now = match now {
                Ok(now) => now,
                Err(e) => {
                    outcome.errors.push(format!("{}: {e}", path.display()));
                    outcome
                        .not_in_force
                        .extend_from(&still_on(&current, &desired, banned));
                    return;
                }
            };
            outcome
                .not_in_force
                .extend_from(&still_on(&now, &desired, banned));
        }
        self.saved.default_affinity = (!banned.is_empty()).then_some(original_text);
    }

    fn apply_irq(&mut self, irq: u32, banned: &CpuSet, outcome: &mut IrqOutcome) {
        let path = self.dir.join(irq.to_string()).join("smp_affinity_list");
        if fixed_by_kernel(&path) {
            // Never written, never recorded: nothing to restore.
            outcome.unchangeable += 1;
            return;
        }
        let Some(current) = read_affinity_file(&path)
            .ok()
            .and_then(|t| CpuSet::parse(t.trim()).ok())
        else {
            return;
        };
        let original = self
            .saved
            .irqs
            .get(&irq)
            .cloned()
            .unwrap_or_else(|| current.clone());
        if !original.is_empty() && original.is_subset(banned) {
            outcome.no_other_cpu += 1;
        }
        let desired = without(&original, banned);
        if desired != current {
            match write_existing(&path, &desired.to_string()) {
                Ok(()) => outcome.written += 1,
                Err(e) if refused_by_kernel(&e) => {
                    outcome.unchangeable += 1;
                    return;
                }
                Err(e) => {
                    if outcome.errors.len() < 3 {
                        outcome.errors.push(format!("{}: {e}", path.display()));
                    }
                    outcome
                        .not_in_force
                        .extend_from(&still_on(&current, &desired, banned));
                    return;
                }
            }
            // In force only as read back.
            let now = read_affinity_file(&path)
                .ok()
                .and_then(|t| CpuSet::parse(t.trim()).ok())
                .unwrap_or(current);
            outcome
                .not_in_force
                .extend_from(&still_on(&now, &desired, banned));
        }
        if desired == original {
            self.saved.irqs.remove(&irq);
        } else {
            self.saved.irqs.insert(irq, original);
        }
    }
}

/// An affinity file's text: no symlink followed, nothing past the kernel-file limit read.
/// The IRQs `<proc-root>/irq` lists (its numbered directories).
fn irq_numbers(dir: &Path) -> Vec<u32> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

fn read_affinity_file(path: &Path) -> io::Result<String> {
    crate::bounded::read_kernel_file(path, crate::bounded::KERNEL_FILE_LIMIT)
}

/// The CPUs of `banned` an affinity read back as `now` still has that the `desired` one does
/// not (an affinity left on its only CPUs keeps them by design).
fn still_on(now: &CpuSet, desired: &CpuSet, banned: &CpuSet) -> CpuSet {
    now.intersection(banned).difference(desired)
}

/// Writes an existing kernel file (procfs' affinity files, sysfs' per-cpu power files): never
/// creates one, never follows a symlink planted in its place.
pub(crate) fn write_existing(path: &Path, value: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    file.write_all(value.as_bytes())?;
    #[cfg(debug_assertions)]
    if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
        crate::faults::written(name);
    }
    Ok(())
}

/// `original` minus `banned`, or `original` when nothing would be left (never an IRQ with no
/// CPU).
fn without(original: &CpuSet, banned: &CpuSet) -> CpuSet {
    let left = original.difference(banned);
    if left.is_empty() {
        original.clone()
    } else {
        left
    }
}

/// An affinity file the kernel made read-only (no write bit: Linux 6.12 creates
/// `smp_affinity_list` 0444 for an IRQ user space may not set, such as IRQ 0). Root could still
/// open it for writing, and the write would be refused; it is left alone as unchangeable.
fn fixed_by_kernel(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::symlink_metadata(path).is_ok_and(|m| m.permissions().mode() & 0o222 == 0)
}

/// The kernel's "this interrupt cannot be moved" answers.
fn refused_by_kernel(e: &io::Error) -> bool {
    [Errno::EIO, Errno::EINVAL]
        .iter()
        .any(|errno| e.raw_os_error() == Some(*errno as i32))
}

/// Why a CPU mask could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    #[error("{text:?} is not a cpu mask (hex digits, commas between 32-bit words)")]
    NotHex { text: String },
    #[error("cpu mask names cpu {cpu}, past the largest cpu id {max}")]
    TooLarge { cpu: usize, max: u32 },
}

/// A CPU mask as the kernel prints it (`ff`, `00000000,000000ff`): hex, most significant
/// first, commas between 32-bit words. Leading zeros are allowed, however many; a set bit past
/// [`MAX_CPU_ID`] is an error.
pub fn parse_mask(text: &str) -> Result<CpuSet, MaskError> {
    let not_hex = || MaskError::NotHex {
        text: text.chars().take(80).collect(),
    };
    let digits = text.bytes().filter(|c| *c != b',');
    if digits.clone().next().is_none() || !digits.clone().all(|c| c.is_ascii_hexdigit()) {
        return Err(not_hex());
    }
    let mut cpus = CpuSet::new();
    for (i, c) in digits.rev().enumerate() {
        let nibble = char::from(c).to_digit(16).ok_or_else(not_hex)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                let cpu = i.saturating_mul(4).saturating_add(bit);
                match u32::try_from(cpu) {
                    Ok(id) if id <= MAX_CPU_ID => cpus.insert(id),
                    _ => {
                        return Err(MaskError::TooLarge {
                            cpu,
                            max: MAX_CPU_ID,
                        })
                    }
                }
            }
        }
    }
    Ok(cpus)
}

/// `cpus` as a mask shaped like `like` (as many hex digits, commas where it has them), widened
/// when a CPU needs more digits.
pub fn format_mask(cpus: &CpuSet, like: &str) -> String {
    let like_digits = like.chars().filter(|c| *c != ',').count().max(1);
    let needed = cpus.iter().last().map_or(1, |max| max as usize / 4 + 1);
    let width = like_digits.max(needed);
    let mut digits = vec![0u8; width];
    for cpu in cpus.iter() {
        let cpu = cpu as usize;
        digits[width - 1 - cpu / 4] |= 1 << (cpu % 4);
    }
    let hex: Vec<char> = digits
        .iter()
        .map(|d| char::from_digit(u32::from(*d), 16).unwrap_or('0'))
        .collect();
    if !like.contains(',') {
        return hex.into_iter().collect();
    }
    // Commas every 8 digits from the right.
    let mut out = String::new();
    for (i, c) in hex.iter().enumerate() {
        if i > 0 && (width - i) % 8 == 0 {
            out.push(',');
        }
        out.push(*c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    /// Issue 23 item 3: a mask naming a cpu past the largest id (a 2,049-digit
    /// `default_smp_affinity`, an irqbalance answer) panicked in `CpuSet::insert`.
    #[test]
    fn a_mask_past_the_largest_cpu_is_an_error_not_a_panic() {
        let past = format!("1{}", "0".repeat(2048));
        let err = parse_mask(&past).unwrap_err();
        assert!(
            err.to_string().contains("8192") && err.to_string().contains("8191"),
            "{err}"
        );
        // Leading zeros are no cpu: as long as the kernel likes.
        assert_eq!(
            parse_mask(&format!("{}3", "0".repeat(3000))).unwrap(),
            set("0-1")
        );
        let proc = fake_proc(&past, &[(1, "0-3")]);
        let mut irqs = IrqAffinity::new(proc.path(), IrqSaved::default());
        let outcome = irqs.apply(&set("2"));
        assert!(
            outcome.errors[0].contains("default_smp_affinity"),
            "{:?}",
            outcome.errors
        );
        assert_eq!(irqs.saved().in_force, CpuSet::new(), "not read back");
        assert_eq!(read(proc.path(), "1/smp_affinity_list"), "0-1,3");
    }

    #[test]
    fn masks_read_and_write_as_the_kernel_prints_them() {
        assert_eq!(parse_mask("ff"), Ok(set("0-7")));
        assert_eq!(parse_mask("00000000,00000101"), Ok(set("0,8")));
        assert_eq!(parse_mask("1,00000000"), Ok(set("32")));
        assert!(parse_mask("xyz").is_err());
        assert!(parse_mask("").is_err());
        assert_eq!(format_mask(&set("0-3,6"), "ff"), "4f");
        assert_eq!(
            format_mask(&set("0,8"), "00000000,000000ff"),
            "00000000,00000101"
        );
        assert_eq!(format_mask(&set("40"), "ff"), "10000000000");
        for text in ["ff", "0f", "00000000,ffffffff", "ffff,ffffffff"] {
            assert_eq!(format_mask(&parse_mask(text).unwrap(), text), text);
        }
    }

    fn fake_proc(default: &str, irqs: &[(u32, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let irq = dir.path().join("irq");
        fs::create_dir_all(&irq).unwrap();
        fs::write(irq.join("default_smp_affinity"), format!("{default}\n")).unwrap();
        for (n, list) in irqs {
            fs::create_dir_all(irq.join(n.to_string())).unwrap();
            fs::write(
                irq.join(format!("{n}/smp_affinity_list")),
                format!("{list}\n"),
            )
            .unwrap();
        }
        dir
    }

    fn read(dir: &Path, file: &str) -> String {
        fs::read_to_string(dir.join("irq").join(file))
            .unwrap()
            .trim()
            .to_string()
    }

    #[test]
    fn banned_cpus_leave_every_irq_and_come_back() {
        let proc = fake_proc("ff", &[(1, "0-7"), (2, "3"), (3, "2-3")]);
        let mut irqs = IrqAffinity::new(proc.path(), IrqSaved::default());
        let outcome = irqs.apply(&set("2-3"));
        assert_eq!(read(proc.path(), "default_smp_affinity"), "f3");
        assert_eq!(read(proc.path(), "1/smp_affinity_list"), "0-1,4-7");
        // Only kept-free CPUs: left where it is, never without a CPU.
        assert_eq!(read(proc.path(), "2/smp_affinity_list"), "3");
        assert_eq!(read(proc.path(), "3/smp_affinity_list"), "2-3");
        assert_eq!((outcome.written, outcome.no_other_cpu), (2, 2));
        // Read back as written: in force (the IRQs with no other cpu are the exception).
        assert_eq!(irqs.saved().in_force, set("2-3"));
        // Idempotent.
        assert_eq!(irqs.apply(&set("2-3")).written, 0);
        // A restart (the saved state from the checkpoint) and a release restore everything.
        let saved = irqs.saved().clone();
        let json = serde_json::to_string(&saved).unwrap();
        let mut again = IrqAffinity::new(proc.path(), serde_json::from_str(&json).unwrap());
        again.apply(&CpuSet::new());
        assert_eq!(read(proc.path(), "default_smp_affinity"), "ff");
        assert_eq!(read(proc.path(), "1/smp_affinity_list"), "0-7");
        assert!(again.saved().is_empty(), "{:?}", again.saved());
    }

    #[test]
    fn a_narrower_set_restores_what_it_no_longer_bans() {
        let proc = fake_proc("0f", &[(10, "0-3")]);
        let mut irqs = IrqAffinity::new(proc.path(), IrqSaved::default());
        irqs.apply(&set("1-2"));
        assert_eq!(read(proc.path(), "10/smp_affinity_list"), "0,3");
        irqs.apply(&set("2"));
        assert_eq!(read(proc.path(), "10/smp_affinity_list"), "0-1,3");
        assert_eq!(read(proc.path(), "default_smp_affinity"), "0b");
        // A new IRQ appears: taken in.
        fs::create_dir_all(proc.path().join("irq/11")).unwrap();
        fs::write(proc.path().join("irq/11/smp_affinity_list"), "0-3").unwrap();
        irqs.apply(&set("2"));
        assert_eq!(read(proc.path(), "11/smp_affinity_list"), "0-1,3");
        irqs.apply(&CpuSet::new());
        assert_eq!(read(proc.path(), "11/smp_affinity_list"), "0-3");
        assert_eq!(read(proc.path(), "default_smp_affinity"), "0f");
    }

    /// Linux 6.12 makes `smp_affinity_list` 0444 where an IRQ cannot be set from user space
    /// (IRQ 0, the timer); root could still open it for writing and the write fails with EPERM
    /// or EIO, which the status then read as isolation not in force.
    #[test]
    fn an_irq_whose_affinity_file_the_kernel_made_read_only_is_never_written() {
        use std::os::unix::fs::PermissionsExt;
        let proc = fake_proc("ff", &[(0, "0-7"), (1, "0-7")]);
        let fixed = proc.path().join("irq/0/smp_affinity_list");
        fs::set_permissions(&fixed, fs::Permissions::from_mode(0o444)).unwrap();
        let mut irqs = IrqAffinity::new(proc.path(), IrqSaved::default());
        let outcome = irqs.apply(&set("2-3"));
        assert_eq!(read(proc.path(), "0/smp_affinity_list"), "0-7");
        assert_eq!(read(proc.path(), "1/smp_affinity_list"), "0-1,4-7");
        // IRQ 1 and default_smp_affinity written; IRQ 0 left as unchangeable.
        assert_eq!((outcome.written, outcome.unchangeable), (2, 1));
        assert_eq!(irqs.saved().in_force, set("2-3"));
        assert!(!irqs.saved().irqs.contains_key(&0), "{:?}", irqs.saved());
    }

    #[test]
    fn no_irq_directory_is_nothing_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut irqs = IrqAffinity::new(dir.path(), IrqSaved::default());
        let outcome = irqs.apply(&set("1"));
        assert_eq!(
            (outcome.written, outcome.unchangeable, outcome.errors.len()),
            (0, 0, 0)
        );
        assert_eq!(outcome.irqbalance, IrqbalanceOutcome::NotRunning);
    }

    #[test]
    fn what_irqbalance_was_not_told_is_said_once_and_recorded_nowhere() {
        let proc = fake_proc("0f", &[(10, "0-3")]);
        // irqbalance runs, but no socket of its is to be found.
        fs::create_dir_all(proc.path().join("77")).unwrap();
        fs::write(proc.path().join("77/comm"), "irqbalance\n").unwrap();
        let mut irqs = IrqAffinity::new(proc.path(), IrqSaved::default());
        // The first look may catch it starting: not said yet.
        assert_eq!(irqs.apply(&set("1")).irqbalance_news, None);
        let first = irqs.apply(&set("1"));
        assert_eq!(first.irqbalance, IrqbalanceOutcome::NoSocket { pid: 77 });
        let (warning, line) = first.irqbalance_news.unwrap();
        assert!(warning && line.contains("pid 77"), "{line}");
        // The affinities are still changed.
        assert_eq!(read(proc.path(), "10/smp_affinity_list"), "0,2-3");
        // Said once, not on every reconcile.
        assert_eq!(irqs.apply(&set("1")).irqbalance_news, None);
        assert_eq!(irqs.saved().irqbalance, None);
    }
}
