//! The on-disk profile database of dcpi.
//!
//! See `FORMAT.md` beside this crate for the normative description of the layout and of every
//! file. This crate is the only code that reads or writes the database; the daemon, `dcpictl` and
//! `dcpiprof` all go through it.

mod atomic;
mod db;
mod error;
mod ident;
mod kallsyms;
mod profile;
mod summary;
pub mod varint;

pub use atomic::write_atomic;
pub use db::{Database, EpochId, HostDir, ProfileEntry};
pub use error::{Error, Result};
pub use ident::{event_file_component, validate_host_name, ImageId};
pub use kallsyms::{KallsymsSnapshot, KernelModule, KernelSymbol};
pub use profile::{EventDesc, ImageKind, JitSymbol, Profile, ProfileHeader, UnknownReason};
pub use summary::{EventSummary, HostSummary};

/// Default location of the database.
pub const DEFAULT_DB: &str = "/var/lib/dcpi";
