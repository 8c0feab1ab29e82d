use std::path::Path;

use crate::error::Result;
use crate::profile::EventDesc;

/// Per-event part of a host summary.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct EventSummary {
    pub desc: Option<EventDesc>,
    /// `hardware`, `software`, or `fallback` (a hardware event was asked for with `auto` but
    /// the machine had no PMU, so cpu-clock was used).
    pub source: String,
    pub samples: u64,
    pub total_period: u64,
    /// Sums over CPUs of the counters' enabled and running times (ns), for multiplex scaling.
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
}

/// `summary.json` in each host directory of an epoch.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct HostSummary {
    pub format_version: u32,
    pub host: String,
    pub epoch: String,
    pub kernel_release: String,
    pub cpus: Vec<u32>,
    pub events: Vec<EventSummary>,
    pub samples: u64,
    pub lost: u64,
    pub throttled: u64,
    pub unknown: u64,
    /// Unix seconds of the first and last write of this summary.
    pub first_written: u64,
    pub last_written: u64,
    pub dcpid_version: String,
}

impl HostSummary {
    pub fn read(path: &Path) -> Result<HostSummary> {
        todo!("{path:?}")
    }
    pub fn write(&self, path: &Path) -> Result<()> {
        todo!("{path:?}")
    }
}
