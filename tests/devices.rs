//! Device locality on the fake 16-CPU, 2-NUMA node (node 0: cpus 0-3,8-11; node 1: 4-7,12-15;
//! CPU 0 reserved): a container whose config names a device (an SR-IOV VF in `PCIDEVICE_*`, a
//! VFIO group in `linux.devices`) on NUMA node 1 gets its exclusive CPUs there, where kubelet's
//! default would have picked node 0; `status` shows the devices and their nodes; the agent logs
//! them with the allocation; containers without devices (or whose device's node is unknown)
//! are placed as before.

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};

use crate::agent_util::{pod, DeviceRow, TestNode};
use crate::util::stdout;

fn device_locality(version: CgroupVersion, extra: &[&str]) {
    let mut node = TestNode::new(version);
    // An SR-IOV VF and a VFIO-bound function on node 1, a function whose node sysfs does not
    // know.
    node.add_pci_device("0000:d8:02.0", "1", None);
    node.add_pci_device("0000:d8:02.1", "1", Some(166));
    node.add_pci_device("0000:3b:00.0", "-1", None);
    let mut agent = node.start_agent(extra);

    // Without devices, or with a device sysfs puts on no node: kubelet's picks, node 0 (the
    // fresh node's first core after the reserved cpu, then the next one on the same node:
    // kubelet packs).
    let plain = pod(
        "plain",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 2000)],
    );
    let plain_id = node.fake.start_pod(&plain).unwrap().remove(0);
    let status = node.wait_cpus(&plain_id, "1,9");
    assert!(status.by_id(&plain_id).unwrap().devices.is_empty());
    let unknown = pod(
        "unknown",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 2000)
            .with_env("PCIDEVICE_EXAMPLE_COM_NIC=0000:3b:00.0")],
    );
    let unknown_id = node.fake.start_pod(&unknown).unwrap().remove(0);
    let status = node.wait_cpus(&unknown_id, "2,10");
    let row = status.by_id(&unknown_id).unwrap();
    assert_eq!(row.devices[0].numa, Vec::<u32>::new());
    assert!(
        row.note.ends_with("; devices 0000:3b:00.0 numa ?"),
        "{}",
        row.note
    );

    // An SR-IOV VF on node 1: kubelet would pick 3,11 next (node 0, where it packs); the
    // device's node wins.
    let sriov = pod(
        "dpdk-fwd",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("fwd", 2000)
            .with_env("PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE=0000:d8:02.0")],
    );
    let sriov_id = node.fake.start_pod(&sriov).unwrap().remove(0);
    let status = node.wait_cpus(&sriov_id, "4,12");
    let row = status.by_id(&sriov_id).unwrap();
    assert_eq!(
        row.devices,
        [DeviceRow {
            device: "0000:d8:02.0".into(),
            pci: vec!["0000:d8:02.0".into()],
            numa: vec![1],
        }]
    );
    assert!(
        row.note.ends_with("; devices 0000:d8:02.0 numa 1"),
        "{}",
        row.note
    );
    let lines = agent.log_lines("allocated cpus=4,12 devices=[0000:d8:02.0 numa 1]");
    assert_eq!(lines.len(), 1, "{}", agent.log());

    // A KubeVirt launcher with a VFIO group: node 1 too.
    let vm = pod(
        "virt-launcher-vm",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("compute", 2000)
            .with_device("/dev/kvm")
            .with_device("/dev/vfio/vfio")
            .with_device("/dev/vfio/166")],
    );
    let vm_id = node.fake.start_pod(&vm).unwrap().remove(0);
    let status = node.wait_cpus(&vm_id, "5,13");
    let row = status.by_id(&vm_id).unwrap();
    assert_eq!(row.devices.len(), 1, "{row:?}");
    assert_eq!(row.devices[0].device, "vfio/166");
    assert_eq!(row.devices[0].pci, ["0000:d8:02.1"]);
    assert_eq!(row.devices[0].numa, [1]);
    // Nothing else moved.
    assert!(status.has(&plain_id, "1,9") && status.has(&unknown_id, "2,10"));

    // The table says it too.
    let table = node.cpusetd("status", &[]);
    assert!(table.status.success(), "{table:?}");
    let text = stdout(&table);
    let line = text
        .lines()
        .find(|l| l.contains("dpdk-fwd") && l.contains("exclusive"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("devices 0000:d8:02.0 numa 1"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("virt-launcher-vm") && l.contains("exclusive"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("devices vfio/166 (0000:d8:02.1) numa 1"),
        "{text}"
    );

    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn agent_devices_pull_exclusive_cpus_to_their_numa_node_v1() {
    device_locality(CgroupVersion::V1, &[]);
}

#[test]
fn agent_devices_pull_exclusive_cpus_to_their_numa_node_v2() {
    device_locality(CgroupVersion::V2, &[]);
}

#[test]
fn agent_devices_pull_exclusive_cpus_to_their_numa_node_best_fit() {
    device_locality(CgroupVersion::V2, &["--placement", "best-fit"]);
}

/// A pod author's flood (issue 23, item 12): a `PCIDEVICE_*` variable of 1.5 million bad
/// entries (a 3 MB config.json), 20,000 annotations that are not strings and a 100 kB
/// opt-out annotation value make one WARN for the config (how many entries were bad, values
/// cut to a few hundred bytes with their full length), not one per entry.
#[test]
fn a_flood_of_bad_entries_from_a_pod_is_said_once_and_short() {
    use cpusetd::classify::Notice;
    use cpusetd::runtime::RuntimeLookup;

    crate::util::capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let id = "f".repeat(64);
    let config_dir = dir.path().join("containerd").join(&id);
    std::fs::create_dir_all(&config_dir).unwrap();
    let flood = vec!["x"; 1_500_000].join(",");
    let annotations: Vec<String> = (0..20_000).map(|i| format!("\"n{i}\": {i}")).collect();
    let long_value = "v".repeat(100_000);
    let config = format!(
        r#"{{"process": {{"env": ["PCIDEVICE_FLOOD={flood}", "PCIDEVICE_OK=0000:3b:02.0,y"]}},
            "annotations": {{{}, "cpusetd.io/exclusive": "{long_value}"}}}}"#,
        annotations.join(", ")
    );
    std::fs::write(config_dir.join("config.json"), config).unwrap();
    let mut lookup = RuntimeLookup::new(crate::util::templates(dir.path()));
    let info = lookup.lookup(&id).unwrap();
    assert_eq!(info.devices.len(), 1, "the good address is kept");
    let needle = dir.path().display().to_string();
    let lines = crate::util::logged(&needle);
    assert_eq!(
        lines.len(),
        1,
        "one line for the config: {:?}",
        lines
            .iter()
            .map(|l| &l[..l.len().min(300)])
            .collect::<Vec<_>>()
    );
    assert!(lines[0].len() < 2_000, "{} bytes", lines[0].len());
    assert!(lines[0].contains("1500001 entries"), "{}", lines[0]);
    assert!(lines[0].contains("20000 annotation values"), "{}", lines[0]);

    let notice = Notice::IgnoredAnnotation {
        key: "cpusetd.io/exclusive".into(),
        value: long_value,
    }
    .to_string();
    assert!(notice.len() < 1_000, "{} bytes", notice.len());
    assert!(notice.contains("(100000 bytes)"), "{notice}");
}
