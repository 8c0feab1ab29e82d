//! glibc allocator tuning.
//!
//! glibc gives each thread that allocates its own arena (up to 8 per CPU) and keeps freed
//! memory in it. dcpid's threads allocate in bursts (a flush resolves and encodes a batch, a
//! drain thread applies a burst of mmap records) and then sit idle, so each arena keeps its
//! largest burst for ever: measured under exec churn, 48 MiB RSS for ~15 MiB of live heap.
//! Two arenas and a trim after each flush keep the RSS close to what is live. On another C
//! library both calls are no-ops.

/// Limit the number of malloc arenas; call before starting threads.
pub fn limit_arenas(n: i32) {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; M_ARENA_MAX takes any positive int
    // and it is called before other threads exist, as glibc recommends.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = n;
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
