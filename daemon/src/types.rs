//! Types shared by the sampler, the aggregator and the resolver (neither of the last two
//! imports the other's module for them).

use profile_format::{ImageId, ImageKind, JitSymbol};

/// Index of a configured event in the daemon's event list.
pub type EventIdx = u16;

/// Timestamps are perf clock (`CLOCK_MONOTONIC` for software events; we set `use_clockid`),
/// nanoseconds.
pub type PerfTime = u64;

/// One sample, as parsed from a ring buffer. Only what aggregation uses: every sample is
/// copied into a pending queue until the watermark passes it, so its size is per-sample cost
/// (48 bytes, the thread id included: it fits in the padding; the CPU of the record is not
/// needed: it is the ring's).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Sample {
    pub time: PerfTime,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id: names the thread for the who table's thread rows (FORMAT.md §12).
    pub tid: u32,
    pub pc: u64,
    pub event: EventIdx,
    /// The overflow period that was in force when this sample was taken (the one the daemon set
    /// with `PERF_EVENT_IOC_PERIOD`, not the record's PERIOD field, which does not change).
    pub period: u64,
    /// True if the sample was taken in kernel mode (`PERF_RECORD_MISC_KERNEL`).
    pub kernel: bool,
    /// cgroup v2 id of the task (`PERF_SAMPLE_CGROUP`); 0 when the kernel cannot say.
    pub cgroup: u64,
    /// Interned call stack in the sampling CPU's stack table (`perf::callchain`); 0 = none.
    pub stack: u32,
}

const _: () = assert!(std::mem::size_of::<Sample>() == 48);

/// A side-band record that changes what the resolver knows about processes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SideBand {
    Mmap2 {
        pid: u32,
        tid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        /// Device major/minor, inode and inode generation (absent when the kernel sent a
        /// build-id instead).
        dev: Option<(u32, u32)>,
        ino: Option<u64>,
        ino_generation: Option<u64>,
        prot: u32,
        flags: u32,
        /// GNU build-id (`PERF_RECORD_MISC_MMAP_BUILD_ID`).
        build_id: Option<Vec<u8>>,
        filename: Vec<u8>,
        /// Mapping made in kernel mode (module load); user mappings have this false.
        kernel: bool,
    },
    Comm {
        pid: u32,
        tid: u32,
        comm: Vec<u8>,
        /// `PERF_RECORD_MISC_COMM_EXEC`: the process exec'ed; its address space was replaced.
        exec: bool,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
    },
    Exit {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
    },
    /// `PERF_RECORD_CGROUP`: a cgroup was created; `path` is relative to the v2 root.
    Cgroup {
        id: u64,
        path: Vec<u8>,
    },
}

/// A side-band record with the time and CPU it was recorded on.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TimedSideBand {
    pub time: PerfTime,
    pub cpu: u32,
    pub record: SideBand,
}

/// Receives what each drain thread reads from its ring. Implemented by the aggregator.
///
/// Called from the drain thread of `cpu` (pinned to that CPU) after each pass over the ring.
/// `drained_until` is a perf-clock time such that every record with a smaller time that will
/// ever appear in this CPU's ring has been delivered (the time at which the pass read
/// `data_head`, minus a small slack). Records arrive in ring order. The callee may take the
/// vectors' contents (`std::mem::take`); the caller reuses them.
pub trait SampleSink: Send + Sync + 'static {
    fn on_drain(
        &self,
        cpu: u32,
        drained_until: PerfTime,
        samples: &mut Vec<Sample>,
        sideband: &mut Vec<TimedSideBand>,
    );
}

/// What a profile on disk needs to know about its image (made by the resolver, carried by the
/// aggregator's resolved batches into the store).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ImageInfo {
    pub kind: ImageKind,
    pub id: ImageId,
    /// Path as seen (`/usr/bin/foo`, `[kernel.kallsyms]`, `[vdso]`, `[anon:1234]`, module name).
    pub path: Vec<u8>,
    /// For `Anon` images: symbols from /tmp/perf-PID.map, if the process published one.
    pub jit_symbols: Vec<JitSymbol>,
}
