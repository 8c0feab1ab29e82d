//! Samples per time bucket from the host directories' `slices.log` (FORMAT.md §14): what
//! `dcpiprof --by time` tabulates and the HTML report charts.
//!
//! Slices of every selected host and epoch are added up by time: dcpid cuts slices aligned to
//! Unix time, so the slices of a fleet's hosts fall into the same buckets. A bucket is
//! `resolution` seconds aligned to Unix time (UTC); a slice belongs, whole, to the bucket of
//! its start, so every sample is counted exactly once and the buckets add up to the slices'
//! total. A slice longer than the resolution (an hour slice left by a roll-up, §14.1, or any
//! slice under a resolution finer than the stored one) is not split (its samples have no finer
//! time): it is a row of its own range, and a bucket starting inside such a row joins it, so
//! that rows never overlap.

use std::collections::BTreeMap;

use profile_format::{HostDir, Slice, SliceKey, SliceLog, SliceTotal, SliceTotals};

use crate::select::par_map;

/// The slice log of each host directory (same order), read in parallel (a fleet's are many
/// files, on NFS). `Ok(None)`: the directory has no slice files (FORMAT.md §14.5).
pub fn read_logs(dirs: &[HostDir]) -> Vec<profile_format::Result<Option<SliceLog>>> {
    par_map(dirs, |_, d| d.read_slices())
}

/// [`read_logs`] as totals per slice and key ([`SliceLog::read_totals`]).
pub fn read_totals(dirs: &[HostDir]) -> Vec<profile_format::Result<Option<SliceTotals>>> {
    par_map(dirs, |_, d| d.read_slice_totals_in(None, None))
}

/// What a key's counts contribute to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// Not counted (another event, the idle task under `--no-idle`).
    Out,
    /// Counted in the bucket's total only (what a share is taken of).
    Of,
    /// Counted in the bucket's selection and total.
    All,
    /// A function's share of the image (selection: its share; total: all of it).
    Offsets(&'a Share),
}

/// Which samples of an image are one function's, by the epoch profile's exact offsets: what
/// places a slice's counts, exact or per `res`-byte block (FORMAT.md §14.2), in the function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// Per exact offset of the profile: (samples in the function, all samples).
    by_offset: BTreeMap<u64, (u64, u64)>,
}

impl Share {
    /// Count `count` samples of the profile at `offset`, in the function or not.
    pub fn add(&mut self, offset: u64, count: u64, inside: bool) {
        let e = self.by_offset.entry(offset).or_default();
        e.1 += count;
        if inside {
            e.0 += count;
        }
    }

    /// Whether the function has a sample anywhere.
    pub fn is_empty(&self) -> bool {
        self.by_offset.values().all(|v| v.0 == 0)
    }

    /// The function's samples among `count` samples of the `res`-byte block at `offset`
    /// (`res` 1: the exact offset): all where the block lies inside the function as the
    /// profile saw it, none outside, and where the block straddles the function's edge the
    /// profile's split of the block (rounded to the nearest sample). A block the profile has no
    /// sample in (sampled after it was published) is not the function's.
    pub fn of_block(&self, offset: u64, res: u64, count: u64) -> u64 {
        let (mut inside, mut all) = (0u128, 0u128);
        for (_, &(i, a)) in self.by_offset.range(offset..offset.saturating_add(res.max(1))) {
            inside += i as u128;
            all += a as u128;
        }
        if all == 0 || inside == 0 {
            return 0;
        }
        if inside == all {
            return count;
        }
        ((count as u128 * inside + all / 2) / all) as u64
    }
}

/// One row of the timeline: `[start, end)` in Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Bucket {
    pub start: u64,
    pub end: u64,
    /// Samples of the selection (the image, the function, or everything counted).
    pub samples: u64,
    /// Samples of everything counted in the bucket (what a share of the bucket is of).
    pub of: u64,
}

impl Bucket {
    pub fn seconds(&self) -> u64 {
        self.end - self.start
    }
}

/// The default resolution of a set of slices: their most common length (ties: the longer), so
/// that minute slices give minutes even with a few short ones (a start, a flush) among them,
/// and rolled-up hour slices give hours. `None` without slices.
pub fn stored_resolution(lens: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut n: BTreeMap<u64, u64> = BTreeMap::new();
    for len in lens {
        *n.entry(len.max(1)).or_default() += 1;
    }
    n.into_iter().max_by_key(|&(len, c)| (c, len)).map(|(len, _)| len)
}

/// The buckets of `slices` (each with its offset resolution in bytes, `SliceLog::resolution_of`)
/// at `resolution` seconds, in order of start; `part` says what each key counts towards.
/// Buckets with no slice are not listed (nothing was sampled then, or the daemon did not run).
pub fn buckets<'s, 'p>(
    slices: impl IntoIterator<Item = (&'s Slice, u64)>,
    resolution: u64,
    part: &mut dyn FnMut(&SliceKey) -> Part<'p>,
) -> Vec<Bucket> {
    let r = resolution.max(1);
    let mut out: BTreeMap<u64, Bucket> = BTreeMap::new();
    let mut parts: BTreeMap<&SliceKey, Part<'p>> = BTreeMap::new();
    for (s, res) in slices {
        let b = place(&mut out, s.start, s.len, r);
        for (k, pairs) in &s.counts {
            let p = *parts.entry(k).or_insert_with(|| part(k));
            let sum = || pairs.iter().fold(0u64, |a, &(_, c)| a.saturating_add(c));
            match p {
                Part::Out => {}
                Part::Of => b.of += sum(),
                Part::All => {
                    let n = sum();
                    b.of += n;
                    b.samples += n;
                }
                Part::Offsets(share) => {
                    let res = if k.image.is_some() { res } else { 1 };
                    for &(o, c) in pairs {
                        b.of += c;
                        b.samples += share.of_block(o, res, c);
                    }
                }
            }
        }
    }
    join(out)
}

/// [`buckets`] of slices read as totals ([`SliceLog::read_totals`]; each with its key
/// table): what a timeline without `--symbol` needs, without decoding offsets. A
/// [`Part::Offsets`] key counts towards the total only (a function needs [`buckets`]).
pub fn buckets_of_totals<'s, 'p>(
    slices: impl IntoIterator<Item = (&'s SliceTotal, &'s [SliceKey])>,
    resolution: u64,
    part: &mut dyn FnMut(&SliceKey) -> Part<'p>,
) -> Vec<Bucket> {
    let r = resolution.max(1);
    let mut out: BTreeMap<u64, Bucket> = BTreeMap::new();
    // Per key table (by address: one per log) and key index, its part.
    let mut parts: BTreeMap<(usize, usize), Part<'p>> = BTreeMap::new();
    for (s, keys) in slices {
        let b = place(&mut out, s.start, s.len, r);
        for &(i, n) in &s.totals {
            let p = *parts.entry((keys.as_ptr() as usize, i)).or_insert_with(|| part(&keys[i]));
            match p {
                Part::Out => {}
                Part::Of | Part::Offsets(_) => b.of += n,
                Part::All => {
                    b.of += n;
                    b.samples += n;
                }
            }
        }
    }
    join(out)
}

/// The bucket a slice `[start, start + len)` goes to at `r` seconds: a slice longer than the
/// resolution is a row of its own range (it cannot be split); the others go to the aligned
/// bucket of their start.
fn place(out: &mut BTreeMap<u64, Bucket>, start: u64, len: u64, r: u64) -> &mut Bucket {
    let b0 = if len > r { start } else { start - start % r };
    let b = out.entry(b0).or_insert(Bucket { start: b0, end: b0 + r, samples: 0, of: 0 });
    b.end = b.end.max(start.saturating_add(len));
    b
}

/// Rows must not overlap: a bucket that starts inside the previous one (which a long slice
/// stretched) joins it.
fn join(out: BTreeMap<u64, Bucket>) -> Vec<Bucket> {
    let mut rows: Vec<Bucket> = Vec::with_capacity(out.len());
    for b in out.into_values() {
        match rows.last_mut() {
            Some(p) if b.start < p.end => {
                p.end = p.end.max(b.end);
                p.samples += b.samples;
                p.of += b.of;
            }
            _ => rows.push(b),
        }
    }
    rows
}

/// Unicode block levels of a sparkline, lowest first.
const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A one-line chart of `buckets` over their whole time span in at most `width` cells: each
/// cell covers an equal share of `[first start, last end)` and shows the samples per second of
/// the buckets starting in it, scaled to the busiest cell; a cell no bucket starts in (no data)
/// is a space. Returns the chart and the seconds per cell.
pub fn sparkline(buckets: &[Bucket], width: usize) -> (String, u64) {
    let (Some(first), Some(last)) = (buckets.first(), buckets.iter().map(|b| b.end).max()) else {
        return (String::new(), 0);
    };
    let span = last - first.start;
    let width = width.max(1) as u64;
    let finest = buckets.iter().map(Bucket::seconds).min().unwrap_or(1).max(1);
    // A whole number of the finest buckets per cell, so that cells fall on bucket boundaries.
    let per = span.div_ceil(width).div_ceil(finest).max(1) * finest;
    let cells = span.div_ceil(per) as usize;
    let mut n = vec![None::<(u64, u64)>; cells.max(1)];
    for b in buckets {
        let i = ((b.start - first.start) / per) as usize;
        let c = n[i.min(cells.saturating_sub(1))].get_or_insert((0, 0));
        c.0 += b.samples;
        c.1 += b.seconds();
    }
    let rate = |(s, secs): (u64, u64)| s as f64 / secs.max(1) as f64;
    let max = n.iter().flatten().map(|&c| rate(c)).fold(0.0, f64::max);
    let chart = n
        .iter()
        .map(|c| match *c {
            None => ' ',
            Some(_) if max <= 0.0 => LEVELS[0],
            Some(c) => {
                let l = (rate(c) / max * (LEVELS.len() - 1) as f64).round() as usize;
                LEVELS[l.min(LEVELS.len() - 1)]
            }
        })
        .collect();
    (chart, per)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of Unix seconds.
pub fn utc(t: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A duration in the largest whole unit: `90s`, `1m`, `1h`, `2d`.
pub fn duration(secs: u64) -> String {
    for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if secs >= n && secs.is_multiple_of(n) {
            return format!("{}{unit}", secs / n);
        }
    }
    format!("{secs}s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile_format::ImageId;
    use std::collections::HashSet;

    fn key(event: &str, image: u8) -> SliceKey {
        SliceKey { event: event.into(), image: Some(ImageId::BuildId(vec![image; 20])) }
    }

    fn slice(start: u64, len: u64, counts: &[(SliceKey, Vec<(u64, u64)>)]) -> Slice {
        Slice { start, len, seq: 0, counts: counts.iter().cloned().collect() }
    }

    /// A pseudo-random log: minute slices over two hours with gaps, a few short ones, keys of
    /// two events and three images.
    fn log() -> Vec<Slice> {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut out = Vec::new();
        let mut t = 1_700_000_040u64;
        while t < 1_700_007_200 {
            let len = if next() % 7 == 0 { 1 + next() % 59 } else { 60 - t % 60 };
            if next() % 5 != 0 {
                let mut counts = Vec::new();
                for (e, i) in
                    [("cpu-clock", 1), ("cpu-clock", 2), ("page-faults", 1), ("cpu-clock", 3)]
                {
                    if next() % 3 != 0 {
                        let pairs =
                            (0..1 + next() % 5).map(|j| (j * 16, 1 + next() % 100)).collect();
                        counts.push((key(e, i), pairs));
                    }
                }
                out.push(slice(t, len, &counts));
            }
            t += len;
        }
        out
    }

    fn total(slices: &[Slice], event: &str) -> u64 {
        slices
            .iter()
            .flat_map(|s| &s.counts)
            .filter(|(k, _)| k.event == event)
            .flat_map(|(_, v)| v)
            .map(|&(_, c)| c)
            .sum()
    }

    #[test]
    fn buckets_at_every_resolution_sum_to_the_slices_total_exactly() {
        let slices = log();
        let want = total(&slices, "cpu-clock");
        assert!(want > 1000, "{want}");
        assert_eq!(stored_resolution(slices.iter().map(|s| s.len)), Some(60));
        for r in [1, 7, 60, 300, 3600, 86_400] {
            let b = buckets(slices.iter().map(|s| (s, 1)), r, &mut |k| {
                if k.event == "cpu-clock" {
                    Part::All
                } else {
                    Part::Out
                }
            });
            assert_eq!(b.iter().map(|b| b.samples).sum::<u64>(), want, "resolution {r}");
            assert_eq!(b.iter().map(|b| b.of).sum::<u64>(), want, "resolution {r}");
            for w in b.windows(2) {
                assert!(w[0].end <= w[1].start, "{r}: buckets overlap: {w:?}");
            }
            let aligned = b.iter().filter(|b| b.start % r == 0).count();
            if r >= 60 {
                assert_eq!(aligned, b.len(), "{r}: aligned to Unix time: {b:?}");
            }
        }
    }

    #[test]
    fn an_image_or_some_offsets_count_towards_their_bucket_and_its_share() {
        let slices = log();
        let two = key("cpu-clock", 2);
        let img: u64 =
            slices.iter().filter_map(|s| s.counts.get(&two)).flatten().map(|p| p.1).sum();
        let b = buckets(slices.iter().map(|s| (s, 1)), 600, &mut |k| match k {
            k if *k == two => Part::All,
            k if k.event == "cpu-clock" => Part::Of,
            _ => Part::Out,
        });
        assert_eq!(b.iter().map(|b| b.samples).sum::<u64>(), img);
        assert_eq!(b.iter().map(|b| b.of).sum::<u64>(), total(&slices, "cpu-clock"));
        let set: HashSet<u64> = [0, 32].into_iter().collect();
        let mut share = Share::default();
        for s in &slices {
            for &(o, c) in s.counts.get(&two).into_iter().flatten() {
                share.add(o, c, set.contains(&o));
            }
        }
        let at: u64 = slices
            .iter()
            .filter_map(|s| s.counts.get(&two))
            .flatten()
            .filter(|p| set.contains(&p.0))
            .map(|p| p.1)
            .sum();
        let b = buckets(slices.iter().map(|s| (s, 1)), 600, &mut |k| {
            if *k == two {
                Part::Offsets(&share)
            } else {
                Part::Out
            }
        });
        assert_eq!(b.iter().map(|b| b.samples).sum::<u64>(), at);
        assert_eq!(b.iter().map(|b| b.of).sum::<u64>(), img);
    }

    /// A function's samples in slices stored per 16-byte block (FORMAT.md §14.2): a block
    /// inside the function counts whole, a block outside not at all, a block straddling its
    /// edge by the profile's split.
    #[test]
    fn a_function_is_counted_in_coarse_slices_by_block() {
        let mut share = Share::default();
        // The function is [0x104, 0x118): 0x104 and 0x10c inside, 0x118 and 0x11c not.
        for (o, c, inside) in [(0x104, 6, true), (0x10c, 2, true), (0x118, 1, false)] {
            share.add(o, c, inside);
        }
        share.add(0x11c, 3, false);
        assert_eq!(share.of_block(0x100, 16, 40), 40, "a block inside the function");
        assert_eq!(share.of_block(0x120, 16, 40), 0, "a block the profile never saw");
        assert_eq!(share.of_block(0x100, 256, 12), 8, "a block straddling the edge: 8 of 12");
        assert_eq!(share.of_block(0x104, 1, 5), 5, "exact offsets");
        assert_eq!(share.of_block(0x118, 1, 5), 0);
        let k = key("cpu-clock", 1);
        let s = slice(120, 60, &[(k.clone(), vec![(0x100, 40), (0x110, 4)])]);
        let b = buckets([(&s, 16)], 60, &mut |_| Part::Offsets(&share));
        assert_eq!((b[0].samples, b[0].of), (40, 44));
    }

    #[test]
    fn totals_give_the_same_buckets_as_the_slices() {
        let mut l = SliceLog { slices: log(), ..SliceLog::default() };
        for (i, s) in l.slices.iter_mut().enumerate() {
            s.seq = i as u64 + 1;
        }
        let bytes = l.rollup_at(1_700_003_600, 3600, 256).encode();
        let path = std::path::Path::new("slices.log");
        let full = SliceLog::decode(&bytes, path).unwrap();
        let totals = SliceTotals::decode(&bytes, path).unwrap();
        let two = key("cpu-clock", 2);
        let mut part = |k: &SliceKey| match k {
            k if *k == two => Part::All,
            k if k.event == "cpu-clock" => Part::Of,
            _ => Part::Out,
        };
        for r in [60, 600, 3600] {
            let a = buckets(full.slices.iter().map(|s| (s, full.resolution_of(s))), r, &mut part);
            let b = buckets_of_totals(
                totals.slices.iter().map(|s| (s, &totals.keys[..])),
                r,
                &mut part,
            );
            assert_eq!(a, b, "resolution {r}");
            assert!(a.iter().map(|b| b.samples).sum::<u64>() > 0);
        }
    }

    #[test]
    fn hosts_add_up_by_time_and_hour_slices_stay_whole() {
        let k = key("cpu-clock", 1);
        let a = [
            slice(120, 60, &[(k.clone(), vec![(0, 5)])]),
            slice(180, 60, &[(k.clone(), vec![(0, 1)])]),
        ];
        let b = [
            slice(120, 60, &[(k.clone(), vec![(8, 7)])]),
            slice(3600, 3600, &[(k.clone(), vec![(0, 9)])]),
        ];
        let got = buckets(a.iter().chain(&b).map(|s| (s, 1)), 60, &mut |_| Part::All);
        let rows: Vec<(u64, u64, u64)> = got.iter().map(|b| (b.start, b.end, b.samples)).collect();
        assert_eq!(rows, [(120, 180, 12), (180, 240, 1), (3600, 7200, 9)]);
        assert_eq!(stored_resolution(b.iter().map(|s| s.len)), Some(3600), "ties: the longer");
    }

    #[test]
    fn the_sparkline_scales_rates_and_shows_gaps() {
        let bs = [
            Bucket { start: 0, end: 60, samples: 60, of: 60 },
            Bucket { start: 60, end: 120, samples: 30, of: 60 },
            Bucket { start: 180, end: 240, samples: 0, of: 0 },
        ];
        let (s, per) = sparkline(&bs, 80);
        assert_eq!(per, 60);
        assert_eq!(s, "█▅ ▁");
        let (s, per) = sparkline(&bs, 2);
        assert_eq!((s.chars().count(), per), (2, 120));
        assert_eq!(sparkline(&[], 10), (String::new(), 0));
    }

    #[test]
    fn times_and_durations_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(duration(60), "1m");
        assert_eq!(duration(3600), "1h");
        assert_eq!(duration(90), "90s");
        assert_eq!(duration(172_800), "2d");
    }
}
