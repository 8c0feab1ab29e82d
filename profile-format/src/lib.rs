//! The on-disk profile database of dcpi.
//!
//! See `FORMAT.md` beside this crate for the normative description of the layout and of every
//! file. This crate is the only code that reads or writes the database; the daemon, `dcpictl` and
//! `dcpiprof` all go through it.

// clippy.toml forbids plain reads of files in this crate (database files go through `safeio`);
// unit tests read what they wrote.
#![cfg_attr(test, allow(clippy::disallowed_methods))]
#![forbid(unsafe_code)]

mod atomic;
mod codec;
mod db;
mod error;
mod ident;
mod kallsyms;
mod ksymstore;
mod lease;
pub mod pairs;
mod profile;
pub mod safeio;
mod slices;
mod stacks;
pub mod sumidx;
mod summary;
mod symtab;
pub mod varint;
mod who;

pub use atomic::write_atomic;
pub use db::{
    continuation_path, Database, EpochId, EpochStart, EpochsStamp, HostDir, ProfileEntry,
    WhoProfileEntry, ABANDONED_EPOCH_AFTER, CORRUPT_SUFFIX, EPOCH_MARKER, PROFILE_SUFFIX,
};
pub use error::{Error, Result};
pub use ident::{event_file_component, validate_host_name, ImageId, MAX_BUILD_ID_LEN};
pub use kallsyms::{
    KallsymsSnapshot, KernelModule, KernelSymbol, KALLSYMS_MAGIC, KALLSYMS_VERSION,
};
pub use ksymstore::{
    kallsyms_from_columns, kallsyms_id, kallsyms_to_columns, pack_kallsyms, unpack_kallsyms,
    KALLSYMS_DIR, KALLSYMS_REF, KALLSYMS_REF_VERSION, KALLSYMS_ZST_MAGIC, KALLSYMS_ZST_VERSION,
};
pub use lease::{same_owner, Lease, LEASES_DIR, LEASE_VERSION};
pub use profile::{
    cgroup_file_component, command_file_component, EventDesc, ImageKind, JitSymbol, Profile,
    ProfileHeader, ProfileWho, UnknownReason, PROFILE_MAGIC, PROFILE_VERSION,
};
pub use slices::{
    encode_record, encode_record_at, hour_of, merge_pairs, record_spans, segment_hour, KeyTable,
    OpenReport, SegmentOpen, SegmentWriter, Slice, SliceFiles, SliceIndex, SliceKey, SliceLog,
    SliceRange, SliceTotal, SliceTotals, SliceWriter, MAX_RECORD, MAX_RESOLUTION_SHIFT,
    SEGMENT_SECS, SLICES_FILE, SLICES_HEADER_LEN, SLICES_MAGIC, SLICES_VERSION, SLICE_HOURS_FILE,
};
pub use stacks::{
    stacks_file_event_component, Frame, StackImage, StackProfile, StackRef, MAX_COMMAND_LEN,
    MAX_STACK_DEPTH, STACKS_MAGIC, STACKS_PREFIX, STACKS_SUFFIX, STACKS_VERSION, UNKNOWN_COMMAND,
};
pub use sumidx::{SUMMARY_INDEX_FILE, SUMMARY_INDEX_MAGIC, SUMMARY_INDEX_VERSION};
pub use summary::{
    EventSummary, FreshMark, HostSummary, ImageTotal, SummaryIndex, FRESH_NAMES_FILE,
    SUMMARY_FORMAT_VERSION,
};
pub use symtab::{
    normalize_symbols, StoredSymtab, SymtabOrigin, SymtabSegment, SymtabSymbol, BINARIES_DIR,
    MAX_SYMTAB_FILE, MAX_SYMTAB_NAME, MAX_SYMTAB_SEGMENTS, MAX_SYMTAB_SYMBOLS, SYMTAB_MAGIC,
    SYMTAB_SUFFIX, SYMTAB_VERSION,
};
pub use who::{
    ThreadKey, WhoKey, WhoTable, EXITING_COMMAND, EXITING_PID, MAX_THREAD_NAMES, OTHER_THREADS,
    WHO_FILE, WHO_MAGIC, WHO_VERSION,
};

/// Default location of the database.
pub const DEFAULT_DB: &str = "/var/lib/dcpi";
