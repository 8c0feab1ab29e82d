//! The perf clock (`CLOCK_MONOTONIC`).
//!
//! Every event is opened with `use_clockid` and `CLOCK_MONOTONIC`, so a record's TIME field and
//! [`monotonic_ns`] are on the same clock: a drain pass can say "everything before now has been
//! delivered".

/// The clock id passed in `perf_event_attr.clockid`.
pub const PERF_CLOCK_ID: i32 = libc::CLOCK_MONOTONIC;

/// `CLOCK_MONOTONIC` in nanoseconds (the perf clock of our events).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux, so the
    // call cannot fail with a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock exists on every Linux since 2.6.12.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// The calling thread's CPU-time clock, which any thread of the process can read with
/// [`clock_ns`] while this thread lives: a thread that wakes once a second need not read its own
/// CPU time at each wake-up for the status to show it.
pub fn own_thread_clock() -> Option<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: `id` is a valid, writable clockid_t; pthread_self() is the calling thread.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    (rc == 0).then_some(id)
}

/// A clock in nanoseconds; `None` if it cannot be read (the thread of a CPU-time clock exited).
pub fn clock_ns(id: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; an invalid clock id is an error, not UB.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    (rc == 0)
        .then(|| (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64))
}

#[cfg(test)]
mod tests {
    /// Another thread reads a thread's CPU clock while it runs and sees its work; once the
    /// thread has exited, the clock is no longer readable.
    #[test]
    fn a_thread_clock_is_read_from_another_thread() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let id = super::own_thread_clock().unwrap();
            // Spin until this thread has had 10 ms of CPU by its own clock, not for a wall
            // time: on a loaded machine 30 ms of wall time can hold far less CPU (seen failing
            // under a full test run on 2 busy cores). The deadline only stops a broken clock.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while super::clock_ns(id).unwrap_or(0) < 10_000_000 {
                assert!(std::time::Instant::now() < deadline, "own CPU clock stuck");
                std::hint::black_box(0u64);
            }
            tx.send(id).unwrap();
            let _ = done_rx.recv();
        });
        let id = rx.recv().unwrap();
        let ns = super::clock_ns(id).expect("readable while the thread lives");
        assert!(ns >= 10_000_000, "{ns} ns after a 10 ms CPU spin");
        drop(done_tx);
        t.join().unwrap();
        assert_eq!(super::clock_ns(id), None, "exited thread");
    }

    #[test]
    fn monotonic_does_not_go_back() {
        let a = super::monotonic_ns();
        let b = super::monotonic_ns();
        assert!(a > 0);
        assert!(b >= a);
    }
}
