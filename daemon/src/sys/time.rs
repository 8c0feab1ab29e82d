//! The perf clock (CLOCK_MONOTONIC).
//!
//! Every event is opened with `use_clockid` and `CLOCK_MONOTONIC`, so a record's TIME field and
//! [`monotonic_ns`] are on the same clock: a drain pass can say "everything before now has been
//! delivered".

/// The clock id passed in `perf_event_attr.clockid`.
pub const PERF_CLOCK_ID: i32 = libc::CLOCK_MONOTONIC;

/// CLOCK_MONOTONIC in nanoseconds (the perf clock of our events).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux, so the
    // call cannot fail with a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// CPU time of the calling thread in nanoseconds (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock exists on every Linux since 2.6.12.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_does_not_go_back() {
        let a = super::monotonic_ns();
        let b = super::monotonic_ns();
        assert!(a > 0);
        assert!(b >= a);
    }
}
