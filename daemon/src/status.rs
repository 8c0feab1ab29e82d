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
//!   `dirty_profiles`, `pending_batches`, `pending_bytes`, `dropped_samples`, `db_error`,
//!   `spool_error`, ...)
//! - `condition`: `ok`, or a one-line description of what is wrong (disk, CPUs not sampled)
//! - `daemon`: `cpu_user_s`, `cpu_sys_s`, `rss_kib`

use std::collections::BTreeMap;

use serde::Serialize;

use crate::aggregate::AggregatorStats;
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
        }
    }

    /// The one-line summary sent as systemd STATUS=.
    pub fn one_line(&self) -> String {
        format!(
            "epoch {} | {} samples, {} lost, {:.1}% unknown | spool {} rows | {}",
            self.epoch.as_deref().unwrap_or("-"),
            self.samples,
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
        let r = StatusReport::build(StatusInputs {
            host: "h",
            db: "/db",
            uptime_s: 1.0,
            sampler: None,
            aggregator: &agg,
            unknown_by_reason: &by,
            resolved_samples: 50,
            store,
        });
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
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(r.one_line().contains("EROFS"));
    }
}
