//! The status report (`{"cmd":"status"}`): what the daemon reports about itself.
//!
//! The JSON form (`dcpictl status --json`) is a stable interface. Fields are only ever added;
//! top level:
//! - `version`, `pid`, `host`, `db`, `uptime_s`
//! - `events[]`: `name`, `requested`, `source` (`hardware`|`software`|`fallback`),
//!   `period_min`, `period_max` (the randomization window), `samples`
//! - `cpus[]`: `cpu`, `online`, `samples`, `lost`, `throttled`, `error`, `wakeups` (drain
//!   thread wake-ups since start), `wakeups_per_s` and `drain_cpu_ms_per_s` (its CPU time),
//!   both over the recent window
//! - `samples`, `lost`, `throttled` (totals since start)
//! - `unknown`: `count`, `fraction` (of resolved samples), `by_reason` {reason: count}
//! - `aggregation`: `samples_aggregated`, `entries_created`, `factor` (samples per table
//!   entry), `pending`, `late_sideband`
//! - `epoch` (current epoch id), `store`: see [`StoreStatus`] (`last_flush`,
//!   `last_publish` {`unix_ms`, `duration_ms`, `items`}, `spool_rows`, `spool_bytes`,
//!   `dirty_profiles`, `pending_batches`, `pending_bytes`, `pending_samples`, `dropped_samples`, `db_error`,
//!   `spool_error`, `spool_quarantined`, `corrupt_files_set_aside`, `last_set_aside`,
//!   `newer_format_files`, `last_newer_format`,
//!   `lease_file`, `lease_renewed_unix_ms`, `lease_lost_to`, `kallsyms_refreshes`,
//!   `kallsyms_changes`, `publish_stalled_since_unix_ms`, ...)
//! - `condition`: `ok`, or a one-line description of what is wrong (disk, CPUs not sampled)
//! - `daemon`: `cpu_user_s`, `cpu_sys_s`, `rss_kib`
//! - `rate`: `samples_per_s` (since start), `samples_per_s_recent` (over the last flush
//!   interval, `recent_window_s` long: from the last flush at least one interval before the
//!   newest, so a slice boundary's flush just after an interval's does not shorten it; since
//!   start, and as long as the uptime, until the daemon has run one interval)
//! - `overhead`: `daemon_cpu_pct` (the daemon's CPU time as a percentage of one CPU, since
//!   start), `daemon_cpu_pct_recent`, `sample_cost_us_estimate` (assumed cost of one sampling
//!   interrupt on the sampled CPU, see the daemon's `status::sample_cost_us`), `sampling_cpu_pct_estimate`
//!   (recent samples/s x that cost, percent of one CPU), `ncpus`, `machine_pct_estimate`, `daemon_cpu_ms_per_s`, `ns_per_sample`,
//!   `stage_cpu_s` (CPU seconds since start, by thread and stage: where the daemon's own time
//!   goes): `drain` (the drain threads, all of it) with its parts `drain_parse`,
//!   `drain_aggregate` and `drain_rearm` (timed inside each pass; the rest of `drain` is waking
//!   up and waiting), `flush_resolve`, `flush_store` with its parts `flush_spool` and
//!   `flush_publish`, `flush_checks` (hotplug and counters at each flush), `resolver_thread`
//!   (daemon + sampling interrupts, percent of the whole machine)
//! - `config`: the settings in force (`file`, `events`, `window_divisor`, `ring_pages`,
//!   `flush_interval_s`, `publish_interval_s`, `max_memory_mb`, `epoch_interval_s` (0: no
//!   scheduled epochs), `retention_days`, `retention_keep`, `socket`, `socket_group`,
//!   `log_level`)
//! - `last_reload`: `null` or {`unix_ms`, `trigger` (`SIGHUP`|`dcpictl`), `ok`, `error`,
//!   `applied[]`, `restart_required[]`}
//! - `state`: `ok` or `degraded` (a daemon thread died); `failed_threads[]`: `thread`,
//!   `reason`, `unix_ms`
//! - `perf_maps`: `read`, `truncated` (JIT perf maps cut by the bounds), `max_bytes`,
//!   `max_entries`
//! - `resolver_thread`: `running`, `wakeups` (since start), `wakeups_per_s`, `cpu_ms_per_s`
//!   (both over the recent window), `records_applied`, `early_buffers` (since start)
//! - `stacks`: `null` without `--callchains fp`, else `recorded`, `truncated`, `overflow`,
//!   `empty`, `distinct_per_cpu[]`, `capacity_per_cpu`, `max_stack`, `early_flushes`

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct EventReport {
    pub name: String,
    pub requested: String,
    pub source: String,
    pub period_min: u64,
    pub period_max: u64,
    pub samples: u64,
}

#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct CpuReport {
    pub cpu: u32,
    pub online: bool,
    pub samples: u64,
    pub lost: u64,
    pub throttled: u64,
    #[serde(deserialize_with = "Option::deserialize")]
    pub error: Option<String>,
    /// Drain thread wake-ups since start.
    pub wakeups: u64,
    /// Wake-ups and drain thread CPU (ms) per second, over the recent window.
    pub wakeups_per_s: f64,
    pub drain_cpu_ms_per_s: f64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct UnknownReport {
    pub count: u64,
    pub fraction: f64,
    pub by_reason: BTreeMap<String, u64>,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct AggregationReport {
    pub samples_aggregated: u64,
    pub entries_created: u64,
    pub factor: f64,
    pub pending: u64,
    pub late_sideband: u64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct DaemonUsage {
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub rss_kib: u64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct RateReport {
    pub samples_per_s: f64,
    pub samples_per_s_recent: f64,
    pub recent_window_s: f64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct OverheadReport {
    pub daemon_cpu_pct: f64,
    pub daemon_cpu_pct_recent: f64,
    pub sample_cost_us_estimate: f64,
    pub sampling_cpu_pct_estimate: f64,
    pub ncpus: u32,
    pub machine_pct_estimate: f64,
    /// All the daemon's threads, recent window.
    pub daemon_cpu_ms_per_s: f64,
    /// The daemon's CPU time per sample collected, recent window.
    pub ns_per_sample: f64,
    pub stage_cpu_s: StageReport,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct ConfigReport {
    #[serde(deserialize_with = "Option::deserialize")]
    pub file: Option<String>,
    pub events: String,
    pub window_divisor: u64,
    pub ring_pages: usize,
    pub redraw_interval_s: f64,
    pub flush_interval_s: f64,
    pub publish_interval_s: f64,
    pub max_memory_mb: u64,
    /// Scheduled epochs start this often (aligned to UTC); 0 when they are off.
    #[serde(default)]
    pub epoch_interval_s: u64,
    pub retention_days: u32,
    pub retention_keep: usize,
    pub socket: String,
    #[serde(deserialize_with = "Option::deserialize")]
    pub socket_group: Option<String>,
    pub log_level: String,
}

/// The outcome of the last reload (SIGHUP or `dcpictl reload`).
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct ReloadReport {
    pub unix_ms: u64,
    pub trigger: String,
    pub ok: bool,
    /// Why the new configuration was rejected (file, line, reason); the old one stays.
    #[serde(deserialize_with = "Option::deserialize")]
    pub error: Option<String>,
    /// `key: old -> new` for each setting changed live.
    pub applied: Vec<String>,
    /// Keys whose new value needs a restart of dcpid; the running value is kept.
    pub restart_required: Vec<String>,
}

/// When an operation last completed.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct OpStat {
    /// Unix time, milliseconds.
    pub unix_ms: u64,
    pub duration_ms: f64,
    /// Files written (publish) or increments spooled (flush).
    pub items: u64,
}

/// The store's part of `dcpictl status`.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct StoreStatus {
    #[serde(deserialize_with = "Option::deserialize")]
    pub epoch: Option<String>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub last_flush: Option<OpStat>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub last_publish: Option<OpStat>,
    /// Increments in the spool not yet published, and their size.
    pub spool_rows: u64,
    pub spool_bytes: u64,
    /// Spool records or increments skipped because they were corrupt.
    pub spool_quarantined: u64,
    /// Profiles with unpublished increments.
    pub dirty_profiles: u64,
    /// Batches held in memory because the spool could not be written.
    pub pending_batches: u64,
    pub pending_bytes: u64,
    pub max_memory_bytes: u64,
    /// Samples dropped: written neither to the spool nor to the database, past the memory
    /// bound (or still held when the daemon stopped).
    pub dropped_samples: u64,
    pub dropped_batches: u64,
    pub published_files: u64,
    pub corrupt_files_set_aside: u64,
    pub bytes_written: BytesWritten,
    /// Current failure writing the shared database, if any.
    #[serde(deserialize_with = "Option::deserialize")]
    pub db_error: Option<String>,
    /// Current failure writing the spool, if any.
    #[serde(deserialize_with = "Option::deserialize")]
    pub spool_error: Option<String>,
    /// The last file of this host's directory set aside (corrupt, or not a regular file):
    /// its path and why.
    #[serde(default)]
    pub last_set_aside: Option<String>,
    /// Profiles of a newer format version than this dcpid reads, found in its host
    /// directories (a rolling downgrade) and left untouched; its samples go beside them
    /// (FORMAT.md §3.1). The last one: its path and version.
    #[serde(default)]
    pub newer_format_files: u64,
    #[serde(default)]
    pub last_newer_format: Option<String>,
    /// This daemon's lease on its host name (`<db>/leases/<host>.lease`), when it holds it.
    #[serde(default)]
    pub lease_file: Option<String>,
    /// When the lease was last renewed (Unix ms; 0 if not held).
    #[serde(default)]
    pub lease_renewed_unix_ms: u64,
    /// Set when another daemon took the host name over: this one no longer publishes.
    #[serde(default)]
    pub lease_lost_to: Option<String>,
    /// Kernel symbol snapshots taken since start after the first one (a module loaded or
    /// unloaded, a new epoch), and how many of them had new content.
    #[serde(default)]
    pub kallsyms_refreshes: u64,
    #[serde(default)]
    pub kallsyms_changes: u64,
    /// Set while a store operation (a publish) has been running for much longer than it
    /// should: the database is not answering. Unix ms at which it began.
    #[serde(default)]
    pub publish_stalled_since_unix_ms: Option<u64>,
    /// Samples of the batches held in memory (`pending_batches`): written neither to the
    /// spool nor to the database yet.
    #[serde(default)]
    pub pending_samples: u64,
    /// The symbol store's worker, since start.
    #[serde(default)]
    pub symbol_tables: SymbolTableStatus,
}

/// The symbol store's worker (FORMAT.md §10): the symbol tables of the ELF images sampled,
/// stored once per build-id in the database by a background thread capped at a tenth of a CPU.
/// Counts since start; `queued` is what a benchmark waits on before it measures a steady state.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct SymbolTableStatus {
    /// Images handed to the worker (once per build-id and epoch).
    pub offered: u64,
    /// Of those, not finished yet.
    pub queued: u64,
    /// Tables written, and their bytes.
    pub stored: u64,
    pub bytes: u64,
    /// Images whose table the database had already.
    pub present: u64,
    /// Images without a table (file gone or replaced, not ELF, stripped bare, over a bound).
    pub skipped: u64,
    /// The worker's CPU time.
    pub cpu_s: f64,
}

#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct StatusReport {
    pub version: String,
    pub pid: u32,
    pub host: String,
    pub db: String,
    pub uptime_s: f64,
    pub events: Vec<EventReport>,
    pub cpus: Vec<CpuReport>,
    pub samples: u64,
    pub lost: u64,
    pub throttled: u64,
    pub unknown: UnknownReport,
    pub aggregation: AggregationReport,
    #[serde(deserialize_with = "Option::deserialize")]
    pub epoch: Option<String>,
    pub store: StoreStatus,
    pub condition: String,
    pub daemon: DaemonUsage,
    pub rate: RateReport,
    pub overhead: OverheadReport,
    pub config: ConfigReport,
    #[serde(deserialize_with = "Option::deserialize")]
    pub last_reload: Option<ReloadReport>,
    /// `ok`, or `degraded` once a daemon thread died (see `failed_threads`); a degraded
    /// daemon no longer feeds the systemd watchdog and exits with status 3.
    pub state: String,
    pub failed_threads: Vec<ThreadFailure>,
    pub perf_maps: PerfMapReport,
    /// Call stacks (`callchains = "fp"`); `None` when the daemon does not sample them.
    #[serde(default)]
    pub stacks: Option<StackReport>,
    #[serde(default)]
    pub resolver_thread: ResolverThreadReport,
    /// Off-CPU time (`off_cpu = true`); `None` when it is off.
    #[serde(default)]
    pub off_cpu: Option<OffCpuReport>,
}

/// The off-CPU source (`dcpid --off-cpu true`, event `off-cpu`): its rate and its own cost,
/// totals since start and rates over the uptime.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct OffCpuReport {
    /// The kernel events timing the waits: `bpf` (a BPF program on `sched_switch` pairing them
    /// in the kernel), `tracepoint` (`sched:sched_switch`, filtered) or `switch-records` (the
    /// context-switches event; `off_cpu_source` in dcpid.toml).
    #[serde(default)]
    pub source: String,
    /// Context switches seen (the idle task's excluded), and per second.
    pub switches: u64,
    pub switches_per_s: f64,
    /// Waits timed (a voluntary switch-out paired with the thread's next switch-in).
    pub waits: u64,
    pub waits_per_s: f64,
    /// Their total in seconds, and per second of uptime (threads off CPU on average).
    pub off_cpu_s: f64,
    pub off_cpu_s_per_s: f64,
    /// Waits counted without a stack (shorter than `off_cpu_threshold`, or a full table;
    /// `bpf`: or a stack id the kernel could not store).
    pub waits_without_stack: u64,
    /// Records the kernel dropped from the off-CPU rings (`bpf`: waits the program dropped
    /// because its waits map was full).
    pub lost: u64,
    /// Waits lost to pairing (a lost record, the bound on threads tracked).
    pub unpaired: u64,
    /// Threads off CPU now (waits open).
    pub open: u64,
    /// The off-CPU thread's own CPU time, in seconds and milliseconds per second, and per
    /// context switch (nanoseconds). The kernel's share (the records it writes, in the
    /// switching thread) is not in it: see BENCHMARKS.md.
    pub cpu_s: f64,
    pub cpu_ms_per_s: f64,
    pub ns_per_switch: f64,
    /// The off-CPU thread's nice value now: 19 while it keeps up, 0 while raised because a
    /// ring filled past five eighths (dcpid's `offcpu` module docs), and the number of raises.
    #[serde(default)]
    pub nice: i32,
    #[serde(default)]
    pub boosts: u64,
}

/// Call-stack counters since start (`dcpid --callchains fp`).
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct StackReport {
    /// Samples whose call chain was recorded as a stack.
    pub recorded: u64,
    /// Of those, stacks that do not reach a root (depth limit, or no caller found).
    pub truncated: u64,
    /// Samples whose stack was new while its CPU's stack table was full: counted in the flat
    /// profile only.
    pub overflow: u64,
    /// Call chains with no frame at all.
    pub empty: u64,
    /// Distinct stacks held now in each CPU's table (index = CPU slot).
    pub distinct_per_cpu: Vec<u64>,
    /// Bound of each CPU's table.
    pub capacity_per_cpu: u64,
    /// `sample_max_stack`: deepest chain kept.
    pub max_stack: u64,
    /// Flushes started before their interval was up because a CPU's table passed half of its
    /// bound (its stacks would not have fit until the next flush).
    #[serde(default)]
    pub early_flushes: u64,
    /// `callchains = "dwarf"`: the unwinder's counters; absent with frame pointers.
    #[serde(default)]
    pub dwarf: Option<DwarfReport>,
    /// `stack_one_in`: one sample in this many has its stack taken (each counts this many);
    /// 0 from a dcpid that predates it (every sample).
    #[serde(default)]
    pub one_in: u64,
    /// Samples whose stack was not taken (`stack_one_in` above 1).
    #[serde(default)]
    pub skipped: u64,
}

/// The DWARF unwinding of copied user stacks (`dcpid --callchains dwarf`), since start.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct DwarfReport {
    /// Samples whose user stack was unwound (with CFI where the process's tables were loaded).
    pub unwound: u64,
    /// Of those, samples of a process whose tables were not loaded yet: unwound through frame
    /// pointers only.
    pub fp_fallback: u64,
    /// Samples whose user stack did not reach a root.
    pub truncated: u64,
    /// Of those, stacks cut at the end of the copied user stack (`sample_user_stack`: deeper
    /// than that in bytes), and stacks cut by the depth bound (`sample_max_stack`); the rest
    /// met a frame the tables could not unwind.
    #[serde(default)]
    pub truncated_copy_end: u64,
    #[serde(default)]
    pub truncated_depth: u64,
    /// CPU time the drain threads spent unwinding, in ms.
    pub unwind_ms: f64,
    /// Processes whose unwind tables the loader thread read.
    pub procs_loaded: u64,
    /// Processes waiting for the loader now.
    pub loader_queue: u64,
    /// Loads that panicked (that process unwinds through frame pointers only).
    pub load_panics: u64,
    /// Whether the loader thread runs; when not, processes not loaded yet unwind through frame
    /// pointers only.
    pub loader_running: bool,
    /// Bytes of unwind sections cached now, all images together, and the bound.
    pub tables_bytes: u64,
    pub tables_limit_bytes: u64,
    /// Images whose unwind sections are cached now.
    pub images: u64,
    /// `callchains = "auto"`: frames stepped by frame pointer (in images that keep them);
    /// false and 0 with `"dwarf"`.
    #[serde(default)]
    pub auto: bool,
    #[serde(default)]
    pub fp_steps: u64,
}

/// JIT perf maps (`/tmp/perf-PID.map`) read since start.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct PerfMapReport {
    /// Maps read (each change of a map is read once per flush).
    pub read: u64,
    /// Reads cut short by the bounds below (only the first part of the map was kept).
    pub truncated: u64,
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// A daemon thread that panicked, or ended while the daemon was running.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct ThreadFailure {
    /// Thread name: `dcpid-flush`, `dcpi-drain-N`, `dcpi-hotplug`, `dcpi-control`, ...
    pub thread: String,
    /// `panicked: <message>` or `ended while the daemon was running`.
    pub reason: String,
    pub unix_ms: u64,
}

impl StatusReport {
    /// The one-line summary sent as systemd STATUS=.
    pub fn one_line(&self) -> String {
        format!(
            "epoch {} | {} samples ({:.0}/s), {} lost, {:.1}% unknown | spool {} rows | {}",
            self.epoch.as_deref().unwrap_or("-"),
            self.samples,
            self.rate.samples_per_s_recent,
            self.lost,
            self.unknown.fraction * 100.0,
            self.store.spool_rows,
            self.condition
        )
    }
}

/// Where the daemon's CPU goes, since start (seconds).
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct StageReport {
    /// The drain threads' whole CPU time: their passes, waits and wake-ups, re-arms.
    pub drain: f64,
    /// Parts of `drain`, timed inside each pass: reading and parsing the ring...
    #[serde(default)]
    pub drain_parse: f64,
    /// ...handing the samples to the per-CPU tables (watermark, address-space versions,
    /// aggregation)...
    #[serde(default)]
    pub drain_aggregate: f64,
    /// ...and redrawing the period (`PERF_EVENT_IOC_PERIOD`, which restarts the timer). The
    /// rest of `drain` is waking up and waiting (poll), and each pass's bookkeeping.
    #[serde(default)]
    pub drain_rearm: f64,
    /// Periodic flushes taking and resolving the tables.
    pub flush_resolve: f64,
    /// Periodic flushes: spool, publish, side files.
    pub flush_store: f64,
    /// Parts of `flush_store`: writing the increments to the spool...
    #[serde(default)]
    pub flush_spool: f64,
    /// ...and publishing profiles into the database.
    #[serde(default)]
    pub flush_publish: f64,
    /// The flush thread's checks at each flush: CPU hotplug and the sampler's counters.
    #[serde(default)]
    pub flush_checks: f64,
    /// The resolver thread (`dcpi-resolve`): side-band records applied, full overflow buffers
    /// resolved between flushes.
    #[serde(default)]
    pub resolver_thread: f64,
}

/// The resolver thread (`dcpi-resolve`), which applies side-band records (and reads the files
/// they need) and resolves full overflow buffers for the drain threads.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct ResolverThreadReport {
    pub running: bool,
    /// Wake-ups that found work since start, and per second over the recent window.
    pub wakeups: u64,
    pub wakeups_per_s: f64,
    /// Its CPU time (ms) per second over the recent window.
    pub cpu_ms_per_s: f64,
    /// Side-band records applied and overflow buffers resolved, since start.
    pub records_applied: u64,
    pub early_buffers: u64,
}

/// Bytes dcpid wrote, per kind of file, since it started (syscall bytes; the kernel's
/// `write_bytes` rounds each newly dirtied page up to 4 KiB).
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct BytesWritten {
    /// Appended to the spool's log.
    pub spool: u64,
    /// Profiles published (each rewritten whole, atomically).
    pub profiles: u64,
    /// `summary.json` files.
    pub summaries: u64,
    /// Kernel symbol snapshots.
    pub kallsyms: u64,
}
