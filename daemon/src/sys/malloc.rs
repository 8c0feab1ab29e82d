//! glibc allocator tuning.
//!
//! glibc gives each thread that allocates its own arena (up to 8 per CPU) and keeps freed
//! memory in it. dcpid's threads allocate in bursts (a flush resolves and encodes a batch, a
//! drain thread applies a burst of mmap records) and then sit idle, so each arena keeps its
//! largest burst for ever: measured under exec churn, 48 MiB RSS for ~15 MiB of live heap.
//! Two arenas and a trim after a flush (at most once a minute) keep the RSS close to what is
//! live. On another C library both calls are no-ops.

/// Limit the number of malloc arenas; call before starting threads.
pub fn limit_arenas(n: i32) {
    #[cfg(target_env = "gnu")]
    mallopt(libc::M_ARENA_MAX, n);
    #[cfg(not(target_env = "gnu"))]
    let _ = n;
}

/// Serve allocations of at least `bytes` with their own mapping, always; call before starting
/// threads.
///
/// glibc starts with a 128 KiB threshold but raises it (up to 32 MiB) each time such a mapped
/// block is freed. The first large buffers freed at start-up (the kallsyms snapshot's) raised
/// it, and from then on each flush's and publish's large transient buffers came from the
/// heap and stayed resident until the next trim (at most once a minute): 1.4-2.2 MiB of
/// dcpid's steady and shutdown RSS (issue 13). A fixed threshold also keeps realloc of such a
/// buffer a `mremap` rather than a copy. The cost is an mmap/munmap and fresh page faults per
/// large buffer: a few per flush.
pub fn fix_mmap_threshold(bytes: i32) {
    #[cfg(target_env = "gnu")]
    mallopt(libc::M_MMAP_THRESHOLD, bytes);
    #[cfg(not(target_env = "gnu"))]
    let _ = bytes;
}

/// Set one allocator parameter (`M_ARENA_MAX`, `M_MMAP_THRESHOLD`: both take any value in the range
/// the callers pass); called before other threads exist, as glibc recommends.
#[cfg(target_env = "gnu")]
fn mallopt(param: libc::c_int, value: libc::c_int) {
    // SAFETY: mallopt only changes allocator parameters; an out-of-range value is refused with
    // a 0 return, not undefined behaviour.
    unsafe {
        libc::mallopt(param, value);
    }
}

/// [`trim`], unless it ran less than `min_gap` ago. A trim walks every free list and
/// madvises the pages it frees, and each madvise shoots down the TLB of every CPU this
/// process runs on (the drain threads' too): after every flush it was a third of the flush
/// thread's CPU (issue 13), while the memory it returns is back within a flush or two anyway.
pub fn trim_at_most_every(min_gap: std::time::Duration) {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.is_some_and(|t| t.elapsed() < min_gap) {
        return;
    }
    *last = Some(Instant::now());
    drop(last);
    trim();
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
