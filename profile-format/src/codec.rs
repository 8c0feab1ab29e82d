//! The container shared by binary files (profiles, kallsyms snapshots): fixed header, payload,
//! CRC-32 trailer (FORMAT.md "Binary container"), and a bounds-checked reader for payloads.

use flate2::read::ZlibDecoder;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ident::{ImageId, ImageIdRef, ImageKind, MAX_BUILD_ID_LEN};
pub(crate) use crate::ident::{ID_TAG_BUILD_ID, ID_TAG_FALLBACK};
use crate::pairs;
use crate::varint::{self, VarintError};

/// magic (8) + version (u16) + flags (u16) + total length (u64).
pub(crate) const FIXED_HEADER_LEN: usize = 20;
/// CRC-32 of every preceding byte.
pub(crate) const TRAILER_LEN: usize = 4;
pub(crate) const MIN_FILE_LEN: usize = FIXED_HEADER_LEN + TRAILER_LEN;

/// Start a file: fixed header with a length placeholder.
pub(crate) fn begin(magic: &[u8; 8], version: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out
}

/// Fill in the length and append the checksum.
pub(crate) fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let total = (out.len() + TRAILER_LEN) as u64;
    out[12..20].copy_from_slice(&total.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

/// The first two checks (magic, version) on the bytes present.
pub(crate) fn check_prefix(
    bytes: &[u8],
    path: &Path,
    magic: &[u8; 8],
    what: &'static str,
    supported: u16,
) -> Result<()> {
    let prefix = bytes.len().min(magic.len());
    if bytes[..prefix] != magic[..prefix] {
        return Err(Error::BadMagic { path: path.into(), what });
    }
    if bytes.len() >= 10 {
        let version = le_u16(&bytes[8..10]);
        if version == 0 || version > supported {
            return Err(Error::UnknownVersion { path: path.into(), version, supported });
        }
    }
    Ok(())
}

/// Validate the container and return the payload (between fixed header and trailer).
///
/// Order of checks: magic, version, length (truncation), checksum, flags. Each failure is its own
/// error type so that a user can tell a foreign file from a half-written or bit-rotted one.
pub(crate) fn open<'a>(
    bytes: &'a [u8],
    path: &Path,
    magic: &[u8; 8],
    what: &'static str,
    supported: u16,
) -> Result<&'a [u8]> {
    let actual = bytes.len() as u64;
    check_prefix(bytes, path, magic, what, supported)?;
    if bytes.len() < FIXED_HEADER_LEN {
        return Err(Error::Truncated { path: path.into(), expected: MIN_FILE_LEN as u64, actual });
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&bytes[12..20]);
    let stored_len = u64::from_le_bytes(len_bytes);
    if stored_len > actual {
        return Err(Error::Truncated { path: path.into(), expected: stored_len, actual });
    }
    if stored_len < MIN_FILE_LEN as u64 {
        return Err(corrupt(path, "length", format!("stored length {stored_len} is too small")));
    }
    if stored_len < actual {
        return Err(corrupt(
            path,
            "length",
            format!("{} bytes after the stored length {stored_len}", actual - stored_len),
        ));
    }
    let body_end = bytes.len() - TRAILER_LEN;
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(&bytes[body_end..]);
    let stored = u32::from_le_bytes(crc_bytes);
    let computed = crc32fast::hash(&bytes[..body_end]);
    if stored != computed {
        return Err(Error::ChecksumMismatch { path: path.into(), stored, computed });
    }
    let flags = le_u16(&bytes[10..12]);
    if flags != 0 {
        return Err(corrupt(path, "flags", format!("unknown flags {flags:#06x}")));
    }
    Ok(&bytes[FIXED_HEADER_LEN..body_end])
}

pub(crate) fn corrupt(path: &Path, field: &'static str, detail: impl Into<String>) -> Error {
    Error::Corrupt { path: path.into(), field, detail: detail.into() }
}

/// Largest payload a zlib container may inflate to: a bound against a small hostile file
/// that expands without end.
pub(crate) const MAX_ZLIB_PAYLOAD: u64 = 256 << 20;

/// The zlib level of every compressed container. Measured with `miniz_oxide` on dcpid's own
/// files (BENCHMARKS.md, "zlib level"): level 3 wrote typical stack files as small as level 9
/// (27 813 against 28 000 bytes) 5x faster, and a machine of distinct stacks' file smaller
/// (137 955 against 140 006 bytes) 25x faster, where level 9 was two thirds of the flush
/// thread's CPU; who tables come out the same.
const ZLIB_LEVEL: u32 = 3;

/// A whole file whose payload is zlib-compressed (who tables, stack profiles). Compressed
/// bytes are not canonical (zlib backends and versions differ): readers check that the
/// *payload* is canonical, never the file.
pub(crate) fn finish_zlib(magic: &[u8; 8], version: u16, payload: &[u8]) -> Vec<u8> {
    let mut file = begin(magic, version);
    DEFLATE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => {
            let z = kept.get_or_insert_with(|| {
                flate2::Compress::new(flate2::Compression::new(ZLIB_LEVEL), true)
            });
            z.reset();
            deflate_into(z, payload, &mut file);
        }
        // Re-entered (cannot happen today): a compressor of its own.
        Err(_) => deflate_into(
            &mut flate2::Compress::new(flate2::Compression::new(ZLIB_LEVEL), true),
            payload,
            &mut file,
        ),
    });
    finish(file)
}

thread_local! {
    /// One zlib compressor per thread, reset between files. A new one allocates and zeroes
    /// ~250 KiB of tables: above the allocator's mmap threshold, so each file cost fresh page
    /// faults and an munmap (a TLB shootdown on every CPU the process runs on). dcpid's flush
    /// thread encodes a stack increment for the spool at every flush, where that was a fifth
    /// of the thread's CPU (issue 19).
    static DEFLATE: std::cell::RefCell<Option<flate2::Compress>> =
        const { std::cell::RefCell::new(None) };
}

/// Append the zlib stream of `payload` to `out` (a fresh or reset compressor).
fn deflate_into(z: &mut flate2::Compress, payload: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.reserve(payload.len() / 2 + 64);
    loop {
        let done = usize::try_from(z.total_in()).unwrap_or(payload.len()).min(payload.len());
        let spare = out.capacity() - out.len();
        match z.compress_vec(&payload[done..], out, flate2::FlushCompress::Finish) {
            Ok(flate2::Status::StreamEnd) => return,
            Ok(_) => out.reserve(spare.max(64)),
            // Only a misuse of the stream (not data) fails: leave the payload empty, which
            // every reader rejects as corrupt, rather than panic in a writer.
            Err(_) => {
                out.truncate(start);
                return;
            }
        }
    }
}

/// Validate a zlib container ([`open`]) and inflate its payload, at most
/// [`MAX_ZLIB_PAYLOAD`] bytes.
pub(crate) fn open_zlib(
    bytes: &[u8],
    path: &Path,
    magic: &[u8; 8],
    what: &'static str,
    supported: u16,
) -> Result<Vec<u8>> {
    let packed = open(bytes, path, magic, what, supported)?;
    inflate_bounded(ZlibDecoder::new(packed), path, "compressed payload", "more than 256 MiB")
}

/// Everything `decoder` yields, at most [`MAX_ZLIB_PAYLOAD`] bytes: the one bound against a
/// small hostile file that expands without end, for every compressed form (zlib, zstd).
/// Errors are `Corrupt{field}`; `too_large` is the detail when the bound is passed.
pub(crate) fn inflate_bounded(
    decoder: impl std::io::Read,
    path: &Path,
    field: &'static str,
    too_large: &'static str,
) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    decoder
        .take(MAX_ZLIB_PAYLOAD + 1)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(path, field, e.to_string()))?;
    if out.len() as u64 > MAX_ZLIB_PAYLOAD {
        return Err(corrupt(path, field, too_large));
    }
    Ok(out)
}

/// Append a length-prefixed byte string.
pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    varint::write_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Append an image id: its tag, then its bytes.
pub(crate) fn put_image_id(out: &mut Vec<u8>, id: &ImageId) {
    let (tag, b) = match id {
        ImageId::BuildId(b) => (ID_TAG_BUILD_ID, &b[..]),
        ImageId::Fallback(f) => (ID_TAG_FALLBACK, &f[..]),
    };
    out.push(tag);
    put_bytes(out, b);
}

/// Bounds-checked payload reader; every error is `Corrupt` naming the field being read.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: PathBuf,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], path: &Path) -> Self {
        Reader { buf, pos: 0, path: path.into() }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn corrupt(&self, field: &'static str, detail: impl Into<String>) -> Error {
        corrupt(&self.path, field, detail)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| self.corrupt(field, format!("missing at payload byte {}", self.pos)))?;
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u64> {
        varint::read_u64(self.buf, &mut self.pos).map_err(|e: VarintError| {
            self.corrupt(field, format!("{e} (at payload byte {})", self.pos))
        })
    }

    /// Skip `n` varints (LEB128: each ends at a byte below 0x80) without decoding them.
    pub(crate) fn skip_varints(&mut self, field: &'static str, n: usize) -> Result<()> {
        let mut left = n;
        if left == 0 {
            return Ok(());
        }
        for (i, &b) in self.buf[self.pos..].iter().enumerate() {
            if b < 0x80 {
                left -= 1;
                if left == 0 {
                    self.pos += i + 1;
                    return Ok(());
                }
            }
        }
        Err(self
            .corrupt(field, format!("{n} varints run past the end (at payload byte {})", self.pos)))
    }

    /// A length that counts items of at least `min_item_len` bytes each: capped by the bytes
    /// left, so a corrupt length can never make the reader allocate or loop beyond the input.
    pub(crate) fn count(&mut self, field: &'static str, min_item_len: usize) -> Result<usize> {
        let n = self.varint(field)?;
        let cap = (self.remaining() / min_item_len.max(1)) as u64;
        if n > cap {
            return Err(
                self.corrupt(field, format!("{n} items cannot fit in {} bytes", self.remaining()))
            );
        }
        Ok(n as usize)
    }

    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<&'a [u8]> {
        let n = self.count(field, 1)?;
        let b = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }

    pub(crate) fn string(&mut self, field: &'static str) -> Result<String> {
        let b = self.bytes(field)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.corrupt(field, format!("not UTF-8: {e}"))),
        }
    }

    /// An image kind's code byte.
    pub(crate) fn image_kind(&mut self, field: &'static str) -> Result<ImageKind> {
        let code = self.u8(field)?;
        ImageKind::from_code(code)
            .ok_or_else(|| self.corrupt(field, format!("unknown image kind {code}")))
    }

    /// An image id as [`put_image_id`] writes it, borrowed from the payload.
    pub(crate) fn image_id(&mut self, field: &'static str) -> Result<ImageIdRef<'a>> {
        match self.u8(field)? {
            ID_TAG_BUILD_ID => {
                let b = self.bytes(field)?;
                if b.is_empty() || b.len() > MAX_BUILD_ID_LEN {
                    return Err(self.corrupt(field, format!("build-id of {} bytes", b.len())));
                }
                Ok(ImageIdRef::BuildId(b))
            }
            ID_TAG_FALLBACK => {
                let b = self.bytes(field)?;
                let f: &[u8; 16] = b.try_into().map_err(|_| {
                    self.corrupt(field, format!("fallback id of {} bytes, not 16", b.len()))
                })?;
                Ok(ImageIdRef::Fallback(f))
            }
            t => Err(self.corrupt(field, format!("unknown id tag {t}"))),
        }
    }

    /// Optional build-id: length 0 = none, else 1..=64 bytes.
    pub(crate) fn opt_build_id(&mut self, field: &'static str) -> Result<Option<Vec<u8>>> {
        let b = self.bytes(field)?;
        match b.len() {
            0 => Ok(None),
            1..=MAX_BUILD_ID_LEN => Ok(Some(b.to_vec())),
            n => Err(self.corrupt(field, format!("build-id of {n} bytes (max 64)"))),
        }
    }

    /// A pair list (`crate::pairs`); returns the sum of its counts.
    pub(crate) fn pairs(&mut self, each: impl FnMut(u64, u64)) -> Result<u64> {
        let start = self.pos;
        pairs::read(self.buf, &mut self.pos, each).map_err(|e| {
            let field = e.field();
            let at = self.pos;
            self.pos = start;
            corrupt(&self.path, field, format!("{e} (at payload byte {at})"))
        })
    }

    pub(crate) fn finish(&self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(self.corrupt(
                "trailing bytes",
                format!("{} unparsed bytes before the checksum", self.buf.len() - self.pos),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept compressor is reset between files: each file inflates to its own payload,
    /// whatever came before on the thread, including payloads far larger than the first
    /// output reserve (incompressible bytes) and empty ones.
    #[test]
    fn kept_compressor_gives_independent_files() {
        const MAGIC: &[u8; 8] = b"DCPITEST";
        let mut noise = Vec::with_capacity(300_000);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.push(x as u8);
        }
        let payloads: [&[u8]; 4] =
            [b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", &noise, b"", b"second small one"];
        for p in payloads {
            let file = finish_zlib(MAGIC, 1, p);
            let back = open_zlib(&file, Path::new("t"), MAGIC, "test", 1).expect("valid file");
            assert_eq!(back, p);
        }
    }
}
