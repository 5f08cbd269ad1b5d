//! The integration test binary: each submodule drives the real `cpusetd` binary or the public
//! library API the way an operator or the agent would. Helpers live in `util`.

mod util;

mod topology_cli;
