//! `dcpictl status`: building the report (its types, and the JSON interface they define, are
//! in the `dcpi-proto` crate shared with `dcpictl`).

use std::collections::BTreeMap;

pub use dcpi_proto::status::{
    AggregationReport, ConfigReport, CpuReport, DaemonUsage, EventReport, OverheadReport,
    RateReport, ReloadReport, ResolverThreadReport, StageReport, StatusReport, StoreStatus,
    UnknownReport,
};

use crate::aggregate::AggregatorStats;
use crate::aggregate::ResolverThreadStats;
use crate::config::Settings;
use crate::offcpu::OffCpuStatus;
use crate::perf::sampler::{CpuStatus, SamplerStatus};
use crate::resolve::ResolverStats;
use crate::sys::sock;
use crate::watch;

/// The settings in force, as the status report shows them.
pub fn config_report(s: &Settings) -> ConfigReport {
    ConfigReport {
        file: s.config_file.as_ref().map(|p| p.display().to_string()),
        events: s.events.clone(),
        window_divisor: s.window_divisor,
        ring_pages: s.ring_pages,
        redraw_interval_s: s.redraw_interval.as_secs_f64(),
        flush_interval_s: s.flush_interval.as_secs_f64(),
        publish_interval_s: s.publish_interval.as_secs_f64(),
        max_memory_mb: s.max_memory_mb,
        epoch_interval_s: s.epoch_interval.get().map_or(0, |d| d.as_secs()),
        retention_days: s.retention_days,
        retention_keep: s.retention_keep,
        socket: s.socket.display().to_string(),
        socket_group: s.socket_group.clone(),
        log_level: s.log_level.clone(),
    }
}

/// CPU time of the periodic flushes, by stage (thread CPU time, ns).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct StageCpu {
    pub resolve_ns: u64,
    pub store_ns: u64,
    /// Parts of `store_ns`.
    pub spool_ns: u64,
    pub publish_ns: u64,
    /// The hotplug check and the sampler's counters, outside the two above.
    pub checks_ns: u64,
}

/// Samples and daemon CPU time over the last flush interval.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct RecentWindow {
    pub seconds: f64,
    pub samples: u64,
    pub cpu_s: f64,
    /// Per CPU: (cpu, drain thread wake-ups, drain thread CPU ns) during the window.
    pub per_cpu: Vec<(u32, u64, u64)>,
    /// The resolver thread's (wake-ups, CPU ns) during the window.
    pub resolver: (u64, u64),
}

/// Estimated cost (µs of the sampled CPU) of one sampling interrupt. These are estimates, not
/// measurements of this machine: a hardware PMU overflow interrupt costs on the order of 1 µs
/// on bare metal; a timer-driven software clock (cpu-clock, the fallback without a PMU) about
/// 2 µs; under a hypervisor each interrupt is a VM exit, measured at ~15-25 µs for cpu-clock on
/// the project's VMs (and assumed ~5 µs for a virtualized PMU).
pub fn sample_cost_us(hardware: bool, virtualized: bool) -> f64 {
    match (hardware, virtualized) {
        (true, false) => 1.0,
        (false, false) => 2.0,
        (true, true) => 5.0,
        (false, true) => 20.0,
    }
}

/// Whether this machine runs under a hypervisor (the `hypervisor` CPU flag).
pub fn virtualized() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|t| {
            t.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|w| w == "hypervisor"))
        })
    })
}

/// Inputs gathered by the service.
#[derive(Debug)]
pub struct StatusInputs<'a> {
    pub host: &'a str,
    pub db: &'a str,
    pub uptime_s: f64,
    pub sampler: Option<&'a SamplerStatus>,
    pub aggregator: &'a AggregatorStats,
    /// Unknown samples by reason and resolved samples, since start.
    pub unknown_by_reason: &'a BTreeMap<String, u64>,
    pub resolved_samples: u64,
    pub store: StoreStatus,
    pub settings: &'a Settings,
    pub last_reload: Option<ReloadReport>,
    /// The last complete flush interval; `None` before two flushes.
    pub recent: Option<RecentWindow>,
    /// Whether to assume VM-exit costs per sample ([`virtualized`]).
    pub virtualized: bool,
    pub stages: StageCpu,
    /// Daemon threads that died ([`crate::watch`]).
    pub failed_threads: Vec<dcpi_proto::ThreadFailure>,
    /// The resolver's counters as last seen.
    pub resolver: &'a ResolverStats,
    /// The resolver thread's counters.
    pub resolver_thread: ResolverThreadStats,
    /// Call-stack counters (`callchains = "fp"`).
    pub stacks: Option<dcpi_proto::StackReport>,
    /// The off-CPU source's counters (`off_cpu = true`).
    pub off_cpu: Option<OffCpuStatus>,
}

/// The off-CPU report: totals since start and rates over `uptime_s`.
pub fn off_cpu_report(o: &OffCpuStatus, uptime_s: f64) -> dcpi_proto::OffCpuReport {
    let per_s = |v: f64| if uptime_s > 0.0 { v / uptime_s } else { 0.0 };
    let cpu_s = o.cpu_ns as f64 / 1e9;
    let off_cpu_s = o.off_cpu_ns as f64 / 1e9;
    dcpi_proto::OffCpuReport {
        source: o.source.to_string(),
        switches: o.switches,
        switches_per_s: per_s(o.switches as f64),
        waits: o.waits,
        waits_per_s: per_s(o.waits as f64),
        off_cpu_s,
        off_cpu_s_per_s: per_s(off_cpu_s),
        waits_without_stack: o.waits_without_stack,
        lost: o.lost,
        unpaired: o.unpaired,
        open: o.open,
        cpu_s,
        cpu_ms_per_s: per_s(cpu_s * 1e3),
        ns_per_switch: if o.switches > 0 { o.cpu_ns as f64 / o.switches as f64 } else { 0.0 },
        nice: o.nice,
        boosts: o.boosts,
    }
}

/// The status report from what the service gathered.
pub fn build(i: StatusInputs<'_>) -> StatusReport {
    let (events, cpus) = match i.sampler {
        Some(s) => (
            s.events
                .iter()
                .map(|e| EventReport {
                    name: e.name.clone(),
                    requested: e.requested.clone(),
                    source: e.source.as_str().to_string(),
                    period_min: e.period_min,
                    period_max: e.period_max,
                    samples: e.samples,
                })
                .collect(),
            s.cpus
                .iter()
                .map(|c| CpuReport {
                    cpu: c.cpu,
                    online: c.online,
                    samples: c.samples,
                    lost: c.lost,
                    throttled: c.throttled,
                    error: c.error.clone(),
                    wakeups: c.wakeups,
                    wakeups_per_s: 0.0,
                    drain_cpu_ms_per_s: 0.0,
                })
                .collect::<Vec<_>>(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let samples = cpus.iter().map(|c| c.samples).sum();
    let lost = cpus.iter().map(|c| c.lost).sum();
    let throttled = cpus.iter().map(|c| c.throttled).sum();
    let unknown_count: u64 = i.unknown_by_reason.values().sum();
    let a = i.aggregator;
    let mut problems = Vec::new();
    if !i.failed_threads.is_empty() {
        problems.push(format!("degraded: {}", watch::describe(&i.failed_threads)));
    }
    if let Some(e) = &i.store.db_error {
        problems.push(format!("database not writable: {e}"));
    }
    if let Some(e) = &i.store.spool_error {
        problems.push(format!("spool not writable: {e}"));
    }
    if i.store.dropped_samples > 0 {
        problems.push(format!(
            "{} samples dropped (written neither to the spool nor to the database)",
            i.store.dropped_samples
        ));
    }
    if i.store.pending_samples > 0 {
        problems.push(format!(
            "{} samples held in memory (not yet written to the spool or the database)",
            i.store.pending_samples
        ));
    }
    if let Some(since) = i.store.publish_stalled_since_unix_ms {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        problems.push(format!(
            "publishing stalled for {:.0} s (the database is not answering; samples are kept)",
            now.saturating_sub(since) as f64 / 1e3
        ));
    }
    if let Some(owner) = &i.store.lease_lost_to {
        problems.push(format!("host name taken over by {owner}; not publishing"));
    }
    let offline: Vec<String> =
        cpus.iter().filter(|c| !c.online).map(|c| c.cpu.to_string()).collect();
    if !offline.is_empty() {
        problems.push(format!("CPU {} not sampled", offline.join(",")));
    }
    let (u, s) = sock::self_cpu_time();
    let cpu_s = (u + s).as_secs_f64();
    let uptime = i.uptime_s.max(1e-3);
    let since_start = samples as f64 / uptime;
    // Per CPU rates over the recent window; since start until there is one.
    let mut cpus = cpus;
    let sampler_cpus = i.sampler.map(|s| s.cpus.as_slice()).unwrap_or(&[]);
    for (c, sc) in cpus.iter_mut().zip(sampler_cpus) {
        let recent = i
            .recent
            .as_ref()
            .filter(|w| w.seconds > 0.0)
            .and_then(|w| w.per_cpu.iter().find(|p| p.0 == c.cpu).map(|p| (w.seconds, p)));
        let (secs, wk, ns) = match recent {
            Some((secs, p)) => (secs, p.1, p.2),
            None => (uptime, sc.wakeups, sc.drain_cpu_ns),
        };
        c.wakeups_per_s = wk as f64 / secs;
        c.drain_cpu_ms_per_s = ns as f64 / 1e6 / secs;
    }
    let (recent_rate, recent_cpu_pct, window) = match &i.recent {
        Some(w) if w.seconds > 0.0 => {
            (w.samples as f64 / w.seconds, w.cpu_s / w.seconds * 100.0, w.seconds)
        }
        _ => (since_start, cpu_s / uptime * 100.0, i.uptime_s),
    };
    // Weight the per-sample cost by what each event sampled.
    let (mut hw, mut sw) = (0u64, 0u64);
    for e in &events {
        if e.source == "hardware" {
            hw += e.samples;
        } else {
            sw += e.samples;
        }
    }
    let cost = if hw + sw == 0 {
        sample_cost_us(events.first().is_some_and(|e| e.source == "hardware"), i.virtualized)
    } else {
        (hw as f64 * sample_cost_us(true, i.virtualized)
            + sw as f64 * sample_cost_us(false, i.virtualized))
            / (hw + sw) as f64
    };
    let sampling_pct = recent_rate * cost / 1e4;
    let ncpus = (cpus.len() as u32).max(1);
    let overhead = OverheadReport {
        daemon_cpu_pct: cpu_s / uptime * 100.0,
        daemon_cpu_pct_recent: recent_cpu_pct,
        sample_cost_us_estimate: cost,
        sampling_cpu_pct_estimate: sampling_pct,
        ncpus,
        machine_pct_estimate: (recent_cpu_pct + sampling_pct) / f64::from(ncpus),
        daemon_cpu_ms_per_s: recent_cpu_pct * 10.0,
        ns_per_sample: if recent_rate > 0.0 {
            recent_cpu_pct / 100.0 * 1e9 / recent_rate
        } else {
            0.0
        },
        stage_cpu_s: {
            let drain =
                |f: fn(&CpuStatus) -> u64| sampler_cpus.iter().map(f).sum::<u64>() as f64 / 1e9;
            let s = |ns: u64| ns as f64 / 1e9;
            StageReport {
                drain: drain(|c| c.drain_cpu_ns),
                drain_parse: drain(|c| c.parse_ns),
                drain_aggregate: drain(|c| c.aggregate_ns),
                drain_rearm: drain(|c| c.rearm_ns),
                flush_resolve: s(i.stages.resolve_ns),
                flush_store: s(i.stages.store_ns),
                flush_spool: s(i.stages.spool_ns),
                flush_publish: s(i.stages.publish_ns),
                flush_checks: s(i.stages.checks_ns),
                resolver_thread: s(i.resolver_thread.cpu_ns),
            }
        },
    };
    StatusReport {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        host: i.host.to_string(),
        db: i.db.to_string(),
        uptime_s: i.uptime_s,
        events,
        cpus,
        samples,
        lost,
        throttled,
        unknown: UnknownReport {
            count: unknown_count,
            fraction: if i.resolved_samples > 0 {
                unknown_count as f64 / i.resolved_samples as f64
            } else {
                0.0
            },
            by_reason: i.unknown_by_reason.clone(),
        },
        aggregation: AggregationReport {
            samples_aggregated: a.samples_aggregated,
            entries_created: a.entries_created,
            factor: if a.entries_created > 0 {
                a.samples_aggregated as f64 / a.entries_created as f64
            } else {
                0.0
            },
            pending: a.pending,
            late_sideband: a.late_sideband,
        },
        epoch: i.store.epoch.clone(),
        store: i.store,
        condition: if problems.is_empty() { "ok".into() } else { problems.join("; ") },
        daemon: DaemonUsage {
            cpu_user_s: u.as_secs_f64(),
            cpu_sys_s: s.as_secs_f64(),
            rss_kib: sock::self_rss_kib().unwrap_or(0),
        },
        rate: RateReport {
            samples_per_s: since_start,
            samples_per_s_recent: recent_rate,
            recent_window_s: window,
        },
        overhead,
        config: config_report(i.settings),
        last_reload: i.last_reload,
        state: if i.failed_threads.is_empty() { "ok" } else { "degraded" }.to_string(),
        failed_threads: i.failed_threads,
        perf_maps: dcpi_proto::PerfMapReport {
            read: i.resolver.jit_maps_read,
            truncated: i.resolver.jit_maps_truncated,
            max_bytes: i.settings.perf_map_max_bytes,
            max_entries: i.settings.perf_map_max_entries as u64,
        },
        stacks: i.stacks,
        resolver_thread: resolver_thread_report(&i.resolver_thread, i.recent.as_ref(), uptime),
        off_cpu: i.off_cpu.as_ref().map(|o| off_cpu_report(o, uptime)),
    }
}

/// The resolver thread's rates over the recent window (since start until there is one).
fn resolver_thread_report(
    t: &ResolverThreadStats,
    recent: Option<&RecentWindow>,
    uptime_s: f64,
) -> ResolverThreadReport {
    let (secs, wk, ns) = match recent.filter(|w| w.seconds > 0.0) {
        Some(w) => (w.seconds, w.resolver.0, w.resolver.1),
        None => (uptime_s, t.wakeups, t.cpu_ns),
    };
    ResolverThreadReport {
        running: t.running,
        wakeups: t.wakeups,
        wakeups_per_s: wk as f64 / secs,
        cpu_ms_per_s: ns as f64 / 1e6 / secs,
        records_applied: t.records_applied,
        early_buffers: t.early_buffers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::ResolverThreadStats;
    use crate::resolve::ResolverStats;

    #[test]
    fn condition_and_fractions() {
        let mut by = BTreeMap::new();
        by.insert("process-gone".to_string(), 5u64);
        let agg =
            AggregatorStats { samples_aggregated: 100, entries_created: 10, ..Default::default() };
        let store = StoreStatus { db_error: Some("EROFS".into()), ..Default::default() };
        let settings = Settings::defaults();
        let r = build(StatusInputs {
            host: "h",
            db: "/db",
            uptime_s: 1.0,
            sampler: None,
            aggregator: &agg,
            unknown_by_reason: &by,
            resolved_samples: 50,
            store,
            settings: &settings,
            last_reload: None,
            recent: Some(RecentWindow {
                seconds: 2.0,
                samples: 4000,
                cpu_s: 0.02,
                per_cpu: vec![(0, 4, 3_000_000)],
                resolver: (6, 1_000_000),
            }),
            virtualized: true,
            stages: StageCpu {
                resolve_ns: 1_500_000_000,
                store_ns: 900_000_000,
                spool_ns: 300_000_000,
                publish_ns: 500_000_000,
                checks_ns: 70_000_000,
            },
            failed_threads: vec![dcpi_proto::ThreadFailure {
                thread: "dcpid-flush".into(),
                reason: "panicked: boom".into(),
                unix_ms: 1,
            }],
            resolver: &ResolverStats {
                jit_maps_read: 4,
                jit_maps_truncated: 1,
                ..Default::default()
            },
            resolver_thread: ResolverThreadStats {
                running: true,
                wakeups: 40,
                cpu_ns: 9_000_000,
                records_applied: 70,
                early_buffers: 2,
            },
            stacks: None,
            off_cpu: None,
        });
        assert!((r.rate.samples_per_s_recent - 2000.0).abs() < 1e-9);
        // The resolver thread's rates are over the recent window, its totals since start.
        assert!((r.resolver_thread.wakeups_per_s - 3.0).abs() < 1e-9);
        assert!((r.resolver_thread.cpu_ms_per_s - 0.5).abs() < 1e-9);
        assert_eq!((r.resolver_thread.wakeups, r.resolver_thread.records_applied), (40, 70));
        assert!((r.overhead.stage_cpu_s.resolver_thread - 0.009).abs() < 1e-12);
        let st = &r.overhead.stage_cpu_s;
        assert_eq!(
            (st.flush_resolve, st.flush_store, st.flush_spool, st.flush_publish, st.flush_checks),
            (1.5, 0.9, 0.3, 0.5, 0.07)
        );
        // No sampler: no drain thread, so none of its parts either.
        assert_eq!(
            (st.drain, st.drain_parse, st.drain_aggregate, st.drain_rearm),
            (0.0, 0.0, 0.0, 0.0)
        );
        assert!((r.overhead.daemon_cpu_pct_recent - 1.0).abs() < 1e-9);
        // No samples by event: the cost of a software clock in a VM, 20 µs x 2000/s = 4 %.
        assert!((r.overhead.sampling_cpu_pct_estimate - 4.0).abs() < 1e-9);
        assert_eq!(r.overhead.ncpus, 1);
        assert!((r.overhead.machine_pct_estimate - 5.0).abs() < 1e-9);
        // 0.02 s of CPU over 2 s = 10 ms/s; at 2000 samples/s that is 5 µs per sample.
        assert!((r.overhead.daemon_cpu_ms_per_s - 10.0).abs() < 1e-9);
        assert!((r.overhead.ns_per_sample - 5000.0).abs() < 1e-6);
        assert_eq!(r.overhead.stage_cpu_s.flush_resolve, 1.5);
        assert_eq!(r.config.flush_interval_s, settings.flush_interval.as_secs_f64());
        assert_eq!(r.unknown.count, 5);
        assert!((r.unknown.fraction - 0.1).abs() < 1e-9);
        assert!((r.aggregation.factor - 10.0).abs() < 1e-9);
        assert!(r.condition.contains("EROFS"), "{}", r.condition);
        assert!(
            r.condition.starts_with("degraded: thread dcpid-flush panicked: boom"),
            "{}",
            r.condition
        );
        assert_eq!(r.state, "degraded");
        assert_eq!((r.perf_maps.read, r.perf_maps.truncated), (4, 1));
        assert_eq!(r.perf_maps.max_entries, 100_000);
        let v = serde_json::to_value(&r).unwrap();
        // What dcpictl parses is exactly what was sent.
        let back: StatusReport = serde_json::from_value(v.clone()).expect("dcpictl's types");
        assert_eq!(back, r);
        for k in [
            "version",
            "events",
            "cpus",
            "unknown",
            "aggregation",
            "store",
            "daemon",
            "condition",
            "epoch",
            "rate",
            "overhead",
            "config",
            "last_reload",
            "state",
            "failed_threads",
            "perf_maps",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(r.one_line().contains("EROFS"));
    }
}
