use std::path::Path;

use crate::error::Result;

/// Write `bytes` to `path` atomically: a uniquely named temporary file in the same directory
/// (`.tmp-<host/pid/random>`), `fsync`, `rename` over `path`, then `fsync` the directory. Readers
/// see the old file or the new one, never a mix, even after a kill -9 or a crash. Works on NFS
/// (no locks, no mmap writes).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    todo!("{path:?} {bytes:?}")
}
