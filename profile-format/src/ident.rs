use crate::error::{Error, Result};

/// Identity of an image (an ELF file, the kernel, a module, the vDSO, a JIT region).
///
/// Ordering and hashing are by kind then bytes; the textual form (`Display`/`parse`) is what
/// appears in file names and in `dcpiprof --image`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum ImageId {
    /// A GNU build-id (`NT_GNU_BUILD_ID`), 1..=64 bytes. Text form: `b` + lowercase hex.
    BuildId(Vec<u8>),
    /// 16 bytes of SHA-256 over a canonical encoding of what identifies an image without a
    /// build-id (see [`ImageId::fallback`] and [`ImageId::special`]). Text form: `f` + hex.
    Fallback([u8; 16]),
}

impl ImageId {
    /// Identity of a file without a build-id: path, size, mtime (ns since the epoch) and inode.
    pub fn fallback(path: &[u8], size: u64, mtime_ns: i64, inode: u64) -> ImageId {
        todo!("{path:?} {size} {mtime_ns} {inode}")
    }

    /// Identity of a pseudo-image such as `[vdso]`, `[anon]` or `[unknown]`; `discriminator`
    /// separates instances (e.g. kernel release for the vDSO, pid and start time for `[anon]`).
    pub fn special(name: &str, discriminator: &[u8]) -> ImageId {
        todo!("{name} {discriminator:?}")
    }

    /// The text form; also the file-name stem of the image's profiles. Always matches
    /// `[bf][0-9a-f]{1,128}`, so it can never escape a directory.
    pub fn to_text(&self) -> String {
        todo!()
    }

    /// Parse the text form produced by [`ImageId::to_text`].
    pub fn parse(s: &str) -> Result<ImageId> {
        todo!("{s}")
    }
}

impl std::fmt::Display for ImageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Map an event name (`cycles`, `raw:0x1a2`, `cpu-clock`) to a file-name component that is
/// unique per name and safe: `[a-z0-9_-]`, at most 64 bytes.
pub fn event_file_component(name: &str) -> String {
    todo!("{name}")
}

/// Host directory names are host names; reject anything that is not a safe single path
/// component (`[A-Za-z0-9._-]`, 1..=64 bytes, not starting with `.`).
pub fn validate_host_name(host: &str) -> Result<()> {
    let _ = Error::Invalid { what: "host name", value: host.into(), detail: String::new() };
    todo!()
}
