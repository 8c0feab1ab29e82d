//! Shared by the sampler's integration tests: a sink that keeps everything. (Tests that need
//! perf say so with `#[dcpi_testkit::test(perf)]`.)
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use dcpid::sys;
use dcpid::types::{PerfTime, Sample, SampleSink, TimedSideBand};

/// Keeps every sample and side-band record, and the `drained_until` of each call.
#[derive(Debug, Default)]
pub(crate) struct CollectSink {
    /// Each sample with the CPU whose ring it came from.
    pub samples: Mutex<Vec<(u32, Sample)>>,
    pub sideband: Mutex<Vec<TimedSideBand>>,
    /// Per CPU: (`drained_until`, clock at delivery) of every call.
    pub drains: Mutex<BTreeMap<u32, Vec<(PerfTime, PerfTime)>>>,
    /// Records delivered with a time below an earlier `drained_until` of the same CPU (the
    /// contract says there must be none).
    pub late: Mutex<Vec<(u32, PerfTime, PerfTime)>>,
}

impl SampleSink for CollectSink {
    fn on_drain(
        &self,
        cpu: u32,
        drained_until: PerfTime,
        samples: &mut Vec<Sample>,
        sideband: &mut Vec<TimedSideBand>,
    ) {
        let now = sys::time::monotonic_ns();
        {
            let drains = self.drains.lock().unwrap();
            let prev = drains.get(&cpu).and_then(|v| v.last()).map_or(0, |d| d.0);
            let mut late = self.late.lock().unwrap();
            for t in samples.iter().map(|s| s.time).chain(sideband.iter().map(|s| s.time)) {
                if t < prev {
                    late.push((cpu, t, prev));
                }
            }
        }
        self.samples.lock().unwrap().extend(samples.drain(..).map(|s| (cpu, s)));
        self.sideband.lock().unwrap().extend(sideband.drain(..));
        self.drains.lock().unwrap().entry(cpu).or_default().push((drained_until, now));
    }
}

impl CollectSink {
    pub(crate) fn take_samples(&self) -> Vec<Sample> {
        self.take_cpu_samples().into_iter().map(|(_, s)| s).collect()
    }

    /// The samples with the CPU whose ring each came from.
    pub(crate) fn take_cpu_samples(&self) -> Vec<(u32, Sample)> {
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// Burn CPU on the calling thread for `d`.
pub(crate) fn spin_for(d: std::time::Duration) -> u64 {
    // CPU time of this thread, not wall time: on a loaded machine (load average 15 seen here)
    // a wall-clock spin got a fraction of a CPU and too few samples for the tests' bounds.
    let start = thread_cpu_ns();
    let want = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut x = 0u64;
    while thread_cpu_ns().saturating_sub(start) < want {
        for i in 0..20_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

/// Nanoseconds this thread has run on a CPU (first field of /proc/thread-self/schedstat).
pub(crate) fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat")
}
