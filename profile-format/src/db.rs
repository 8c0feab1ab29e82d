use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::error::Result;
use crate::ident::ImageId;

/// Epoch identifier: UTC start time `YYYYMMDDTHHMMSSZ`; names sort by start time.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EpochId(String);

impl EpochId {
    /// The id for an epoch starting at `t` (second resolution).
    pub fn from_time(t: SystemTime) -> EpochId {
        todo!("{t:?}")
    }
    /// Validate the text form.
    pub fn parse(s: &str) -> Result<EpochId> {
        todo!("{s}")
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The start time this id encodes.
    pub fn start_time(&self) -> SystemTime {
        todo!()
    }
}

impl std::fmt::Display for EpochId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A database directory (FORMAT.md "Layout").
#[derive(Clone, Debug)]
pub struct Database {
    root: PathBuf,
}

/// A profile file found in a host directory (name parsed, contents not read).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ProfileEntry {
    pub path: PathBuf,
    /// `None` for the per-event unknown profile.
    pub image_id: Option<ImageId>,
    /// The event file-name component (see [`crate::event_file_component`]).
    pub event_component: String,
}

impl Database {
    /// Open an existing database (the directory must exist).
    pub fn open(root: &Path) -> Result<Database> {
        todo!("{root:?}")
    }
    /// Open, creating the directory (and `epochs/`) if needed.
    pub fn create(root: &Path) -> Result<Database> {
        todo!("{root:?}")
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// All epochs, sorted oldest first.
    pub fn epochs(&self) -> Result<Vec<EpochId>> {
        todo!()
    }
    /// The current epoch: the newest epoch directory that has its `EPOCH` marker. `None` if
    /// there is none yet.
    pub fn current_epoch(&self) -> Result<Option<EpochId>> {
        todo!()
    }
    /// Start a new epoch at `now` (or one second after the current one if the clock is behind):
    /// `mkdir` the epoch directory (atomic on NFS too; retries on EEXIST) and write its marker.
    pub fn new_epoch(&self, now: SystemTime, initiator_host: &str) -> Result<EpochId> {
        todo!("{now:?} {initiator_host}")
    }
    pub fn epoch_dir(&self, epoch: &EpochId) -> PathBuf {
        self.root.join("epochs").join(epoch.as_str())
    }
    /// Host names that have a directory in `epoch`, sorted.
    pub fn hosts(&self, epoch: &EpochId) -> Result<Vec<String>> {
        todo!("{epoch}")
    }
    /// The directory of `host` in `epoch` (validated host name; not created).
    pub fn host_dir(&self, epoch: &EpochId, host: &str) -> Result<HostDir> {
        todo!("{epoch} {host}")
    }
    /// Remove `host`'s directory from `epoch` (retention); removes the epoch directory too if it
    /// is then empty apart from its marker and was not the current epoch.
    pub fn remove_host_epoch(&self, epoch: &EpochId, host: &str) -> Result<()> {
        todo!("{epoch} {host}")
    }
}

/// One host's directory within one epoch.
#[derive(Clone, Debug)]
pub struct HostDir {
    pub path: PathBuf,
    pub host: String,
    pub epoch: EpochId,
}

impl HostDir {
    /// Create the directory (and the epoch directory) if missing.
    pub fn create(&self) -> Result<()> {
        todo!()
    }
    /// Path of the profile for (image, event name).
    pub fn profile_path(&self, image: &ImageId, event_name: &str) -> PathBuf {
        todo!("{image} {event_name}")
    }
    /// Path of the unknown profile for an event.
    pub fn unknown_path(&self, event_name: &str) -> PathBuf {
        todo!("{event_name}")
    }
    pub fn summary_path(&self) -> PathBuf {
        self.path.join("summary.json")
    }
    pub fn kallsyms_path(&self) -> PathBuf {
        self.path.join("kallsyms.snap")
    }
    /// Profile files in this directory (temporary and `*.corrupt` files skipped), sorted by name.
    pub fn profiles(&self) -> Result<Vec<ProfileEntry>> {
        todo!()
    }
}
