//! `/tmp/perf-PID.map`: symbols that JIT compilers publish for their anonymous code.
//!
//! Format (perf's convention): one symbol per line, `START SIZE NAME`, START and SIZE in hex
//! (with or without `0x`), NAME the rest of the line. Garbage lines are skipped. The file is
//! written by the (untrusted) process, and dcpid reads it with its own privileges and publishes
//! its lines in world-readable profiles, so the file must be the process's own: it is opened
//! with `O_NOFOLLOW`/`O_NONBLOCK` (a symlink is refused, a FIFO does not block), and the
//! opened descriptor (fstat, never the path again) must be a regular file with exactly one
//! link, owned by the process's user (its uid when the map is read, not at fork: a process
//! may change it before it writes the map). A root-owned map is accepted only for a root
//! process: a hard link to a 0600 root file (possible where `fs.protected_hardlinks=0`:
//! containers, older hosts) is root-owned and would otherwise leak the file's lines into the
//! profiles; the one-link rule refuses such a link even for a root process. It is read up to a
//! bound in bytes and in entries ([`JitLimits`], settings `perf_map_max_bytes` and
//! `perf_map_max_entries`); a map cut short is counted in status.
//!
//! Names are kept as written, except that bytes that are not UTF-8 are replaced (U+FFFD) and
//! a name is cut at [`MAX_NAME`] bytes on a character boundary. Control characters are kept:
//! the report tools escape them when they print.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use profile_format::JitSymbol;

use super::procfs::open_nofollow;

/// Bytes read from one map file at most, by default.
pub const MAX_JIT_MAP_BYTES: u64 = 16 << 20;
/// Symbols kept from one map file at most, by default.
pub const MAX_JIT_MAP_ENTRIES: usize = 100_000;
/// Longest symbol name kept (longer names are truncated).
pub const MAX_NAME: usize = 1024;

/// How much of one perf map is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JitLimits {
    pub max_bytes: u64,
    pub max_entries: usize,
}

impl Default for JitLimits {
    fn default() -> Self {
        Self { max_bytes: MAX_JIT_MAP_BYTES, max_entries: MAX_JIT_MAP_ENTRIES }
    }
}

/// What one [`refresh`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Refreshed {
    /// The symbols changed (the map was read again).
    pub changed: bool,
    /// The map was larger than the limits: only its first part was kept.
    pub truncated: bool,
}

/// What was read last, to re-read only when the file changed (it usually only grows).
#[derive(Clone, Debug, Default)]
pub(crate) struct JitMapState {
    pub seen: Option<(u64, i64, u64)>,
    pub symbols: Vec<JitSymbol>,
}

/// Parse the text of a perf map; the result is sorted by start address.
pub fn parse_perf_map(text: &[u8]) -> Vec<JitSymbol> {
    parse_perf_map_bounded(text, usize::MAX).0
}

/// [`parse_perf_map`] keeping at most `max_entries` symbols (the first ones in the file);
/// also returns whether there were more.
pub fn parse_perf_map_bounded(text: &[u8], max_entries: usize) -> (Vec<JitSymbol>, bool) {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let Some(sym) = parse_line(line) else { continue };
        if out.len() >= max_entries {
            out.sort_by_key(|s: &JitSymbol| s.start);
            return (out, true);
        }
        out.push(sym);
    }
    out.sort_by_key(|s| s.start);
    (out, false)
}

/// One `START SIZE NAME` line; `None` for garbage.
fn parse_line(line: &[u8]) -> Option<JitSymbol> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut it = line.splitn(3, |&b| b == b' ');
    let (a, s, name) = (it.next()?, it.next()?, it.next()?);
    let h = |v: &[u8]| {
        let v = std::str::from_utf8(v).ok()?;
        u64::from_str_radix(v.strip_prefix("0x").unwrap_or(v), 16).ok()
    };
    let (start, size) = (h(a)?, h(s)?);
    start.checked_add(size)?;
    // Cut the raw bytes first (a name may be huge), then decode: invalid UTF-8 becomes U+FFFD
    // instead of losing the symbol, and a sequence cut at the bound is replaced, never split.
    let name = name.trim_ascii();
    let raw = &name[..name.len().min(MAX_NAME)];
    let decoded = String::from_utf8_lossy(raw);
    let mut end = decoded.len().min(MAX_NAME);
    while !decoded.is_char_boundary(end) {
        end -= 1;
    }
    let name = decoded[..end].trim();
    if name.is_empty() {
        return None;
    }
    Some(JitSymbol { start, size, name: name.to_string() })
}

/// Whether a perf map opened as `md` may be read for a process of uid `owner` (`None`: the
/// uid is unknown, nothing is accepted): see the module's comment.
pub(crate) fn acceptable(md: &std::fs::Metadata, owner: Option<u32>) -> bool {
    md.is_file() && md.nlink() == 1 && Some(md.uid()) == owner
}

/// Re-read `path` if it changed since `state` was filled. `owner` is the process's uid, which
/// the file must belong to ([`acceptable`]); `None` (unknown) accepts nothing.
pub(crate) fn refresh(
    path: &Path,
    owner: Option<u32>,
    limits: JitLimits,
    state: &mut JitMapState,
) -> Refreshed {
    use std::io::Read;
    let none = Refreshed::default();
    let Ok(f) = open_nofollow(path) else { return none };
    let Ok(md) = f.metadata() else { return none };
    if !acceptable(&md, owner) {
        return none;
    }
    let seen = (md.size(), md.mtime() * 1_000_000_000 + md.mtime_nsec(), md.ino());
    if state.seen == Some(seen) {
        return none;
    }
    let mut buf = Vec::new();
    // One byte more than the bound tells whether the file goes on.
    if f.take(limits.max_bytes.saturating_add(1)).read_to_end(&mut buf).is_err() {
        return none;
    }
    let mut truncated = false;
    if buf.len() as u64 > limits.max_bytes {
        truncated = true;
        // Keep whole lines only: the last one may be cut.
        buf.truncate(limits.max_bytes as usize);
        let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        buf.truncate(whole);
    }
    let (symbols, more) = parse_perf_map_bounded(&buf, limits.max_entries);
    state.seen = Some(seen);
    state.symbols = symbols;
    Refreshed { changed: true, truncated: truncated || more }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_skips_garbage() {
        let t = b"7f0000001000 20 LazyCompile:foo bar.js:1\n\
                  garbage line\n\
                  0x7f0000000000 0x10 stub\n\
                  zz 10 x\n\
                  ffffffffffffffff 10 overflow\n\
                  10 \n\xff\xfe 1 2\n";
        let s = parse_perf_map(t);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], JitSymbol { start: 0x7f0000000000, size: 0x10, name: "stub".into() });
        assert_eq!(s[1].name, "LazyCompile:foo bar.js:1");
        assert_eq!(s[1].size, 0x20);
    }

    #[test]
    fn refuses_symlinks_and_rereads_on_growth() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real.map");
        std::fs::write(&real, "1000 10 a\n").expect("write");
        let link = dir.path().join("perf-1.map");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let me = std::fs::metadata(&real).expect("md").uid();
        let mut st = JitMapState::default();
        let l = JitLimits::default();
        assert!(!refresh(&link, Some(me), l, &mut st).changed, "symlink must not be followed");
        assert!(refresh(&real, Some(me), l, &mut st).changed);
        assert_eq!(st.symbols.len(), 1);
        assert!(!refresh(&real, Some(me), l, &mut st).changed, "unchanged file is not re-read");
        std::fs::write(&real, "1000 10 a\n2000 10 b\n").expect("write");
        assert!(refresh(&real, Some(me), l, &mut st).changed);
        assert_eq!(st.symbols.len(), 2);
    }

    #[test]
    fn reads_are_bounded_in_bytes_and_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let map = dir.path().join("perf-1.map");
        // 1000 lines of 17 bytes: "00001000 10 f000\n" ...
        let text: String =
            (0..1000).map(|i| format!("{:08x} 10 f{i:03}\n", 0x1000 + i * 16)).collect();
        std::fs::write(&map, &text).expect("write");
        let me = std::fs::metadata(&map).expect("md").uid();
        let mut st = JitMapState::default();
        let r = refresh(&map, Some(me), JitLimits { max_bytes: 1 << 20, max_entries: 10 }, &mut st);
        assert_eq!(r, Refreshed { changed: true, truncated: true });
        assert_eq!(st.symbols.len(), 10);
        assert_eq!(st.symbols[9].name, "f009", "the first entries of the file are kept");
        // 100 bytes: five whole lines; the sixth, cut, is dropped.
        let mut st = JitMapState::default();
        let r = refresh(&map, Some(me), JitLimits { max_bytes: 100, max_entries: 1000 }, &mut st);
        assert_eq!(r, Refreshed { changed: true, truncated: true });
        assert_eq!(st.symbols.len(), 5, "{:?}", st.symbols);
        // Exactly at the bounds: not truncated.
        let mut st = JitMapState::default();
        let exact = JitLimits { max_bytes: text.len() as u64, max_entries: 1000 };
        assert_eq!(
            refresh(&map, Some(me), exact, &mut st),
            Refreshed { changed: true, truncated: false }
        );
        assert_eq!(st.symbols.len(), 1000);
    }

    #[test]
    fn hostile_names_never_panic_and_are_kept_as_text() {
        // Invalid UTF-8 is replaced, not a reason to drop the symbol; ESC and other control
        // characters are kept (the report tools escape them).
        let s = parse_perf_map(b"1000 10 evil\xff\xfe\x1b[31mred\x07\n2000 10 \x1b]0;title\x07\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "evil\u{fffd}\u{fffd}\u{1b}[31mred\u{7}");
        assert_eq!(s[1].name, "\u{1b}]0;title\u{7}");
        // A multi-byte character across the MAX_NAME bound: cut before it, never inside.
        let mut line = b"3000 10 ".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_NAME - 1));
        line.extend("é€".as_bytes());
        let s = parse_perf_map(&line);
        assert_eq!(s[0].name.len(), MAX_NAME - 1, "{}", s[0].name.len());
        // A name cut in the middle of a sequence by the bound on bytes read.
        let mut line = b"3000 10 ".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_NAME - 2));
        line.extend("€".as_bytes());
        let s = parse_perf_map(&line);
        assert!(s[0].name.len() <= MAX_NAME && s[0].name.starts_with("aaa"), "{}", s[0].name);
        // Lone bytes, NULs and broken mangled names of every length do not panic.
        for n in 0..64usize {
            let mut l = b"4000 10 _ZN".to_vec();
            l.extend((0..n).map(|i| (i * 37 % 256) as u8));
            drop(parse_perf_map(&l));
        }
        assert!(parse_perf_map(b"1000 10 \t \r\n").is_empty(), "blank names are garbage");
    }
}
