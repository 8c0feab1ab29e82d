//! Building reports from loaded profiles: weighting, per-image and per-symbol aggregation.
//!
//! Weighting: a count `c` in a profile represents `c * total_period / total_samples` events of
//! that profile's event (each profile weighted on its own before anything is summed, since
//! profiles of different epochs, hosts or period windows have different mean periods), times
//! `time_enabled / time_running` of the event in the host summary when the counter was
//! multiplexed (ratio > 1). `samples` in a report is always the raw number of samples;
//! `events` is that weighted estimate; `percent` is the share of `events` (like `perf report`'s
//! overhead, which is period-weighted too). Rows are sorted by the first event's `events`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use profile_format::{ImageId, ImageKind};
use serde::Serialize;

use super::debuginfo::{find_debug_file, live_vdso, Located, Locator};
pub use super::error::Candidate;
use super::image::{build_id_hex, image_display, image_label, parse_spec, spec_rank, Spec};
pub use super::image::{display_path, kind_name, ImageFilter};
use super::names::display_name;
use super::select::{epochs_and_hosts, Loaded, TotalRow, Totals};
use super::symbolize::{elf_identity, ElfError, ElfSymbolizer, SymbolTable};
pub use super::symbolizer::{kernel_lookup, unsymbolized, ElfState, SymbolMode};
use super::symbolizer::{JitTable, Kallsyms, Snapshots, Source};
use super::symcache::{CacheKey, SymbolCache};
use super::ProfError;

/// Whether an event's counts are nanoseconds rather than samples (a *time-weighted* event):
/// dcpid's off-CPU time (`off-cpu`, issue 40; FORMAT.md §5.2: each wait adds its length in
/// nanoseconds, period 1). Reports show such an event as time (seconds in text tables),
/// keep the nanoseconds in JSON and CSV, and never call them samples.
pub fn time_weighted(event: &str) -> bool {
    event == "off-cpu"
}

/// Nanoseconds as seconds for a text table: `2.345 s` (millisecond resolution).
pub fn seconds_text(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// One event in a report header.
#[derive(Clone, Debug, Serialize)]
pub struct EventInfo {
    pub name: String,
    /// Raw samples of this event in the report's scope.
    pub samples: u64,
    /// Weighted estimate of events represented.
    pub events: u64,
    /// Mean period actually in force (sum of periods / samples).
    pub mean_period: f64,
    /// Configured mean period of the randomization window.
    pub nominal_period: u64,
    /// Largest multiplexing scale applied (1 when never multiplexed).
    pub multiplex_scale: f64,
}

/// Per-event numbers of one row.
#[derive(Clone, Debug, Serialize)]
pub struct EventCount {
    pub event: String,
    pub samples: u64,
    pub events: u64,
    pub percent: f64,
}

/// A row of the per-image report.
#[derive(Clone, Debug, Serialize)]
pub struct ImageRow {
    pub image: String,
    pub kind: &'static str,
    /// Text form of the image identity (`b<hex>` or `f<hex>`); null for `[unknown]`.
    pub image_id: Option<String>,
    pub build_id: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
}

/// The numbers of one ranked row (image, symbol, global symbol): the first event's at top
/// level, then every event's. Embedded with `#[serde(flatten)]`, so a row's JSON keeps its
/// flat shape (`samples`, `events`, `percent`, `cumulative_percent`, `counts: [COUNT]`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    /// Raw samples of the first event.
    pub samples: u64,
    /// Weighted events of the first event.
    pub events: u64,
    /// Share of the first event's `events` (what the total is, the report says).
    pub percent: f64,
    /// `percent` summed over this row and every row ranked above it.
    pub cumulative_percent: f64,
    /// Per event, in the report's event order.
    #[serde(rename = "counts")]
    pub per_event: Vec<EventCount>,
}

impl Counts {
    /// A row's numbers from its per-event counts: the top level is the first event's.
    pub fn new(per_event: Vec<EventCount>, cumulative_percent: f64) -> Self {
        let (samples, events, percent) =
            per_event.first().map_or((0, 0, 0.0), |c| (c.samples, c.events, c.percent));
        Self { samples, events, percent, cumulative_percent, per_event }
    }
}

/// Lets a row's numbers read as the row's own (`row.samples`, `row.percent`) for a row type
/// with a `counts: Counts` field: the code that reads rows did not change when the numbers got
/// one home.
#[macro_export]
macro_rules! counts_deref {
    ($($row:ty),*) => {$(
        impl std::ops::Deref for $row {
            type Target = $crate::report::Counts;
            fn deref(&self) -> &$crate::report::Counts {
                &self.counts
            }
        }
    )*};
}
counts_deref!(ImageRow, SymbolRow);

/// A row of the per-symbol report.
#[derive(Clone, Debug, Serialize)]
pub struct SymbolRow {
    pub symbol: String,
    /// `file:line` with `--lines`; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
}

/// The image a per-symbol report is about.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ImageInfo {
    pub path: String,
    pub kind: &'static str,
    pub image_id: Option<String>,
    pub build_id: Option<String>,
    /// Binary used for symbols, if any.
    pub binary: Option<String>,
    pub debug_file: Option<String>,
    /// What the symbols lack and how to get them (a stripped binary with only `.dynsym`):
    /// said in the table's header. Not part of the JSON schema.
    #[serde(skip)]
    pub symbols_note: Option<String>,
    /// Why the image's function names are missing or partial, when they are (for the one-line
    /// summary of such images). Not part of the JSON schema.
    #[serde(skip)]
    pub names_missing: Option<NamesMissing>,
    /// The names come from the database's stored symbol table (FORMAT.md §10): the binary of
    /// this build was not found (rebuilt or deleted). No source lines or inlined functions.
    #[serde(skip)]
    pub from_symbol_store: bool,
}

impl ImageInfo {
    /// An image known by its path and kind only: what it is named with (identity, binary,
    /// debug file, notes) is filled in by whoever finds it.
    pub fn new(path: String, kind: &'static str) -> Self {
        Self {
            path,
            kind,
            image_id: None,
            build_id: None,
            binary: None,
            debug_file: None,
            symbols_note: None,
            names_missing: None,
            from_symbol_store: false,
        }
    }
}

/// Why an image's function names are missing (or only the exported ones are known).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NamesMissing {
    /// No binary of this build found, and no stored symbol table.
    NotFound,
    /// Only another build of the binary found, and no stored symbol table.
    OtherBuild,
    /// The binary found cannot be read or parsed.
    Unreadable,
    /// The binary has no symbols at all and no debug file was found.
    Stripped,
    /// Stripped, no debug file: only exported functions (`.dynsym`) are named.
    NoDebugFile,
}

impl NamesMissing {
    /// Short lowercase reason, as a summary line shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "binary not found",
            Self::OtherBuild => "binary rebuilt (other build-id)",
            Self::Unreadable => "unreadable",
            Self::Stripped => "stripped",
            Self::NoDebugFile => "no debug file",
        }
    }
}

impl std::fmt::Display for NamesMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Common header fields.
#[derive(Clone, Debug, Serialize)]
pub struct Scope {
    pub database: String,
    pub epochs: Vec<String>,
    pub hosts: Vec<String>,
    /// Unix seconds of the newest summary write among the selected host directories (0 when
    /// none says): how fresh the report is. Table header only; not part of the JSON schema.
    #[serde(skip)]
    pub newest_data: u64,
    /// `--since`/`--until`: the time range the counts are of (absent: whole epochs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<super::timerange::TimeCoverage>,
}

/// Epochs as report headers show them: `none`, the one, or `first .. last (N epochs)`.
pub fn epoch_range(epochs: &[String]) -> String {
    match epochs {
        [] => "none".to_owned(),
        [one] => one.clone(),
        [first, .., last] => format!("{first} .. {last} ({} epochs)", epochs.len()),
    }
}

/// What the ranked reports (per image, global per symbol) start with. Flattened into their
/// JSON, so its keys stay at the top level.
#[derive(Clone, Debug, Serialize)]
pub struct Head {
    pub report: &'static str,
    #[serde(flatten)]
    pub scope: Scope,
    pub events: Vec<EventInfo>,
    /// The first event's samples in the selection.
    pub total_samples: u64,
    /// Rows left out by `--limit`.
    pub rows_omitted: usize,
}

impl Head {
    /// The head of the report named `report` over `w`'s events, `rows_omitted` rows left out.
    pub fn new(report: &'static str, scope: Scope, w: &Weights, rows_omitted: usize) -> Self {
        Self {
            report,
            scope,
            events: w.infos.clone(),
            total_samples: w.infos.first().map_or(0, |i| i.samples),
            rows_omitted,
        }
    }
}

/// `dcpiprof` (no `--image`).
#[derive(Clone, Debug, Serialize)]
pub struct ImageReport {
    #[serde(flatten)]
    pub head: Head,
    /// Whether the idle task's samples (`[idle]`) are in the rows and the percentages.
    pub idle: IdleShare,
    pub rows: Vec<ImageRow>,
}

/// How much of the selection the idle task took (`[idle]`, first event).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct IdleShare {
    /// False with `--no-idle`: the rows and percentages leave the idle task out.
    pub included: bool,
    /// Share of `[idle]` in the report (0 when excluded or absent).
    pub percent: f64,
}

impl IdleShare {
    /// At least this share of idle makes a report say the machine was mostly idle.
    pub const MOSTLY_IDLE_PERCENT: f64 = 50.0;

    pub fn mostly_idle(&self) -> bool {
        self.included && self.percent >= Self::MOSTLY_IDLE_PERCENT
    }
}

/// `dcpiprof --image X`.
#[derive(Clone, Debug, Serialize)]
pub struct SymbolReport {
    pub report: &'static str,
    #[serde(flatten)]
    pub scope: Scope,
    pub image: ImageInfo,
    pub events: Vec<EventInfo>,
    pub total_samples: u64,
    pub rows_omitted: usize,
    pub rows: Vec<SymbolRow>,
}

/// Resolved events and per-profile weights.
#[derive(Debug)]
pub struct Weights {
    pub events: Vec<String>,
    /// Per loaded profile (same index): event index (None if not selected) and events/sample.
    pub per_profile: Vec<Option<(usize, f64)>>,
    pub infos: Vec<EventInfo>,
}

/// The rows of loaded profiles (one group each).
fn loaded_rows(loaded: &Loaded) -> impl Iterator<Item = TotalRow<'_>> + Clone {
    loaded.profiles.iter().enumerate().map(|(i, p)| TotalRow {
        dir: p.dir,
        header: &p.profile.header,
        group: i,
        samples: p.samples,
        total_samples: p.profile.header.total_samples,
        total_period: p.profile.header.total_period,
    })
}

/// Decide the event columns (`--event` order, else summary order then name) and weights.
pub fn weights(loaded: &Loaded, wanted: &[String]) -> Result<Weights, ProfError> {
    weights_of_rows(&loaded.summaries, loaded_rows(loaded), wanted)
}

/// [`weights`] of the per-image totals.
pub fn weights_of_totals(t: &Totals, wanted: &[String]) -> Result<Weights, ProfError> {
    weights_of_rows(&t.summaries, t.rows(), wanted)
}

fn weights_of_rows<'a>(
    summaries: &[Option<profile_format::HostSummary>],
    rows: impl Iterator<Item = TotalRow<'a>> + Clone,
    wanted: &[String],
) -> Result<Weights, ProfError> {
    let in_rows: HashSet<&str> = rows.clone().map(|r| r.header.event.name.as_str()).collect();
    let mut present: Vec<String> = Vec::new();
    for s in summaries.iter().flatten() {
        for e in &s.events {
            if let Some(d) = &e.desc {
                if !present.contains(&d.name) && in_rows.contains(d.name.as_str()) {
                    present.push(d.name.clone());
                }
            }
        }
    }
    let mut rest: BTreeSet<String> = BTreeSet::new();
    for name in in_rows {
        if !present.iter().any(|p| p == name) {
            rest.insert(name.to_owned());
        }
    }
    present.extend(rest);
    let events: Vec<String> = if wanted.is_empty() {
        present.clone()
    } else {
        for w in wanted {
            if !present.contains(w) {
                return Err(ProfError::UnknownEvent {
                    event: w.clone(),
                    available: if present.is_empty() { "none".into() } else { present.join(", ") },
                    scope: "the selected epochs and hosts".into(),
                });
            }
        }
        let mut v: Vec<String> = Vec::new();
        for w in wanted {
            if !v.contains(w) {
                v.push(w.clone());
            }
        }
        v
    };
    let mut infos: Vec<EventInfo> = events
        .iter()
        .map(|n| EventInfo {
            name: n.clone(),
            samples: 0,
            events: 0,
            mean_period: 0.0,
            nominal_period: 0,
            multiplex_scale: 1.0,
        })
        .collect();
    let mut period_sums = vec![0u128; events.len()];
    let mut event_sums = vec![0f64; events.len()];
    let mut per_profile = Vec::with_capacity(rows.size_hint().0);
    for p in rows {
        let h = p.header;
        let Some(ei) = events.iter().position(|e| *e == h.event.name) else {
            per_profile.push(None);
            continue;
        };
        let mux = summaries[p.dir]
            .as_ref()
            .and_then(|s| {
                s.events.iter().find(|e| e.desc.as_ref().is_some_and(|d| d.name == h.event.name))
            })
            .filter(|e| e.time_running_ns > 0 && e.time_enabled_ns > e.time_running_ns)
            .map_or(1.0, |e| e.time_enabled_ns as f64 / e.time_running_ns as f64);
        let samples = p.samples;
        // Profiles written without period tracking fall back to the configured mean.
        let per_sample = if p.total_samples > 0 && p.total_period > 0 {
            p.total_period as f64 / p.total_samples as f64
        } else {
            h.event.period_mean.max(1) as f64
        };
        let w = per_sample * mux;
        let info = &mut infos[ei];
        info.samples += samples;
        info.nominal_period = info.nominal_period.max(h.event.period_mean);
        info.multiplex_scale = info.multiplex_scale.max(mux);
        period_sums[ei] += (per_sample * samples as f64) as u128;
        event_sums[ei] += w * samples as f64;
        per_profile.push(Some((ei, w)));
    }
    for (i, info) in infos.iter_mut().enumerate() {
        info.events = event_sums[i].round() as u64;
        info.mean_period =
            if info.samples > 0 { period_sums[i] as f64 / info.samples as f64 } else { 0.0 };
    }
    Ok(Weights { events, per_profile, infos })
}

/// Per-row accumulator: samples and weighted events per event column.
#[derive(Clone, Debug)]
struct Acc {
    samples: Vec<u64>,
    events: Vec<f64>,
}

impl Acc {
    fn new(n: usize) -> Self {
        Self { samples: vec![0; n], events: vec![0.0; n] }
    }
    fn add(&mut self, ei: usize, count: u64, w: f64) {
        self.samples[ei] += count;
        self.events[ei] += count as f64 * w;
    }
}

/// `part` as a percentage of `total`, rounded to four decimals (0 when `total` is 0): every
/// report's `percent` and `cumulative_percent`.
pub fn pct(part: f64, total: f64) -> f64 {
    if total > 0.0 {
        (part / total * 1e6).round() / 1e4
    } else {
        0.0
    }
}

/// Turn accumulated rows into sorted (key, counts, cumulative) with percents of `totals`.
fn finish<K: Ord + Clone>(
    rows: BTreeMap<K, Acc>,
    names: &[String],
    name_of: impl Fn(&K) -> String,
) -> Vec<(K, Counts)> {
    let n = names.len();
    let mut totals = vec![0f64; n];
    for a in rows.values() {
        for (t, e) in totals.iter_mut().zip(&a.events) {
            *t += e;
        }
    }
    let mut v: Vec<(K, Acc)> = rows.into_iter().collect();
    v.sort_by(|(ka, a), (kb, b)| {
        let (ea, eb) =
            (a.events.first().copied().unwrap_or(0.0), b.events.first().copied().unwrap_or(0.0));
        eb.total_cmp(&ea)
            .then(b.samples.first().cmp(&a.samples.first()))
            .then_with(|| name_of(ka).cmp(&name_of(kb)))
    });
    let mut cum = 0.0;
    v.into_iter()
        .map(|(k, a)| {
            let counts: Vec<EventCount> = (0..n)
                .map(|i| EventCount {
                    event: names[i].clone(),
                    samples: a.samples[i],
                    events: a.events[i].round() as u64,
                    percent: pct(a.events[i], totals[i]),
                })
                .collect();
            cum += a.events.first().copied().unwrap_or(0.0);
            let c = pct(cum, totals.first().copied().unwrap_or(0.0));
            (k, Counts::new(counts, c))
        })
        .collect()
}

pub fn scope(loaded: &Loaded, db: &str) -> Scope {
    scope_of(&loaded.scan, db)
}

fn scope_of(scan: &super::select::Scanned, db: &str) -> Scope {
    let (epochs, hosts) = epochs_and_hosts(&scan.dirs);
    let newest_data = scan.summaries.iter().flatten().map(|s| s.last_written).max().unwrap_or(0);
    Scope { database: db.to_owned(), epochs, hosts, newest_data, time: scan.time.clone() }
}

/// The per-image report.
pub fn image_report(loaded: &Loaded, w: &Weights, db: &str, limit: Option<usize>) -> ImageReport {
    let scope = scope(loaded, db);
    image_report_of_rows(loaded_rows(loaded), w, scope, limit, loaded.idle_excluded)
}

/// [`image_report`] of the per-image totals.
pub fn image_report_of_totals(
    t: &Totals,
    w: &Weights,
    db: &str,
    limit: Option<usize>,
) -> ImageReport {
    let scope = scope_of(&t.scan, db);
    image_report_of_rows(t.rows(), w, scope, limit, t.idle_excluded)
}

fn image_report_of_rows<'a>(
    rows_in: impl Iterator<Item = TotalRow<'a>>,
    w: &Weights,
    scope: Scope,
    limit: Option<usize>,
    idle_excluded: bool,
) -> ImageReport {
    type Key = (ImageKind, Option<ImageId>);
    // Each row is added to its key's accumulator in the order of the rows, so the sums (and
    // their rounding) are the same however the rows were loaded.
    let mut slot_of_group: Vec<u32> = Vec::new();
    let mut slot_of_key: HashMap<Key, usize> = HashMap::new();
    let mut slots: Vec<(Key, Acc, String)> = Vec::new();
    for (p, pw) in rows_in.zip(&w.per_profile) {
        let Some((ei, wt)) = *pw else { continue };
        let slot = match slot_of_group.get(p.group) {
            Some(&s) if s != u32::MAX => s as usize,
            _ => {
                let h = p.header;
                let key = match h.kind {
                    ImageKind::Unknown => (ImageKind::Unknown, None),
                    k => (k, Some(h.image_id.clone())),
                };
                let s = *slot_of_key.entry(key.clone()).or_insert_with(|| {
                    slots.push((key, Acc::new(w.events.len()), image_display(h)));
                    slots.len() - 1
                });
                if slot_of_group.len() <= p.group {
                    slot_of_group.resize(p.group + 1, u32::MAX);
                }
                slot_of_group[p.group] = s as u32;
                s
            }
        };
        slots[slot].1.add(ei, p.samples, wt);
    }
    let mut rows: BTreeMap<Key, Acc> = BTreeMap::new();
    let mut names: HashMap<Key, String> = HashMap::new();
    for (k, acc, name) in slots {
        names.insert(k.clone(), name);
        rows.insert(k, acc);
    }
    let name_of = |k: &Key| names.get(k).cloned().unwrap_or_default();
    let mut out: Vec<ImageRow> = finish(rows, &w.events, name_of)
        .into_iter()
        .map(|(k, counts)| ImageRow {
            image: names.get(&k).cloned().unwrap_or_default(),
            kind: kind_name(k.0),
            image_id: k.1.as_ref().map(ImageId::to_text),
            build_id: k.1.as_ref().and_then(build_id_hex),
            counts,
        })
        .collect();
    let idle_percent = out
        .iter()
        .find(|r| r.kind == "kernel" && r.image == super::image::IDLE)
        .map_or(0.0, |r| r.counts.percent);
    let omitted = truncate(&mut out, limit);
    ImageReport {
        head: Head::new("images", scope, w, omitted),
        idle: IdleShare { included: !idle_excluded, percent: idle_percent },
        rows: out,
    }
}

/// Keep the first `limit` rows; returns how many were left out (a report's `rows_omitted`).
pub fn truncate<T>(v: &mut Vec<T>, limit: Option<usize>) -> usize {
    match limit {
        Some(n) if v.len() > n => {
            let o = v.len() - n;
            v.truncate(n);
            o
        }
        _ => 0,
    }
}

/// Indices of the loaded profiles `--image` selects, or the ambiguity.
pub fn resolve_image(
    loaded: &Loaded,
    w: &Weights,
    spec_text: &str,
) -> Result<Vec<usize>, ProfError> {
    let mut spec = parse_spec(spec_text);
    let (mut idx, mut inexact) = pick(loaded, w, &spec);
    if idx.is_empty() {
        if let Spec::Hex(h) = &spec {
            spec = Spec::Name(h.clone());
            (idx, inexact) = pick(loaded, w, &spec);
        }
    }
    if idx.is_empty() {
        let mut known: Vec<(u64, String)> = Vec::new();
        let mut seen = HashMap::new();
        for (p, pw) in loaded.profiles.iter().zip(&w.per_profile) {
            if pw.is_some() {
                *seen.entry(image_display(&p.profile.header)).or_insert(0u64) += p.samples;
            }
        }
        for (k, v) in seen {
            known.push((v, k));
        }
        // Images whose profiles were not loaded because they did not match.
        for (k, v) in &loaded.other_images {
            if !known.iter().any(|(_, n)| n == k) {
                known.push((*v, k.clone()));
            }
        }
        known.sort_by(|a, b| b.cmp(a));
        let list: Vec<String> = known.into_iter().take(10).map(|(_, n)| n).collect();
        let known = if list.is_empty() { "none".to_owned() } else { list.join(", ") };
        return Err(ProfError::NoSuchImage { spec: spec_text.to_owned(), known });
    }
    // Kernel, vDSO, unknown and JIT regions are symbolized per profile and merge by name.
    // (Modules too: each host's snapshot names their symbols, so builds may merge.)
    // A prefix or substring of several names (`--image lib`) names none of them: list them.
    let per_identity =
        inexact || idx.iter().any(|&i| loaded.profiles[i].profile.header.kind == ImageKind::Elf);
    if per_identity {
        let mut groups: BTreeMap<ImageId, Candidate> = BTreeMap::new();
        for &i in &idx {
            let p = &loaded.profiles[i];
            let h = &p.profile.header;
            let c = groups.entry(h.image_id.clone()).or_insert_with(|| Candidate {
                path: image_display(&p.profile.header),
                image_id: h.image_id.to_text(),
                build_id: build_id_hex(&h.image_id),
                samples: 0,
                hosts: Vec::new(),
                epochs: Vec::new(),
            });
            c.samples += p.samples;
            let d = &loaded.dirs[p.dir];
            if !c.hosts.contains(&d.host) {
                c.hosts.push(d.host.clone());
            }
            if !c.epochs.contains(&d.epoch.to_string()) {
                c.epochs.push(d.epoch.to_string());
            }
        }
        if groups.len() > 1 {
            let mut cands: Vec<Candidate> = groups.into_values().collect();
            cands.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.image_id.cmp(&b.image_id)));
            return Err(ProfError::Ambiguous { spec: spec_text.to_owned(), candidates: cands });
        }
    }
    Ok(idx)
}

/// The profiles `spec` names, keeping only the best match ([`spec_rank`]: an exact basename
/// wins over a prefix, a prefix over a substring), and whether that match is inexact.
fn pick(loaded: &Loaded, w: &Weights, spec: &Spec) -> (Vec<usize>, bool) {
    let ranked: Vec<(usize, u8)> = (0..loaded.profiles.len())
        .filter(|&i| w.per_profile[i].is_some())
        .filter_map(|i| spec_rank(spec, &loaded.profiles[i].profile.header).map(|r| (i, r)))
        .collect();
    let best = ranked.iter().map(|&(_, r)| r).min();
    let idx = ranked.into_iter().filter(|&(_, r)| Some(r) == best).map(|(i, _)| i).collect();
    (idx, best.is_some_and(|b| b > 0))
}

/// Per-symbol report over the profiles `idx` (from [`resolve_image`]).
pub struct SymbolContext<'a> {
    pub loaded: &'a Loaded,
    pub weights: &'a Weights,
    pub locator: &'a mut Locator,
    /// Per build-id symbol tables and DWARF answers ([`SymbolCache::disabled`] for none).
    pub cache: &'a mut SymbolCache,
    pub mode: SymbolMode,
    pub warn: &'a mut dyn FnMut(String),
}

impl std::fmt::Debug for SymbolContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymbolContext").field("mode", &self.mode).finish()
    }
}

/// Row name and optional `file:line`.
pub type RowKey = (String, Option<String>);

/// One symbolized offset of a profile, as [`symbolize_image`] reports it.
#[derive(Debug)]
pub struct Hit<'a> {
    /// Index into [`Loaded::profiles`].
    pub profile: usize,
    /// The stored offset (file offset; kernel: from the text/module base; unknown: reason).
    pub offset: u64,
    pub count: u64,
    /// Row name and, with `--lines`, `file:line`.
    pub key: &'a RowKey,
    /// The same number for the same `key` within one [`symbolize_image`] call, counted from 0
    /// in order of first appearance: lets a caller sum into a vector instead of a map by name.
    pub key_id: u32,
    /// The symbol table's name before demangling, when an ELF symbol covers the offset.
    pub system_name: Option<&'a str>,
}

/// Symbolize every counted offset of the profiles `idx` (one image, from [`resolve_image`] or
/// one image identity), calling `visit` per offset; returns what was used to symbolize it.
pub fn symbolize_image(
    cx: SymbolContext<'_>,
    idx: &[usize],
    visit: &mut dyn FnMut(Hit<'_>),
) -> ImageInfo {
    let SymbolContext { loaded, weights: w, locator, cache, mode, warn } = cx;
    let first = &loaded.profiles[idx[0]];
    let fh = &first.profile.header;
    let mut info = ImageInfo {
        image_id: (fh.kind != ImageKind::Unknown).then(|| fh.image_id.to_text()),
        build_id: build_id_hex(&fh.image_id),
        ..ImageInfo::new(image_display(&first.profile.header), kind_name(fh.kind))
    };
    // ELF and vDSO images: one source per identity (only one unless the spec merges).
    let mut elf_cache: HashMap<ImageId, Source> = HashMap::new();
    // What each offset of an identity symbolized to (key number, symbol table name): a fleet's
    // profiles of one image repeat the same offsets thousands of times, and looking up and
    // demangling each once is most of a per-symbol report's work.
    // Keyed by the label too: an unsymbolized offset's name carries the path the profile recorded.
    let mut elf_memo: HashMap<(ImageId, String), OffsetMap<Named>> = HashMap::new();
    let mut keys = KeyInterner::default();
    // Per ELF symbol (by its name's address in its table, alive as long as `elf_cache`): its
    // row key and its table name in `raws`.
    let mut sym_memo: OffsetMap<Named> = OffsetMap::default();
    let mut raws: Vec<String> = Vec::new();
    let mut snaps = Snapshots::default();
    for &i in idx {
        let p = &loaded.profiles[i];
        if w.per_profile[i].is_none() {
            continue;
        }
        let h = &p.profile.header;
        let label = image_label(&p.profile.header);
        let mut add_id =
            |keys: &KeyInterner, key_id: u32, off: u64, c: u64, system_name: Option<&str>| {
                let key = &keys.list[key_id as usize];
                visit(Hit { profile: i, offset: off, count: c, key, key_id, system_name })
            };
        // The one dispatch on the image's kind: which source names its offsets.
        let own: Source;
        let src = match h.kind {
            ImageKind::Elf | ImageKind::Vdso => {
                &*elf_cache.entry(h.image_id.clone()).or_insert_with(|| {
                    let mut recorded: Vec<Vec<u8>> = Vec::new();
                    for &j in idx {
                        let hp = &loaded.profiles[j].profile.header.image_path;
                        if loaded.profiles[j].profile.header.image_id == h.image_id
                            && !recorded.contains(hp)
                        {
                            recorded.push(hp.clone());
                        }
                    }
                    let r = ElfRequest { id: &h.image_id, recorded: &recorded, mode };
                    elf_source(h.kind, locator, cache, &r, &mut info, warn)
                })
            }
            ImageKind::Kernel | ImageKind::KernelModule => {
                let snap = snaps.get(loaded, p.dir, "samples", warn);
                let module =
                    (h.kind == ImageKind::KernelModule).then(|| display_path(&h.image_path));
                let k = Kallsyms::new(
                    snap,
                    module.as_deref(),
                    &h.image_id,
                    &image_display(h),
                    &loaded.dirs[p.dir].path,
                    warn,
                );
                own = if module.is_some() { Source::Module(k) } else { Source::Kernel(k) };
                &own
            }
            ImageKind::Anon => {
                own = Source::Jit(JitTable::new(h.jit_symbols.clone()));
                &own
            }
            ImageKind::Unknown => {
                own = Source::Unknown;
                &own
            }
        };
        if !matches!(src, Source::Elf(_)) {
            for (&off, &c) in &p.profile.counts {
                let n = src.symbolize(off, mode, &label);
                let id = keys.intern((n.name, n.source));
                add_id(&keys, id, off, c, None);
            }
            continue;
        }
        let memo = elf_memo.entry((h.image_id.clone(), label.clone())).or_default();
        for (&off, &c) in &p.profile.counts {
            let (key_id, raw) = *memo.entry(off).or_insert_with(|| match src.function(off) {
                // Without lines or inlines the row is the symbol's: name it (demangle) once
                // per symbol, not once per offset.
                Some(x) if !mode.lines && !mode.inlines => {
                    let at = x.raw.as_ptr() as u64;
                    *sym_memo.entry(at).or_insert_with(|| {
                        let key = (display_name(x.raw, mode.raw_names), None);
                        raws.push(x.raw.to_owned());
                        (keys.intern(key), Some(raws.len() as u32 - 1))
                    })
                }
                found => {
                    let n = src.symbolize(off, mode, &label);
                    let key = keys.intern((n.name, n.source));
                    let raw = found.map(|x| {
                        raws.push(x.raw.to_owned());
                        raws.len() as u32 - 1
                    });
                    (key, raw)
                }
            });
            let raw = raw.map(|r| raws[r as usize].as_str());
            add_id(&keys, key_id, off, c, raw);
        }
    }
    // Remember what DWARF answered, so that the next report need not load it.
    for st in elf_cache.values() {
        if let Source::Elf(ElfState::Ready(s, Some(entry))) = st {
            cache.put_frames(*entry, &s.take_fresh_frames(), warn);
        }
    }
    info
}

/// What an offset or a symbol was named: its row key number and its table name in `raws`.
type Named = (u32, Option<u32>);

/// Row keys numbered in order of first appearance ([`Hit::key_id`]).
#[derive(Default)]
struct KeyInterner {
    ids: HashMap<RowKey, u32>,
    list: Vec<RowKey>,
}

impl KeyInterner {
    fn intern(&mut self, key: RowKey) -> u32 {
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.list.len() as u32;
        self.list.push(key.clone());
        self.ids.insert(key, id);
        id
    }
}

/// A map keyed by offsets, hashed by one multiplication (the default `SipHash` costs more than
/// the rest of a memo lookup; offsets are not attacker-chosen keys of a long-lived map).
type OffsetMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<OffsetHasher>>;

#[derive(Default)]
struct OffsetHasher(u64);

impl std::hash::Hasher for OffsetHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and a tag from the top 7: both must mix.
        self.0 ^ (self.0 >> 32)
    }
}

pub fn symbol_report(
    cx: SymbolContext<'_>,
    idx: &[usize],
    db: &str,
    limit: Option<usize>,
) -> SymbolReport {
    let (loaded, w) = (cx.loaded, cx.weights);
    let n = w.events.len();
    // Summed per key number, in the order the hits come: every row's floating-point sum is
    // added in the same order as by name, so the report is the same.
    let mut accs: Vec<Option<(RowKey, Acc)>> = Vec::new();
    let info = symbolize_image(cx, idx, &mut |hit| {
        if let Some((ei, wt)) = w.per_profile[hit.profile] {
            let k = hit.key_id as usize;
            if accs.len() <= k {
                accs.resize_with(k + 1, || None);
            }
            accs[k].get_or_insert_with(|| (hit.key.clone(), Acc::new(n))).1.add(ei, hit.count, wt);
        }
    });
    let rows: BTreeMap<RowKey, Acc> = accs.into_iter().flatten().collect();
    let mut out: Vec<SymbolRow> = finish(rows, &w.events, |k: &RowKey| k.0.clone())
        .into_iter()
        .map(|(k, counts)| SymbolRow { symbol: k.0, source: k.1, counts })
        .collect();
    let mut infos = w.infos.clone();
    // Header counts describe this image only.
    for (ei, inf) in infos.iter_mut().enumerate() {
        inf.samples = out.iter().map(|r| r.counts.per_event[ei].samples).sum();
        inf.events = out.iter().map(|r| r.counts.per_event[ei].events).sum();
    }
    let omitted = truncate(&mut out, limit);
    SymbolReport {
        report: "symbols",
        scope: scope(loaded, db),
        image: info,
        total_samples: infos.first().map_or(0, |i| i.samples),
        events: infos,
        rows_omitted: omitted,
        rows: out,
    }
}

/// The vDSO has no file: look for a copy by build-id (binary paths, caches), else use this
/// machine's own vDSO if it is the same build.
pub fn load_vdso(
    locator: &mut Locator,
    id: &ImageId,
    // DWARF is opened when a frame is first asked for, whatever the mode.
    _mode: SymbolMode,
    info: &mut ImageInfo,
) -> ElfState {
    let ImageId::BuildId(bid) = id else { return ElfState::Missing };
    // A copy on disk can carry DWARF (read from the file when asked); this machine's vDSO
    // has none.
    // A binary the locator found (not a database file), read whole for its DWARF.
    #[allow(clippy::disallowed_methods)]
    let found = match locator.locate(id, &[]) {
        Located::Found { path, .. } => std::fs::read(&path).ok().map(|d| (d, Some(path))),
        _ => None,
    };
    let (data, file) = match found {
        Some(x) => x,
        None => match live_vdso() {
            Some(d) if elf_identity(&d).ok().and_then(|i| i.build_id).as_ref() == Some(bid) => {
                (d, None)
            }
            _ => return ElfState::Missing,
        },
    };
    match SymbolTable::build(&data, None) {
        Ok(t) => {
            info.binary = Some(match &file {
                Some(p) => p.display().to_string(),
                None => "[vdso] of this machine (same build-id)".to_owned(),
            });
            ElfState::Ready(Box::new(ElfSymbolizer::from_table(t, file, None)), None)
        }
        Err(_) => ElfState::Missing,
    }
}

/// What [`load_elf`] looks for.
#[derive(Debug)]
pub struct ElfRequest<'a> {
    pub id: &'a ImageId,
    pub recorded: &'a [Vec<u8>],
    pub mode: SymbolMode,
}

fn debug_key(p: &std::path::Path) -> (std::path::PathBuf, u64, i64) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(p) {
        Ok(md) => (
            p.to_owned(),
            md.len(),
            md.mtime().saturating_mul(1_000_000_000).saturating_add(md.mtime_nsec()),
        ),
        Err(_) => (p.to_owned(), 0, 0),
    }
}

pub fn load_elf(
    locator: &mut Locator,
    cache: &mut SymbolCache,
    r: &ElfRequest<'_>,
    info: &mut ImageInfo,
    warn: &mut dyn FnMut(String),
) -> ElfState {
    let located = locator.locate(r.id, r.recorded);
    if !matches!(located, Located::Found { .. }) {
        // No binary of this build: the database's stored table, before any warning.
        if let Some(t) = stored_table(locator, r, warn) {
            return use_stored(t, r, info, warn);
        }
    }
    let (path, identity) = match located {
        Located::Found { path, identity } => (path, identity),
        Located::Mismatch { path, expected, found } => {
            info.names_missing = Some(NamesMissing::OtherBuild);
            warn(format!(
                "{}: build-id mismatch: profile was taken from build {expected}, file now has {found}; \
                 not symbolizing with the wrong build (use --binary-path or --cache-dir to supply the original)",
                path.display()
            ));
            return ElfState::Mismatch;
        }
        Located::Unparsable { path, detail } => {
            info.names_missing = Some(NamesMissing::Unreadable);
            warn(format!(
                "{}: cannot parse as ELF ({detail}); its samples are shown as NAME+0xOFFSET (use \
                 --binary-path or --cache-dir to supply an intact copy)",
                path.display()
            ));
            return ElfState::Missing;
        }
        Located::NotFound { tried } => {
            info.names_missing = Some(NamesMissing::NotFound);
            warn(format!(
                "binary for {} not found (tried {tried}); its samples are shown as NAME+0xOFFSET \
                 (use --binary-path DIR or --cache-dir DIR to supply it)",
                r.id.to_text()
            ));
            return ElfState::Missing;
        }
    };
    let paths = locator.paths.clone();
    let debug = find_debug_file(&path, &identity, &paths, warn);
    // Only a build-id names the content; a fallback identity is not cached.
    let key = match r.id {
        ImageId::BuildId(b) => {
            Some(CacheKey { build_id: b.clone(), debug: debug.as_deref().map(debug_key) })
        }
        ImageId::Fallback(_) => None,
    };
    let cached = key.as_ref().and_then(|k| cache.get(k, warn));
    let (entry, table) = match cached {
        Some((e, t)) => (Some(e), t),
        None => {
            // Only the headers and symbol tables are read, not the DWARF that is most of a
            // debug build.
            match SymbolTable::from_files(&path, debug.as_deref()) {
                Ok(t) => {
                    let e = key.as_ref().and_then(|k| cache.put(k, &t, warn));
                    (e, t)
                }
                Err(ElfError::Io(e)) => {
                    info.names_missing = Some(NamesMissing::Unreadable);
                    warn(format!(
                        "{}: cannot read: {e}; its samples are shown as NAME+0xOFFSET",
                        path.display()
                    ));
                    return ElfState::Missing;
                }
                Err(e) => {
                    info.names_missing = Some(NamesMissing::Unreadable);
                    warn(format!("{}: cannot read symbols: {e}", path.display()));
                    return ElfState::Missing;
                }
            }
        }
    };
    let want_dwarf = r.mode.inlines || r.mode.lines;
    let s = ElfSymbolizer::from_table(table, Some(path.clone()), debug.clone());
    if let (Some(e), true) = (entry, want_dwarf) {
        s.preload_frames(cache.frames(e, warn));
    }
    if s.symbol_count() == 0 || s.dynsym_only() {
        // A stripped binary whose stored table (taken by dcpid from a debug file installed
        // then) knows more than the binary does now.
        if let Some(t) = stored_table(locator, r, warn) {
            if t.0.symbol_count() > s.symbol_count() && !t.0.dynsym_only() {
                return use_stored(t, r, info, warn);
            }
        }
    }
    if s.symbol_count() == 0 {
        info.names_missing = Some(NamesMissing::Stripped);
        warn(format!(
            "{}: no symbols (stripped) and no debug file found; samples are shown as NAME+0xOFFSET \
             (install its debug info, e.g. the -dbgsym/-debuginfo package, or pass --debug-dir DIR)",
            path.display()
        ));
    } else if s.dynsym_only() {
        let note = format!(
            "only .dynsym (exported functions) was available: the binary is stripped and no \
             debug file was found, so samples in internal functions show as NAME+0xOFFSET; \
             install its debug info (the -dbgsym/-debuginfo package, or `debuginfod-find \
             debuginfo {}`) or pass --debug-dir DIR",
            info.build_id.as_deref().unwrap_or("BUILD-ID")
        );
        warn(format!("{}: {note}", path.display()));
        info.symbols_note = Some(note);
        info.names_missing = Some(NamesMissing::NoDebugFile);
    } else if want_dwarf && !s.has_dwarf() {
        warn(format!(
            "{}: no DWARF found (binary or debug file); --lines/--inlines fall back to symbols",
            path.display()
        ));
    }
    info.binary = Some(path.display().to_string());
    info.debug_file = debug.map(|p| p.display().to_string());
    ElfState::Ready(Box::new(s), entry)
}

/// The table of build `r.id` in the database's symbol store (FORMAT.md §10), which dcpid
/// filled while the binary existed, and its path: `None` when the store has no table for it
/// (or no database is known). A damaged or planted table is a warning, and `None`.
fn stored_table(
    locator: &Locator,
    r: &ElfRequest<'_>,
    warn: &mut dyn FnMut(String),
) -> Option<(ElfSymbolizer, std::path::PathBuf)> {
    let ImageId::BuildId(bid) = r.id else { return None };
    let root = locator.paths.symbol_store.as_ref()?;
    let db = profile_format::Database::open(root).ok()?;
    match db.read_symtab(bid) {
        Ok(t) => Some((
            ElfSymbolizer::from_table(SymbolTable::from_stored(&t), None, None),
            db.symtab_path(bid),
        )),
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => {
            warn(format!("{e}; the stored symbol table is not used"));
            None
        }
    }
}

/// Name the image from its stored table ([`stored_table`]); says so when lines or inlines
/// were asked (the table has no DWARF).
fn use_stored(
    (s, path): (ElfSymbolizer, std::path::PathBuf),
    r: &ElfRequest<'_>,
    info: &mut ImageInfo,
    warn: &mut dyn FnMut(String),
) -> ElfState {
    if r.mode.inlines || r.mode.lines {
        warn(format!(
            "{}: named from the database's stored symbol table (the binary of this build is \
             gone): no source lines or inlined functions",
            info.path
        ));
    }
    info.binary = Some(path.display().to_string());
    info.debug_file = None;
    info.from_symbol_store = true;
    info.names_missing = s.dynsym_only().then_some(NamesMissing::NoDebugFile);
    ElfState::Ready(Box::new(s), None)
}

/// The source of an ELF or vDSO image (`kind`): a vDSO found by build-id or taken from this
/// machine ([`load_vdso`]), an ELF file found, checked and cached by [`load_elf`].
pub fn elf_source(
    kind: ImageKind,
    locator: &mut Locator,
    cache: &mut SymbolCache,
    r: &ElfRequest<'_>,
    info: &mut ImageInfo,
    warn: &mut dyn FnMut(String),
) -> Source {
    if kind == ImageKind::Vdso {
        Source::Vdso(load_vdso(locator, r.id, r.mode, info))
    } else {
        Source::Elf(load_elf(locator, cache, r, info, warn))
    }
}

/// The symbolizer of an ELF image, found, checked and cached exactly as for a per-symbol report
/// (for tools that map offsets to symbols themselves, e.g. `dcpiexport`). `None`, after a
/// warning, when the binary is missing, unreadable or another build.
pub fn elf_symbolizer(
    locator: &mut Locator,
    cache: &mut SymbolCache,
    id: &ImageId,
    recorded: &[Vec<u8>],
    warn: &mut dyn FnMut(String),
) -> Option<ElfSymbolizer> {
    let mut info = ImageInfo::new(String::new(), kind_name(ImageKind::Elf));
    let r = ElfRequest { id, recorded, mode: SymbolMode::default() };
    match load_elf(locator, cache, &r, &mut info, warn) {
        ElfState::Ready(s, _) => Some(*s),
        ElfState::Mismatch | ElfState::Missing => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where each key first stands in `json`, in the order given.
    fn key_positions(json: &str, keys: &[&str]) -> Vec<usize> {
        keys.iter().map(|k| json.find(&format!("\"{k}\":")).unwrap_or(usize::MAX)).collect()
    }

    /// The rows' JSON keeps the flat shape `--help` documents, in its order, with the numbers
    /// in one embedded [`Counts`].
    #[test]
    fn rows_serialize_flat_in_documented_order() {
        let per_event = vec![
            EventCount { event: "cycles".into(), samples: 3, events: 300, percent: 75.0 },
            EventCount { event: "instructions".into(), samples: 1, events: 90, percent: 10.0 },
        ];
        let counts = Counts::new(per_event, 80.5);
        assert_eq!((counts.samples, counts.events, counts.percent), (3, 300, 75.0));
        let image = ImageRow {
            image: "/bin/x".into(),
            kind: "elf",
            image_id: None,
            build_id: Some("ab".into()),
            counts: counts.clone(),
        };
        let json = serde_json::to_string(&image).expect("serialize");
        assert_eq!(
            json,
            r#"{"image":"/bin/x","kind":"elf","image_id":null,"build_id":"ab","samples":3,"events":300,"percent":75.0,"cumulative_percent":80.5,"counts":[{"event":"cycles","samples":3,"events":300,"percent":75.0},{"event":"instructions","samples":1,"events":90,"percent":10.0}]}"#
        );
        let symbol = SymbolRow { symbol: "f".into(), source: None, counts };
        let json = serde_json::to_string(&symbol).expect("serialize");
        let at = key_positions(
            &json,
            &["symbol", "samples", "events", "percent", "cumulative_percent", "counts"],
        );
        assert!(at.windows(2).all(|w| w[0] < w[1]) && at[5] != usize::MAX, "{json}");
        assert!(!json.contains("\"source\""), "no source without --lines: {json}");
        assert_eq!(symbol.percent, 75.0, "a row reads as its numbers");
    }

    /// Issue 39: an image whose binary is gone (or rebuilt) is named from the database's
    /// stored symbol table through the one symbolizer, and says why when it has none.
    #[test]
    fn gone_binary_is_named_from_the_stored_table_else_says_why() {
        use crate::debuginfo::SearchPaths;
        use profile_format::{StoredSymtab, SymtabOrigin, SymtabSegment, SymtabSymbol};
        let dir = tempfile::tempdir().expect("tmp");
        let db = profile_format::Database::create(dir.path()).expect("db");
        let bid = vec![0x42; 20];
        db.put_symtab(&StoredSymtab {
            build_id: bid.clone(),
            origin: SymtabOrigin::DebugFile,
            segments: vec![SymtabSegment { offset: 0x1000, filesz: 0x1000, vaddr: 0x401000 }],
            symbols: vec![
                SymtabSymbol { start: 0x401000, size: 0x100, name: "work_a".into() },
                SymtabSymbol { start: 0x401100, size: 0x100, name: "_ZN3foo3barEv".into() },
            ],
        })
        .expect("store");
        let paths = SearchPaths { symbol_store: Some(dir.path().to_owned()), ..Default::default() };
        let mut locator = Locator::new(paths);
        let mut cache = SymbolCache::disabled();
        let gone = b"/nonexistent/dcpi-test/app".to_vec();
        let recorded = [gone];
        let id = ImageId::BuildId(bid);
        let r = ElfRequest { id: &id, recorded: &recorded, mode: SymbolMode::default() };
        let mut info = ImageInfo::default();
        let mut warnings = Vec::new();
        let st = load_elf(&mut locator, &mut cache, &r, &mut info, &mut |w| warnings.push(w));
        let src = Source::Elf(st);
        let mode = SymbolMode::default();
        assert_eq!(src.symbolize(0x1010, mode, "app").name, "work_a");
        assert_eq!(src.symbolize(0x1120, mode, "app").name, "foo::bar()");
        assert_eq!(src.symbolize(0x1800, mode, "app").name, "app+0x1000", "no symbol: the page");
        assert!(info.from_symbol_store && info.names_missing.is_none(), "{info:?}");
        assert!(info.binary.as_deref().is_some_and(|b| b.ends_with(".sym")), "{info:?}");
        assert!(warnings.is_empty(), "{warnings:?}");

        // Another build with no stored table: unsymbolized, and the reason is given.
        let other = ImageId::BuildId(vec![0x43; 20]);
        let r = ElfRequest { id: &other, recorded: &recorded, mode };
        let mut info = ImageInfo::default();
        let st = load_elf(&mut locator, &mut cache, &r, &mut info, &mut |w| warnings.push(w));
        assert_eq!(Source::Elf(st).symbolize(0x1010, mode, "app").name, "app+0x1000");
        assert_eq!(info.names_missing, Some(NamesMissing::NotFound));
        assert!(!info.from_symbol_store);
    }

    #[test]
    fn counts_of_no_event_are_zero() {
        let c = Counts::new(Vec::new(), 0.0);
        assert_eq!((c.samples, c.events, c.percent, c.per_event.len()), (0, 0, 0.0, 0));
    }
}
