//! CPU lists and CPU hotplug.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;

use super::{
    errno_name, lock, open_cpu, spawn_cpu, CpuSlot, CpuStats, SamplerConfig, SamplerError, Shared,
};

/// Where the list of online CPUs comes from.
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// Parse a kernel CPU list (`0-3,5,8-9`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let t = text.trim();
    if t.is_empty() {
        return Some(out);
    }
    for part in t.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let a: u32 = a.trim().parse().ok()?;
            let b: u32 = b.trim().parse().ok()?;
            if b < a || b - a > 65536 {
                return None;
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().ok()?);
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Where the list of possible CPUs comes from: every CPU id that may ever come online.
pub const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";

/// The possible CPUs, from [`POSSIBLE_CPUS`].
pub fn possible_cpus() -> Result<Vec<u32>, SamplerError> {
    read_cpu_list(std::path::Path::new(POSSIBLE_CPUS))
}

/// The online CPUs, from [`ONLINE_CPUS`].
pub fn online_cpus() -> Result<Vec<u32>, SamplerError> {
    read_cpu_list(std::path::Path::new(ONLINE_CPUS))
}

/// A CPU list file in the kernel's format.
pub fn read_cpu_list(path: &std::path::Path) -> Result<Vec<u32>, SamplerError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SamplerError::OnlineList { path: path.display().to_string(), source })?;
    parse_cpu_list_of(path, &text)
}

/// [`parse_cpu_list`] of the online list read from `path`, with an error that names the file.
/// A list that names no CPU is an error too: the kernel always has one CPU online, so an empty
/// read is a file caught between its truncation and its write (the hotplug tests rewrite theirs
/// in place), and following it would stop every drain thread.
pub(super) fn parse_cpu_list_of(
    path: &std::path::Path,
    text: &str,
) -> Result<Vec<u32>, SamplerError> {
    parse_cpu_list(text).filter(|cpus| !cpus.is_empty()).ok_or_else(|| SamplerError::BadCpuList {
        path: path.display().to_string(),
        text: text.trim().chars().take(200).collect(),
    })
}

pub(super) fn cfg_online_cpus(cfg: &SamplerConfig) -> Result<Vec<u32>, SamplerError> {
    match &cfg.online_cpus_path {
        Some(p) => read_cpu_list(p),
        None => online_cpus(),
    }
}

/// The online CPU list, re-read through one open file: a periodic hotplug check then costs one
/// `pread` at offset 0 (sysfs regenerates the text), not a path walk through sysfs and an open,
/// which were most of a quiet flush's CPU. Reopened after an error.
#[derive(Debug, Default)]
pub(super) struct CpuListFile {
    file: Option<std::fs::File>,
}

impl CpuListFile {
    pub(super) fn read(&mut self, cfg: &SamplerConfig) -> Result<Vec<u32>, SamplerError> {
        use std::os::unix::fs::FileExt;
        let path = cfg.online_cpus_path.as_deref().unwrap_or(std::path::Path::new(ONLINE_CPUS));
        let io_err = |source| SamplerError::OnlineList { path: path.display().to_string(), source };
        let file = match self.file.take() {
            Some(f) => f,
            None => std::fs::File::open(path).map_err(io_err)?,
        };
        let mut text = Vec::with_capacity(64);
        let mut buf = [0u8; 256];
        loop {
            // Bounded: a CPU list of the largest machines is a few KiB.
            let n = file.read_at(&mut buf, text.len() as u64).map_err(io_err)?;
            if n == 0 || text.len() > 1 << 20 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        self.file = Some(file);
        parse_cpu_list_of(path, &String::from_utf8_lossy(&text))
    }
}

pub(super) const HOTPLUG_THREAD: &str = "dcpi-hotplug";

/// Follows CPU hotplug on its own thread (when [`SamplerConfig::hotplug_thread`]): stops the
/// threads of CPUs that went offline, (re)opens CPUs that are online without a running thread.
pub(super) fn supervise(shared: &Arc<Shared>) {
    let interval_ms =
        i32::try_from(shared.cfg.hotplug_interval.as_millis()).unwrap_or(i32::MAX).max(10);
    let mut hp = Hotplug::default();
    while !shared.wake.wait(interval_ms) && !shared.stop.load(Ordering::Acquire) {
        if let Some(w) = &shared.cfg.watch {
            w.fault_point(HOTPLUG_THREAD);
        }
        drop(hp.step(shared));
    }
}

/// What a hotplug check keeps between calls.
#[derive(Debug, Default)]
pub(super) struct Hotplug {
    rng: Option<StdRng>,
    list: CpuListFile,
    list_error_warned: bool,
}

impl Hotplug {
    /// One check; returns the online list it read (the daemon's other per-CPU source, the
    /// off-CPU one, follows the same list: `crate::offcpu::OffCpu::follow_cpus`).
    pub(super) fn step(&mut self, shared: &Arc<Shared>) -> Option<Vec<u32>> {
        let online = match self.list.read(&shared.cfg) {
            Ok(v) => v,
            Err(e) => {
                if !self.list_error_warned {
                    tracing::warn!(error = %e, "cannot re-read the online CPU list");
                    self.list_error_warned = true;
                }
                return None;
            }
        };
        let mut cpus = lock(&shared.cpus);
        for (cpu, slot) in cpus.iter_mut() {
            if !online.contains(cpu) && slot.stats.online.load(Ordering::Acquire) {
                tracing::info!(cpu, "CPU went offline; stopping its drain thread");
                slot.stats.stop.store(true, Ordering::Release);
            }
            if slot.thread.as_ref().is_some_and(std::thread::JoinHandle::is_finished) {
                if let Some(h) = slot.thread.take() {
                    if h.join().is_err() {
                        tracing::error!(cpu, "drain thread panicked");
                    }
                }
            }
        }
        for &cpu in &online {
            let nev = shared.plans.len();
            let slot = match cpus.entry(cpu) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => match CpuStats::new(cpu, nev) {
                    Ok(st) => v.insert(CpuSlot {
                        stats: Arc::new(st),
                        thread: None,
                        // No earlier attempt: due now (`now` if the interval reaches back before boot).
                        last_attempt: Instant::now()
                            .checked_sub(shared.cfg.hotplug_interval)
                            .unwrap_or_else(Instant::now),
                    }),
                    Err(e) => {
                        tracing::warn!(cpu, error = %e, "cannot create an eventfd for a new CPU");
                        continue;
                    }
                },
            };
            if slot.thread.is_some() || slot.last_attempt.elapsed() < shared.cfg.hotplug_interval {
                continue;
            }
            slot.last_attempt = Instant::now();
            let rng = self.rng.get_or_insert_with(rand::make_rng::<StdRng>);
            match open_cpu(shared, cpu, rng) {
                Ok(ring) => match spawn_cpu(shared, cpu, ring, Arc::clone(&slot.stats)) {
                    Ok(h) => {
                        tracing::info!(cpu, "CPU online; sampling it");
                        slot.thread = Some(h);
                    }
                    Err(e) => slot.stats.set_error(format!("spawn: {e}")),
                },
                Err((i, e)) => {
                    let name = shared.names.get(i).cloned().unwrap_or_default();
                    slot.stats.set_error(format!("{name}: {}: {e}", errno_name(&e)));
                }
            }
        }
        drop(cpus);
        Some(online)
    }
}

/// What following the online list changes for a source open on the CPUs `have`: the CPUs to
/// close (open but no longer online) and those to open (online but not open), each sorted.
pub fn cpu_changes(have: &[u32], online: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut gone: Vec<u32> = have.iter().copied().filter(|c| !online.contains(c)).collect();
    let mut new: Vec<u32> = online.iter().copied().filter(|c| !have.contains(c)).collect();
    gone.sort_unstable();
    gone.dedup();
    new.sort_unstable();
    new.dedup();
    (gone, new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_changes_close_what_went_offline_and_open_what_came_online() {
        assert_eq!(cpu_changes(&[0, 1], &[0, 1]), (vec![], vec![]));
        // CPU 1 offline, then back with CPU 3 (hot-added past the CPUs seen at start).
        assert_eq!(cpu_changes(&[0, 1], &[0]), (vec![1], vec![]));
        assert_eq!(cpu_changes(&[0], &[0, 1, 3]), (vec![], vec![1, 3]));
        assert_eq!(cpu_changes(&[3, 0, 1], &[2, 1]), (vec![0, 3], vec![2]));
        assert_eq!(cpu_changes(&[], &[1, 0]), (vec![], vec![0, 1]));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,5\n"), Some(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("8-9,0-1"), Some(vec![0, 1, 8, 9]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
        assert_eq!(parse_cpu_list("0-"), None);
    }

    /// The kept file sees a list rewritten in place (as sysfs regenerates it, and as the
    /// hotplug tests write it), shorter or longer than before; a removed file is an error
    /// that names it, and the list is read again once it is back.
    #[test]
    fn cpu_list_file_is_reread_through_one_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("online");
        let cfg = SamplerConfig { online_cpus_path: Some(path.clone()), ..Default::default() };
        let mut f = CpuListFile::default();
        std::fs::write(&path, "0-3,8-11\n").unwrap();
        assert_eq!(f.read(&cfg).unwrap(), vec![0, 1, 2, 3, 8, 9, 10, 11]);
        std::fs::write(&path, "1\n").unwrap();
        assert_eq!(f.read(&cfg).unwrap(), vec![1]);
        let long: String = (0..400).map(|c| format!("{},", c * 2)).collect::<String>() + "1000";
        std::fs::write(&path, &long).unwrap();
        assert_eq!(f.read(&cfg).unwrap().len(), 401, "longer than one read");
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(f.read(&cfg), Err(SamplerError::BadCpuList { .. })));
        // What a reader sees between a rewrite's truncation and its write.
        std::fs::write(&path, "").unwrap();
        assert!(matches!(f.read(&cfg), Err(SamplerError::BadCpuList { .. })), "empty list");
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(f.read(&cfg), Err(SamplerError::BadCpuList { .. })), "blank list");
        std::fs::remove_file(&path).unwrap();
        // The open file still reads the unlinked inode; an error comes once it is reopened.
        f.file = None;
        let e = f.read(&cfg).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, "2-3").unwrap();
        assert_eq!(f.read(&cfg).unwrap(), vec![2, 3]);
    }
}
