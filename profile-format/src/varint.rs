//! LEB128 unsigned varints, the integer encoding of profile bodies.
//!
//! Seven bits per byte, least significant group first, high bit set on every byte but the last.
//! Decoding accepts only the canonical (shortest) encoding of a value, at most 10 bytes, so every
//! value has exactly one encoding and a corrupted continuation bit is caught even when the
//! checksum is not consulted.

/// Why a varint could not be decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum VarintError {
    #[error("varint runs past the end of the data")]
    Eof,
    #[error("varint does not fit in 64 bits")]
    Overflow,
    #[error("varint is not in canonical (shortest) form")]
    NonCanonical,
}

/// Maximum encoded length of a `u64`.
pub const MAX_LEN: usize = 10;

/// Append the encoding of `v` to `out`.
#[inline]
pub fn write_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Number of bytes [`write_u64`] appends for `v`.
#[inline]
pub fn len_u64(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Decode one varint from `buf` at `*pos`, advancing `*pos` past it.
#[inline]
pub fn read_u64(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    let start = *pos;
    loop {
        let Some(&b) = buf.get(*pos) else {
            *pos = start;
            return Err(VarintError::Eof);
        };
        *pos += 1;
        let low = u64::from(b & 0x7f);
        if shift == 63 && low > 1 {
            *pos = start;
            return Err(VarintError::Overflow);
        }
        v |= low << shift;
        if b & 0x80 == 0 {
            if b == 0 && shift > 0 {
                *pos = start;
                return Err(VarintError::NonCanonical);
            }
            return Ok(v);
        }
        shift += 7;
        if shift > 63 {
            *pos = start;
            return Err(VarintError::Overflow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_edges() {
        for v in [0u64, 1, 127, 128, 255, 16383, 16384, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, v);
            assert_eq!(out.len(), len_u64(v), "length of {v}");
            let mut pos = 0;
            assert_eq!(read_u64(&out, &mut pos), Ok(v));
            assert_eq!(pos, out.len());
        }
    }

    #[test]
    fn rejects_bad_encodings() {
        let mut pos = 0;
        assert_eq!(read_u64(&[0x80], &mut pos), Err(VarintError::Eof));
        assert_eq!(pos, 0);
        assert_eq!(read_u64(&[], &mut pos), Err(VarintError::Eof));
        assert_eq!(read_u64(&[0x80, 0x00], &mut pos), Err(VarintError::NonCanonical));
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert_eq!(read_u64(&too_big, &mut pos), Err(VarintError::Overflow));
        let eleven = [0xffu8; 11];
        assert_eq!(read_u64(&eleven, &mut pos), Err(VarintError::Overflow));
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(read_u64(&max, &mut pos), Ok(u64::MAX));
    }
}
