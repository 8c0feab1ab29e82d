//! Safe reader over one perf ring: Acquire head, hand each record to the caller where it lies
//! (records that wrap around the end of the data area are reassembled in a scratch buffer),
//! Release tail.
//!
//! Records are read in place, not copied out: a variable-length copy is a `memcpy` call per
//! record, on the path every sample takes.

use std::cell::{Cell, RefCell};

use crate::sys::perf::RingMap;

/// The operations the reader needs from a ring; implemented by the real mmap'ed ring and by an
/// in-memory ring for tests and benchmarks.
pub trait RingBuffer {
    /// Size of the data area (a power of two).
    fn data_size(&self) -> usize;
    /// `data_head` (Acquire).
    fn head(&self) -> u64;
    fn tail(&self) -> u64;
    /// `data_tail` (Release).
    fn set_tail(&self, tail: u64);
    /// Copy bytes at `off` in the data area; `off + dst.len() <= data_size()`.
    fn read_at(&self, off: usize, dst: &mut [u8]);
    /// Call `f` with the `len` bytes at `off` in the data area, in place;
    /// `off + len <= data_size()`. Only called for bytes between tail and head.
    fn with_bytes<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T;
}

impl RingBuffer for RingMap {
    fn data_size(&self) -> usize {
        Self::data_size(self)
    }
    fn head(&self) -> u64 {
        Self::head(self)
    }
    fn tail(&self) -> u64 {
        Self::tail(self)
    }
    fn set_tail(&self, tail: u64) {
        Self::set_tail(self, tail)
    }
    fn read_at(&self, off: usize, dst: &mut [u8]) {
        Self::read_at(self, off, dst)
    }
    fn with_bytes<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T {
        f(self.bytes_at(off, len))
    }
}

/// One record, header split off; `body` is valid until the next record.
#[derive(Clone, Copy, Debug)]
pub struct RawRecord<'a> {
    pub kind: u32,
    pub misc: u16,
    pub body: &'a [u8],
}

/// Counts of one drain pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    pub records: u64,
    pub bytes: u64,
    /// The ring held something that is not a record (size < 8 or past head): the rest of the
    /// pass was skipped.
    pub corrupt: bool,
}

/// Reads records out of a ring. Holds the scratch buffer, so draining allocates nothing.
#[derive(Debug)]
pub struct RingReader {
    scratch: Vec<u8>,
}

impl Default for RingReader {
    fn default() -> Self {
        Self::new()
    }
}

impl RingReader {
    pub fn new() -> Self {
        // A record's size is a u16.
        Self { scratch: vec![0; 1 << 16] }
    }

    fn copy<R: RingBuffer + ?Sized>(ring: &R, pos: u64, dst: &mut [u8]) {
        let size = ring.data_size();
        let off = (pos as usize) & (size - 1);
        let first = dst.len().min(size - off);
        let (a, b) = dst.split_at_mut(first);
        ring.read_at(off, a);
        if !b.is_empty() {
            // The record wraps around the end of the data area.
            ring.read_at(0, b);
        }
    }

    /// Deliver every record between tail and the head read at the start of the pass, then
    /// release them to the kernel.
    pub fn drain<R, F>(&mut self, ring: &R, mut f: F) -> DrainStats
    where
        R: RingBuffer + ?Sized,
        F: FnMut(RawRecord<'_>),
    {
        let head = ring.head();
        let mut pos = ring.tail();
        let mut stats = DrainStats::default();
        let size_total = ring.data_size();
        while pos < head {
            if head - pos < 8 {
                stats.corrupt = true;
                break;
            }
            let off = (pos as usize) & (size_total - 1);
            let contiguous = size_total - off;
            // Records are 8-byte aligned in a data area whose size is a power of two: a header
            // never wraps, but a ring that lies is read through the copying path.
            let hdr = if contiguous >= 8 {
                ring.with_bytes(off, 8, |h| <[u8; 8]>::try_from(h).unwrap_or([0; 8]))
            } else {
                let mut hdr = [0u8; 8];
                Self::copy(ring, pos, &mut hdr);
                hdr
            };
            let kind = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
            let misc = u16::from_ne_bytes([hdr[4], hdr[5]]);
            let size = u16::from_ne_bytes([hdr[6], hdr[7]]) as usize;
            if size < 8 || (head - pos) < size as u64 {
                stats.corrupt = true;
                break;
            }
            if contiguous >= size {
                ring.with_bytes(off, size, |rec| f(RawRecord { kind, misc, body: &rec[8..] }));
            } else {
                let rec = &mut self.scratch[..size];
                Self::copy(ring, pos, rec);
                f(RawRecord { kind, misc, body: &rec[8..] });
            }
            stats.records += 1;
            stats.bytes += size as u64;
            pos += size as u64;
        }
        // Everything up to head was read (or is unreadable garbage): give it back.
        ring.set_tail(head);
        stats
    }
}

/// An in-memory ring with the kernel's layout, for tests and benchmarks: records are written at
/// `head` and wrap around the end of the data area exactly as the kernel writes them.
#[derive(Debug)]
pub struct MemRing {
    data: RefCell<Vec<u8>>,
    head: Cell<u64>,
    tail: Cell<u64>,
}

impl MemRing {
    /// `size` must be a power of two.
    pub fn new(size: usize) -> Self {
        assert!(size.is_power_of_two());
        Self { data: RefCell::new(vec![0; size]), head: Cell::new(0), tail: Cell::new(0) }
    }

    /// Start both head and tail at `pos` (to place records across the wrap point).
    pub fn with_position(size: usize, pos: u64) -> Self {
        let r = Self::new(size);
        r.head.set(pos);
        r.tail.set(pos);
        r
    }

    /// Append a record (header + body, body padded to 8 bytes). Returns false if it does not
    /// fit in the free space.
    pub fn push(&self, kind: u32, misc: u16, body: &[u8]) -> bool {
        let padded = body.len().div_ceil(8) * 8;
        let size = 8 + padded;
        let len = self.data.borrow().len();
        let used = (self.head.get() - self.tail.get()) as usize;
        if size > u16::MAX as usize || used + size > len {
            return false;
        }
        let mut rec = Vec::with_capacity(size);
        rec.extend_from_slice(&kind.to_ne_bytes());
        rec.extend_from_slice(&misc.to_ne_bytes());
        rec.extend_from_slice(&(size as u16).to_ne_bytes());
        rec.extend_from_slice(body);
        rec.resize(size, 0);
        self.push_raw(&rec);
        true
    }

    /// Append raw bytes at head (may be a malformed record).
    pub fn push_raw(&self, bytes: &[u8]) {
        let mut data = self.data.borrow_mut();
        let len = data.len();
        let mut pos = self.head.get();
        for b in bytes {
            data[(pos as usize) & (len - 1)] = *b;
            pos += 1;
        }
        self.head.set(pos);
    }
}

impl RingBuffer for MemRing {
    fn data_size(&self) -> usize {
        self.data.borrow().len()
    }
    fn head(&self) -> u64 {
        self.head.get()
    }
    fn tail(&self) -> u64 {
        self.tail.get()
    }
    fn set_tail(&self, tail: u64) {
        self.tail.set(tail)
    }
    fn read_at(&self, off: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.data.borrow()[off..off + dst.len()]);
    }
    fn with_bytes<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T {
        f(&self.data.borrow()[off..off + len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn reads_records_that_wrap_around_the_end() {
        // 256-byte ring; start 40 bytes before the end so the 2nd record straddles the end, and
        // the header of a later one is split too.
        for start in [0u64, 216, 220, 250, 252, 255, 256 + 200, (1 << 40) - 4] {
            let ring = MemRing::with_position(256, start);
            let mut reader = RingReader::new();
            let mut expected = Vec::new();
            let mut got = Vec::new();
            for round in 0..20u8 {
                // Fill until full, drain, check.
                let mut k = 0u32;
                loop {
                    let b = body(8 + 8 * ((round as usize + k as usize) % 5), round ^ k as u8);
                    if !ring.push(k + 1, k as u16, &b) {
                        break;
                    }
                    expected.push((k + 1, k as u16, b));
                    k += 1;
                }
                let st = reader.drain(&ring, |r| got.push((r.kind, r.misc, r.body.to_vec())));
                assert!(!st.corrupt);
                assert_eq!(ring.tail(), ring.head());
                assert_eq!(got, expected, "start {start} round {round}");
                got.clear();
                expected.clear();
            }
        }
    }

    #[test]
    fn corrupt_ring_is_skipped_not_looped_on() {
        let ring = MemRing::with_position(64, 60);
        assert!(ring.push(9, 0, &[1; 8]));
        // A header claiming size 4 (< 8): unreadable.
        let mut bad = Vec::new();
        bad.extend_from_slice(&9u32.to_ne_bytes());
        bad.extend_from_slice(&0u16.to_ne_bytes());
        bad.extend_from_slice(&4u16.to_ne_bytes());
        ring.push_raw(&bad);
        let mut n = 0;
        let st = RingReader::new().drain(&ring, |r| {
            assert_eq!(r.body, &[1; 8]);
            n += 1
        });
        assert_eq!(n, 1);
        assert!(st.corrupt);
        assert_eq!(ring.tail(), ring.head());
        // A header claiming more bytes than were written.
        let mut bad = Vec::new();
        bad.extend_from_slice(&9u32.to_ne_bytes());
        bad.extend_from_slice(&0u16.to_ne_bytes());
        bad.extend_from_slice(&48u16.to_ne_bytes());
        ring.push_raw(&bad);
        let st = RingReader::new().drain(&ring, |_| panic!("no record expected"));
        assert!(st.corrupt);
        assert_eq!(st.records, 0);
    }
}
