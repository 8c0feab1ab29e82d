use std::collections::BTreeMap;
use std::path::Path;

use crate::db::EpochId;
use crate::error::Result;
use crate::ident::ImageId;

/// What kind of image a profile describes; decides how offsets are interpreted (FORMAT.md).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum ImageKind {
    /// A file mapped by a process. Offsets are file offsets.
    Elf = 0,
    /// The kernel. Offsets are relative to the `_text` symbol of the running kernel.
    Kernel = 1,
    /// A kernel module. Offsets are relative to the module's load address (kallsyms snapshot).
    KernelModule = 2,
    /// The vDSO. Offsets are relative to its start (it is mapped with pgoff 0).
    Vdso = 3,
    /// Anonymous executable memory of one process (JIT). Offsets are absolute addresses.
    Anon = 4,
    /// Samples that could not be attributed. Offsets are [`UnknownReason`] codes.
    Unknown = 5,
}

/// Why a sample could not be attributed; the offset of a count in an `Unknown` profile.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum UnknownReason {
    /// The process was known but no mapping covered the pc.
    NoMap = 0,
    /// The process had exited (or was never seen) by the time the sample was resolved.
    ProcessGone = 1,
    /// The process's /proc entries could not be read (e.g. EACCES on PID 1).
    Unreadable = 2,
    /// A kernel-space pc outside the kernel and every known module.
    KernelUnknown = 3,
}

impl UnknownReason {
    pub const ALL: [UnknownReason; 4] = [
        UnknownReason::NoMap,
        UnknownReason::ProcessGone,
        UnknownReason::Unreadable,
        UnknownReason::KernelUnknown,
    ];
    pub fn from_code(code: u64) -> Option<UnknownReason> {
        Self::ALL.into_iter().find(|r| *r as u64 == code)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownReason::NoMap => "no-map",
            UnknownReason::ProcessGone => "process-gone",
            UnknownReason::Unreadable => "unreadable",
            UnknownReason::KernelUnknown => "kernel-unknown",
        }
    }
}

/// A sampling event as configured on the daemon.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct EventDesc {
    /// User-facing name: `cycles`, `cpu-clock`, `raw:0x1a2`, ...
    pub name: String,
    /// `perf_event_attr.type`.
    pub perf_type: u32,
    /// `perf_event_attr.config`.
    pub perf_config: u64,
    /// Mean of the randomization window of the overflow period (events per sample).
    pub period_mean: u64,
    /// Lower bound of the window.
    pub period_min: u64,
    /// Upper bound of the window.
    pub period_max: u64,
}

/// A symbol published by a JIT in `/tmp/perf-PID.map`; stored with `Anon` profiles.
#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct JitSymbol {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// Everything in a profile file except the counts.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ProfileHeader {
    pub kind: ImageKind,
    pub image_id: ImageId,
    /// The image path as the kernel or /proc showed it; arbitrary bytes (may hold newlines).
    pub image_path: Vec<u8>,
    pub event: EventDesc,
    pub host: String,
    pub epoch: EpochId,
    /// Sum of the counts in the body; checked on read.
    pub total_samples: u64,
    /// Sum of the periods in force for every sample counted (events represented). A report
    /// weights a count `c` as `c * total_period / total_samples`.
    pub total_period: u64,
    /// Monotonic sequence number of the last daemon spool increment merged into this file;
    /// lets the daemon publish each increment exactly once across crashes. 0 if unused.
    pub sequence: u64,
    /// JIT symbols (only for `Anon` profiles; empty otherwise).
    pub jit_symbols: Vec<JitSymbol>,
}

/// One profile: the samples of one (image, event) in one epoch on one host.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Profile {
    pub header: ProfileHeader,
    /// Count per offset (see [`ImageKind`] for what an offset means). No zero counts.
    pub counts: BTreeMap<u64, u64>,
}

impl Profile {
    /// An empty profile.
    pub fn new(header: ProfileHeader) -> Profile {
        Profile { header, counts: BTreeMap::new() }
    }

    /// Add `count` samples at `offset`, together with the sum of their periods.
    pub fn add(&mut self, offset: u64, count: u64, period_sum: u64) {
        todo!("{offset} {count} {period_sum}")
    }

    /// Serialize to the on-disk format (FORMAT.md), checksum included.
    pub fn encode(&self) -> Vec<u8> {
        todo!()
    }

    /// Parse and validate; `path` is only used to name the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Profile> {
        todo!("{bytes:?} {path:?}")
    }

    /// Read and validate a profile file.
    pub fn read(path: &Path) -> Result<Profile> {
        todo!("{path:?}")
    }

    /// Write atomically (temp file in the same directory, fsync, rename, fsync directory).
    pub fn write(&self, path: &Path) -> Result<()> {
        todo!("{path:?}")
    }

    /// Add `other`'s counts and totals to `self`. Both must describe the same image and event
    /// name (otherwise [`crate::Error::MergeMismatch`]); the period window widens to cover both,
    /// `sequence` becomes the max, JIT symbols are unioned. Host and epoch of `self` are kept.
    pub fn merge(&mut self, other: &Profile) -> Result<()> {
        todo!("{other:?}")
    }
}
