//! The `cpusetd` binary: parse the command line, run the subcommand, map its result to an exit
//! code. Everything else lives in the library.

fn main() -> std::process::ExitCode {
    cpusetd::cli::main()
}
