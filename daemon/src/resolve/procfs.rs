//! Reading /proc, /sys and /tmp files defensively.
//!
//! Every file is opened with `O_NOFOLLOW` (a symlink planted by an untrusted process is never
//! followed), `O_NONBLOCK` (a FIFO planted in its place cannot block the resolver thread or a flush) and read up
//! to a bound (a huge or endless file cannot exhaust memory).

use object::elf::ELF_NOTE_GNU;
use object::elf::NT_GNU_BUILD_ID;
use object::read::elf::FileHeader;
use object::read::elf::NoteIterator;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Open `path` for reading without following a symlink in its last component.
pub(crate) fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Read at most `limit` bytes of `path` (opened with [`open_nofollow`]).
pub(crate) fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let f = open_nofollow(path)?;
    let mut buf = Vec::new();
    f.take(limit).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The lines of `path` (opened with [`open_nofollow`]) as they are read, up to `limit` bytes,
/// decoded lossily: for files of several MB such as /proc/kallsyms, of which a caller keeps
/// only a part.
pub(crate) fn lines_bounded(
    path: &Path,
    limit: u64,
) -> io::Result<impl Iterator<Item = io::Result<String>>> {
    use std::io::BufRead;
    let f = open_nofollow(path)?;
    Ok(io::BufReader::new(f.take(limit))
        .split(b'\n')
        .map(|l| l.map(|l| String::from_utf8_lossy(&l).into_owned())))
}

/// Whether an I/O error means "the process is gone" (it exited between listing and reading).
pub(crate) fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
        || e.kind() == io::ErrorKind::NotFound
}

/// Whether an I/O error means "not allowed to read" (PID 1's maps here, hardened kernels).
pub(crate) fn is_denied(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

/// The effective uid in `/proc/PID/status` (`Uid:\treal\teffective\tsaved\tfs`).
pub(crate) fn parse_status_euid(status: &[u8]) -> Option<u32> {
    let line = status.split(|&b| b == b'\n').find_map(|l| l.strip_prefix(b"Uid:"))?;
    let text = std::str::from_utf8(line).ok()?;
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Parse `/proc/PID/stat`: (comm, starttime in clock ticks since boot, number of threads).
pub(crate) fn parse_stat(stat: &[u8]) -> Option<(Vec<u8>, u64, u32)> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let comm = stat[open + 1..close].to_vec();
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // Field 3 (state) is the first after ')'; num_threads is field 20, starttime field 22.
    let mut f = rest.split_ascii_whitespace().skip(17);
    let threads = f.next()?.parse().ok()?;
    let start = f.nth(1)?.parse().ok()?;
    Some((comm, start, threads))
}

/// Find the GNU build-id in a buffer of ELF notes (as in /sys/kernel/notes and
/// /sys/module/NAME/notes/.note.gnu.build-id), native endian, 4-byte aligned.
pub(crate) fn gnu_build_id_from_notes(data: &[u8]) -> Option<Vec<u8>> {
    use object::elf::FileHeader64;
    use object::NativeEndian;
    // The note header has the same layout in ELF32 and ELF64.
    let notes = NoteIterator::<FileHeader64<NativeEndian>>::new(NativeEndian, 4, data).ok()?;
    gnu_build_id(notes, NativeEndian)
}

/// The GNU build-id among `notes` (object's note iterator: the one note reader of the daemon,
/// for files, the vDSO and the kernel's notes alike).
pub(crate) fn gnu_build_id<H: FileHeader>(
    mut notes: NoteIterator<'_, H>,
    endian: H::Endian,
) -> Option<Vec<u8>> {
    while let Ok(Some(note)) = notes.next() {
        if note.name() == ELF_NOTE_GNU && note.n_type(endian) == NT_GNU_BUILD_ID {
            return valid_build_id(note.desc());
        }
    }
    None
}

/// A build-id usable as [`profile_format::ImageId::BuildId`] (1..=64 bytes, not all zero).
pub(crate) fn valid_build_id(b: &[u8]) -> Option<Vec<u8>> {
    if b.is_empty() || b.len() > 64 || b.iter().all(|&x| x == 0) {
        None
    } else {
        Some(b.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_effective_uid() {
        let st = b"Name:\tjit\nUmask:\t0022\nUid:\t0\t65534\t65534\t65534\nGid:\t0\t0\t0\t0\n";
        assert_eq!(parse_status_euid(st), Some(65534));
        assert_eq!(parse_status_euid(b"Name:\tx\n"), None);
        assert_eq!(parse_status_euid(b"Uid:\t5\n"), None);
    }

    #[test]
    fn stat_with_parens_in_comm() {
        let s = b"42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 98765 1000 10";
        let (comm, start, threads) = parse_stat(s).expect("parse");
        assert_eq!(comm, b"a) b) (c");
        assert_eq!(start, 98765);
        assert_eq!(threads, 3);
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x) S 1"), None);
    }

    #[test]
    fn notes_parsing() {
        let mut n = Vec::new();
        // An unrelated note first (name "Linux", type 6).
        n.extend_from_slice(&6u32.to_ne_bytes());
        n.extend_from_slice(&4u32.to_ne_bytes());
        n.extend_from_slice(&6u32.to_ne_bytes());
        n.extend_from_slice(b"Linux\0\0\0");
        n.extend_from_slice(&[1, 2, 3, 4]);
        n.extend_from_slice(&4u32.to_ne_bytes());
        n.extend_from_slice(&5u32.to_ne_bytes());
        n.extend_from_slice(&3u32.to_ne_bytes());
        n.extend_from_slice(b"GNU\0");
        n.extend_from_slice(&[9, 8, 7, 6, 5, 0, 0, 0]);
        assert_eq!(gnu_build_id_from_notes(&n), Some(vec![9, 8, 7, 6, 5]));
        // Truncated input never panics.
        for cut in 0..n.len() {
            drop(gnu_build_id_from_notes(&n[..cut]));
        }
        assert_eq!(gnu_build_id_from_notes(&n[..20]), None);
    }
}
