//! `cpusetd topology`: print the discovered topology as a tree or as the JSON document that
//! `cpusetd allocate --topology` reads back.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;

use super::CommandError;
use crate::topology::{render_map, render_tree, MapStyle, Mark};

#[derive(Debug, Args)]
pub struct TopologyArgs {
    /// Where sysfs is mounted (a fake tree in tests).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Where procfs is mounted; only `cmdline` is read from it.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    proc_root: PathBuf,
    /// Print the JSON document instead of the tree.
    #[arg(long)]
    json: bool,
    /// Draw the CPUs as a grid (sockets, NUMA nodes, L3 caches, cores), as `status --map` does
    /// without owners.
    #[arg(long, conflicts_with = "json")]
    map: bool,
}

pub fn run(args: &TopologyArgs) -> Result<(), CommandError> {
    for (flag, dir) in [
        ("--sysfs-root", &args.sysfs_root),
        ("--proc-root", &args.proc_root),
    ] {
        if !dir.is_dir() {
            return Err(CommandError::usage(format!(
                "{flag} {}: not a directory; pass the directory where it is mounted",
                dir.display()
            )));
        }
    }
    let topo = super::node::discover_topology(&args.sysfs_root, &args.proc_root)?;
    if args.json {
        println!("{}", topo.to_document().to_json_lines());
    } else if args.map {
        let isolated = topo.isolated().clone();
        let mark = |cpu: u32| {
            if isolated.contains(cpu) {
                Mark::Isolated
            } else {
                Mark::Online
            }
        };
        let legend = [
            "".to_string(),
            "· online   I isolated (isolcpus)   X offline".to_string(),
        ];
        let style = MapStyle::for_output(std::io::stdout().is_terminal());
        print!("{}", render_map(&topo, mark, &legend, style));
    } else {
        print!("{}", render_tree(&topo));
    }
    Ok(())
}
