use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Longest build-id accepted (GNU build-ids are 20 bytes with SHA-1, 16 with MD5; a few linkers
/// emit up to 32).
pub const MAX_BUILD_ID_LEN: usize = 64;

/// Tags of an image id's two forms (FORMAT.md), shared by every file that names an image.
pub(crate) const ID_TAG_BUILD_ID: u8 = 0;
pub(crate) const ID_TAG_FALLBACK: u8 = 1;

/// What kind of image a profile describes; decides how offsets are interpreted (FORMAT.md).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum ImageKind {
    /// A file mapped by a process. Offsets are file offsets.
    Elf = 0,
    /// The kernel. Offsets are relative to the `_text` symbol of the running kernel.
    Kernel = 1,
    /// A kernel module. Offsets are relative to the module's load address (kallsyms snapshot).
    KernelModule = 2,
    /// The vDSO. Offsets are relative to its start (it is mapped with pgoff 0).
    Vdso = 3,
    /// Anonymous executable memory of one process (JIT). Offsets are absolute addresses.
    Anon = 4,
    /// Samples that could not be attributed. Offsets are [`UnknownReason`](crate::UnknownReason) codes.
    Unknown = 5,
}

impl ImageKind {
    pub const ALL: [Self; 6] =
        [Self::Elf, Self::Kernel, Self::KernelModule, Self::Vdso, Self::Anon, Self::Unknown];
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == code)
    }
}

/// An image id borrowed from an index file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageIdRef<'a> {
    BuildId(&'a [u8]),
    Fallback(&'a [u8; 16]),
}

impl ImageIdRef<'_> {
    pub fn to_owned_id(&self) -> ImageId {
        match self {
            ImageIdRef::BuildId(b) => ImageId::BuildId(b.to_vec()),
            ImageIdRef::Fallback(f) => ImageId::Fallback(**f),
        }
    }
    /// Tag byte and id bytes, as stored.
    pub fn tag_and_bytes(&self) -> (u8, &[u8]) {
        match self {
            ImageIdRef::BuildId(b) => (ID_TAG_BUILD_ID, b),
            ImageIdRef::Fallback(f) => (ID_TAG_FALLBACK, &f[..]),
        }
    }
}

/// Identity of an image (an ELF file, the kernel, a module, the vDSO, a JIT region).
///
/// Ordering and hashing are by kind then bytes; the textual form (`Display`/`parse`) is what
/// appears in file names and in `dcpiprof --image`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum ImageId {
    /// A GNU build-id (`NT_GNU_BUILD_ID`), 1..=64 bytes. Text form: `b` + lowercase hex.
    /// Build with [`ImageId::from_build_id`] to have the length checked.
    BuildId(Vec<u8>),
    /// 16 bytes of SHA-256 over a canonical encoding of what identifies an image without a
    /// build-id (see [`ImageId::fallback`] and [`ImageId::special`]). Text form: `f` + hex.
    Fallback([u8; 16]),
}

/// SHA-256 over length-prefixed fields, so that no two distinct inputs share an encoding.
fn digest16(domain: &str, fields: &[&[u8]]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update((domain.len() as u64).to_le_bytes());
    h.update(domain.as_bytes());
    for f in fields {
        h.update((f.len() as u64).to_le_bytes());
        h.update(f);
    }
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

impl ImageId {
    /// A build-id identity; `Invalid` if `bytes` is empty or longer than 64 bytes.
    pub fn from_build_id(bytes: &[u8]) -> Result<Self> {
        if bytes.is_empty() || bytes.len() > MAX_BUILD_ID_LEN {
            return Err(Error::Invalid {
                what: "build-id",
                value: hex::encode(&bytes[..bytes.len().min(80)]),
                detail: format!("{} bytes; a build-id has 1..=64", bytes.len()),
            });
        }
        Ok(Self::BuildId(bytes.to_vec()))
    }

    /// Identity of a file without a build-id: path, size, mtime (ns since the epoch) and inode.
    pub fn fallback(path: &[u8], size: u64, mtime_ns: i64, inode: u64) -> Self {
        Self::Fallback(digest16(
            "dcpi-file",
            &[path, &size.to_le_bytes(), &mtime_ns.to_le_bytes(), &inode.to_le_bytes()],
        ))
    }

    /// Identity of a pseudo-image such as `[vdso]`, `[anon]` or `[unknown]`; `discriminator`
    /// separates instances (e.g. kernel release for the vDSO, pid and start time for `[anon]`).
    pub fn special(name: &str, discriminator: &[u8]) -> Self {
        Self::Fallback(digest16("dcpi-special", &[name.as_bytes(), discriminator]))
    }

    /// Whether this value can be written: a build-id must have 1..=64 bytes.
    pub fn is_valid(&self) -> bool {
        match self {
            Self::BuildId(b) => !b.is_empty() && b.len() <= MAX_BUILD_ID_LEN,
            Self::Fallback(_) => true,
        }
    }

    /// The text form; also the file-name stem of the image's profiles. Always matches
    /// `[bf][0-9a-f]{1,128}`, so it can never escape a directory.
    ///
    /// A `BuildId` of invalid length (only constructible by bypassing
    /// [`ImageId::from_build_id`]) is shown as a fallback id hashed from its bytes, so that even
    /// then the text stays a bounded, safe file name; such an id is refused when written.
    pub fn to_text(&self) -> String {
        match self {
            Self::BuildId(b) if self.is_valid() => format!("b{}", hex::encode(b)),
            Self::BuildId(b) => format!("f{}", hex::encode(digest16("dcpi-bad-build-id", &[b]))),
            Self::Fallback(f) => format!("f{}", hex::encode(f)),
        }
    }

    /// Parse the text form produced by [`ImageId::to_text`].
    pub fn parse(s: &str) -> Result<Self> {
        let invalid = |detail: &str| Error::Invalid {
            what: "image id",
            value: s.chars().take(200).collect(),
            detail: detail.into(),
        };
        let hexpart = s.get(1..).ok_or_else(|| invalid("empty"))?;
        if !hexpart.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
            return Err(invalid("expected `b` or `f` followed by lowercase hex digits"));
        }
        if hexpart.len() % 2 != 0 {
            return Err(invalid("odd number of hex digits"));
        }
        let bytes = hex::decode(hexpart).map_err(|e| invalid(&e.to_string()))?;
        match s.as_bytes()[0] {
            b'b' => {
                if bytes.is_empty() || bytes.len() > MAX_BUILD_ID_LEN {
                    return Err(invalid("a build-id has 1..=64 bytes"));
                }
                Ok(Self::BuildId(bytes))
            }
            b'f' => {
                let arr: [u8; 16] =
                    bytes.try_into().map_err(|_| invalid("a fallback id has 16 bytes"))?;
                Ok(Self::Fallback(arr))
            }
            _ => Err(invalid("expected `b` (build-id) or `f` (fallback) prefix")),
        }
    }
}

impl std::fmt::Display for ImageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

const MAX_EVENT_COMPONENT: usize = 64;

/// Map an event name (`cycles`, `raw:0x1a2`, `cpu-clock`) to a file-name component that is
/// unique per name and safe: `[a-z0-9_-]`, at most 64 bytes.
///
/// Names made only of `[a-z0-9-]` (at most 64 bytes, not empty) are used as they are. Any other
/// name becomes a readable sanitized prefix, `_`, and 16 hex digits of SHA-256 of the name; since
/// plain names never contain `_`, the two forms cannot collide.
pub fn event_file_component(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= MAX_EVENT_COMPONENT
        && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if plain {
        return name.to_owned();
    }
    let hash = Sha256::digest(name.as_bytes());
    let mut out: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(MAX_EVENT_COMPONENT - 17)
        .collect();
    out.push('_');
    out.push_str(&hex::encode(&hash[..8]));
    out
}

/// Host directory names are host names; reject anything that is not a safe single path
/// component (`[A-Za-z0-9._-]`, 1..=64 bytes, not starting with `.`).
pub fn validate_host_name(host: &str) -> Result<()> {
    let invalid = |detail: &str| Error::Invalid {
        what: "host name",
        value: host.chars().take(200).collect(),
        detail: detail.into(),
    };
    if host.is_empty() || host.len() > 64 {
        return Err(invalid("must have 1..=64 bytes"));
    }
    if host.starts_with('.') {
        return Err(invalid("must not start with `.`"));
    }
    if !host.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'_' || c == b'-') {
        return Err(invalid("only letters, digits, `.`, `_` and `-` are allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let ids = [
            ImageId::from_build_id(&[0xde, 0xad]).unwrap(),
            ImageId::from_build_id(&[7u8; 64]).unwrap(),
            ImageId::fallback(b"/tmp/../x\n", 10, -5, 3),
            ImageId::special("[vdso]", b"6.18"),
        ];
        for id in ids {
            let t = id.to_text();
            assert!(t.len() <= 129);
            assert_eq!(ImageId::parse(&t).unwrap(), id, "{t}");
        }
    }

    #[test]
    fn rejects_bad_ids() {
        assert!(ImageId::from_build_id(&[1u8; 65]).is_err());
        assert!(ImageId::from_build_id(&[]).is_err());
        for bad in ["", "b", "x00", "bAB", "b0", "f00", "b/..", &format!("b{}", "00".repeat(65))] {
            assert!(ImageId::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long = ImageId::BuildId(vec![9u8; 100]);
        assert!(!long.is_valid());
        let t = long.to_text();
        assert!(t.starts_with('f') && t.len() == 33, "{t}");
    }

    #[test]
    fn fallback_distinguishes_fields() {
        let a = ImageId::fallback(b"/a", 1, 2, 3);
        assert_ne!(a, ImageId::fallback(b"/a", 1, 2, 4));
        assert_ne!(a, ImageId::fallback(b"/a", 1, 3, 3));
        assert_ne!(a, ImageId::fallback(b"/b", 1, 2, 3));
        assert_ne!(ImageId::special("[vdso]", b""), ImageId::special("[anon]", b""));
    }

    #[test]
    fn event_components() {
        assert_eq!(event_file_component("cpu-clock"), "cpu-clock");
        let raw = event_file_component("raw:0x1a2");
        assert!(raw.starts_with("raw-0x1a2_"), "{raw}");
        assert_ne!(event_file_component("Cycles"), event_file_component("cycles"));
        assert_ne!(event_file_component("raw:1"), event_file_component("raw-1"));
        for name in ["", "a/b/../c", "x\ny", &"é".repeat(100), &"a".repeat(65)] {
            let c = event_file_component(name);
            assert!(!c.is_empty() && c.len() <= 64, "{c}");
            assert!(c
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'));
        }
    }

    #[test]
    fn host_names() {
        assert!(validate_host_name("web-01.example.com").is_ok());
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", &"h".repeat(65), "x\n"] {
            assert!(validate_host_name(bad).is_err(), "{bad:?}");
        }
    }
}
