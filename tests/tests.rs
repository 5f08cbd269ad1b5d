//! The integration test binary: one binary, one submodule per area (ripgrep's layout). Each
//! submodule drives the real `cpusetd` binary or the public library API the way an operator or
//! the agent would. Helpers live in `util`.

mod agent_process;
mod agent_util;
mod util;
mod v2_inherit;

mod agent;
mod agent_real;
mod allocate_cli;
mod cgroup_scan;
mod checkpoint;
mod config_errors;
mod confinement;
mod containerd;
mod controller;
mod crash;
mod demo_cli;
mod devices;
mod faults;
mod fuzz_replay;
mod harness;
mod hostile;
mod hostile_agent;
mod hotplug;
mod irqbalance;
mod isolated_pool;
mod isolation;
mod kubelet_vectors;
mod migration;
mod placement;
mod plan_cli;
mod pod_level;
mod podresources;
mod power;
mod projection;
mod prometheus;
mod real_containers;
mod real_kernel;
mod runc;
mod status_cli;
mod systemd_unit;
mod topology_cli;
mod watcher;
