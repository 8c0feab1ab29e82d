//! `dcpictl status`: what the daemon reports about itself.
//!
//! The JSON form (`dcpictl status --json`) is a stable interface. Fields are only ever added;
//! top level:
//! - `version`, `pid`, `host`, `db`, `uptime_s`
//! - `events[]`: `name`, `requested`, `source` (`hardware`|`software`|`fallback`),
//!   `period_min`, `period_max` (the randomization window), `samples`
//! - `cpus[]`: `cpu`, `online`, `samples`, `lost`, `throttled`, `error`
//! - `samples`, `lost`, `throttled` (totals since start)
//! - `unknown`: `count`, `fraction` (of resolved samples), `by_reason` {reason: count}
//! - `aggregation`: `samples_aggregated`, `entries_created`, `factor` (samples per table
//!   entry), `pending`, `late_sideband`
//! - `epoch` (current epoch id), `store`: see [`crate::store::StoreStatus`] (`last_flush`,
//!   `last_publish` {`unix_ms`, `duration_ms`, `items`}, `spool_rows`, `spool_bytes`,
//!   `spool_quarantined`, `dirty_profiles`, `pending_batches`, `pending_bytes`,
//!   `dropped_samples`, `bytes_written` {`spool`, `profiles`, `summaries`, `kallsyms`},
//!   `db_error`, `spool_error`, ...)
//! - `condition`: `ok`, or a one-line description of what is wrong (disk, CPUs not sampled)
//! - `daemon`: `cpu_user_s`, `cpu_sys_s`, `rss_kib`
//! - `rate`: `samples_per_s` (since start), `samples_per_s_recent` (over the last flush
//!   interval, `recent_window_s` long)
//! - `overhead`: `daemon_cpu_pct` (the daemon's CPU time as a percentage of one CPU, since
//!   start), `daemon_cpu_pct_recent`, `sample_cost_us_estimate` (assumed cost of one sampling
//!   interrupt on the sampled CPU, see [`sample_cost_us`]), `sampling_cpu_pct_estimate`
//!   (recent samples/s x that cost, percent of one CPU), `ncpus`, `machine_pct_estimate`
//!   (daemon + sampling interrupts, percent of the whole machine)
//! - `config`: the settings in force (`file`, `events`, `window_divisor`, `ring_pages`,
//!   `flush_interval_s`, `publish_interval_s`, `max_memory_mb`, `retention_days`,
//!   `retention_keep`, `socket`, `socket_group`, `log_level`)
//! - `last_reload`: `null` or {`unix_ms`, `trigger` (`SIGHUP`|`dcpictl`), `ok`, `error`,
//!   `applied[]`, `restart_required[]`}

use std::collections::BTreeMap;

use serde::Serialize;

use crate::aggregate::AggregatorStats;
use crate::config::Settings;
use crate::perf::sampler::SamplerStatus;
use crate::store::StoreStatus;

#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct EventReport {
    pub name: String,
    pub requested: String,
    pub source: String,
    pub period_min: u64,
    pub period_max: u64,
    pub samples: u64,
}

#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct CpuReport {
    pub cpu: u32,
    pub online: bool,
    pub samples: u64,
    pub lost: u64,
    pub throttled: u64,
    pub error: Option<String>,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct UnknownReport {
    pub count: u64,
    pub fraction: f64,
    pub by_reason: BTreeMap<String, u64>,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct AggregationReport {
    pub samples_aggregated: u64,
    pub entries_created: u64,
    pub factor: f64,
    pub pending: u64,
    pub late_sideband: u64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct DaemonUsage {
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub rss_kib: u64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct RateReport {
    pub samples_per_s: f64,
    pub samples_per_s_recent: f64,
    pub recent_window_s: f64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct OverheadReport {
    pub daemon_cpu_pct: f64,
    pub daemon_cpu_pct_recent: f64,
    pub sample_cost_us_estimate: f64,
    pub sampling_cpu_pct_estimate: f64,
    pub ncpus: u32,
    pub machine_pct_estimate: f64,
}

#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct ConfigReport {
    pub file: Option<String>,
    pub events: String,
    pub window_divisor: u64,
    pub ring_pages: usize,
    pub flush_interval_s: f64,
    pub publish_interval_s: f64,
    pub max_memory_mb: u64,
    pub retention_days: u32,
    pub retention_keep: usize,
    pub socket: String,
    pub socket_group: Option<String>,
    pub log_level: String,
}

impl ConfigReport {
    pub fn from_settings(s: &Settings) -> ConfigReport {
        ConfigReport {
            file: s.config_file.as_ref().map(|p| p.display().to_string()),
            events: s.events.clone(),
            window_divisor: s.window_divisor,
            ring_pages: s.ring_pages,
            flush_interval_s: s.flush_interval.as_secs_f64(),
            publish_interval_s: s.publish_interval.as_secs_f64(),
            max_memory_mb: s.max_memory_mb,
            retention_days: s.retention_days,
            retention_keep: s.retention_keep,
            socket: s.socket.display().to_string(),
            socket_group: s.socket_group.clone(),
            log_level: s.log_level.clone(),
        }
    }
}

/// The outcome of the last reload (SIGHUP or `dcpictl reload`).
#[derive(Clone, PartialEq, Debug, Default, Serialize)]
pub struct ReloadReport {
    pub unix_ms: u64,
    pub trigger: String,
    pub ok: bool,
    /// Why the new configuration was rejected (file, line, reason); the old one stays.
    pub error: Option<String>,
    /// `key: old -> new` for each setting changed live.
    pub applied: Vec<String>,
    /// Keys whose new value needs a restart of dcpid; the running value is kept.
    pub restart_required: Vec<String>,
}

/// Samples and daemon CPU time over the last flush interval.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
pub struct RecentWindow {
    pub seconds: f64,
    pub samples: u64,
    pub cpu_s: f64,
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

#[derive(Clone, PartialEq, Debug, Serialize)]
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
    pub epoch: Option<String>,
    pub store: StoreStatus,
    pub condition: String,
    pub daemon: DaemonUsage,
    pub rate: RateReport,
    pub overhead: OverheadReport,
    pub config: ConfigReport,
    pub last_reload: Option<ReloadReport>,
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
}

impl StatusReport {
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
        if let Some(e) = &i.store.db_error {
            problems.push(format!("database not writable: {e}"));
        }
        if let Some(e) = &i.store.spool_error {
            problems.push(format!("spool not writable: {e}"));
        }
        if i.store.dropped_samples > 0 {
            problems.push(format!("{} samples dropped (memory bound)", i.store.dropped_samples));
        }
        let offline: Vec<String> =
            cpus.iter().filter(|c| !c.online).map(|c| c.cpu.to_string()).collect();
        if !offline.is_empty() {
            problems.push(format!("CPU {} not sampled", offline.join(",")));
        }
        let (u, s) = crate::sys::sock::self_cpu_time();
        let cpu_s = (u + s).as_secs_f64();
        let uptime = i.uptime_s.max(1e-3);
        let since_start = samples as f64 / uptime;
        let (recent_rate, recent_cpu_pct, window) = match i.recent {
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
                rss_kib: crate::sys::sock::self_rss_kib().unwrap_or(0),
            },
            rate: RateReport {
                samples_per_s: since_start,
                samples_per_s_recent: recent_rate,
                recent_window_s: window,
            },
            overhead,
            config: ConfigReport::from_settings(i.settings),
            last_reload: i.last_reload,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_and_fractions() {
        let mut by = BTreeMap::new();
        by.insert("process-gone".to_string(), 5u64);
        let agg =
            AggregatorStats { samples_aggregated: 100, entries_created: 10, ..Default::default() };
        let store = StoreStatus { db_error: Some("EROFS".into()), ..Default::default() };
        let settings = Settings::defaults();
        let r = StatusReport::build(StatusInputs {
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
            recent: Some(RecentWindow { seconds: 2.0, samples: 4000, cpu_s: 0.02 }),
            virtualized: true,
        });
        assert!((r.rate.samples_per_s_recent - 2000.0).abs() < 1e-9);
        assert!((r.overhead.daemon_cpu_pct_recent - 1.0).abs() < 1e-9);
        // No samples by event: the cost of a software clock in a VM, 20 µs x 2000/s = 4 %.
        assert!((r.overhead.sampling_cpu_pct_estimate - 4.0).abs() < 1e-9);
        assert_eq!(r.overhead.ncpus, 1);
        assert!((r.overhead.machine_pct_estimate - 5.0).abs() < 1e-9);
        assert_eq!(r.config.flush_interval_s, 2.0);
        assert_eq!(r.unknown.count, 5);
        assert!((r.unknown.fraction - 0.1).abs() < 1e-9);
        assert!((r.aggregation.factor - 10.0).abs() < 1e-9);
        assert!(r.condition.contains("EROFS"), "{}", r.condition);
        let v = serde_json::to_value(&r).unwrap();
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
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(r.one_line().contains("EROFS"));
    }
}
