//! Reading database files that anyone with write access to the (shared) directory may have
//! replaced by something hostile: a FIFO (a plain `open` blocks until a writer comes), a
//! symbolic link to `/dev/zero` (a plain `read` never ends), a sparse file of many GiB (a plain
//! `read` allocates all of it). Every reader of the database goes through here (FORMAT.md §6.1):
//! open with `O_NOFOLLOW | O_NONBLOCK`, refuse anything but a regular file (`fstat`), and read
//! no more than the file may hold: the length its container header announces, or a fixed bound
//! for text files.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::codec::FIXED_HEADER_LEN;
use crate::error::{Error, Result};

/// Largest profile or kernel symbol snapshot a reader accepts (the largest real ones are a few
/// MB). A header announcing more is `Corrupt{field: "length"}`.
pub const MAX_CONTAINER_FILE: u64 = 256 << 20;
/// Largest `summary.json` a reader accepts (an index entry is ~200 bytes: 300 000 profiles).
pub const MAX_SUMMARY_FILE: u64 = 64 << 20;
/// Largest small text file (`kallsyms.ref`, `EPOCH`, lease).
pub const MAX_SMALL_FILE: u64 = 64 << 10;

fn file_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Open `path` for reading without following a final symbolic link and without blocking, and
/// check that it is a regular file. Returns the file and its size.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            match e.raw_os_error() {
                // O_NOFOLLOW on a symbolic link.
                Some(libc::ELOOP) => {
                    Error::NotRegularFile { path: path.into(), kind: "a symbolic link" }
                }
                // A socket, or a device without a driver: not retried as if the file system
                // failed.
                Some(libc::ENXIO | libc::ENODEV) => match std::fs::symlink_metadata(path) {
                    Ok(m) if !m.is_file() => {
                        Error::NotRegularFile { path: path.into(), kind: file_kind(m.file_type()) }
                    }
                    _ => Error::io(path, e),
                },
                _ => Error::io(path, e),
            }
        })?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::NotRegularFile { path: path.into(), kind: file_kind(meta.file_type()) });
    }
    Ok((f, meta.len()))
}

/// Read at most `limit` bytes into `out`; an error naming the file if it holds more.
fn read_up_to(f: &mut File, path: &Path, limit: u64, out: &mut Vec<u8>) -> Result<()> {
    let n = f.take(limit.saturating_add(1)).read_to_end(out).map_err(|e| Error::io(path, e))?;
    if n as u64 > limit {
        return Err(Error::TooLarge { path: path.into(), limit });
    }
    Ok(())
}

/// A whole (text) file of at most `limit` bytes.
pub fn read_small(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let (mut f, size) = open_regular(path)?;
    if size > limit {
        return Err(Error::TooLarge { path: path.into(), limit });
    }
    let mut out = Vec::with_capacity(size as usize);
    read_up_to(&mut f, path, limit, &mut out)?;
    Ok(out)
}

/// A whole (text) file of at most `limit` bytes, as UTF-8.
pub fn read_small_string(path: &Path, limit: u64) -> Result<String> {
    String::from_utf8(read_small(path, limit)?).map_err(|e| Error::Corrupt {
        path: path.into(),
        field: "text",
        detail: format!("not UTF-8: {e}"),
    })
}

/// A binary container file (FORMAT.md §4): reads the fixed header first and then exactly the
/// length it announces, which must equal the file's size and be at most
/// [`MAX_CONTAINER_FILE`]. What comes back still goes through the container checks (magic,
/// version, checksum), which name the right error for short or foreign files.
pub(crate) fn read_container(
    path: &Path,
    magic: &[u8; 8],
    what: &'static str,
    supported: u16,
) -> Result<Vec<u8>> {
    let (mut f, size) = open_regular(path)?;
    let mut head = Vec::with_capacity(FIXED_HEADER_LEN);
    (&mut f)
        .take(FIXED_HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    if head.len() < FIXED_HEADER_LEN {
        // Too short to announce a length: the container checks say what it is.
        return Ok(head);
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&head[12..20]);
    let announced = u64::from_le_bytes(len_bytes);
    let corrupt = |detail: String| Error::Corrupt { path: path.into(), field: "length", detail };
    if announced > MAX_CONTAINER_FILE {
        // Magic and version first, so that a foreign file is reported as such.
        crate::codec::check_prefix(&head, path, magic, what, supported)?;
        return Err(corrupt(format!(
            "header announces {announced} bytes, more than the {MAX_CONTAINER_FILE} a file may have"
        )));
    }
    if size > MAX_CONTAINER_FILE {
        // A file of its kind (magic and version) larger than any valid one, e.g. a sparse file
        // of many GiB behind a real header: refused as oversized, not taken for a damaged
        // file that a reader of an optional file (index, snapshot) would skip.
        crate::codec::check_prefix(&head, path, magic, what, supported)?;
        return Err(Error::TooLarge { path: path.into(), limit: MAX_CONTAINER_FILE });
    }
    if size != announced {
        crate::codec::check_prefix(&head, path, magic, what, supported)?;
        if size > announced {
            return Err(corrupt(format!(
                "{} bytes after the stored length {announced}",
                size - announced
            )));
        }
        return Err(Error::Truncated { path: path.into(), expected: announced, actual: size });
    }
    let mut out = head;
    out.reserve(announced as usize - FIXED_HEADER_LEN.min(announced as usize));
    read_up_to(&mut f, path, announced - FIXED_HEADER_LEN as u64, &mut out).map_err(
        |e| match e {
            Error::TooLarge { .. } => {
                corrupt(format!("file grew past its stored length {announced}"))
            }
            e => e,
        },
    )?;
    if (out.len() as u64) < announced {
        return Err(Error::Truncated {
            path: path.into(),
            expected: announced,
            actual: out.len() as u64,
        });
    }
    Ok(out)
}

impl crate::HostDir {
    /// Open, without reading it, the kernel symbol snapshot that
    /// [`HostDir::read_kallsyms`](crate::HostDir::read_kallsyms) would read: an error if it
    /// (or `kallsyms.ref`) is a FIFO, a device, a symbolic link or larger than any snapshot
    /// ([`Error::is_hostile_file`]); `Ok` otherwise, also when it is missing or damaged (that
    /// is for the reader to report). A few system calls: report tools call it before they
    /// symbolize kernel samples, so that a planted file stops the report with an error naming
    /// it instead of a warning in its middle.
    pub fn check_kallsyms_file(&self) -> Result<()> {
        let hostile = |r: Result<()>| match r {
            Err(e) if e.is_hostile_file() => Err(e),
            _ => Ok(()),
        };
        let path = match self.kallsyms_ref() {
            Ok(Some(id)) => {
                let db = match crate::Database::open(&self.db_root()) {
                    Ok(db) => db,
                    Err(_) => return Ok(()),
                };
                let packed = db.kallsyms_store_path(&id);
                if packed.symlink_metadata().is_ok() {
                    packed
                } else {
                    db.kallsyms_store_path_zlib(&id)
                }
            }
            Ok(None) => self.kallsyms_path(),
            Err(e) => return hostile(Err(e)),
        };
        hostile(open_regular(&path).and_then(|(_, size)| {
            if size > MAX_CONTAINER_FILE {
                return Err(Error::TooLarge { path: path.clone(), limit: MAX_CONTAINER_FILE });
            }
            Ok(())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_fifo_symlink_and_directory_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = read_small(&fifo, 10).unwrap_err();
        assert!(matches!(e, Error::NotRegularFile { kind: "a FIFO", .. }), "{e}");
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_container(&link, b"DCPIPROF", "profile", 1).unwrap_err();
        assert!(e.to_string().contains("symbolic link") && e.to_string().contains("zero"), "{e}");
        let e = read_small(dir.path(), 10).unwrap_err();
        assert!(matches!(e, Error::NotRegularFile { kind: "a directory", .. }), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 11]).unwrap();
        assert!(matches!(read_small(&big, 10), Err(Error::TooLarge { .. })));
        assert_eq!(read_small(&big, 11).unwrap().len(), 11);
    }
}
