//! Process-wide counters of the expensive things a report does (files read, symbol tables
//! built, DWARF loaded, symbol cache hits). `dcpiprof --verbose` prints them; tests use them to
//! prove that a report reads only what it needs and that a warm symbol cache skips DWARF.

use std::sync::atomic::{AtomicU64, Ordering};

/// Profile files found by listing the selected host directories.
pub static PROFILES_LISTED: AtomicU64 = AtomicU64::new(0);
/// Profile files opened and decoded.
pub static PROFILES_READ: AtomicU64 = AtomicU64::new(0);
/// Host directories whose per-image totals came from the summary index (no profile opened).
pub static SUMMARY_INDEXES_USED: AtomicU64 = AtomicU64::new(0);
/// ELF symbol tables built by parsing a binary (cache misses and uncached images).
pub static ELF_TABLES_BUILT: AtomicU64 = AtomicU64::new(0);
/// Times DWARF was loaded and parsed.
pub static DWARF_LOADS: AtomicU64 = AtomicU64::new(0);
/// Symbol tables served by the symbol cache.
pub static CACHE_HITS: AtomicU64 = AtomicU64::new(0);
/// Symbol tables looked up in the cache and not found.
pub static CACHE_MISSES: AtomicU64 = AtomicU64::new(0);

pub fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One line for `--verbose`; the field names are stable (tests parse them).
pub fn line() -> String {
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    format!(
        "profiles_listed={} profiles_read={} elf_tables_built={} dwarf_loads={} \
         symbol_cache_hits={} symbol_cache_misses={} summary_indexes_used={}",
        g(&PROFILES_LISTED),
        g(&PROFILES_READ),
        g(&ELF_TABLES_BUILT),
        g(&DWARF_LOADS),
        g(&CACHE_HITS),
        g(&CACHE_MISSES),
        g(&SUMMARY_INDEXES_USED)
    )
}
