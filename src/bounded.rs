//! Bounded reads of text that another process or a user controls (a `--topology` file,
//! `/proc/irq` and sysfs files under an injected root, irqbalance's answers): nothing past a
//! limit is read, and going past it is an error that names the limit, never a read that runs
//! until memory runs out (`/dev/zero`, a daemon that never stops talking).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::OFlag;

/// Limit for one file of the kernel's (`/proc`, `/sys`): the kernel prints at most a page or
/// two there; 64 KiB leaves room for every CPU list of an 8192-CPU machine.
pub const KERNEL_FILE_LIMIT: u64 = 64 << 10;

/// Reads at most `limit` bytes from `reader` as text (invalid UTF-8 replaced); more is an
/// error naming the limit.
pub fn read_text(reader: impl Read, limit: u64) -> io::Result<String> {
    let mut bytes = Vec::new();
    reader.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// A file a user named (symlinks followed, as a shell would), read up to `limit` bytes.
pub fn read_file(path: &Path, limit: u64) -> io::Result<String> {
    read_text(File::open(path)?, limit)
}

/// A file under an injected root (`/proc`, `/sys`): no symlink followed in its place
/// (`ELOOP`), a FIFO planted there does not block, nothing past `limit` read.
pub fn read_kernel_file(path: &Path, limit: u64) -> io::Result<String> {
    let file = File::options()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    read_text(file, limit)
}

/// The error for text past `limit`: `larger than the 64 KiB limit`.
pub fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("larger than the {} limit", human(limit)),
    )
}

/// `16 MiB`, `64 KiB`, `100 bytes`.
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_past_the_limit_is_an_error_naming_it() {
        assert_eq!(read_text(&b"0-3\n"[..], 4).unwrap(), "0-3\n");
        let err = read_text(&b"0-3,5"[..], 4).unwrap_err();
        assert_eq!(err.to_string(), "larger than the 4 bytes limit");
        let err = read_file(Path::new("/dev/zero"), 64 << 10).unwrap_err();
        assert_eq!(err.to_string(), "larger than the 64 KiB limit");
        assert_eq!(human(16 << 20), "16 MiB");
    }

    #[test]
    fn kernel_files_are_not_read_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real"), "ff\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        assert_eq!(
            read_kernel_file(&dir.path().join("real"), 10).unwrap(),
            "ff\n"
        );
        let err = read_kernel_file(&dir.path().join("link"), 10).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::errno::Errno::ELOOP as i32));
    }
}
