use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error names the file it concerns, so that a user can find and inspect it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: truncated: file has {actual} bytes, expected {expected}")]
    Truncated { path: PathBuf, expected: u64, actual: u64 },
    #[error("{path}: bad magic: not a dcpi {what} file")]
    BadMagic { path: PathBuf, what: &'static str },
    #[error("{path}: unknown format version {version} (this build reads up to {supported})")]
    UnknownVersion { path: PathBuf, version: u16, supported: u16 },
    #[error("{path}: checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { path: PathBuf, stored: u32, computed: u32 },
    /// The checksum was right but a field does not make sense (written by a buggy writer).
    #[error("{path}: corrupt field `{field}`: {detail}")]
    Corrupt { path: PathBuf, field: &'static str, detail: String },
    /// A database file that is a FIFO, a device, a directory or a symbolic link: never opened
    /// further (it could block a reader or feed it without end).
    #[error("{path}: is {kind}, not a regular file (refused: a database file must be one)")]
    NotRegularFile { path: PathBuf, kind: &'static str },
    /// A database directory that is a symbolic link (or a file, a FIFO, ...): never entered,
    /// so that a link planted by another writer of a shared database cannot send writes (or
    /// removals) anywhere else (FORMAT.md §6.1).
    #[error("{path}: is {kind}, not a directory (refused: a database directory must be one)")]
    NotDirectory { path: PathBuf, kind: &'static str },
    /// A file larger than any valid one of its kind; not read.
    #[error("{path}: larger than the {limit} bytes such a file may have (refused)")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("cannot merge profiles: {0}")]
    MergeMismatch(String),
    #[error("invalid {what} {value:?}: {detail}")]
    Invalid { what: &'static str, value: String, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A FIFO, device, socket or symbolic link where a database file belongs, or a file larger
    /// than any valid one of its kind: planted, not a stale or damaged file (those could make
    /// a reader block or read without end, were it not for `safeio`). Readers that skip or
    /// fall back on a damaged optional file (an index, a summary, a symbol snapshot) still
    /// refuse these, with an error naming the file (issue 34). A directory is not one of them:
    /// it can neither block nor feed a reader, and an optional file that is one is skipped as
    /// a damaged one is.
    pub fn is_hostile_file(&self) -> bool {
        match self {
            Self::NotRegularFile { kind, .. } => *kind != "a directory",
            Self::TooLarge { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}
