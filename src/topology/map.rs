//! The node as a grid (`topology --map`, `status --map`): one block per socket, NUMA node and
//! L3 cache (and per die where a socket has several, per core type on a hybrid part), each core
//! a bracket of its threads side by side, every CPU marked: reserved,
//! shared, isolated, offline, or the key of the container holding it exclusively, with a
//! legend. Lines wrap at a width (120 columns by default), so 288 CPUs stay readable; colour
//! only when asked (a terminal, without `NO_COLOR`).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{CoreType, Topology};
use crate::cpuset::CpuSet;

/// What the map shows for one CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Online and nothing more to say (`topology --map`).
    Online,
    Reserved,
    Shared,
    Isolated,
    /// Held exclusively: the owner's key and its number (for its colour).
    Owner {
        key: String,
        index: usize,
    },
}

impl Mark {
    fn symbol(&self) -> &str {
        match self {
            Mark::Online | Mark::Shared => "·",
            Mark::Reserved => "R",
            Mark::Isolated => "I",
            Mark::Owner { key, .. } => key,
        }
    }

    /// ANSI SGR parameters.
    fn colour(&self) -> Option<&'static str> {
        const OWNERS: [&str; 6] = ["1;31", "1;32", "1;33", "1;34", "1;35", "1;36"];
        match self {
            Mark::Online | Mark::Shared => None,
            Mark::Reserved => Some("2"),
            Mark::Isolated => Some("7"),
            Mark::Owner { index, .. } => Some(OWNERS[index % OWNERS.len()]),
        }
    }
}

/// How to draw.
#[derive(Debug, Clone, Copy)]
pub struct MapStyle {
    /// Wrap lines at this many columns.
    pub width: usize,
    pub colour: bool,
}

impl MapStyle {
    /// 120 columns; colour when `is_terminal` and `NO_COLOR` is unset or empty.
    pub fn for_output(is_terminal: bool) -> MapStyle {
        let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        MapStyle {
            width: 120,
            colour: is_terminal && !no_colour,
        }
    }
}

/// The key of the `n`th owner: `a`…`z`, then `aa`, `ab`, … (lower case, so they never read as
/// the upper-case states).
pub fn owner_key(n: usize) -> String {
    let letter = |i: usize| char::from(b'a' + (i % 26) as u8);
    if n < 26 {
        letter(n).to_string()
    } else {
        let n = n - 26;
        format!("{}{}", letter(n / 26 % 26), letter(n % 26))
    }
}

/// Draws `topo` with `mark` for each online CPU; `legend` lines (already formatted) follow the
/// grid. Offline CPUs, whose place the kernel no longer reports, are drawn `X` in a block of
/// their own after it.
pub fn render_map(
    topo: &Topology,
    mark: impl Fn(u32) -> Mark,
    legend: &[String],
    style: MapStyle,
) -> String {
    let (grid, several_dies) = grid_of(topo);
    let marks: BTreeMap<u32, Mark> = topo.cpus().iter().map(|c| (c.id, mark(c.id))).collect();
    let cells = Cells {
        id_width: topo
            .cpus()
            .iter()
            .map(|c| c.id)
            .chain(topo.offline().iter())
            .max()
            .map_or(1, |max| max.to_string().len()),
        key_width: marks
            .values()
            .map(|m| m.symbol().chars().count())
            .max()
            .unwrap_or(1),
        marks,
        style,
    };
    let mut out = String::new();
    for ((socket, die, numa, uncore, core_type), cores) in &grid {
        let cpus: CpuSet = cores.values().flatten().copied().collect();
        let die = if several_dies {
            format!(" · die {die}")
        } else {
            String::new()
        };
        let core_type = core_type.map_or(String::new(), |t| format!(" · {} cores", t.name()));
        let _ = writeln!(
            out,
            "socket {socket}{die} · NUMA node {numa} · L3 {uncore}{core_type} · cpus {cpus}"
        );
        cells.draw_cores(&mut out, cores);
    }
    cells.draw_offline(&mut out, topo);
    for line in legend {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// socket → die → NUMA node → L3 → core type → core → threads. A die is the pair
/// (socket, die id): kernels number dies per package or across the machine.
type Grid = BTreeMap<(u32, u32, u32, u32, Option<CoreType>), BTreeMap<u32, Vec<u32>>>;

/// The online CPUs of `topo` by block and core, and whether any socket has several dies.
fn grid_of(topo: &Topology) -> (Grid, bool) {
    let mut grid: Grid = BTreeMap::new();
    let types = topo.core_types();
    let mut dies: BTreeMap<u32, std::collections::BTreeSet<u32>> = BTreeMap::new();
    for cpu in topo.cpus() {
        dies.entry(cpu.socket).or_default().insert(cpu.die);
        let core_type = [CoreType::Performance, CoreType::Efficient]
            .into_iter()
            .find(|&t| types.of(t).contains(cpu.id));
        grid.entry((cpu.socket, cpu.die, cpu.numa, cpu.uncore, core_type))
            .or_default()
            .entry(cpu.core)
            .or_default()
            .push(cpu.id);
    }
    let several_dies = dies.values().any(|d| d.len() > 1);
    (grid, several_dies)
}

/// How a CPU's cell is drawn: its mark, ids and marks padded to one width, wrapped at the
/// style's width.
struct Cells {
    marks: BTreeMap<u32, Mark>,
    id_width: usize,
    key_width: usize,
    style: MapStyle,
}

impl Cells {
    /// One block's cores, a `[threads]` cell each, wrapped into lines.
    fn draw_cores(&self, out: &mut String, cores: &BTreeMap<u32, Vec<u32>>) {
        let (id_width, key_width) = (self.id_width, self.key_width);
        let mut line = String::from(" ");
        let mut line_width = 1;
        for threads in cores.values() {
            let mut threads = threads.clone();
            threads.sort_unstable();
            // Plain width first (for wrapping), colour codes around each thread after.
            let cell_width = 2 + threads.len() * (id_width + key_width) + threads.len() - 1;
            if line_width + 1 + cell_width > self.style.width && line_width > 1 {
                out.push_str(line.trim_end());
                out.push('\n');
                line = String::from(" ");
                line_width = 1;
            }
            line.push_str(" [");
            for (i, id) in threads.iter().enumerate() {
                if i > 0 {
                    line.push(' ');
                }
                let m = &self.marks[id];
                let text = format!("{id:>id_width$}{:<key_width$}", m.symbol());
                match (self.style.colour, m.colour()) {
                    (true, Some(sgr)) => {
                        let _ = write!(line, "\x1b[{sgr}m{text}\x1b[0m");
                    }
                    _ => line.push_str(&text),
                }
            }
            line.push(']');
            line_width += 1 + cell_width;
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }

    /// Offline cpus: the kernel no longer says where they are, so they have a block of their
    /// own, each drawn `X`.
    fn draw_offline(&self, out: &mut String, topo: &Topology) {
        if topo.offline().is_empty() {
            return;
        }
        let (id_width, key_width) = (self.id_width, self.key_width);
        let _ = writeln!(
            out,
            "offline · place not reported by the kernel · cpus {}",
            topo.offline()
        );
        let mut line = String::from(" ");
        for id in topo.offline().iter() {
            let cell = format!(" [{id:>id_width$}{:<key_width$}]", "X");
            if line.chars().count() + cell.chars().count() > self.style.width && line.len() > 1 {
                out.push_str(line.trim_end());
                out.push('\n');
                line = String::from(" ");
            }
            line.push_str(&cell);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::RegularShape;

    fn machine(sockets: u32, numa: u32, l3: u32, cores: u32, threads: u32) -> Topology {
        Topology::regular(RegularShape {
            sockets,
            numa_nodes_per_socket: numa,
            uncore_caches_per_numa_node: l3,
            cores_per_uncore_cache: cores,
            threads_per_core: threads,
        })
        .unwrap()
    }

    #[test]
    fn owner_keys_never_repeat_and_stay_lower_case() {
        let keys: Vec<String> = (0..26 * 27).map(owner_key).collect();
        let unique: std::collections::BTreeSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len());
        assert_eq!(keys[0], "a");
        assert_eq!(keys[25], "z");
        assert_eq!(keys[26], "aa");
        assert!(keys
            .iter()
            .all(|k| k.chars().all(|c| c.is_ascii_lowercase())));
    }

    #[test]
    fn every_cpu_appears_once_with_its_mark_and_lines_fit() {
        // 288 CPUs: 2 sockets × 2 NUMA nodes × 2 L3 × 18 cores × 2 threads.
        let topo = machine(2, 2, 2, 18, 2);
        assert_eq!(topo.all_cpus().len(), 288);
        let owned = CpuSet::parse("10,154").unwrap();
        let map = render_map(
            &topo,
            |cpu| match cpu {
                0 | 144 => Mark::Reserved,
                c if owned.contains(c) => Mark::Owner {
                    key: "a".into(),
                    index: 0,
                },
                _ => Mark::Shared,
            },
            &["a  default/db/db".to_string()],
            MapStyle {
                width: 120,
                colour: false,
            },
        );
        assert!(map.lines().all(|l| l.chars().count() <= 120), "{map}");
        // Every thread token (`<id><mark>`) of the grid, by id.
        let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
        for line in map.lines().filter(|l| l.starts_with("  [")) {
            for token in line.replace(['[', ']'], " ").split_whitespace() {
                let digits: String = token.chars().take_while(char::is_ascii_digit).collect();
                *seen.entry(digits.parse().unwrap()).or_default() += 1;
            }
        }
        assert_eq!(seen.len(), 288, "{map}");
        assert!(seen.values().all(|n| *n == 1), "{map}");
        assert!(map.contains("  0R 144R]"), "{map}");
        assert!(map.contains(" 10a 154a]"), "{map}");
        assert!(map.contains("socket 1 · NUMA node 3 · L3 7"), "{map}");
        assert!(map.ends_with("a  default/db/db\n"));
    }

    #[test]
    fn offline_cpus_are_drawn_x() {
        let online = machine(1, 1, 1, 2, 2);
        let topo = Topology::new(
            online.cpus().to_vec(),
            CpuSet::parse("4-5").unwrap(),
            CpuSet::new(),
            online.memory_nodes().clone(),
        )
        .unwrap();
        let map = render_map(
            &topo,
            |_| Mark::Shared,
            &[],
            MapStyle {
                width: 120,
                colour: false,
            },
        );
        assert!(
            map.contains("offline · place not reported by the kernel · cpus 4-5\n  [4X] [5X]\n"),
            "{map}"
        );
    }

    #[test]
    fn colour_only_when_asked() {
        let topo = machine(1, 1, 1, 2, 2);
        let mark = |cpu: u32| {
            if cpu == 1 {
                Mark::Owner {
                    key: "a".into(),
                    index: 0,
                }
            } else {
                Mark::Shared
            }
        };
        let plain = render_map(
            &topo,
            mark,
            &[],
            MapStyle {
                width: 120,
                colour: false,
            },
        );
        assert!(!plain.contains('\x1b'));
        let coloured = render_map(
            &topo,
            mark,
            &[],
            MapStyle {
                width: 120,
                colour: true,
            },
        );
        assert!(coloured.contains("\x1b[1;31m1a\x1b[0m"), "{coloured:?}");
    }
}
