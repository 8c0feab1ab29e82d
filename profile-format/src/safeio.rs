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

use crate::codec;
use crate::codec::FIXED_HEADER_LEN;
use crate::error::{Error, Result};

/// Suffix given to files moved aside because they could not be read.
pub const CORRUPT_SUFFIX: &str = ".corrupt";
/// Largest profile or kernel symbol snapshot a reader accepts (the largest real ones are a few
/// MB). A header announcing more is `Corrupt{field: "length"}`.
pub const MAX_CONTAINER_FILE: u64 = 256 << 20;
/// Largest `summary.json` a reader accepts (an index entry is ~200 bytes: 300 000 profiles).
pub const MAX_SUMMARY_FILE: u64 = 64 << 20;
/// Largest small text file (`kallsyms.ref`, `EPOCH`, lease).
pub const MAX_SMALL_FILE: u64 = 64 << 10;

pub(crate) fn file_kind(ft: std::fs::FileType) -> &'static str {
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

/// Whether `path` is a real directory, checked with `lstat` (a symbolic link, even to a
/// directory, is not one): `Ok(false)` if nothing is there, `NotDirectory` if something else
/// is. Every directory of the database a writer creates or enters goes through here or
/// [`ensure_dir`] (FORMAT.md §6.1): a link planted by another writer of a shared database
/// would otherwise send its files, and its removals, wherever it points.
pub fn check_dir(path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => Ok(true),
        Ok(m) => Err(Error::NotDirectory { path: path.into(), kind: file_kind(m.file_type()) }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Create directory `path` if it is missing (its parent must exist: check it first), and
/// check that what is there is a real directory ([`check_dir`]). Returns whether it was
/// created. `mkdir` never follows a link, so a link planted between the check and the
/// `mkdir` makes it fail with EEXIST, and the check after that refuses it.
pub fn ensure_dir(path: &Path) -> Result<bool> {
    if check_dir(path)? {
        return Ok(false);
    }
    match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => check_dir(path).map(|_| false),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Rename a database entry that cannot be used (a corrupt file, a link or FIFO where a file
/// or directory belongs) to `NAME.corrupt`, or `NAME.<unix ms>.corrupt` if that exists
/// already; readers skip both (FORMAT.md §1). The entry itself is renamed, never what a link
/// points to. Returns the new path.
pub fn set_aside(path: &Path) -> Result<std::path::PathBuf> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(CORRUPT_SUFFIX);
    let mut aside = std::path::PathBuf::from(aside);
    if aside.symlink_metadata().is_ok() {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut a = path.as_os_str().to_owned();
        a.push(format!(".{ms}{CORRUPT_SUFFIX}"));
        aside = a.into();
    }
    std::fs::rename(path, &aside).map_err(|e| Error::io(path, e))?;
    Ok(aside)
}

/// Whether `path` is a container file (FORMAT.md §4) of a version newer than `supported`:
/// a regular file starting with `magic`, a version above `supported`, and a `length` field
/// (at the offset every version keeps, §11) equal to the file's size. A writer leaves such a
/// file alone instead of setting it aside as corrupt (§3.1); a short or truncated file, or
/// garbage after the magic, is not one.
pub fn is_newer_container(path: &Path, magic: &[u8; 8], supported: u16) -> bool {
    let Ok((f, size)) = open_regular(path) else { return false };
    let mut head = Vec::with_capacity(FIXED_HEADER_LEN);
    if f.take(FIXED_HEADER_LEN as u64).read_to_end(&mut head).is_err()
        || head.len() < FIXED_HEADER_LEN
        || &head[..8] != magic
    {
        return false;
    }
    let version = u16::from_le_bytes([head[8], head[9]]);
    let mut len = [0u8; 8];
    len.copy_from_slice(&head[12..20]);
    let length = u64::from_le_bytes(len);
    version > supported && length == size && length > FIXED_HEADER_LEN as u64
}

/// The container version in the fixed header of the file at `path` (§4), if it opens safely
/// (§6.1) and starts with `magic`; nothing else is checked (the caller reads the file whole
/// when it needs it).
pub fn container_version(path: &Path, magic: &[u8; 8]) -> Option<u16> {
    let (f, _) = open_regular(path).ok()?;
    let mut head = Vec::with_capacity(FIXED_HEADER_LEN);
    f.take(FIXED_HEADER_LEN as u64).read_to_end(&mut head).ok()?;
    (head.len() >= FIXED_HEADER_LEN && &head[..8] == magic)
        .then(|| u16::from_le_bytes([head[8], head[9]]))
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
        codec::check_prefix(&head, path, magic, what, supported)?;
        return Err(corrupt(format!(
            "header announces {announced} bytes, more than the {MAX_CONTAINER_FILE} a file may have"
        )));
    }
    if size > MAX_CONTAINER_FILE {
        // A file of its kind (magic and version) larger than any valid one, e.g. a sparse file
        // of many GiB behind a real header: refused as oversized, not taken for a damaged
        // file that a reader of an optional file (index, snapshot) would skip.
        codec::check_prefix(&head, path, magic, what, supported)?;
        return Err(Error::TooLarge { path: path.into(), limit: MAX_CONTAINER_FILE });
    }
    if size != announced {
        codec::check_prefix(&head, path, magic, what, supported)?;
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

    #[test]
    fn directories_are_checked_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        assert!(ensure_dir(&real).unwrap(), "created");
        assert!(!ensure_dir(&real).unwrap(), "there already");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = ensure_dir(&link).unwrap_err();
        assert!(matches!(e, Error::NotDirectory { kind: "a symbolic link", .. }), "{e}");
        assert!(e.to_string().contains("link") && e.to_string().contains("not a directory"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(check_dir(&file), Err(Error::NotDirectory { .. })));
        assert!(!check_dir(&dir.path().join("none")).unwrap());
        let aside = set_aside(&link).unwrap();
        assert!(aside.to_string_lossy().ends_with("link.corrupt"));
        assert!(real.is_dir(), "the link is moved, not its target");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let aside2 = set_aside(&link).unwrap();
        assert_ne!(aside, aside2);
        assert!(aside2.to_string_lossy().ends_with(".corrupt"));
    }
}
