use std::path::Path;

use crate::error::{Error, Result};
use crate::profile::EventDesc;

/// Per-event part of a host summary.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
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

/// Value of [`HostSummary::format_version`] written by this build.
pub const SUMMARY_FORMAT_VERSION: u32 = 1;

/// `summary.json` in each host directory of an epoch. Unknown fields are ignored and missing
/// ones default, so that newer and older writers stay readable.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
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
    /// The writer's spool sequence number up to which this summary includes the counts (0 =
    /// not recorded). After a crash the daemon adds only what its spool holds beyond it.
    pub spool_sequence: u64,
}

impl HostSummary {
    /// Read and parse; errors name the file.
    pub fn read(path: &Path) -> Result<HostSummary> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Json { path: path.into(), source })
    }
    /// Write atomically as pretty-printed JSON; returns the bytes written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        let mut bytes = serde_json::to_vec_pretty(self)
            .map_err(|source| Error::Json { path: path.into(), source })?;
        bytes.push(b'\n');
        crate::atomic::write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors_name_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("summary.json");
        let s = HostSummary {
            format_version: SUMMARY_FORMAT_VERSION,
            host: "h1".into(),
            epoch: "20240101T000000Z".into(),
            cpus: vec![0, 1],
            events: vec![EventSummary {
                source: "software".into(),
                samples: 5,
                ..Default::default()
            }],
            samples: 5,
            ..Default::default()
        };
        s.write(&p).unwrap();
        assert_eq!(HostSummary::read(&p).unwrap(), s);
        std::fs::write(&p, b"{\"samples\": \"many\"}").unwrap();
        let e = HostSummary::read(&p).unwrap_err();
        assert!(matches!(e, Error::Json { .. }), "{e}");
        assert!(e.to_string().contains("summary.json"), "{e}");
        let missing = dir.path().join("nope.json");
        assert!(HostSummary::read(&missing).unwrap_err().to_string().contains("nope.json"));
    }
}
