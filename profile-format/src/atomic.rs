use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Prefix of every temporary file; listings skip such names.
pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// This machine's host name reduced to safe characters, for temporary file names (two hosts
/// sharing a directory over NFS must never pick the same temporary name).
fn local_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        // A kernel file, not a database file (clippy.toml).
        #[allow(clippy::disallowed_methods)]
        let raw = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let tag: String = raw
            .trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
            .take(64)
            .collect();
        if tag.is_empty() {
            "host".to_owned()
        } else {
            tag
        }
    })
}

fn tmp_path(dir: &Path) -> PathBuf {
    let name = format!(
        "{TMP_PREFIX}{}-{}-{:016x}",
        local_tag(),
        std::process::id(),
        rand::random::<u64>()
    );
    dir.join(name)
}

/// `fsync` a directory so that a rename or a new entry in it survives a crash. Some file
/// systems refuse `fsync` on directories (EINVAL); their renames are durable without it.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    // O_DIRECTORY: something else planted under the name is refused, never opened (a FIFO
    // would block the open).
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| Error::io(dir, e))?;
    match f.sync_all() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        r => r.map_err(|e| Error::io(dir, e)),
    }
}

/// Write `bytes` to `path` atomically: a uniquely named temporary file in the same directory
/// (`.tmp-<host/pid/random>`), `fsync`, `rename` over `path`, then `fsync` the directory. Readers
/// see the old file or the new one, never a mix, even after a kill -9 or a crash. Works on NFS
/// (no locks, no mmap writes).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = dir_of(path);
    if path.file_name().is_none() {
        return Err(Error::Invalid {
            what: "file path",
            value: path.display().to_string(),
            detail: "has no file name".into(),
        });
    }
    let tmp = tmp_path(dir);
    let result = write_synced(&tmp, path, bytes)
        .and_then(|()| fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if result.is_err() {
        drop(fs::remove_file(&tmp));
    }
    result?;
    sync_dir(dir)
}

/// The directory `path` is in (`.` for a bare name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Create `tmp` (it must not exist) with `bytes`, fsynced; errors name `path`, the file the
/// caller is writing.
fn write_synced(tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        // O_EXCL alone already refuses a link at the last component; O_NOFOLLOW says so
        // explicitly, as every file this project creates does.
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(tmp)
        .map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

/// Create `path` with `bytes` only if no file of that name exists: `Ok(false)` if one does.
/// The complete content is written to a temporary file first and hard-linked to `path`
/// (`link` fails with EEXIST if the name exists, atomically, on NFS too), so a reader never
/// sees a partial file. The caller syncs the directory.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> Result<bool> {
    let tmp = tmp_path(dir_of(path));
    let result = write_synced(&tmp, path, bytes).and_then(|()| match fs::hard_link(&tmp, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(path, e)),
    });
    drop(fs::remove_file(&tmp));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f")]);
    }

    #[test]
    fn error_names_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing-dir").join("f");
        let e = write_atomic(&p, b"x").unwrap_err().to_string();
        assert!(e.contains("missing-dir/f"), "{e}");
    }
}
