//! Process-level calls: auxiliary vector (vDSO).

/// The daemon's own vDSO image (the kernel maps the same vDSO into every 64-bit process), copied
/// out of memory; `None` if there is none or its extent cannot be found in /proc/self/maps.
pub fn vdso_image() -> Option<Vec<u8>> {
    // SAFETY: getauxval has no preconditions; it reads the process's auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    // The extent comes from our own maps: the vDSO is one `[vdso]` mapping starting at base.
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let range = line.split_whitespace().next()?;
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    if start != base || end <= start || end - start > (64 << 20) {
        return None;
    }
    let len = usize::try_from(end - start).ok()?;
    // SAFETY: [start, end) is the vDSO mapping of this process (checked against the auxiliary
    // vector and /proc/self/maps); it is readable, never unmapped or written while the process
    // runs, and we only copy it.
    let bytes = unsafe { std::slice::from_raw_parts(start as usize as *const u8, len) };
    Some(bytes.to_vec())
}
