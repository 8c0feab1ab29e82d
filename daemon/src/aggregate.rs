//! Per-CPU aggregation of samples, ordered against side-band records by time.
//!
//! CONTRACT (used by `store` and `service`; owned by the resolver work):
//! - `Aggregator::new(resolver, ncpus) -> Arc<Aggregator>`; it implements `SampleSink`.
//! - `take_resolved(&self) -> Resolved`: swaps out every per-CPU table and resolves each entry.
//! - `flush_all(&self) -> Resolved`: like `take_resolved`, but first applies every queued
//!   side-band record and aggregates every pending sample regardless of the watermark (used at
//!   shutdown and when an epoch is closed).
//! - `stats(&self) -> AggregatorStats`.
//! - `with_resolver(&self, f)` gives access to the resolver (status, kallsyms snapshot).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use profile_format::{ImageId, ImageKind, JitSymbol, UnknownReason};

use crate::types::EventIdx;

/// What a profile on disk needs to know about its image.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ImageInfo {
    pub kind: ImageKind,
    pub id: ImageId,
    /// Path as seen (`/usr/bin/foo`, `[kernel.kallsyms]`, `[vdso]`, `[anon:1234]`, module name).
    pub path: Vec<u8>,
    /// For `Anon` images: symbols from /tmp/perf-PID.map, if the process published one.
    pub jit_symbols: Vec<JitSymbol>,
}

/// Samples of one (image, event), resolved: offset → (count, sum of periods in force).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResolvedProfile {
    pub image: Arc<ImageInfo>,
    pub event: EventIdx,
    pub counts: BTreeMap<u64, (u64, u64)>,
}

/// Output of one flush of the per-CPU tables.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Resolved {
    /// Keyed by (image id, event index).
    pub profiles: HashMap<(ImageId, EventIdx), ResolvedProfile>,
    /// Keyed by (event index, reason): (count, period sum).
    pub unknown: HashMap<(EventIdx, UnknownReason), (u64, u64)>,
    /// Total samples in this batch (resolved + unknown).
    pub samples: u64,
}

/// Counters for `dcpictl status`.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize)]
pub struct AggregatorStats {
    /// Samples received from drain threads.
    pub samples_in: u64,
    /// Samples added into the per-CPU tables.
    pub samples_aggregated: u64,
    /// Table entries created (each distinct key per flush); samples_aggregated / entries_created
    /// is the aggregation factor.
    pub entries_created: u64,
    /// Samples waiting for the watermark.
    pub pending: u64,
    /// Side-band records that arrived after the watermark had passed their time.
    pub late_sideband: u64,
    /// Current watermark (perf clock ns).
    pub watermark: u64,
}
