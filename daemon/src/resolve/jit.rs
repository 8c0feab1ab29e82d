//! `/tmp/perf-PID.map`: symbols that JIT compilers publish for their anonymous code.
//!
//! Format (perf's convention): one symbol per line, `START SIZE NAME`, START and SIZE in hex
//! (with or without `0x`), NAME the rest of the line. Garbage lines are skipped. The file is
//! written by the (untrusted) process: it is opened with `O_NOFOLLOW`/`O_NONBLOCK`, must be a
//! regular file owned by root or by the process's user, and is read up to a bound.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use profile_format::JitSymbol;

use super::procfs::open_nofollow;

/// Bytes read from one map file at most.
pub const MAX_JIT_MAP_BYTES: u64 = 16 << 20;
/// Longest symbol name kept (longer names are truncated).
const MAX_NAME: usize = 1024;

/// What was read last, to re-read only when the file changed (it usually only grows).
#[derive(Clone, Debug, Default)]
pub(crate) struct JitMapState {
    pub seen: Option<(u64, i64, u64)>,
    pub symbols: Vec<JitSymbol>,
}

/// Parse the text of a perf map; the result is sorted by start address.
pub fn parse_perf_map(text: &[u8]) -> Vec<JitSymbol> {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else { continue };
        let line = line.trim_end_matches('\r');
        let mut it = line.splitn(3, ' ');
        let (Some(a), Some(s), Some(name)) = (it.next(), it.next(), it.next()) else { continue };
        let h = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok();
        let (Some(start), Some(size)) = (h(a), h(s)) else { continue };
        let name = name.trim();
        if name.is_empty() || start.checked_add(size).is_none() {
            continue;
        }
        let mut end = name.len().min(MAX_NAME);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        out.push(JitSymbol { start, size, name: name[..end].to_string() });
    }
    out.sort_by_key(|s| s.start);
    out
}

/// Re-read `path` if it changed since `state` was filled. `owner` is the uid the file must
/// belong to (besides root); `None` accepts only root-owned files. Returns whether the
/// symbols changed.
pub(crate) fn refresh(path: &Path, owner: Option<u32>, state: &mut JitMapState) -> bool {
    use std::io::Read;
    let Ok(f) = open_nofollow(path) else { return false };
    let Ok(md) = f.metadata() else { return false };
    if !md.is_file() || !(md.uid() == 0 || Some(md.uid()) == owner) {
        return false;
    }
    let seen = (md.size(), md.mtime() * 1_000_000_000 + md.mtime_nsec(), md.ino());
    if state.seen == Some(seen) {
        return false;
    }
    let mut buf = Vec::new();
    if f.take(MAX_JIT_MAP_BYTES).read_to_end(&mut buf).is_err() {
        return false;
    }
    state.seen = Some(seen);
    state.symbols = parse_perf_map(&buf);
    true
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
        assert!(!refresh(&link, Some(me), &mut st), "symlink must not be followed");
        assert!(refresh(&real, Some(me), &mut st));
        assert_eq!(st.symbols.len(), 1);
        assert!(!refresh(&real, Some(me), &mut st), "unchanged file is not re-read");
        std::fs::write(&real, "1000 10 a\n2000 10 b\n").expect("write");
        assert!(refresh(&real, Some(me), &mut st));
        assert_eq!(st.symbols.len(), 2);
    }
}
