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

use std::collections::{BTreeMap, HashSet};

use profile_format::{HostDir, Slice, SliceKey, SliceLog};

use crate::select::par_map;

/// The slice log of each host directory (same order), read in parallel (a fleet's are many
/// files, on NFS). `Ok(None)`: the directory has no `slices.log`.
pub fn read_logs(dirs: &[HostDir]) -> Vec<profile_format::Result<Option<SliceLog>>> {
    par_map(dirs, |_, d| d.read_slices())
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
    /// Of these offsets: selection and total; the other offsets: total only (one function).
    Offsets(&'a HashSet<u64>),
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
pub fn stored_resolution<'a>(slices: impl IntoIterator<Item = &'a Slice>) -> Option<u64> {
    let mut n: BTreeMap<u64, u64> = BTreeMap::new();
    for s in slices {
        *n.entry(s.len.max(1)).or_default() += 1;
    }
    n.into_iter().max_by_key(|&(len, c)| (c, len)).map(|(len, _)| len)
}

/// The buckets of `slices` at `resolution` seconds, in order of start; `part` says what each
/// key counts towards. Buckets with no slice are not listed (nothing was sampled then, or the
/// daemon did not run).
pub fn buckets<'s, 'p>(
    slices: impl IntoIterator<Item = &'s Slice>,
    resolution: u64,
    part: &mut dyn FnMut(&SliceKey) -> Part<'p>,
) -> Vec<Bucket> {
    let r = resolution.max(1);
    let mut out: BTreeMap<u64, Bucket> = BTreeMap::new();
    let mut parts: BTreeMap<&SliceKey, Part<'p>> = BTreeMap::new();
    for s in slices {
        // A slice longer than the resolution is a row of its own range (it cannot be split);
        // the others go to the aligned bucket of their start.
        let start = if s.len > r { s.start } else { s.start - s.start % r };
        let b = out.entry(start).or_insert(Bucket { start, end: start + r, samples: 0, of: 0 });
        b.end = b.end.max(s.end());
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
                Part::Offsets(set) => {
                    for &(o, c) in pairs {
                        b.of += c;
                        if set.contains(&o) {
                            b.samples += c;
                        }
                    }
                }
            }
        }
    }
    // Rows must not overlap: a bucket that starts inside the previous one (which a long
    // slice stretched) joins it.
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
        assert_eq!(stored_resolution(&slices), Some(60));
        for r in [1, 7, 60, 300, 3600, 86_400] {
            let b = buckets(&slices, r, &mut |k| {
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
        let b = buckets(&slices, 600, &mut |k| match k {
            k if *k == two => Part::All,
            k if k.event == "cpu-clock" => Part::Of,
            _ => Part::Out,
        });
        assert_eq!(b.iter().map(|b| b.samples).sum::<u64>(), img);
        assert_eq!(b.iter().map(|b| b.of).sum::<u64>(), total(&slices, "cpu-clock"));
        let set: HashSet<u64> = [0, 32].into_iter().collect();
        let at: u64 = slices
            .iter()
            .filter_map(|s| s.counts.get(&two))
            .flatten()
            .filter(|p| set.contains(&p.0))
            .map(|p| p.1)
            .sum();
        let b =
            buckets(&slices, 600, &mut |k| if *k == two { Part::Offsets(&set) } else { Part::Out });
        assert_eq!(b.iter().map(|b| b.samples).sum::<u64>(), at);
        assert_eq!(b.iter().map(|b| b.of).sum::<u64>(), img);
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
        let got = buckets(a.iter().chain(&b), 60, &mut |_| Part::All);
        let rows: Vec<(u64, u64, u64)> = got.iter().map(|b| (b.start, b.end, b.samples)).collect();
        assert_eq!(rows, [(120, 180, 12), (180, 240, 1), (3600, 7200, 9)]);
        assert_eq!(stored_resolution(&b), Some(3600), "ties: the longer");
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
