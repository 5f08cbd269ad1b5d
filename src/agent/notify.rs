//! sd_notify(3) that never blocks the controller: readiness, `STATUS=`, the watchdog and
//! `STOPPING=1` go to `$NOTIFY_SOCKET` as datagrams from a non-blocking socket. When the
//! receiver does not drain its queue (a broken or stopped service manager, a test's socket that
//! nobody reads), a message is dropped and counted instead of stalling the agent: `send(2)` on a
//! blocking datagram socket waits for room in the receiver's queue (ten datagrams by default),
//! and the controller loop is the one writer of the cgroup tree.

use std::io;
use std::os::unix::net::UnixDatagram;

use sd_notify::NotifyState;

/// Where notifications go, and what has been sent.
#[derive(Debug, Default)]
pub struct Notifier {
    target: Option<Target>,
    last_status: String,
    /// Messages dropped because the receiver's queue was full (or the send failed).
    pub dropped: u64,
}

#[derive(Debug)]
struct Target {
    socket: UnixDatagram,
    address: std::os::unix::net::SocketAddr,
}

impl Notifier {
    /// A notifier for `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket); one that
    /// sends nothing when the variable is unset or the socket cannot be made.
    pub fn from_env() -> Notifier {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Notifier::default();
        };
        match Target::new(&path) {
            Ok(target) => Notifier {
                target: Some(target),
                ..Notifier::default()
            },
            Err(e) => {
                log::warn!(
                    "NOTIFY_SOCKET={}: {e}; systemd will not hear from the agent",
                    path.to_string_lossy()
                );
                Notifier::default()
            }
        }
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends the states in one datagram, or drops it (counted) when it cannot go at once.
    pub fn send(&mut self, states: &[NotifyState]) {
        let Some(target) = &self.target else {
            return;
        };
        let message: String = states.iter().map(|s| format!("{s}\n")).collect();
        if let Err(e) = target
            .socket
            .send_to_addr(message.as_bytes(), &target.address)
        {
            self.dropped += 1;
            // Said once, then every 1,000th time: a receiver that never drains would
            // otherwise fill the log at the rate of the watchdog and status updates.
            if self.dropped == 1 || self.dropped % 1000 == 0 {
                let why = if e.kind() == io::ErrorKind::WouldBlock {
                    "the receiver's queue is full".to_string()
                } else {
                    e.to_string()
                };
                log::warn!(
                    "sd_notify: {why}; dropped {} message(s) so far (the agent does not wait \
                     for systemd)",
                    self.dropped
                );
            }
        }
    }

    /// Sends `STATUS=text` when it differs from the last status sent.
    pub fn status(&mut self, text: &str) {
        if !self.enabled() || self.last_status == text {
            return;
        }
        self.send(&[NotifyState::Status(text)]);
        self.last_status = text.to_string();
    }
}

impl Target {
    fn new(path: &std::ffi::OsStr) -> io::Result<Target> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_bytes();
        let address = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)?
            }
            None => std::os::unix::net::SocketAddr::from_pathname(path)?,
        };
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Target { socket, address })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver that never reads: the sender drops and counts instead of blocking.
    #[test]
    fn a_receiver_that_never_drains_never_blocks_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _receiver = UnixDatagram::bind(&path).unwrap();
        let mut notifier = Notifier {
            target: Some(Target::new(path.as_os_str()).unwrap()),
            ..Notifier::default()
        };
        // Far more than the kernel's default queue of ten datagrams; a blocking send would
        // hang here forever.
        for i in 0..2000 {
            notifier.status(&format!("status {i}"));
        }
        assert!(notifier.dropped > 0, "nothing was dropped");
        assert!(notifier.dropped < 2000, "nothing was sent");
    }

    #[test]
    fn an_unchanged_status_is_not_sent_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        receiver.set_nonblocking(true).unwrap();
        let mut notifier = Notifier {
            target: Some(Target::new(path.as_os_str()).unwrap()),
            ..Notifier::default()
        };
        notifier.status("a");
        notifier.status("a");
        notifier.status("b");
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        while let Ok(n) = receiver.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(got, ["STATUS=a\n", "STATUS=b\n"]);
    }
}
