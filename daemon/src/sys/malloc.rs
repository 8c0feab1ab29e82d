//! glibc allocator tuning.
//!
//! glibc gives each thread that allocates its own arena (up to 8 per CPU) and keeps freed
//! memory in it. dcpid's threads allocate in bursts (a flush resolves and encodes a batch, a
//! drain thread applies a burst of mmap records) and then sit idle, so each arena keeps its
//! largest burst for ever: measured under exec churn, 48 MiB RSS for ~15 MiB of live heap.
//! Two arenas bound that.
//!
//! What is freed otherwise stays in the process, up to [`KEEP_FREE`]: memory handed back to
//! the kernel comes back as fresh pages, and a fresh page is not cheap everywhere. In a VM
//! whose host reclaims the pages its guest frees (virtio-balloon free page reporting, as on
//! the development machine) the first touch of such a page can cost milliseconds (a test
//! program re-touching 64 MiB six seconds after freeing it: 814 of 16 384 faults over 50 µs,
//! the slowest 8 ms). dcpid used to give back every buffer of 128 KiB or more as it was freed
//! and trim its arenas once a minute, so each flush refilled its buffers from fresh pages:
//! the flush thread cost up to three times as much (BENCHMARKS.md, "Keeping freed memory").
//! On another C library these calls are no-ops.

/// Free memory the arenas may hold before a flush gives it back ([`trim_if_holding`]): the
/// steady state's transient buffers stay (a few MiB), an exec storm's resolver state goes.
pub const KEEP_FREE: usize = 32 << 20;

/// Limit the number of malloc arenas; call before starting threads.
pub fn limit_arenas(n: i32) {
    #[cfg(target_env = "gnu")]
    mallopt(libc::M_ARENA_MAX, n);
    #[cfg(not(target_env = "gnu"))]
    let _ = n;
}

/// Keep freed memory in the arenas: allocations up to [`KEEP_FREE`] are served from them
/// (not each from its own mapping, unmapped when freed), and glibc does not shrink an arena
/// by itself until its free top exceeds that; call before starting threads.
pub fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    {
        let keep = i32::try_from(KEEP_FREE).unwrap_or(i32::MAX);
        mallopt(libc::M_MMAP_THRESHOLD, keep);
        mallopt(libc::M_TRIM_THRESHOLD, keep);
    }
}

/// Set one allocator parameter (`M_ARENA_MAX`, `M_MMAP_THRESHOLD`, `M_TRIM_THRESHOLD`: each takes
/// any value in the range the callers pass); called before other threads exist, as glibc recommends.
#[cfg(target_env = "gnu")]
fn mallopt(param: libc::c_int, value: libc::c_int) {
    // SAFETY: mallopt only changes allocator parameters; an out-of-range value is refused with
    // a 0 return, not undefined behaviour.
    unsafe {
        libc::mallopt(param, value);
    }
}

/// [`trim`] when the arenas hold more than `keep` bytes of free memory, at most once per
/// `min_gap`. A trim walks every free list and madvises the pages it frees, and each madvise
/// shoots down the TLB of every CPU this process runs on (the drain threads' too); what it
/// returns comes back as fresh pages ([module docs](self)). So only a burst's leftovers are
/// worth returning, not the buffers every flush refills.
pub fn trim_if_holding(keep: usize, min_gap: std::time::Duration) {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.is_some_and(|t| t.elapsed() < min_gap) {
        return;
    }
    *last = Some(Instant::now());
    drop(last);
    if free_bytes().is_some_and(|free| free > keep) {
        trim();
    }
}

/// Free bytes held by every arena (glibc's `mallinfo2().fordblks`); None on another C library.
pub fn free_bytes() -> Option<usize> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 has no preconditions; it locks each arena while it sums it.
        let m = unsafe { libc::mallinfo2() };
        Some(m.fordblks)
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// Return free memory at the top of every arena, and whole free pages inside them, to the
/// kernel. Costs a walk over the free lists: call it after a flush, not per sample.
pub fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions and is thread-safe (it locks each arena).
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_env = "gnu"))]
mod tests {
    use super::*;

    /// A buffer of a few MiB, freed, stays in the arena as free memory (the old policy mapped
    /// every buffer of 128 KiB or more on its own and unmapped it when freed: none stayed).
    #[test]
    fn a_freed_buffer_below_the_bound_stays_in_the_process() {
        keep_freed_memory();
        const SIZE: usize = 8 << 20;
        let mut v = vec![0u8; SIZE];
        // Touched, so that it is resident memory, as a flush's buffers are.
        v.iter_mut().step_by(4096).for_each(|b| *b = 1);
        std::hint::black_box(&v);
        drop(v);
        let free = free_bytes().expect("glibc reports its free memory");
        assert!(free >= SIZE, "{free} bytes free in the arenas after freeing {SIZE}");
    }
}
