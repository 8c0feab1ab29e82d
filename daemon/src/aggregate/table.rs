//! The per-CPU sample table, after DCPI's: 4-way set-associative buckets, evictions to a
//! bounded overflow buffer.
//!
//! An entry is 32 bytes (DCPI's were 16, but it kept neither an address-space version nor a
//! period sum): `pc`, a tag packing `asid` (48 bits), `event` (15 bits) and the kernel bit,
//! `pid`, a 32-bit `count` and the 64-bit sum of the periods in force for those samples. The
//! store needs exact per-(image, offset, event) period sums, and periods are redrawn per CPU
//! every ~64 samples, so the sum is kept per entry (one add on a line already in cache) rather
//! than reconstructed. A bucket is 4 entries = 128 bytes, aligned to 128 so it spans exactly
//! the two lines the adjacent-line prefetcher fetches together.
//!
//! An empty way has `count == 0`. Ways fill in order and an entry only leaves by being
//! replaced (eviction) or by the whole table being drained, so the first empty way ends the
//! search. On a miss in a full bucket the way with the smallest count is evicted (hot entries
//! stay; DCPI used a similar policy) and returned to the caller, which puts it in the overflow
//! buffer.

use crate::types::EventIdx;

/// Address-space versions must fit in 48 bits (one is taken per exec, executable mmap or new
/// process: at a million a second that is 9 years of uptime). Larger ones are folded to 0
/// ("process unknown at that time") rather than merged with another version.
pub(crate) const ASID_BITS: u32 = 48;
const ASID_MASK: u64 = (1 << ASID_BITS) - 1;
const EVENT_MASK: u64 = 0x7fff;
const KERNEL_BIT: u64 = 1 << 63;
pub(crate) const WAYS: usize = 4;

/// One aggregated key and its count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Entry {
    pub(crate) pc: u64,
    tag: u64,
    pub(crate) pid: u32,
    pub(crate) count: u32,
    pub(crate) period_sum: u64,
}

impl Entry {
    pub(crate) fn tag(asid: u64, event: EventIdx, kernel: bool) -> u64 {
        let asid = if asid > ASID_MASK { 0 } else { asid };
        asid | ((u64::from(event) & EVENT_MASK) << ASID_BITS) | if kernel { KERNEL_BIT } else { 0 }
    }
    /// Event and kernel bit of a tag made by [`Entry::tag`].
    #[inline]
    pub(crate) fn tag_event_kernel(tag: u64) -> (EventIdx, bool) {
        (((tag >> ASID_BITS) & EVENT_MASK) as EventIdx, tag & KERNEL_BIT != 0)
    }
    pub(crate) fn asid(&self) -> u64 {
        self.tag & ASID_MASK
    }
    pub(crate) fn event(&self) -> EventIdx {
        ((self.tag >> ASID_BITS) & EVENT_MASK) as EventIdx
    }
    pub(crate) fn kernel(&self) -> bool {
        self.tag & KERNEL_BIT != 0
    }
}

#[derive(Clone, Copy, Default)]
#[repr(C, align(128))]
struct Bucket([Entry; WAYS]);

/// What [`Table::add`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Added {
    /// Counted in an existing entry.
    Hit,
    /// A new entry in a free way.
    New,
    /// A new entry replaced this one, which must go to the overflow buffer.
    Evicted(Entry),
}

/// Fixed-size set-associative table; never grows.
pub(crate) struct Table {
    buckets: Box<[Bucket]>,
    /// `64 - log2(buckets)`: the bucket is the top bits of the hash.
    shift: u32,
    live: usize,
    /// Buckets that went from empty to used since the last drain, while they are few: a
    /// drain then visits those, not the whole table (a mostly empty table of hundreds of KiB,
    /// cold after a flush interval, cost more to scan than its entries to resolve).
    used: Vec<u32>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("entries", &self.capacity())
            .field("live", &self.live)
            .finish()
    }
}

impl Table {
    /// At least 4 entries; the bucket count is rounded up to a power of two.
    pub(crate) fn new(entries: usize) -> Self {
        let buckets = Self::capacity_for(entries) / WAYS;
        Self {
            buckets: vec![Bucket::default(); buckets].into_boxed_slice(),
            shift: 64 - buckets.trailing_zeros(),
            live: 0,
            used: Vec::with_capacity(Self::used_limit(buckets)),
        }
    }

    /// Past this many used buckets a drain scans the whole table.
    fn used_limit(buckets: usize) -> usize {
        buckets / 8
    }

    /// The capacity `new(entries)` would have.
    pub(crate) fn capacity_for(entries: usize) -> usize {
        entries.div_ceil(WAYS).max(1).next_power_of_two() * WAYS
    }

    pub(crate) fn capacity(&self) -> usize {
        self.buckets.len() * WAYS
    }

    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val::<[Bucket]>(&self.buckets)
    }

    /// Entries in use.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    #[inline]
    pub(crate) fn bucket_of(&self, pc: u64, tag: u64, pid: u32) -> usize {
        let h =
            (pc ^ tag.rotate_left(23) ^ (u64::from(pid) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // With one bucket, shift is 64: checked_shr gives None, i.e. bucket 0.
        h.checked_shr(self.shift).unwrap_or(0) as usize
    }

    /// Load the start of bucket `i` (the caller sums these to start several cache misses at
    /// once, before the dependent compare-and-branch work of [`Table::add_at`]).
    #[inline]
    pub(crate) fn touch(&self, i: usize) -> u32 {
        self.buckets[i].0[0].count
    }

    /// Count one sample of period `period` under `(pc, tag, pid)`.
    #[cfg(test)]
    pub(crate) fn add(&mut self, pc: u64, tag: u64, pid: u32, period: u64) -> Added {
        let i = self.bucket_of(pc, tag, pid);
        self.add_at(i, pc, tag, pid, period)
    }

    /// [`Table::add`] with the bucket already computed by [`Table::bucket_of`].
    #[inline]
    pub(crate) fn add_at(&mut self, i: usize, pc: u64, tag: u64, pid: u32, period: u64) -> Added {
        let b = &mut self.buckets[i].0;
        let fresh = Entry { pc, tag, pid, count: 1, period_sum: period };
        for (w, e) in b.iter_mut().enumerate() {
            if e.count == 0 {
                *e = fresh;
                self.live += 1;
                if w == 0 && self.used.len() <= Self::used_limit(self.buckets.len()) {
                    self.used.push(i as u32);
                }
                return Added::New;
            }
            if e.pc == pc && e.tag == tag && e.pid == pid {
                if e.count == u32::MAX {
                    // Saturated: retire it to the overflow buffer and start over.
                    return Added::Evicted(std::mem::replace(e, fresh));
                }
                e.count += 1;
                e.period_sum = e.period_sum.saturating_add(period);
                return Added::Hit;
            }
        }
        let mut victim = 0;
        for w in 1..WAYS {
            if b[w].count < b[victim].count {
                victim = w;
            }
        }
        Added::Evicted(std::mem::replace(&mut b[victim], fresh))
    }

    /// Hand every entry to `f` and leave the table empty.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(Entry)) {
        if self.live == 0 {
            return;
        }
        let mut take = |b: &mut Bucket| {
            for e in b.0.iter_mut() {
                if e.count == 0 {
                    break;
                }
                f(std::mem::take(e));
            }
        };
        if self.used.len() <= Self::used_limit(self.buckets.len()) {
            for &i in &self.used {
                take(&mut self.buckets[i as usize]);
            }
        } else {
            self.buckets.iter_mut().for_each(take);
        }
        self.used.clear();
        self.live = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_compact() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        assert_eq!(std::mem::size_of::<Bucket>(), 128);
        assert_eq!(std::mem::align_of::<Bucket>(), 128);
        let t = Table::new(1000);
        assert_eq!(t.capacity(), 1024);
        assert_eq!(t.bytes(), 1024 * 32);
        assert_eq!(Table::new(0).capacity(), 4);
    }

    #[test]
    fn tag_round_trips() {
        let t = Entry::tag(0xabcd_1234_5678, 0x1234, true);
        let e = Entry { tag: t, ..Default::default() };
        assert_eq!((e.asid(), e.event(), e.kernel()), (0xabcd_1234_5678, 0x1234, true));
        let e = Entry { tag: Entry::tag(7, 0, false), ..Default::default() };
        assert_eq!((e.asid(), e.event(), e.kernel()), (7, 0, false));
        // Too large an asid is folded to "unknown", never aliased onto another version.
        let e = Entry { tag: Entry::tag(1 << 48 | 5, 1, false), ..Default::default() };
        assert_eq!((e.asid(), e.event()), (0, 1));
    }

    #[test]
    fn counts_and_period_sums_are_exact() {
        let mut t = Table::new(64);
        let tag = Entry::tag(3, 1, false);
        for i in 0..1000u64 {
            t.add(0x1000 + (i % 10), tag, 42, 100 + i);
        }
        assert_eq!(t.len(), 10);
        let mut got = Vec::new();
        t.drain(|e| got.push(e));
        got.sort_by_key(|e| e.pc);
        for (k, e) in got.iter().enumerate() {
            let k = k as u64;
            let periods: u64 = (0..1000u64).filter(|i| i % 10 == k).map(|i| 100 + i).sum();
            assert_eq!((e.pc, e.count, e.period_sum), (0x1000 + k, 100, periods));
            assert_eq!((e.pid, e.asid(), e.event()), (42, 3, 1));
        }
        assert_eq!(t.len(), 0);
        let mut n = 0;
        t.drain(|_| n += 1);
        assert_eq!(n, 0, "drain empties the table");
    }

    /// A drain hands over every entry and empties the table both when few buckets are used
    /// (it visits only those) and when many are (it scans), across several reuses.
    #[test]
    fn drain_finds_every_entry_of_a_sparse_or_a_full_table() {
        let mut t = Table::new(4096);
        let tag = Entry::tag(1, 0, false);
        for keys in [3u64, 100, 127, 129, 3000, 0, 50] {
            for k in 0..keys {
                t.add(0x40_0000 + k * 16, tag, 7, 1);
                t.add(0x40_0000 + k * 16, tag, 7, 2);
            }
            let mut got = Vec::new();
            t.drain(|e| got.push((e.pc, e.count, e.period_sum)));
            got.sort_unstable();
            let want: Vec<_> = (0..keys).map(|k| (0x40_0000 + k * 16, 2, 3)).collect();
            let evicted = keys as usize - got.len();
            assert!(keys > 1000 || evicted == 0, "{keys} keys: {evicted} evicted");
            assert!(got.iter().all(|g| want.contains(g)), "{keys} keys");
            assert!(t.buckets.iter().all(|b| b.0.iter().all(|e| e.count == 0)), "{keys} keys");
            assert_eq!(t.len(), 0);
        }
    }

    #[test]
    fn full_bucket_evicts_the_coldest_way() {
        // One bucket: every key collides.
        let mut t = Table::new(4);
        let tag = Entry::tag(1, 0, false);
        for (pc, hits) in [(1u64, 5), (2, 1), (3, 7), (4, 3)] {
            for _ in 0..hits {
                assert_ne!(t.add(pc, tag, 9, 10), Added::Evicted(Entry::default()));
            }
        }
        assert_eq!(t.len(), 4);
        let Added::Evicted(e) = t.add(5, tag, 9, 10) else { panic!("bucket is full") };
        assert_eq!((e.pc, e.count, e.period_sum), (2, 1, 10), "least-counted way goes");
        assert_eq!(t.add(5, tag, 9, 10), Added::Hit, "the newcomer took its way");
        // Distinct pid, asid, event or kernel bit are distinct keys.
        for (tag, pid) in [
            (Entry::tag(2, 0, false), 9),
            (Entry::tag(1, 1, false), 9),
            (Entry::tag(1, 0, true), 9),
            (tag, 10),
        ] {
            assert!(matches!(t.add(1, tag, pid, 1), Added::Evicted(_)));
        }
    }

    #[test]
    fn saturated_count_is_retired_not_wrapped() {
        let mut t = Table::new(4);
        let tag = Entry::tag(1, 0, false);
        t.add(1, tag, 1, 1);
        t.buckets[0].0[0].count = u32::MAX;
        let Added::Evicted(e) = t.add(1, tag, 1, 1) else { panic!("must retire") };
        assert_eq!(e.count, u32::MAX);
        assert_eq!(t.add(1, tag, 1, 1), Added::Hit);
        let mut c = 0;
        t.drain(|e| c += e.count);
        assert_eq!(c, 2);
    }

    mod model {
        //! Model-based: any sequence of adds and drains against a plain map of exact counts.
        use std::collections::HashMap;

        use proptest::collection;
        use proptest::prelude::*;

        use super::super::*;

        #[derive(Clone, Debug)]
        enum Op {
            /// pc, pid and event are drawn from small sets so that keys repeat and buckets fill.
            Add {
                pc: u64,
                pid: u32,
                event: EventIdx,
                kernel: bool,
                period: u64,
            },
            Drain,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                20 => (0u64..48, 0u32..3, 0u16..2, any::<bool>(), 1u64..1000).prop_map(
                    |(pc, pid, event, kernel, period)| Op::Add {
                        pc: pc * 4,
                        pid,
                        event,
                        kernel,
                        period,
                    }
                ),
                1 => Just(Op::Drain),
            ]
        }

        type Key = (u64, u64, u32);

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn counts_and_period_sums_are_exact_through_evictions_and_drains(
                entries in 1usize..40,
                ops in collection::vec(op(), 1..600),
            ) {
                let mut t = Table::new(entries);
                // What was added, per key; what came out (evictions and drains), per key.
                let mut added: HashMap<Key, (u64, u64)> = HashMap::new();
                let mut out: HashMap<Key, (u64, u64)> = HashMap::new();
                let take = |e: Entry, out: &mut HashMap<Key, (u64, u64)>| {
                    prop_assert!(e.count > 0, "an empty way came out: {e:?}");
                    let o = out.entry((e.pc, e.tag, e.pid)).or_default();
                    o.0 += u64::from(e.count);
                    o.1 += e.period_sum;
                    Ok(())
                };
                for op in ops {
                    match op {
                        Op::Add { pc, pid, event, kernel, period } => {
                            let tag = Entry::tag(7, event, kernel);
                            let i = t.bucket_of(pc, tag, pid);
                            let before = t.buckets[i].0;
                            let a = added.entry((pc, tag, pid)).or_default();
                            a.0 += 1;
                            a.1 += period;
                            match t.add(pc, tag, pid, period) {
                                Added::Hit => {
                                    prop_assert!(before.iter().any(|e| e.count > 0
                                        && (e.pc, e.tag, e.pid) == (pc, tag, pid)));
                                }
                                Added::New => {
                                    prop_assert!(before.iter().any(|e| e.count == 0),
                                        "New in a full bucket");
                                }
                                Added::Evicted(e) => {
                                    // Only from a full bucket, and the victim is a coldest way
                                    // (or the key itself, saturated).
                                    prop_assert!(before.iter().all(|w| w.count > 0));
                                    let min = before.iter().map(|w| w.count).min().unwrap_or(0);
                                    prop_assert!(e.count == min || e.count == u32::MAX);
                                    take(e, &mut out)?;
                                }
                            }
                            // A key lives in at most one way.
                            let same = t.buckets[i].0.iter()
                                .filter(|e| e.count > 0 && (e.pc, e.tag, e.pid) == (pc, tag, pid))
                                .count();
                            prop_assert_eq!(same, 1);
                        }
                        Op::Drain => {
                            let mut drained = Vec::new();
                            t.drain(|e| drained.push(e));
                            for e in drained {
                                take(e, &mut out)?;
                            }
                            prop_assert_eq!(t.len(), 0);
                        }
                    }
                    prop_assert!(t.len() <= t.capacity());
                }
                let mut rest = Vec::new();
                t.drain(|e| rest.push(e));
                for e in rest {
                    take(e, &mut out)?;
                }
                prop_assert_eq!(added, out);
            }
        }
    }
}
