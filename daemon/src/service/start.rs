//! The start steps before the daemon is ready: spool, sampling, database, resolver.

use std::sync::Arc;
use std::time::Instant;

use crate::aggregate::Aggregator;
use crate::config::Settings;
use crate::perf::sampler::{online_cpus, possible_cpus, Sampler, SamplerConfig};
use crate::resolve::{Resolver, ResolverConfig};
use crate::store::{EventInfo, Store, StoreConfig, StoreError};
use crate::watch::Watch;

use super::flush::read_every;
use super::{explain_sampler_error, orderly, ServiceError};
use crate::aggregate::RESOLVER_THREAD;
use crate::faults::Faults;
use crate::offcpu::OffCpu;
use crate::offcpu::OffCpuConfig;
use crate::offcpu::Source;
use crate::offcpu::EVENT_NAME;
use crate::offcpu::MAX_THREADS;
use crate::offcpu::RING_PAGES;
use crate::perf::callchain::StackTables;
use crate::perf::callchain::DEFAULT_STACKS_PER_CPU;
use crate::perf::dwarf::DEFAULT_CACHE_BYTES;
use crate::perf::dwarf::LOADER_THREAD;
use crate::perf::EventSpec;
use crate::resolve;
use crate::resolve::jit::JitLimits;
use crate::resolve::procfs;
use crate::store::KernelSymbolSource;
use crate::store::SliceSettings;
use crate::store::WhoProfiles;
use crate::sys;
use crate::sys::perf::PERF_COUNT_SW_CONTEXT_SWITCHES;
use crate::sys::perf::PERF_TYPE_SOFTWARE;
use crate::sys::sock;
use crate::types::SampleSink;

/// Whether a failure to write the database at start is one that waiting will not fix.
pub(super) fn permanent_db_error(e: &StoreError) -> bool {
    let StoreError::Db(profile_format::Error::Io { source, .. }) = e else { return false };
    matches!(
        source.raw_os_error(),
        Some(
            libc::EACCES
                | libc::EPERM
                | libc::EROFS
                | libc::ENOTDIR
                | libc::EEXIST
                | libc::EISDIR
                | libc::ENAMETOOLONG
                | libc::ELOOP
                | libc::EINVAL
        )
    )
}

/// Directories a start created; removed again (if still empty) unless the start succeeds, so
/// that a failed start leaves nothing behind.
#[derive(Debug, Default)]
pub(super) struct CreatedDirs {
    dirs: Vec<std::path::PathBuf>,
}

impl CreatedDirs {
    /// `create_dir_all`, remembering each directory it made.
    pub(super) fn create_all(&mut self, dir: &std::path::Path) -> std::io::Result<()> {
        let missing: Vec<&std::path::Path> = dir
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .take_while(|a| std::fs::symlink_metadata(a).is_err())
            .collect();
        for d in missing.into_iter().rev() {
            // 0700: the spool holds the symbol names of every user's processes, and only dcpid
            // reads it (under systemd the unit's RuntimeDirectory= makes it, 0750).
            match std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
                .create(d)
            {
                Ok(()) => self.dirs.push(d.to_path_buf()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The start succeeded: keep them.
    pub(super) fn keep(mut self) {
        self.dirs.clear();
    }
}

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            // remove_dir, never remove_dir_all: only what is still empty goes.
            drop(std::fs::remove_dir(d));
        }
    }
}

/// The spool must be a directory that exists or can be created, and that this process can
/// write (a read-only directory or file system, `/proc/x`): checked by creating it and a small
/// file in it. Directories created are recorded in `created`.
pub(super) fn prepare_spool(
    spool: &std::path::Path,
    created: &mut CreatedDirs,
) -> Result<(), ServiceError> {
    let bad = |d: String| ServiceError::Spool(spool.display().to_string(), d);
    if spool.is_file() {
        return Err(bad(
            "is a file; the spool is a directory (an SQLite spool of an older dcpid? it is \
             published at that dcpid's shutdown; remove it or choose another path)"
                .into(),
        ));
    }
    for a in spool.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::metadata(a) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(bad(format!("{} is not a directory", a.display()))),
            Err(_) => continue,
        }
    }
    created.create_all(spool).map_err(|e| bad(format!("cannot create it: {e}")))?;
    let probe = spool.join(format!(".dcpid-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"dcpid\n")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| bad(format!("cannot write in it: {e}")))
}

pub(super) fn jit_limits(s: &Settings) -> JitLimits {
    JitLimits { max_bytes: s.perf_map_max_bytes, max_entries: s.perf_map_max_entries }
}

pub(super) fn socket_group_id(settings: &Settings) -> Result<Option<u32>, ServiceError> {
    match &settings.socket_group {
        Some(name) => match sock::group_id(name) {
            Some(g) => Ok(Some(g)),
            None if settings.socket_group_explicit => Err(ServiceError::NoGroup(name.clone())),
            None => Ok(None),
        },
        None => Ok(None),
    }
}

/// The database (first epoch if none) and the spool, which `prepare_spool` checked.
/// The store's part of the settings (at start, and after each reload).
pub(super) fn store_config(s: &Settings) -> StoreConfig {
    StoreConfig {
        db: s.db.clone(),
        spool: s.spool.clone(),
        host: s.host.clone(),
        flush_interval: s.flush_interval,
        publish_interval: s.publish_interval,
        publish_max_delay: s.publish_max_delay,
        max_memory_bytes: s.max_memory_mb.saturating_mul(1 << 20),
        retention_days: s.retention_days,
        retention_keep: s.retention_keep,
    }
}

pub(super) fn open_store(settings: &Settings, faults: &Faults) -> Result<Store, ServiceError> {
    if let Err(e) = Store::check_db_writable(&settings.db, &settings.host) {
        if permanent_db_error(&e) {
            return Err(ServiceError::Database {
                db: settings.db.display().to_string(),
                source: e,
            });
        }
        tracing::warn!(db = %settings.db.display(), error = %e,
            "database not writable now; sampling anyway, keeping data in the spool and retrying");
    }
    let mut store = Store::open_leased_with_faults(store_config(settings), faults)
        // One daemon per host name: two would overwrite each other's profiles.
        .map_err(ServiceError::LeaseHeld)?;
    store.set_who_by_pid(settings.by_pid);
    store.set_slices(SliceSettings {
        interval: settings.slice_interval,
        rollup_after: settings.slice_rollup_after,
    });
    store.set_who_profiles(who_profiles(settings));
    Ok(store)
}

/// The per-process, per-cgroup and per-command profiles the settings ask for (FORMAT.md §5.6).
pub(super) fn who_profiles(s: &Settings) -> WhoProfiles {
    WhoProfiles { by_pid: s.by_pid, by_cgroup: s.by_cgroup, by_command: s.by_command }
}

/// Every event on every CPU (before anything is written: a daemon that may not sample creates
/// nothing). Returns the sampling start instant (uptime counts from it, so that samples/s is
/// right) and the perf clock read before the events were opened (T0 of the /proc scan).
pub(super) fn start_sampling(
    settings: &Settings,
    specs: Vec<EventSpec>,
    faults: &Faults,
    watch: &Arc<Watch>,
) -> Result<(Arc<Aggregator>, Sampler, Instant, u64), ServiceError> {
    let ncpus = cpu_slot_count(&online_cpus()?, &possible_or_warn()) as usize;
    let mut resolver = Resolver::new(ResolverConfig::default());
    resolver.set_jit_limits(jit_limits(settings));
    // The off-CPU source's samples come in as those of one more CPU slot (`crate::offcpu`).
    let slots = ncpus + usize::from(settings.off_cpu);
    let aggregator = Aggregator::new(resolver, slots);
    // Before the first sample: kernel samples are keyed per process from the start.
    aggregator.set_who_profiles(who_profiles(settings).any());
    // Before the drain threads start: they hand side-band records and full overflow buffers
    // to it (they never read a file nor take the resolver for writing).
    aggregator
        .start_resolver_thread(Some(watch))
        .map_err(|e| ServiceError::Thread(format!("{RESOLVER_THREAD}: {e}")))?;
    let stacks = match settings.callchains.as_str() {
        // CFI unwinding of copied user stacks (perf/dwarf.rs), with its loader thread.
        // "auto": the same copy, stepped by frame pointer through frame-pointer images.
        mode @ ("dwarf" | "auto") => Some(
            StackTables::new_dwarf(
                slots,
                DEFAULT_STACKS_PER_CPU,
                settings.sample_max_stack,
                settings.sample_user_stack,
                DEFAULT_CACHE_BYTES,
                mode == "auto",
            )
            .map_err(|e| ServiceError::Thread(format!("{LOADER_THREAD}: {e}")))?,
        ),
        "fp" => Some(StackTables::new(slots, DEFAULT_STACKS_PER_CPU, settings.sample_max_stack)),
        _ => None,
    }
    .map(|mut t| {
        t.set_one_in(settings.stack_one_in, ncpus);
        let t = Arc::new(t);
        aggregator.set_stack_tables(Arc::clone(&t));
        t
    });
    let scfg = SamplerConfig {
        stacks,
        events: specs,
        window_divisor: settings.window_divisor,
        ring_pages: settings.ring_pages,
        redraw_interval: settings.redraw_interval,
        read_every: read_every(settings.flush_interval),
        faults: faults.clone(),
        watch: Some(Arc::clone(watch)),
        // The flush thread follows hotplug (FlushThread::spawn): it wakes every few seconds
        // anyway.
        hotplug_thread: false,
        ..SamplerConfig::default()
    };
    let t0 = sys::time::monotonic_ns();
    let since = Instant::now();
    let sampler = Sampler::start(&scfg, Arc::<Aggregator>::clone(&aggregator))
        .map_err(|e| orderly(watch, explain_sampler_error(e)))?;
    Ok((aggregator, sampler, since, t0))
}

/// The `off-cpu` event as the store records it: counts are nanoseconds, period 1.
pub(super) fn off_cpu_event_info() -> EventInfo {
    EventInfo {
        desc: profile_format::EventDesc {
            name: EVENT_NAME.to_string(),
            perf_type: PERF_TYPE_SOFTWARE,
            perf_config: u64::from(PERF_COUNT_SW_CONTEXT_SWITCHES),
            period_mean: 1,
            period_min: 1,
            period_max: 1,
        },
        source: "software".to_string(),
    }
}

/// The store learns the events as opened (and `off-cpu` after them when it is on), the CPUs
/// and the kernel release.
pub(super) fn register_sampler(
    sampler: &Sampler,
    settings: &Settings,
    store: &mut Store,
) -> Result<(), ServiceError> {
    let mut events: Vec<EventInfo> = sampler
        .events()
        .iter()
        .map(|e| EventInfo { desc: e.desc.clone(), source: e.source.as_str().to_string() })
        .collect();
    if settings.off_cpu {
        events.push(off_cpu_event_info());
    }
    store.set_events(events);
    for e in sampler.events() {
        tracing::info!(event = %e.desc.name, requested = %e.requested, source = e.source.as_str(),
            period_min = e.desc.period_min, period_max = e.desc.period_max, "event");
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    store.set_host_info(release, online_cpus()?);
    Ok(())
}

/// How many CPU slots the aggregator has (the off-CPU source's slot is the next one): one per
/// CPU id up to the highest possible CPU, so that a CPU brought online later has a slot (and a
/// clock: the aggregator's clocks are indexed by CPU id) of its own and never shares the
/// off-CPU source's (`Aggregator::slot` is `cpu % slots`). `possible` empty (unreadable):
/// the online CPUs only.
pub(super) fn cpu_slot_count(online: &[u32], possible: &[u32]) -> u32 {
    online.iter().chain(possible).max().map_or(1, |m| m + 1)
}

/// [`possible_cpus`], or nothing (with a warning) when the list cannot be read.
fn possible_or_warn() -> Vec<u32> {
    possible_cpus().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read the possible CPUs; slots for the online ones only");
        Vec::new()
    })
}

/// `off_cpu = true`: the off-CPU source on every online CPU, its samples in the aggregator's
/// last slot (made for it by [`start_sampling`]) as the event after the sampler's.
pub(super) fn start_off_cpu(
    settings: &Settings,
    aggregator: &Arc<Aggregator>,
    sampler: &Sampler,
) -> Result<Option<OffCpu>, ServiceError> {
    if !settings.off_cpu {
        return Ok(None);
    }
    let cpus = online_cpus()?;
    let ncpus = cpu_slot_count(&cpus, &possible_or_warn());
    let event = u16::try_from(sampler.events().len()).unwrap_or(u16::MAX);
    aggregator.set_time_event(event);
    let cfg = OffCpuConfig {
        event,
        slot: ncpus,
        threshold_ns: u64::try_from(settings.off_cpu_threshold.as_nanos()).unwrap_or(u64::MAX),
        max_stack: settings.sample_max_stack,
        ring_pages: RING_PAGES,
        max_threads: MAX_THREADS,
        // Validated with the settings.
        source: Source::parse(&settings.off_cpu_source).unwrap_or_default(),
    };
    let sink: Arc<dyn SampleSink> = Arc::<Aggregator>::clone(aggregator);
    let stacks = aggregator.stack_tables().cloned();
    let o = OffCpu::start(cfg, &cpus, sink, stacks)?;
    tracing::info!(event = EVENT_NAME, threshold = ?settings.off_cpu_threshold,
        source = o.source().name(), "off-CPU time on");
    Ok(Some(o))
}

/// Start steps 3 and 4: processes that already exist (side-band records older than the scan
/// are ignored for them), then the kernel symbol snapshot for the epoch.
pub(super) fn prime_resolver(aggregator: &Aggregator, store: &mut Store, t0: u64) {
    let scan = aggregator.with_resolver(|r| r.scan_proc(t0));
    tracing::info!(
        processes = scan.processes,
        mappings = scan.mappings,
        unreadable = scan.unreadable,
        "scanned /proc"
    );
    store.set_kallsyms_source(Box::new(ProcKernelSymbols(ResolverConfig::default())));
    store.tick();
}

/// Fresh kernel symbol snapshots from /proc, refreshed when /proc/modules changes.
pub(super) struct ProcKernelSymbols(ResolverConfig);

impl KernelSymbolSource for ProcKernelSymbols {
    fn fingerprint(&mut self) -> Option<Vec<u8>> {
        let text = procfs::read_bounded(&self.0.proc_root.join("modules"), 16 << 20).ok()?;
        // Name, size and address of each module: not the use counts, which change all the
        // time without changing any symbol.
        let mut fp = Vec::new();
        for line in String::from_utf8_lossy(&text).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            for i in [0, 1, 5] {
                fp.extend_from_slice(f.get(i).unwrap_or(&"").as_bytes());
                fp.push(b' ');
            }
            fp.push(b'\n');
        }
        Some(fp)
    }
    fn snapshot(&mut self) -> Result<profile_format::KallsymsSnapshot, String> {
        resolve::kallsyms_snapshot(&self.0).map_err(|e| e.to_string())
    }
    fn snapshot_file_bytes(&mut self) -> Result<Vec<u8>, String> {
        resolve::kallsyms_file_bytes(&self.0).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPUs 0-1 online and 0-3 possible: CPU 2 or 3 coming online later must not share the
    /// off-CPU source's slot (a pending queue and a clock of the aggregator).
    #[test]
    fn the_off_cpu_slot_is_past_every_possible_cpu() {
        let n = cpu_slot_count(&[0, 1], &[0, 1, 2, 3]);
        let slots = n + 1;
        for cpu in 0..4 {
            assert_ne!(cpu % slots, n % slots, "CPU {cpu} shares the off-CPU slot {n}");
        }
        assert_eq!(n, 4);
        // Unreadable possible list: the online CPUs; a list that lies: still past online.
        assert_eq!(cpu_slot_count(&[0, 1], &[]), 2);
        assert_eq!(cpu_slot_count(&[0, 5], &[0, 1]), 6);
        assert_eq!(cpu_slot_count(&[], &[]), 1);
    }
}
