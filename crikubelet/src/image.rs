//! The pause and workload images, built locally (no registry is reachable on a test node): one
//! layer holding a static busybox and a few applet links, packed as OCI image-layout tarballs
//! and imported into the runtime's `k8s.io` namespace with `ctr images import`.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::cgroups::run;
use crate::cri::WORKLOAD_IMAGE;

/// The sandbox ("pause") image: containerd's `sandbox_image` must name it.
pub const PAUSE_IMAGE: &str = "localhost/crikubelet/pause:1";
/// The applets a container may run.
const APPLETS: &[&str] = &["sh", "sleep", "cat", "grep", "true"];

/// Builds both images from `busybox` (a static binary) in `work`, imports them through `ctr`
/// at `address` and returns their names.
pub fn build_and_import(
    busybox: &Path,
    work: &Path,
    ctr: &Path,
    address: &Path,
) -> io::Result<Vec<String>> {
    let rootfs = work.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs)?;
    }
    fs::create_dir_all(rootfs.join("bin"))?;
    for dir in ["proc", "sys", "dev", "tmp", "etc"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy(busybox, rootfs.join("bin/busybox")).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: {e} (a static busybox: apt-get install busybox-static)",
                busybox.display()
            ),
        )
    })?;
    for applet in APPLETS {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    let mut names = Vec::new();
    for (name, cmd) in [
        (PAUSE_IMAGE, vec!["/bin/sleep", "2147483647"]),
        (WORKLOAD_IMAGE, vec!["/bin/sleep", "100000"]),
    ] {
        import_rootfs(&rootfs, work, ctr, address, name, &cmd)?;
        names.push(name.to_string());
    }
    Ok(names)
}

/// An image holding `binary` at `/<its file name>` and the shared libraries `ldd` lists for it
/// (at the paths the binary names), imported as `name`; its command runs the binary. How the
/// tests run cpusetd itself as a pod (the DaemonSet).
pub fn build_binary_image(
    binary: &Path,
    name: &str,
    work: &Path,
    ctr: &Path,
    address: &Path,
) -> io::Result<()> {
    let file_name = binary
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{}: no file name", binary.display())))?;
    let rootfs = work.join("rootfs-binary");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs)?;
    }
    for dir in ["proc", "sys", "dev", "tmp", "etc"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy(binary, rootfs.join(file_name))?;
    let ldd = run(Command::new("ldd").arg(binary))?;
    for line in ldd.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux-x86-64.so.2 (0x…)`.
        let path = match line.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "=>", path, ..] | [path, ..] if path.starts_with('/') => path.to_string(),
            _ => continue,
        };
        let target = rootfs.join(path.trim_start_matches('/'));
        fs::create_dir_all(target.parent().expect("a library path has a parent"))?;
        fs::copy(&path, &target).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    }
    let command = format!("/{}", file_name.to_string_lossy());
    import_rootfs(&rootfs, work, ctr, address, name, &[command.as_str()])
}

/// Packs `rootfs` as one layer and imports it as `name` running `cmd`.
fn import_rootfs(
    rootfs: &Path,
    work: &Path,
    ctr: &Path,
    address: &Path,
    name: &str,
    cmd: &[&str],
) -> io::Result<()> {
    let layer = work.join("layer.tar");
    run(Command::new("tar")
        .args([
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--sort=name",
            "-C",
        ])
        .arg(rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."))?;
    let tarball = oci_archive(work, &layer, name, cmd)?;
    run(Command::new(ctr)
        .arg("--address")
        .arg(address)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&tarball))?;
    Ok(())
}

/// An OCI image-layout tarball of one layer and `cmd`, named `name` for containerd.
fn oci_archive(work: &Path, layer: &Path, name: &str, cmd: &[&str]) -> io::Result<PathBuf> {
    let slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let layout = work.join(&slug);
    if layout.exists() {
        fs::remove_dir_all(&layout)?;
    }
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    let put = |bytes: &[u8]| -> io::Result<(String, usize)> {
        let digest = sha256(bytes)?;
        fs::write(blobs.join(&digest), bytes)?;
        Ok((format!("sha256:{digest}"), bytes.len()))
    };
    let (layer_digest, layer_size) = put(&fs::read(layer)?)?;
    let arch = oci_arch();
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = put(&serde_json::to_vec(&config)?)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = put(&serde_json::to_vec(&manifest)?)?;
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": name},
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    pack_layout(&layout, &work.join(format!("{slug}.tar")))
}

/// The running machine's architecture as OCI names it.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Marks `layout` an OCI image layout and packs it into the tarball `tarball`.
fn pack_layout(layout: &Path, tarball: &Path) -> io::Result<PathBuf> {
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    run(Command::new("tar")
        .arg("-C")
        .arg(layout)
        .arg("-cf")
        .arg(tarball)
        .args(["oci-layout", "index.json", "blobs"]))?;
    Ok(tarball.to_path_buf())
}

/// Hex SHA-256 of `bytes`, by `sha256sum` (coreutils).
fn sha256(bytes: &[u8]) -> io::Result<String> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped stdin").write_all(bytes)?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let digest = text.split_whitespace().next().unwrap_or_default();
    if !out.status.success() || digest.len() != 64 {
        return Err(io::Error::other(format!(
            "sha256sum failed: {}",
            out.status
        )));
    }
    Ok(digest.to_string())
}
