//! Unix socket credentials and ownership, and the daemon's own resource usage.
//!
//! What needs libc here: the peer's credentials (`SO_PEERCRED`; std's `peer_cred` is not
//! stable), waking a blocked accept, the group lookup (NSS-aware) and getrusage.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// Who is at the other end of a Unix stream socket, as the kernel recorded it at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
    /// `None` when the peer's pid is not visible in this pid namespace.
    pub pid: Option<i32>,
}

/// The peer's credentials (`SO_PEERCRED`).
pub fn peer_cred(stream: &UnixStream) -> std::io::Result<PeerCred> {
    // SAFETY: zeroed `ucred` is a valid out-parameter (integers only).
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the descriptor is a live socket owned by `stream`; `cred` and `len` are live
    // locals, and `len` holds the size of `cred`, so the kernel writes only within it.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred { uid: cred.uid, gid: cred.gid, pid: (cred.pid > 0).then_some(cred.pid) })
}

/// Shut `listener` down so that an accept(2) blocked on it in another thread returns (Linux
/// fails it with EINVAL) and later ones fail at once.
pub fn shutdown_listener(listener: &UnixListener) {
    // SAFETY: the descriptor is a live socket owned by `listener`; shutdown(2) does not close
    // it, so it stays valid for its owner.
    unsafe {
        libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR);
    }
}

/// The gid of group `name`, or `None` if there is no such group (or the lookup failed).
pub fn group_id(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    for _ in 0..4 {
        // SAFETY: zeroed `group` is a valid out-parameter (plain pointers and integers).
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `cname` is NUL-terminated, `buf` is
        // writable for `buf.len()` bytes, `grp` and `result` are live locals. getgrnam_r writes
        // only within them.
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast::<libc::c_char>(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE {
            let n = buf.len() * 4;
            buf.resize(n, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        return Some(grp.gr_gid);
    }
    None
}

/// Whether process `pid` (with primary gid `gid`) is a member of group `group`: its primary
/// gid or one of its supplementary groups (from /proc/PID/status, read while the peer is
/// connected).
pub fn process_in_group(pid: Option<i32>, gid: u32, group: u32) -> bool {
    if gid == group {
        return true;
    }
    let Some(pid) = pid else { return false };
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse::<u32>().ok() == Some(group)))
}

/// The effective uid of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// User and system CPU time used by this process.
pub fn self_cpu_time() -> (Duration, Duration) {
    // SAFETY: zeroed rusage is a valid out-parameter (integers only).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live, writable rusage; RUSAGE_SELF is valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Resident set size of this process in KiB (`VmRSS` of /proc/self/status).
pub fn self_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_group_exists_and_bogus_does_not() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-dcpi-test"), None);
        assert_eq!(group_id("bad\0name"), None);
    }

    #[test]
    fn usage_and_rss() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let (u, s) = self_cpu_time();
        assert!(u + s > Duration::ZERO);
        assert!(self_rss_kib().unwrap() > 0);
        let me = std::process::id().cast_signed();
        // SAFETY: getegid has no preconditions.
        let gid = unsafe { libc::getegid() };
        assert!(process_in_group(Some(me), gid, gid));
        assert!(!process_in_group(Some(me), gid, 0xfff_fff0));
    }
}
