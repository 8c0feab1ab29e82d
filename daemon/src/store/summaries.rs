//! Per-epoch `summary.json`: the cumulative counts in memory, rebuilt after a restart from the
//! published file plus the spool's deltas above its `spool_sequence`.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use profile_format::{EventSummary, HostSummary};

use super::pending::PendingBatch;
use super::spool::{EventDelta, SummaryDelta};
use super::EventInfo;

/// Summaries of the epochs this store touched.
#[derive(Default)]
pub(super) struct Summaries {
    pub current: HashMap<String, HostSummary>,
    /// Changed since last written.
    pub dirty: HashSet<String>,
    pub written_at: HashMap<String, Instant>,
}

fn event_mut<'a>(s: &'a mut HostSummary, info: &profile_format::EventDesc) -> &'a mut EventSummary {
    let pos = s.events.iter().position(|e| e.desc.as_ref().map(|d| &d.name) == Some(&info.name));
    match pos {
        Some(i) => &mut s.events[i],
        None => {
            s.events.push(EventSummary { desc: Some(info.clone()), ..EventSummary::default() });
            s.events.last_mut().expect("just pushed")
        }
    }
}

/// Add one spool record's delta.
pub(super) fn apply(s: &mut HostSummary, d: &SummaryDelta) {
    s.samples = s.samples.saturating_add(d.samples);
    s.unknown = s.unknown.saturating_add(d.unknown);
    s.lost = s.lost.saturating_add(d.lost);
    s.throttled = s.throttled.saturating_add(d.throttled);
    for e in &d.events {
        let x = event_mut(s, &e.desc);
        x.samples = x.samples.saturating_add(e.samples);
        x.total_period = x.total_period.saturating_add(e.total_period);
        x.time_enabled_ns = x.time_enabled_ns.saturating_add(e.time_enabled_ns);
        x.time_running_ns = x.time_running_ns.saturating_add(e.time_running_ns);
    }
}

/// What a batch adds to its epoch's summary: its counters, the samples dropped before it, and
/// the counters' enabled/running times accumulated since the previous spooled batch.
pub(super) fn delta_of(
    batch: &PendingBatch,
    dropped: u64,
    events: &[EventInfo],
    times: &[(u64, u64)],
) -> SummaryDelta {
    let mut d = SummaryDelta {
        samples: batch.samples,
        unknown: batch.unknown,
        lost: batch.lost.saturating_add(dropped),
        throttled: batch.throttled,
        events: Vec::new(),
    };
    let mut slot = |desc: &profile_format::EventDesc| -> usize {
        match d.events.iter().position(|e| e.desc.name == desc.name) {
            Some(i) => i,
            None => {
                d.events.push(EventDelta {
                    desc: desc.clone(),
                    samples: 0,
                    total_period: 0,
                    time_enabled_ns: 0,
                    time_running_ns: 0,
                });
                d.events.len() - 1
            }
        }
    };
    let mut adds = Vec::new();
    for p in &batch.profiles {
        let n = p.counts.iter().fold(0u64, |a, c| a.saturating_add(c.1));
        adds.push((slot(&p.desc), n, p.total_period, 0, 0));
    }
    for (i, (en, run)) in times.iter().enumerate() {
        let Some(info) = events.get(i) else { continue };
        if *en == 0 && *run == 0 {
            continue;
        }
        adds.push((slot(&info.desc), 0, 0, *en, *run));
    }
    for (i, n, p, en, run) in adds {
        let e = &mut d.events[i];
        e.samples = e.samples.saturating_add(n);
        e.total_period = e.total_period.saturating_add(p);
        e.time_enabled_ns = e.time_enabled_ns.saturating_add(en);
        e.time_running_ns = e.time_running_ns.saturating_add(run);
    }
    d
}
