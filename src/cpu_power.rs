//! CRI-O's power annotations on the exclusive CPUs of the pods that ask:
//! `cpu-c-states.crio.io` writes each CPU's `power/pm_qos_resume_latency_us` (the idle-state
//! wake-up limit: `0` none, `n/a` no idle state but polling, `N` microseconds), and
//! `cpu-freq-governor.crio.io` each CPU's `cpufreq/scaling_governor` (refused, and said once,
//! when the governor is not in that CPU's `scaling_available_governors`).
//!
//! Every value is recorded before it is first changed ([`PowerSaved`], written ahead to
//! `host.json`: [`crate::checkpoint::host`], and kept in the checkpoint), and written back when
//! no pod asks any more: when the pod goes, at the next start after a `kill -9`, and by
//! `cpusetd reset`. A value is in force only as read back after the write. Everything is under
//! the injected sysfs root (`<sysfs>/devices/system/cpu/cpu<N>/...`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::checkpoint::host::HostJournal;
use crate::cpuset::CpuSet;

/// One of the two per-CPU files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    /// `power/pm_qos_resume_latency_us` (`cpu-c-states.crio.io`).
    ResumeLatency,
    /// `cpufreq/scaling_governor` (`cpu-freq-governor.crio.io`).
    Governor,
}

impl Knob {
    /// The file under `cpu<N>/`.
    pub fn file(self) -> &'static str {
        match self {
            Knob::ResumeLatency => "power/pm_qos_resume_latency_us",
            Knob::Governor => "cpufreq/scaling_governor",
        }
    }

    fn annotation(self) -> &'static str {
        match self {
            Knob::ResumeLatency => crate::classify::CPU_C_STATES_ANNOTATION,
            Knob::Governor => crate::classify::CPU_FREQ_GOVERNOR_ANNOTATION,
        }
    }
}

/// What to restore, and (a report only) what is in force now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerSaved {
    /// Each changed CPU's `pm_qos_resume_latency_us` before the first change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency: BTreeMap<u32, String>,
    /// Each changed CPU's `scaling_governor` before the first change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub governor: BTreeMap<u32, String>,
    /// CPUs whose resume latency read back as a pod asked.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub latency_in_force: CpuSet,
    /// CPUs whose governor read back as a pod asked.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub governor_in_force: CpuSet,
}

impl PowerSaved {
    /// Nothing to restore, nothing in force.
    pub fn is_empty(&self) -> bool {
        self.latency.is_empty()
            && self.governor.is_empty()
            && self.latency_in_force.is_empty()
            && self.governor_in_force.is_empty()
    }

    /// Only what is to be restored (what `host.json` keeps).
    pub fn originals(&self) -> PowerSaved {
        PowerSaved {
            latency: self.latency.clone(),
            governor: self.governor.clone(),
            ..PowerSaved::default()
        }
    }

    /// [`PowerSaved::originals`] as `host.json` keeps it (`Null` when nothing).
    pub fn originals_value(&self) -> serde_json::Value {
        let originals = self.originals();
        crate::effects::to_saved(&originals, originals.is_empty())
    }

    fn map(&mut self, knob: Knob) -> (&mut BTreeMap<u32, String>, &mut CpuSet) {
        match knob {
            Knob::ResumeLatency => (&mut self.latency, &mut self.latency_in_force),
            Knob::Governor => (&mut self.governor, &mut self.governor_in_force),
        }
    }
}

/// What one [`CpuPower::apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerOutcome {
    /// Files written (settings and restores).
    pub written: usize,
    /// Failures and refusals, one line each, for the log (said once each by the caller).
    pub lines: Vec<String>,
    /// CPUs whose governor was refused (not available there).
    pub governor_refused: CpuSet,
}

/// The per-CPU power files under `<sysfs>/devices/system/cpu`.
#[derive(Debug)]
pub struct CpuPower {
    dir: PathBuf,
    saved: PowerSaved,
    journal: Option<HostJournal>,
}

impl CpuPower {
    /// `saved`: what an earlier run recorded (host record or checkpoint), or the default.
    pub fn new(sysfs_root: &Path, saved: PowerSaved) -> CpuPower {
        CpuPower {
            dir: sysfs_root.join("devices/system/cpu"),
            saved,
            journal: None,
        }
    }

    /// Records every original in `journal` (synced) before changing it.
    pub fn with_journal(mut self, journal: HostJournal) -> CpuPower {
        self.journal = Some(journal);
        self
    }

    pub fn saved(&self) -> &PowerSaved {
        &self.saved
    }

    fn path(&self, cpu: u32, knob: Knob) -> PathBuf {
        self.dir.join(format!("cpu{cpu}")).join(knob.file())
    }

    fn record(&self) -> Result<(), String> {
        match &self.journal {
            Some(journal) => journal
                .record(crate::effects::power::NAME, self.saved.originals_value())
                .map_err(|e| {
                    format!(
                    "{}: cpu power settings left alone while their originals cannot be recorded",
                    crate::logging::error_chain(&e)
                )
                }),
            None => Ok(()),
        }
    }

    /// Sets each CPU of `latency` and `governor` to its value, and puts back every recorded CPU
    /// that is in neither (empty maps: restores everything). Idempotent: a second call writes
    /// only what someone changed meanwhile.
    pub fn apply(
        &mut self,
        latency: &BTreeMap<u32, String>,
        governor: &BTreeMap<u32, String>,
    ) -> PowerOutcome {
        let mut outcome = PowerOutcome::default();
        let governor = self.available(governor, &mut outcome);
        // Write-ahead: every original durable before the first write.
        for (knob, wanted) in [(Knob::ResumeLatency, latency), (Knob::Governor, &governor)] {
            for &cpu in wanted.keys() {
                if self.saved.map(knob).0.contains_key(&cpu) {
                    continue;
                }
                match read(&self.path(cpu, knob)) {
                    Ok(now) => {
                        self.saved.map(knob).0.insert(cpu, now);
                    }
                    Err(e) => outcome.lines.push(format!(
                        "{} not in force on cpu {cpu}: {}: {e}",
                        knob.annotation(),
                        self.path(cpu, knob).display()
                    )),
                }
            }
        }
        if let Err(e) = self.record() {
            outcome.lines.push(e);
            return outcome;
        }
        self.set(Knob::ResumeLatency, latency, &mut outcome);
        self.set(Knob::Governor, &governor, &mut outcome);
        if let Err(e) = self.record() {
            outcome.lines.push(e);
        }
        outcome
    }

    /// Those of `governor` the CPU offers; the others are refused (a line each).
    fn available(
        &self,
        governor: &BTreeMap<u32, String>,
        outcome: &mut PowerOutcome,
    ) -> BTreeMap<u32, String> {
        let mut kept = BTreeMap::new();
        for (&cpu, name) in governor {
            let path = self
                .dir
                .join(format!("cpu{cpu}/cpufreq/scaling_available_governors"));
            match read(&path) {
                Ok(list) if list.split_whitespace().any(|g| g == name) => {
                    kept.insert(cpu, name.clone());
                }
                Ok(list) => {
                    outcome.governor_refused.insert(cpu);
                    outcome.lines.push(format!(
                        "cpu-freq-governor.crio.io: governor {name:?} refused on cpu {cpu}: not in {} ({list:?}); its governor is left as it is",
                        path.display()
                    ));
                }
                Err(e) => {
                    outcome.governor_refused.insert(cpu);
                    outcome.lines.push(format!(
                        "cpu-freq-governor.crio.io: governor {name:?} refused on cpu {cpu}: {}: {e} (no cpufreq driver?); its governor is left as it is",
                        path.display()
                    ));
                }
            }
        }
        kept
    }

    /// Writes `wanted` (CPUs with a recorded original) and restores the recorded CPUs not in
    /// it; in force only as read back.
    fn set(&mut self, knob: Knob, wanted: &BTreeMap<u32, String>, outcome: &mut PowerOutcome) {
        let mut in_force = CpuSet::new();
        let recorded: Vec<(u32, String)> = self
            .saved
            .map(knob)
            .0
            .iter()
            .map(|(c, v)| (*c, v.clone()))
            .collect();
        for (cpu, original) in recorded {
            let target = wanted.get(&cpu).unwrap_or(&original);
            let path = self.path(cpu, knob);
            match self.write_checked(&path, target, outcome) {
                Ok(()) if wanted.contains_key(&cpu) => {
                    in_force.insert(cpu);
                }
                Ok(()) => {
                    self.saved.map(knob).0.remove(&cpu);
                }
                Err(e) => outcome.lines.push(format!(
                    "{} on cpu {cpu}: {}: {e}{}",
                    knob.annotation(),
                    path.display(),
                    if wanted.contains_key(&cpu) {
                        " (not in force)"
                    } else {
                        " (the original is kept to be restored later)"
                    }
                )),
            }
        }
        *self.saved.map(knob).1 = in_force;
    }

    /// Makes `path` read `value`: written when it differs, then read back.
    fn write_checked(
        &self,
        path: &Path,
        value: &str,
        outcome: &mut PowerOutcome,
    ) -> io::Result<()> {
        if read(path)? == value {
            return Ok(());
        }
        crate::irq::write_existing(path, value)?;
        outcome.written += 1;
        let now = read(path)?;
        if now != value {
            return Err(io::Error::other(format!(
                "reads {now:?} after {value:?} was written"
            )));
        }
        Ok(())
    }
}

/// A sysfs value, trimmed.
fn read(path: &Path) -> io::Result<String> {
    crate::bounded::read_kernel_file(path, crate::bounded::KERNEL_FILE_LIMIT)
        .map(|t| t.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn cpu_dir(root: &Path, cpu: u32) -> PathBuf {
        root.join(format!("devices/system/cpu/cpu{cpu}"))
    }

    fn fake(root: &Path, cpus: u32) {
        for cpu in 0..cpus {
            let dir = cpu_dir(root, cpu);
            fs::create_dir_all(dir.join("power")).unwrap();
            fs::create_dir_all(dir.join("cpufreq")).unwrap();
            fs::write(dir.join("power/pm_qos_resume_latency_us"), "0\n").unwrap();
            fs::write(dir.join("cpufreq/scaling_governor"), "schedutil\n").unwrap();
            fs::write(
                dir.join("cpufreq/scaling_available_governors"),
                "performance schedutil\n",
            )
            .unwrap();
        }
    }

    fn get(root: &Path, cpu: u32, knob: Knob) -> String {
        read(&cpu_dir(root, cpu).join(knob.file())).unwrap()
    }

    #[test]
    fn sets_reads_back_and_restores_each_original() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path(), 4);
        let mut power = CpuPower::new(dir.path(), PowerSaved::default());
        let latency = BTreeMap::from([(2, "n/a".to_string()), (3, "n/a".to_string())]);
        let governor = BTreeMap::from([(2, "performance".to_string())]);
        let outcome = power.apply(&latency, &governor);
        assert_eq!(outcome.written, 3, "{outcome:?}");
        assert!(outcome.lines.is_empty(), "{outcome:?}");
        assert_eq!(get(dir.path(), 2, Knob::ResumeLatency), "n/a");
        assert_eq!(get(dir.path(), 2, Knob::Governor), "performance");
        assert_eq!(power.saved().latency[&3], "0");
        assert_eq!(
            power.saved().latency_in_force,
            CpuSet::parse("2-3").unwrap()
        );
        assert_eq!(power.saved().governor_in_force, CpuSet::parse("2").unwrap());
        // Again: nothing to write.
        assert_eq!(power.apply(&latency, &governor).written, 0);
        // Someone else's value is not recorded as an original once one is.
        fs::write(cpu_dir(dir.path(), 3).join(Knob::ResumeLatency.file()), "5").unwrap();
        assert_eq!(power.apply(&latency, &governor).written, 1);
        assert_eq!(power.saved().latency[&3], "0");
        // Nobody asks: every original back, nothing left recorded.
        let outcome = power.apply(&BTreeMap::new(), &BTreeMap::new());
        assert_eq!(outcome.written, 3);
        for cpu in 0..4 {
            assert_eq!(get(dir.path(), cpu, Knob::ResumeLatency), "0");
            assert_eq!(get(dir.path(), cpu, Knob::Governor), "schedutil");
        }
        assert!(power.saved().is_empty(), "{:?}", power.saved());
    }

    #[test]
    fn a_governor_the_cpu_does_not_offer_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path(), 2);
        let mut power = CpuPower::new(dir.path(), PowerSaved::default());
        let governor = BTreeMap::from([(1, "ondemand".to_string())]);
        let outcome = power.apply(&BTreeMap::new(), &governor);
        assert_eq!(outcome.written, 0);
        assert_eq!(outcome.governor_refused, CpuSet::parse("1").unwrap());
        assert!(
            outcome.lines[0].contains("\"ondemand\" refused on cpu 1"),
            "{outcome:?}"
        );
        assert_eq!(get(dir.path(), 1, Knob::Governor), "schedutil");
        assert!(power.saved().is_empty());
        // No cpufreq at all (QEMU's guest): refused too, saying why.
        fs::remove_dir_all(cpu_dir(dir.path(), 1).join("cpufreq")).unwrap();
        let outcome = power.apply(&BTreeMap::new(), &governor);
        assert!(
            outcome.lines[0].contains("no cpufreq driver"),
            "{outcome:?}"
        );
    }

    #[test]
    fn a_missing_latency_file_is_not_in_force_and_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path(), 2);
        fs::remove_file(cpu_dir(dir.path(), 1).join(Knob::ResumeLatency.file())).unwrap();
        let mut power = CpuPower::new(dir.path(), PowerSaved::default());
        let latency = BTreeMap::from([(0, "7".to_string()), (1, "7".to_string())]);
        let outcome = power.apply(&latency, &BTreeMap::new());
        assert_eq!(outcome.written, 1);
        assert_eq!(outcome.lines.len(), 1, "{outcome:?}");
        assert_eq!(power.saved().latency_in_force, CpuSet::parse("0").unwrap());
        assert!(!power.saved().latency.contains_key(&1));
    }
}
