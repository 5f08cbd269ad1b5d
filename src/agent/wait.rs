//! Waiting for something on the node that is not there yet (the kubepods cgroup at boot,
//! before kubelet made it): the agent sleeps on inotify over the nearest directory that
//! exists, keeps systemd's watchdog fed, and stops cleanly on SIGTERM/SIGINT. It never exits
//! because kubelet is late.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use inotify::{Inotify, WatchMask};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::Notifier;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Something changed under the watched directory (or the periodic re-check is due): look
    /// again.
    Changed,
    /// SIGTERM or SIGINT: stop, exit 0.
    Stopped(Signal),
}

/// Longest sleep between two looks, whatever inotify says (a directory replaced by a mount,
/// an event lost): a minute.
const RECHECK: Duration = Duration::from_secs(60);

/// Sleeps until something is created, moved or removed in `dir` (or `dir` itself goes), a
/// signal arrives, or [`RECHECK`] passes; pings the watchdog meanwhile. SIGHUP wakes it too.
/// The signals are blocked in the calling thread (the agent blocks them anyway before it
/// spawns threads, so none is lost between a wait and the start).
pub fn wait_for_change(dir: &Path, notifier: &mut Notifier) -> std::io::Result<Waited> {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block()?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
    let inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::CREATE
            | WatchMask::MOVED_TO
            | WatchMask::DELETE
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR,
    )?;
    let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
    let until = Instant::now() + RECHECK;
    loop {
        let now = Instant::now();
        if now >= until {
            return Ok(Waited::Changed);
        }
        let sleep = watchdog.map_or(until - now, |w| w.min(until - now));
        let timeout = PollTimeout::try_from(sleep).unwrap_or(PollTimeout::MAX);
        let mut fds = [
            PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if watchdog.is_some() {
            notifier.send(&[sd_notify::NotifyState::Watchdog]);
        }
        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[0]) {
            if let Some(info) = signal_fd.read_signal()? {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(s @ (Signal::SIGTERM | Signal::SIGINT)) => return Ok(Waited::Stopped(s)),
                    _ => return Ok(Waited::Changed),
                }
            }
        }
        if ready(&fds[1]) {
            return Ok(Waited::Changed);
        }
    }
}
