//! `sd_notify(3)` for dcpid: READY, WATCHDOG, STATUS and STOPPING messages to the service
//! manager.
//!
//! The unit (`systemd/dcpid.service`) is `Type=notify` with a `WatchdogSec=`, so systemd
//! considers dcpid started only when [`Notifier::ready`] is sent (every CPU is sampling), and
//! restarts it when [`Notifier::watchdog`] stops arriving. The service sends WATCHDOG=1 only
//! while every per-CPU drain thread makes progress: a wedged drain thread means the rings fill
//! and samples are lost, which is exactly the failure a restart fixes.
//!
//! Outside systemd (no `NOTIFY_SOCKET`) every method is a no-op, so callers need no checks.
//! Messages are formatted by the `sd-notify` crate; the socket address is captured once at
//! construction (unlike `sd_notify::notify`, which re-reads the environment on every call) so
//! that tests can build a notifier for a socket of their own without touching the process
//! environment, and so that abstract-namespace sockets (`@name`) work too.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;

/// Sends state changes to the service manager; cheap to call, never fails the caller.
#[derive(Debug)]
pub struct Notifier {
    socket: Option<SocketAddr>,
    watchdog_usec: Option<u64>,
    /// A send error is logged once at `warn` (then at `debug`), so a vanished socket cannot
    /// flood the log at the watchdog rate.
    warned: AtomicBool,
}

impl Notifier {
    /// A notifier configured from `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var_os(name), std::process::id())
    }

    /// A notifier that never sends anything (not under a service manager).
    pub fn disabled() -> Self {
        Self { socket: None, watchdog_usec: None, warned: AtomicBool::new(false) }
    }

    /// A notifier configured from variables looked up with `var`, for a process whose pid is
    /// `my_pid`. Follows `sd_watchdog_enabled(3)`: the watchdog applies when `WATCHDOG_USEC` is a
    /// positive integer and `WATCHDOG_PID` is either absent or equal to `my_pid` (a watchdog
    /// meant for a parent is not ours to feed).
    pub fn from_lookup(var: impl Fn(&str) -> Option<OsString>, my_pid: u32) -> Self {
        let socket = var("NOTIFY_SOCKET").and_then(|path| match socket_addr(&path) {
            Ok(addr) => Some(addr),
            Err(e) => {
                tracing::warn!(
                    "NOTIFY_SOCKET={:?} is not a usable socket address ({e}); \
                     not notifying the service manager",
                    path
                );
                None
            }
        });
        let pid_matches = match var("WATCHDOG_PID") {
            None => true,
            Some(pid) => pid.to_str().and_then(|p| p.trim().parse::<u32>().ok()) == Some(my_pid),
        };
        let watchdog_usec = var("WATCHDOG_USEC")
            .and_then(|v| v.to_str().and_then(|s| s.trim().parse::<u64>().ok()))
            .filter(|&usec| usec > 0 && pid_matches);
        Self { socket, watchdog_usec, warned: AtomicBool::new(false) }
    }

    /// Whether messages go anywhere (a `NOTIFY_SOCKET` was given).
    pub fn is_enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// READY=1: startup is complete (every CPU is sampling).
    pub fn ready(&self) {
        self.send(&[NotifyState::Ready]);
    }

    /// STATUS=…: a one-line summary shown by `systemctl status`. Newlines (which would end the
    /// field and start a bogus one) are replaced by spaces.
    pub fn status(&self, line: &str) {
        let line = one_line(line);
        self.send(&[NotifyState::Status(&line)]);
    }

    /// The interval at which [`Notifier::watchdog`] should be called: half the service
    /// manager's `WATCHDOG_USEC`, as `sd_watchdog_enabled(3)` advises, so that one late ping does
    /// not kill the service. `None` when no watchdog is configured for this process.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog_usec.map(|usec| Duration::from_micros(usec / 2))
    }

    /// WATCHDOG=1: the service is healthy. Call it only after checking that it is.
    pub fn watchdog(&self) {
        if self.watchdog_usec.is_some() {
            self.send(&[NotifyState::Watchdog]);
        }
    }

    /// STOPPING=1: shutdown has begun (a final flush may still take a while).
    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    /// `EXTEND_TIMEOUT_USEC=…`: ask for more time before the start (or stop) timeout fires, e.g.
    /// while a slow shared database is opened or the last flush is published.
    pub fn extend_timeout(&self, by: Duration) {
        let usec = u32::try_from(by.as_micros()).unwrap_or(u32::MAX);
        self.send(&[NotifyState::ExtendTimeoutUsec(usec)]);
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        let Some(addr) = &self.socket else { return };
        let mut msg = String::new();
        for s in states {
            msg.push_str(&s.to_string());
            msg.push('\n');
        }
        let result = UnixDatagram::unbound().and_then(|sock| {
            sock.connect_addr(addr)?;
            sock.send(msg.as_bytes())
        });
        if let Err(e) = result {
            if self.warned.swap(true, Ordering::Relaxed) {
                tracing::debug!("sd_notify {:?} failed: {e}", msg.trim_end());
            } else {
                tracing::warn!(
                    "cannot notify the service manager ({:?}): {e}; further failures are \
                     logged at debug level",
                    msg.trim_end()
                );
            }
        }
    }
}

/// `NOTIFY_SOCKET` is a filesystem path, or an abstract-namespace name when it starts with `@`.
fn socket_addr(value: &OsStr) -> std::io::Result<SocketAddr> {
    let bytes = value.as_bytes();
    match bytes.split_first() {
        None => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty")),
        Some((b'@', name)) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
        Some((b'/', _)) => SocketAddr::from_pathname(value),
        Some(_) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "neither an absolute path nor an @abstract name",
        )),
    }
}

fn one_line(s: &str) -> String {
    s.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Listener {
        _dir: tempfile::TempDir,
        sock: UnixDatagram,
        path: std::path::PathBuf,
    }

    fn listener() -> Listener {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        sock.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        Listener { _dir: dir, sock, path }
    }

    impl Listener {
        fn recv(&self) -> String {
            let mut buf = [0u8; 4096];
            let n = self.sock.recv(&mut buf).expect("a notification within 5 s");
            String::from_utf8(buf[..n].to_vec()).expect("utf-8")
        }
        fn nothing_pending(&self) -> bool {
            self.sock.set_nonblocking(true).expect("nonblocking");
            let mut buf = [0u8; 64];
            let r = self.sock.recv(&mut buf);
            self.sock.set_nonblocking(false).expect("blocking");
            matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
    }

    fn notifier(vars: &[(&str, &str)], pid: u32) -> Notifier {
        let map: HashMap<String, OsString> =
            vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        Notifier::from_lookup(|k| map.get(k).cloned(), pid)
    }

    #[test]
    fn sends_each_state_as_one_datagram() {
        let l = listener();
        let path = l.path.to_str().expect("utf-8 path");
        let n = notifier(&[("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "1000000")], 42);
        assert!(n.is_enabled());
        n.ready();
        assert_eq!(l.recv(), "READY=1\n");
        n.status("sampling 2 CPUs\nsecond line");
        assert_eq!(l.recv(), "STATUS=sampling 2 CPUs second line\n");
        n.watchdog();
        assert_eq!(l.recv(), "WATCHDOG=1\n");
        n.extend_timeout(Duration::from_secs(3));
        assert_eq!(l.recv(), "EXTEND_TIMEOUT_USEC=3000000\n");
        n.stopping();
        assert_eq!(l.recv(), "STOPPING=1\n");
        assert!(l.nothing_pending());
    }

    #[test]
    fn watchdog_interval_is_half_of_watchdog_usec() {
        let n = notifier(&[("NOTIFY_SOCKET", "/nonexistent"), ("WATCHDOG_USEC", "3000000")], 7);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn watchdog_pid_must_be_ours() {
        let l = listener();
        let path = l.path.to_str().expect("utf-8 path");
        let theirs = notifier(
            &[("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "1000000"), ("WATCHDOG_PID", "8")],
            7,
        );
        assert_eq!(theirs.watchdog_interval(), None);
        theirs.watchdog();
        assert!(l.nothing_pending(), "WATCHDOG=1 sent for another process's watchdog");
        let ours = notifier(
            &[("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "1000000"), ("WATCHDOG_PID", "7")],
            7,
        );
        assert_eq!(ours.watchdog_interval(), Some(Duration::from_millis(500)));
        ours.watchdog();
        assert_eq!(l.recv(), "WATCHDOG=1\n");
    }

    #[test]
    fn bad_watchdog_values_disable_the_watchdog() {
        for v in ["0", "-5", "abc", ""] {
            let n = notifier(&[("WATCHDOG_USEC", v)], 1);
            assert_eq!(n.watchdog_interval(), None, "WATCHDOG_USEC={v:?}");
        }
    }

    #[test]
    fn absent_socket_is_a_no_op() {
        let n = notifier(&[], 1);
        assert!(!n.is_enabled());
        assert_eq!(n.watchdog_interval(), None);
        n.ready();
        n.status("x");
        n.watchdog();
        n.stopping();
        let d = Notifier::disabled();
        assert!(!d.is_enabled());
        d.ready();
    }

    #[test]
    fn unusable_socket_values_are_rejected_not_fatal() {
        for v in ["", "relative/path"] {
            let n = notifier(&[("NOTIFY_SOCKET", v)], 1);
            assert!(!n.is_enabled(), "NOTIFY_SOCKET={v:?}");
        }
        // A socket that vanished: sending fails, the caller carries on.
        let n = notifier(&[("NOTIFY_SOCKET", "/nonexistent/notify.sock")], 1);
        assert!(n.is_enabled());
        n.ready();
        n.ready();
    }

    #[test]
    fn abstract_socket_names_work() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("dcpi-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let sock = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        sock.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let n = notifier(&[("NOTIFY_SOCKET", &format!("@{name}"))], 1);
        n.ready();
        let mut buf = [0u8; 64];
        let len = sock.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..len], b"READY=1\n");
    }
}
