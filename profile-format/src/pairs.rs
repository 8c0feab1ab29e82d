//! The (offset, count) pair list of profile bodies (FORMAT.md §5 fields 18-19), shared with the
//! daemon's spool so that both store counts in the same ~2 bytes per pair.
//!
//! A list is its length, then per pair the offset gap and the count, all varints. Offsets are
//! strictly increasing: the first pair stores its offset, each later one `offset − previous − 1`.
//! Counts are never 0.

use crate::varint::{self, VarintError};

/// Why a pair list could not be decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PairsError {
    #[error("pair list: {0}")]
    Varint(#[from] VarintError),
    #[error("pair list: {0} pairs cannot fit in the bytes left")]
    TooMany(u64),
    #[error("pair list: offset exceeds 64 bits")]
    OffsetOverflow,
    #[error("pair list: zero count at offset {0:#x}")]
    ZeroCount(u64),
}

/// Which field of the list a [`PairsError`] concerns (for errors that name a file's field).
impl PairsError {
    pub fn field(&self) -> &'static str {
        match self {
            Self::TooMany(_) => "counts",
            Self::OffsetOverflow => "counts.offset",
            Self::ZeroCount(_) => "counts.count",
            Self::Varint(_) => "counts",
        }
    }
}

/// Append a pair list. `pairs` must have strictly increasing offsets and no zero count (the
/// callers hold them in ordered maps without zeros); `len` is the number of pairs.
pub fn write(out: &mut Vec<u8>, len: usize, pairs: impl IntoIterator<Item = (u64, u64)>) {
    varint::write_u64(out, len as u64);
    out.reserve(len * 3);
    let mut prev: Option<u64> = None;
    for (off, count) in pairs {
        let delta = match prev {
            None => off,
            Some(p) => off.wrapping_sub(p).wrapping_sub(1),
        };
        varint::write_u64(out, delta);
        varint::write_u64(out, count);
        prev = Some(off);
    }
}

/// Decode a pair list at `*pos`, advancing past it; calls `each(offset, count)` per pair and
/// returns the sum of the counts (saturating). The length is checked against the bytes left
/// (at least 2 per pair) before anything is decoded.
pub fn read(
    buf: &[u8],
    pos: &mut usize,
    mut each: impl FnMut(u64, u64),
) -> Result<u64, PairsError> {
    let n = varint::read_u64(buf, pos)?;
    if n > (buf.len().saturating_sub(*pos) / 2) as u64 {
        return Err(PairsError::TooMany(n));
    }
    let mut prev: Option<u64> = None;
    let mut sum = 0u64;
    for _ in 0..n {
        let delta = varint::read_u64(buf, pos)?;
        let off = match prev {
            None => Some(delta),
            Some(p) => p.checked_add(delta).and_then(|v| v.checked_add(1)),
        }
        .ok_or(PairsError::OffsetOverflow)?;
        let count = varint::read_u64(buf, pos)?;
        if count == 0 {
            return Err(PairsError::ZeroCount(off));
        }
        sum = sum.saturating_add(count);
        each(off, count);
        prev = Some(off);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size() {
        let pairs = [(0u64, 1u64), (1, 2), (40, 1), (u64::MAX, 300)];
        let mut out = Vec::new();
        write(&mut out, pairs.len(), pairs);
        let mut got = Vec::new();
        let mut pos = 0;
        assert_eq!(read(&out, &mut pos, |o, c| got.push((o, c))), Ok(304));
        assert_eq!(pos, out.len());
        assert_eq!(got, pairs);
        // Dense small pairs cost 2 bytes each.
        let dense: Vec<(u64, u64)> = (0..1000).map(|i| (i * 10, 3)).collect();
        let mut out = Vec::new();
        write(&mut out, dense.len(), dense.iter().copied());
        assert!(out.len() <= 2 * dense.len() + 2, "{} bytes", out.len());
    }

    #[test]
    fn rejects_bad_lists() {
        let mut pos = 0;
        assert_eq!(read(&[5, 1, 1], &mut pos, |_, _| {}), Err(PairsError::TooMany(5)));
        let mut pos = 0;
        assert_eq!(read(&[1, 7, 0], &mut pos, |_, _| {}), Err(PairsError::ZeroCount(7)));
        let mut big = vec![2u8];
        varint::write_u64(&mut big, u64::MAX);
        big.push(1);
        big.extend([0, 1]);
        let mut pos = 0;
        assert_eq!(read(&big, &mut pos, |_, _| {}), Err(PairsError::OffsetOverflow));
        let mut pos = 0;
        assert!(matches!(read(&[1, 0x80, 0x80], &mut pos, |_, _| {}), Err(PairsError::Varint(_))));
    }
}
