//! Parsing `/proc/PID/maps` lines.
//!
//! Format: `START-END PERMS OFFSET MAJ:MIN INODE [PATH]`, hexadecimal addresses and offset,
//! decimal inode. The kernel escapes newlines in paths (`\012`), so one line is one mapping;
//! the path is everything after the inode, leading blanks removed, and may contain spaces.
//! A ` (deleted)` suffix marks a file removed (or replaced) since it was mapped.

/// One parsed line.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub perms: [u8; 4],
    pub offset: u64,
    pub dev: (u32, u32),
    pub inode: u64,
    pub path: &'a [u8],
}

impl MapsLine<'_> {
    pub fn executable(&self) -> bool {
        self.perms[2] == b'x'
    }
    /// The path without the ` (deleted)` suffix.
    pub fn path_clean(&self) -> &[u8] {
        self.path.strip_suffix(b" (deleted)").unwrap_or(self.path)
    }
}

fn field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let s = rest.iter().position(|&b| b != b' ')?;
    let r = &rest[s..];
    let e = r.iter().position(|&b| b == b' ').unwrap_or(r.len());
    *rest = &r[e..];
    Some(&r[..e])
}

fn hex(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}

/// Parse one line (without its newline); `None` for anything malformed.
pub fn parse_maps_line(line: &[u8]) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let range = field(&mut rest)?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    if end <= start {
        return None;
    }
    let p = field(&mut rest)?;
    let perms: [u8; 4] = p.try_into().ok()?;
    let offset = hex(field(&mut rest)?)?;
    let dev = field(&mut rest)?;
    let colon = dev.iter().position(|&b| b == b':')?;
    let major = u32::try_from(hex(&dev[..colon])?).ok()?;
    let minor = u32::try_from(hex(&dev[colon + 1..])?).ok()?;
    let inode = std::str::from_utf8(field(&mut rest)?).ok()?.parse().ok()?;
    let s = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    Some(MapsLine { start, end, perms, offset, dev: (major, minor), inode, path: &rest[s..] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_typical_lines() {
        let l = parse_maps_line(
            b"7f0e1c000000-7f0e1c021000 r-xp 00002000 fd:01 1234567   /usr/lib/my lib.so (deleted)",
        )
        .expect("parse");
        assert_eq!(l.start, 0x7f0e1c000000);
        assert_eq!(l.end, 0x7f0e1c021000);
        assert!(l.executable());
        assert_eq!(l.offset, 0x2000);
        assert_eq!(l.dev, (0xfd, 1));
        assert_eq!(l.inode, 1234567);
        assert_eq!(l.path_clean(), b"/usr/lib/my lib.so");
        let v = parse_maps_line(b"7ffd1000-7ffd3000 r-xp 00000000 00:00 0                  [vdso]")
            .expect("vdso");
        assert_eq!(v.path, b"[vdso]");
        let anon = parse_maps_line(b"1000-2000 rwxp 00000000 00:00 0").expect("anon");
        assert_eq!(anon.path, b"");
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            &b""[..],
            b"zzzz",
            b"2000-1000 r-xp 0 00:00 0",
            b"1000-2000 r-x 0 00:00 0",
            b"1000-2000 r-xp 0 0000 0",
            b"1000-2000 r-xp 0 00:00 notanumber",
            b"10000000000000000-20000000000000000 r-xp 0 00:00 0",
        ] {
            assert_eq!(parse_maps_line(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
