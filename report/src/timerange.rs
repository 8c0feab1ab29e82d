//! Exact time ranges (`--since`/`--until`, issue 36): the counts of a range come from the
//! host directories' time slices (`slices.log`, FORMAT.md §14) instead of their epoch totals.
//!
//! Part of the one selection model ([`super::select`]): `--since`/`--until` first choose the
//! epochs that overlap the range ([`super::select::EpochSel::Between`]), then every loaded
//! profile of a chosen host directory gets, in place of its counts, the sum of that
//! directory's slices that intersect the range, for the profile's key (event, image id), offset
//! by offset: the same in-memory profiles the reports use, so every report and export works on
//! a range unchanged.
//!
//! A host directory without `slices.log` (a database written before §14, or a daemon with
//! `slice_interval = 0`) has no time axis: it is counted whole when its epoch lies entirely
//! inside the range (then the range is honoured exactly for it), and left out, named in a
//! warning and in the header, when the range cuts its epoch.

use std::collections::BTreeMap;

use profile_format::{merge_pairs, HostDir, ImageKind, ProfileHeader, SliceKey};
use serde::Serialize;

use super::error::ProfError;

/// A `--since`/`--until` request: `[since, until)` in Unix seconds, either end open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeRange {
    pub since: Option<u64>,
    pub until: Option<u64>,
}

impl TimeRange {
    pub fn new(since: Option<u64>, until: Option<u64>) -> Self {
        Self { since, until }
    }
}

/// What a time range selection covered: report headers say it, JSON carries it as `time`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TimeCoverage {
    /// The request (Unix seconds; `null`: open).
    pub since: Option<u64>,
    pub until: Option<u64>,
    /// `[start, end)` exactly covered by the slices used: the request rounded outwards to the
    /// stored resolution (`null`: no slice intersects the range).
    pub covered: Option<(u64, u64)>,
    /// Host directories (`epoch/host`) without time slices whose epoch lies inside the range:
    /// counted whole.
    pub whole_epochs: Vec<String>,
    /// Host directories (`epoch/host`) without time slices whose epoch the range cuts: their
    /// samples cannot be placed in time and are left out.
    pub left_out: Vec<String>,
    /// The coarsest offset resolution, in bytes, of the slices used (FORMAT.md §14.2): 1 when
    /// every slice counts exact offsets. Above 1, a slice counts the samples of each
    /// `resolution`-byte block of an image, and the range's counts are placed on the offsets
    /// of the block by the epoch profile's split of that block ([`apportion`]): per-image
    /// totals stay exact, per-function totals too where a block lies inside one function,
    /// per-instruction counts are the block's share.
    pub resolution: u64,
}

fn utc(t: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
        .to_string()
}

fn secs(d: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(d)).to_string()
}

impl TimeCoverage {
    /// How much the covered range reaches beyond the request: (seconds before `since`,
    /// seconds after `until`), each 0 when the request fell on a slice boundary (or is open).
    pub fn rounded_by(&self) -> (u64, u64) {
        let Some((a, b)) = self.covered else { return (0, 0) };
        let before = self.since.map_or(0, |s| s.saturating_sub(a));
        let after = self.until.map_or(0, |u| b.saturating_sub(u));
        (before, after)
    }

    /// The header lines: the range covered, how the request was rounded, what was left out.
    pub fn lines(&self) -> Vec<String> {
        let end = |t: Option<u64>, open: &str| t.map_or(open.to_owned(), utc);
        let req = format!("{} .. {}", end(self.since, "epoch start"), end(self.until, "now"));
        let mut out = Vec::new();
        match self.covered {
            Some((a, b)) => {
                let mut l =
                    format!("time: {} .. {} (slices covered; requested {req}", utc(a), utc(b));
                let (before, after) = self.rounded_by();
                if before > 0 || after > 0 {
                    let mut parts = Vec::new();
                    if before > 0 {
                        parts.push(format!("{} earlier start", secs(before)));
                    }
                    if after > 0 {
                        parts.push(format!("{} later end", secs(after)));
                    }
                    l.push_str(&format!("; rounded to the stored slices: {}", parts.join(", ")));
                }
                l.push(')');
                out.push(l);
            }
            None => out.push(format!("time: no time slice in the requested range {req}")),
        }
        if self.resolution > 1 {
            out.push(format!(
                "time: offsets at {}-byte resolution in this range: each block's samples are \
                 placed on its instructions by the epoch profile's split of the block, so \
                 per-instruction counts are estimates; image totals are exact, function totals \
                 too except where a block straddles two functions",
                self.resolution
            ));
        }
        if !self.whole_epochs.is_empty() {
            out.push(format!(
                "time: without time slices, counted whole (the epoch lies inside the range): {}",
                self.whole_epochs.join(", ")
            ));
        }
        if !self.left_out.is_empty() {
            out.push(format!(
                "time: without time slices, LEFT OUT (the range cuts the epoch; its samples \
                 cannot be placed in time): {}",
                self.left_out.join(", ")
            ));
        }
        out
    }
}

/// What one host directory contributes to a range.
#[derive(Debug)]
pub enum DirRange {
    /// Its slices in the range: per offset resolution (bytes, finest first), per key, summed
    /// (offset, count); the range they cover and their coarsest resolution.
    Slices {
        covered: Option<(u64, u64)>,
        sums: Vec<(u64, BTreeMap<SliceKey, Vec<(u64, u64)>>)>,
        resolution: u64,
    },
    /// No slices, its epoch inside the range: the epoch totals as they are.
    Whole,
    /// No slices, the range cuts its epoch: nothing.
    LeftOut,
}

/// The key of a profile in a slice log: (event, image id), no id for the unknown profile.
pub fn slice_key(h: &ProfileHeader) -> SliceKey {
    SliceKey {
        event: h.event.name.clone(),
        image: (h.kind != ImageKind::Unknown).then(|| h.image_id.clone()),
    }
}

impl DirRange {
    /// Read `d`'s slices for `r`. `span` is its epoch's `[start, end)` (end `u64::MAX` for
    /// the newest epoch), which decides a directory without slices.
    pub fn read(d: &HostDir, r: TimeRange, span: (u64, u64)) -> Result<Self, ProfError> {
        match d.read_slices_in(r.since, r.until)? {
            Some(log) => {
                let sel = log.range(r.since, r.until);
                let resolution = log.range_resolution(&sel);
                Ok(Self::Slices { covered: sel.covered, sums: log.range_sums(&sel), resolution })
            }
            None => {
                let inside = r.since.is_none_or(|s| s <= span.0)
                    && r.until.is_none_or(|u| span.1 != u64::MAX && span.1 <= u);
                Ok(if inside { Self::Whole } else { Self::LeftOut })
            }
        }
    }

    /// [`DirRange::read`] of the keys `want` selects only: the other keys' pairs are not
    /// decoded ([`profile_format::SliceIndex::pairs`]), nor those of slices that hold none of
    /// them (a per-symbol report over a range needs one image's pairs, a sixth of the slices'
    /// on the bench's mix). Coverage and resolution are those of every slice of the range, as
    /// [`DirRange::read`] gives them.
    pub fn read_keys(
        d: &HostDir,
        r: TimeRange,
        span: (u64, u64),
        want: &dyn Fn(&SliceKey) -> bool,
    ) -> Result<Self, ProfError> {
        let Some(ix) = d.read_slice_index_in(r.since, r.until)? else {
            return Self::read(d, r, span);
        };
        let t = &ix.totals;
        let wanted: Vec<bool> = t.keys.iter().map(want).collect();
        let (since, until) = (r.since.unwrap_or(0), r.until.unwrap_or(u64::MAX));
        let mut covered: Option<(u64, u64)> = None;
        let mut resolution = 1;
        // Per resolution, per key index: the pair lists of its slices.
        let mut parts: BTreeMap<u64, BTreeMap<usize, Vec<Vec<(u64, u64)>>>> = BTreeMap::new();
        for (j, s) in t.slices.iter().enumerate() {
            if !(s.start < until && s.end() > since) {
                continue;
            }
            covered =
                Some(covered.map_or((s.start, s.end()), |(a, b)| (a.min(s.start), b.max(s.end()))));
            let res = t.resolution_of(s);
            resolution = resolution.max(res);
            if !s.totals.iter().any(|&(i, _)| wanted[i]) {
                continue;
            }
            let by_key = parts.entry(res).or_default();
            for (i, v) in ix.pairs(j, &|i| wanted[i])? {
                by_key.entry(i).or_default().push(v);
            }
        }
        let sums = parts
            .into_iter()
            .map(|(res, by_key)| {
                let m =
                    by_key.into_iter().map(|(i, v)| (t.keys[i].clone(), sum_parts(v))).collect();
                (res, m)
            })
            .collect();
        Ok(Self::Slices { covered, sums, resolution })
    }

    /// [`DirRange::read`] keeping each key's total only, at offset 0 (for
    /// [`DirRange::take_total`]); the resolution is still the slices' (the header says it).
    pub fn read_totals(d: &HostDir, r: TimeRange, span: (u64, u64)) -> Result<Self, ProfError> {
        match d.read_slice_totals_in(r.since, r.until)? {
            Some(log) => {
                let sel = log.range(r.since, r.until);
                let covered = sel.iter().fold(None, |acc: Option<(u64, u64)>, s| {
                    Some(acc.map_or((s.start, s.end()), |(a, b)| (a.min(s.start), b.max(s.end()))))
                });
                let mut sums: BTreeMap<SliceKey, Vec<(u64, u64)>> = BTreeMap::new();
                let mut by_index: BTreeMap<usize, u64> = BTreeMap::new();
                for s in &sel {
                    for &(i, n) in &s.totals {
                        *by_index.entry(i).or_default() += n;
                    }
                }
                for (i, n) in by_index {
                    sums.insert(log.keys[i].clone(), vec![(0, n)]);
                }
                let resolution = sel.iter().map(|s| log.resolution_of(s)).max().unwrap_or(1);
                Ok(Self::Slices { covered, sums: vec![(1, sums)], resolution })
            }
            None => Self::read(d, r, span),
        }
    }

    /// Take the range's counts of `key` at exact offsets (each key once per directory: a
    /// continuation file of the same key gets nothing more). Counts stored at a coarser
    /// resolution are placed on the offsets of `reference` (the epoch profile's exact counts
    /// of the key) by [`apportion`]. `None`: keep the profile as it is (whole epoch).
    pub fn take(
        &mut self,
        key: &SliceKey,
        reference: &BTreeMap<u64, u64>,
    ) -> Option<Vec<(u64, u64)>> {
        match self {
            Self::Slices { sums, .. } => {
                let mut out: Vec<(u64, u64)> = Vec::new();
                for (res, by_key) in sums.iter_mut() {
                    let Some(pairs) = by_key.remove(key) else { continue };
                    // Unknown-sample keys (no image) are always exact (§14.2).
                    let pairs = if *res > 1 && key.image.is_some() {
                        apportion(&pairs, *res, reference)
                    } else {
                        pairs
                    };
                    out = if out.is_empty() { pairs } else { merge_pairs(&out, &pairs) };
                }
                Some(out)
            }
            Self::Whole => None,
            Self::LeftOut => Some(Vec::new()),
        }
    }

    /// The range's samples of `key` (taken, as [`DirRange::take`]); `None`: the whole epoch's.
    pub fn take_total(&mut self, key: &SliceKey) -> Option<u64> {
        match self {
            Self::Slices { sums, .. } => Some(
                sums.iter_mut()
                    .filter_map(|(_, by_key)| by_key.remove(key))
                    .flatten()
                    .fold(0u64, |a, (_, c)| a.saturating_add(c)),
            ),
            Self::Whole => None,
            Self::LeftOut => Some(0),
        }
    }
}

/// Pair lists (each sorted by offset) summed per offset: one sort of their concatenation, not
/// a merge per list (a day of minutes merged one by one into a growing list was quadratic in
/// the slices).
pub(crate) fn sum_parts(parts: Vec<Vec<(u64, u64)>>) -> Vec<(u64, u64)> {
    if parts.len() <= 1 {
        return parts.into_iter().next().unwrap_or_default();
    }
    let mut all: Vec<(u64, u64)> = parts.concat();
    all.sort_unstable_by_key(|p| p.0);
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (o, c) in all {
        match out.last_mut() {
            Some(last) if last.0 == o => last.1 = last.1.saturating_add(c),
            _ => out.push((o, c)),
        }
    }
    out
}

/// Place counts stored per `res`-byte block (`blocks`: (block start, count), starts multiples
/// of `res`, increasing) on exact offsets: each block's count is split over the offsets of
/// `reference` inside the block (the epoch profile, which counts exact offsets) in proportion
/// to their counts there, by largest remainder, so that every block keeps its count exactly. A
/// block holding no offset of `reference` (sampled after the profile was last published) keeps
/// its count at its start. Where a block lies inside one function, that function's total is
/// therefore exact whatever the split; a block that straddles two functions (a function not
/// aligned to `res`) is split between them as the whole epoch split it (BENCHMARKS.md, "time
/// slices at a coarser offset resolution": how often that happens).
pub fn apportion(
    blocks: &[(u64, u64)],
    res: u64,
    reference: &BTreeMap<u64, u64>,
) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(blocks.len());
    let mut shares: Vec<(u64, u64, u128)> = Vec::new();
    for &(b, c) in blocks {
        let inside: Vec<(u64, u64)> = reference
            .range(b..b.saturating_add(res))
            .filter(|(_, &w)| w > 0)
            .map(|(&o, &w)| (o, w))
            .collect();
        let weight: u128 = inside.iter().map(|&(_, w)| w as u128).sum();
        if weight == 0 {
            push_pair(&mut out, b, c);
            continue;
        }
        shares.clear();
        let mut given = 0u64;
        for &(o, w) in &inside {
            let exact = c as u128 * w as u128;
            let n = (exact / weight) as u64;
            given += n;
            shares.push((o, n, exact % weight));
        }
        // The remainder, one each, to the largest fractional parts (ties: the lower offset).
        let mut order: Vec<usize> = (0..shares.len()).collect();
        order.sort_by(|&i, &j| shares[j].2.cmp(&shares[i].2).then(i.cmp(&j)));
        for &i in order.iter().take((c - given) as usize) {
            shares[i].1 += 1;
        }
        for &(o, n, _) in &shares {
            if n > 0 {
                push_pair(&mut out, o, n);
            }
        }
    }
    out
}

fn push_pair(out: &mut Vec<(u64, u64)>, o: u64, c: u64) {
    match out.last_mut() {
        Some(l) if l.0 == o => l.1 = l.1.saturating_add(c),
        _ => out.push((o, c)),
    }
}

/// The coverage of per-directory ranges (`names[i]` is directory i's `epoch/host`).
pub fn coverage(r: TimeRange, ranges: &[DirRange], names: &[String]) -> TimeCoverage {
    let mut cov =
        TimeCoverage { since: r.since, until: r.until, resolution: 1, ..Default::default() };
    for (x, name) in ranges.iter().zip(names) {
        match x {
            DirRange::Slices { covered: Some((a, b)), resolution, .. } => {
                cov.covered = Some(cov.covered.map_or((*a, *b), |(x, y)| (x.min(*a), y.max(*b))));
                cov.resolution = cov.resolution.max(*resolution);
            }
            DirRange::Slices { covered: None, .. } => {}
            DirRange::Whole => cov.whole_epochs.push(name.clone()),
            DirRange::LeftOut => cov.left_out.push(name.clone()),
        }
    }
    cov
}

/// The warning for directories left out of a range (none: nothing to say).
pub fn left_out_warning(cov: &TimeCoverage) -> Option<String> {
    (!cov.left_out.is_empty()).then(|| {
        format!(
            "--since/--until: {} host-epoch(s) have no time slices (slices.log; written before \
             slices existed or with slice_interval = 0) and the range cuts their epoch: left out \
             of the report: {}",
            cov.left_out.len(),
            cov.left_out.join(", ")
        )
    })
}

/// Scale totals `(samples, period)` to `samples` samples: the mean period (`period /
/// samples`), which weights each sample, stays.
pub fn rescale(total_samples: u64, total_period: u64, samples: u64) -> (u64, u64) {
    if total_samples == 0 {
        return (samples, total_period);
    }
    (samples, (total_period as u128 * samples as u128 / total_samples as u128) as u64)
}

#[cfg(test)]
mod tests;
