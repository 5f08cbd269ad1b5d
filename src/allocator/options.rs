//! The static policy options (`--cpu-manager-policy-options k=v,k=v`), named and validated as
//! kubelet names and validates them (`policy_options.go`).
//!
//! Values are read like Go's `strconv.ParseBool`. Unknown names, bad values and kubelet's
//! mutually exclusive pairs are errors naming the option. kubelet's feature-gate maturity levels
//! (alpha options need `CPUManagerPolicyAlphaOptions`) do not apply: cpusetd has no feature gates,
//! so every option is available.

use std::fmt;

use crate::topology::Topology;

pub const FULL_PCPUS_ONLY: &str = "full-pcpus-only";
pub const DISTRIBUTE_CPUS_ACROSS_NUMA: &str = "distribute-cpus-across-numa";
pub const DISTRIBUTE_CPUS_ACROSS_CORES: &str = "distribute-cpus-across-cores";
pub const ALIGN_BY_SOCKET: &str = "align-by-socket";
pub const STRICT_CPU_RESERVATION: &str = "strict-cpu-reservation";
pub const PREFER_ALIGN_CPUS_BY_UNCORECACHE: &str = "prefer-align-cpus-by-uncorecache";

/// Every option name, in kubelet's documentation order.
pub const OPTION_NAMES: [&str; 6] = [
    FULL_PCPUS_ONLY,
    DISTRIBUTE_CPUS_ACROSS_NUMA,
    ALIGN_BY_SOCKET,
    DISTRIBUTE_CPUS_ACROSS_CORES,
    STRICT_CPU_RESERVATION,
    PREFER_ALIGN_CPUS_BY_UNCORECACHE,
];

/// Why a policy option string or combination was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("malformed policy option {pair:?}: expected name=value")]
    Malformed { pair: String },
    #[error("unknown cpu manager policy option {name:?}")]
    Unknown { name: String },
    #[error(
        "bad value {value:?} for policy option {name}: expected 1, t, T, TRUE, true, True, 0, f, \
         F, FALSE, false or False"
    )]
    BadValue { name: &'static str, value: String },
    #[error("policy options {first} and {second} can not be used at the same time")]
    MutuallyExclusive {
        first: &'static str,
        second: &'static str,
    },
    #[error(
        "policy option {ALIGN_BY_SOCKET} needs at least as many NUMA nodes as sockets, but the \
         topology has {sockets} sockets and {numa_nodes} NUMA nodes"
    )]
    AlignBySocketUnsupported { sockets: usize, numa_nodes: usize },
}

/// The six static policy options. `Default` is kubelet's default: all off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyOptions {
    pub full_pcpus_only: bool,
    pub distribute_cpus_across_numa: bool,
    pub distribute_cpus_across_cores: bool,
    pub align_by_socket: bool,
    pub strict_cpu_reservation: bool,
    pub prefer_align_cpus_by_uncorecache: bool,
}

impl PolicyOptions {
    /// Parses `name=value,name=value` as kubelet's map flag does: empty parts are skipped, names
    /// and values are trimmed, a later value for the same name wins. The combination is then
    /// checked for kubelet's mutually exclusive pairs.
    pub fn parse(text: &str) -> Result<Self, OptionsError> {
        let mut options = PolicyOptions::default();
        for pair in text.split(',').filter(|pair| !pair.is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(OptionsError::Malformed {
                    pair: pair.to_string(),
                });
            };
            let (name, value) = (name.trim(), value.trim());
            let Some((name, flag)) = options.flag_mut(name) else {
                return Err(OptionsError::Unknown {
                    name: name.to_string(),
                });
            };
            *flag = parse_go_bool(value).ok_or_else(|| OptionsError::BadValue {
                name,
                value: value.to_string(),
            })?;
        }
        options.check_exclusions()?;
        Ok(options)
    }

    fn flag_mut(&mut self, name: &str) -> Option<(&'static str, &mut bool)> {
        Some(match name {
            FULL_PCPUS_ONLY => (FULL_PCPUS_ONLY, &mut self.full_pcpus_only),
            DISTRIBUTE_CPUS_ACROSS_NUMA => (
                DISTRIBUTE_CPUS_ACROSS_NUMA,
                &mut self.distribute_cpus_across_numa,
            ),
            DISTRIBUTE_CPUS_ACROSS_CORES => (
                DISTRIBUTE_CPUS_ACROSS_CORES,
                &mut self.distribute_cpus_across_cores,
            ),
            ALIGN_BY_SOCKET => (ALIGN_BY_SOCKET, &mut self.align_by_socket),
            STRICT_CPU_RESERVATION => (STRICT_CPU_RESERVATION, &mut self.strict_cpu_reservation),
            PREFER_ALIGN_CPUS_BY_UNCORECACHE => (
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                &mut self.prefer_align_cpus_by_uncorecache,
            ),
            _ => return None,
        })
    }

    /// kubelet's mutually exclusive pairs, checked in kubelet's order.
    pub fn check_exclusions(&self) -> Result<(), OptionsError> {
        let pairs = [
            (
                self.full_pcpus_only && self.distribute_cpus_across_cores,
                FULL_PCPUS_ONLY,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                self.distribute_cpus_across_numa && self.distribute_cpus_across_cores,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                self.prefer_align_cpus_by_uncorecache && self.distribute_cpus_across_cores,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                self.prefer_align_cpus_by_uncorecache && self.distribute_cpus_across_numa,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
        ];
        match pairs.into_iter().find(|(both, _, _)| *both) {
            Some((_, first, second)) => Err(OptionsError::MutuallyExclusive { first, second }),
            None => Ok(()),
        }
    }

    /// kubelet's `ValidateStaticPolicyOptions` against the topology: `align-by-socket` needs
    /// `NumSockets <= NumNUMANodes`. (kubelet also refuses it with the topology manager's
    /// `single-numa-node` policy; cpusetd has no topology manager.)
    pub fn validate_for(&self, topology: &Topology) -> Result<(), OptionsError> {
        self.check_exclusions()?;
        let counters = topology.counters();
        if self.align_by_socket && counters.num_sockets > counters.num_numa_nodes {
            return Err(OptionsError::AlignBySocketUnsupported {
                sockets: counters.num_sockets,
                numa_nodes: counters.num_numa_nodes,
            });
        }
        Ok(())
    }

    /// The options that are on, as `name=true` pairs (the empty string when none is).
    fn enabled(&self) -> impl Iterator<Item = &'static str> {
        let flags = [
            self.full_pcpus_only,
            self.distribute_cpus_across_numa,
            self.align_by_socket,
            self.distribute_cpus_across_cores,
            self.strict_cpu_reservation,
            self.prefer_align_cpus_by_uncorecache,
        ];
        OPTION_NAMES
            .into_iter()
            .zip(flags)
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
    }
}

/// Writes the enabled options in the form [`PolicyOptions::parse`] reads.
impl fmt::Display for PolicyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, name) in self.enabled().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}=true")?;
        }
        Ok(())
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_go_boolean_spelling() {
        for value in ["1", "t", "T", "TRUE", "true", "True"] {
            let options = PolicyOptions::parse(&format!("full-pcpus-only={value}")).unwrap();
            assert!(options.full_pcpus_only, "{value}");
        }
        for value in ["0", "f", "F", "FALSE", "false", "False"] {
            let options = PolicyOptions::parse(&format!("full-pcpus-only={value}")).unwrap();
            assert!(!options.full_pcpus_only, "{value}");
        }
        for value in ["yes", "tRUE", "", "2", "on"] {
            let err = PolicyOptions::parse(&format!("full-pcpus-only={value}")).unwrap_err();
            assert_eq!(
                err,
                OptionsError::BadValue {
                    name: FULL_PCPUS_ONLY,
                    value: value.to_string()
                }
            );
        }
    }

    #[test]
    fn parses_lists_like_kubelets_map_flag() {
        let options = PolicyOptions::parse(
            " full-pcpus-only = true,,distribute-cpus-across-numa=1,align-by-socket=T,\
             strict-cpu-reservation=true,full-pcpus-only=false,",
        )
        .unwrap();
        assert_eq!(
            options,
            PolicyOptions {
                full_pcpus_only: false,
                distribute_cpus_across_numa: true,
                align_by_socket: true,
                strict_cpu_reservation: true,
                ..PolicyOptions::default()
            }
        );
        assert_eq!(PolicyOptions::parse("").unwrap(), PolicyOptions::default());
        assert_eq!(
            options.to_string(),
            "distribute-cpus-across-numa=true,align-by-socket=true,strict-cpu-reservation=true"
        );
        assert_eq!(PolicyOptions::parse(&options.to_string()).unwrap(), options);
    }

    #[test]
    fn unknown_and_malformed_options_name_the_culprit() {
        let err = PolicyOptions::parse("full-pcpus-only=true,fast=true").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown cpu manager policy option \"fast\""
        );
        let err = PolicyOptions::parse("full-pcpus-only").unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed policy option \"full-pcpus-only\": expected name=value"
        );
        let err = PolicyOptions::parse("align-by-socket=maybe").unwrap_err();
        assert!(err.to_string().contains("align-by-socket"), "{err}");
    }

    #[test]
    fn mutually_exclusive_pairs_are_refused_in_kubelets_order() {
        let cases = [
            (
                "full-pcpus-only=true,distribute-cpus-across-cores=true",
                FULL_PCPUS_ONLY,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                "distribute-cpus-across-numa=true,distribute-cpus-across-cores=true",
                DISTRIBUTE_CPUS_ACROSS_NUMA,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                "prefer-align-cpus-by-uncorecache=true,distribute-cpus-across-cores=true",
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                "prefer-align-cpus-by-uncorecache=true,distribute-cpus-across-numa=true",
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
        ];
        for (text, first, second) in cases {
            assert_eq!(
                PolicyOptions::parse(text).unwrap_err(),
                OptionsError::MutuallyExclusive { first, second },
                "{text}"
            );
        }
        let err = PolicyOptions::parse(
            "full-pcpus-only=true,distribute-cpus-across-cores=true,\
             distribute-cpus-across-numa=true",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "policy options full-pcpus-only and distribute-cpus-across-cores can not be used at \
             the same time"
        );
        // Compatible combinations pass.
        PolicyOptions::parse("full-pcpus-only=true,prefer-align-cpus-by-uncorecache=true").unwrap();
        PolicyOptions::parse("full-pcpus-only=true,distribute-cpus-across-numa=true").unwrap();
    }
}
