//! `dcpiexport`: the counts of a dcpi profile database as Parquet (or CSV) files that `DuckDB`,
//! `ClickHouse`, Spark or Trino read directly. The schema and example queries are in
//! `dcpiexport/EXPORT.md`.
//!
//! Layout of the output directory (Parquet):
//!
//! ```text
//! OUT/manifest.json                                   what was exported, from which files
//! OUT/samples/epoch=<ID>/host=<HOST>/part-<fp>.parquet one file per host-epoch
//! OUT/symbols/part-<run>.parquet                      (image, offset range) -> symbol
//! ```
//!
//! A host-epoch is exported again only when its files changed (the manifest keeps a
//! fingerprint of their names, sizes and modification times); its new data goes to a new
//! file and the old one is removed, so a finished partition is never rewritten. Symbols are
//! exported once per image identity (a build names immutable content).
#![forbid(unsafe_code)]

mod parquet_out;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use dcpi_client::args::{Selection, SymbolSearch};
// The report tools' CSV text cell: escaped, quoted, formulas neutralised (a path or symbol
// name can hold anything).
use dcpi_client::escape::csv_text as csv_field;
use dcpi_client::prof::image::image_display;
use dcpi_client::prof::report::{display_path, elf_symbolizer, kind_name, ElfState};
use dcpi_client::prof::select;
use dcpi_client::prof::symbolize::demangle;
use dcpi_client::prof::symbolizer::{Kallsyms, Source};
use dcpi_client::prof::ProfError;
use profile_format::{HostDir, HostSummary, ImageId, ImageKind, Profile, ProfileHeader, SliceLog};
use sha2::{Digest, Sha256};

use dcpi_client::prof::timeline;
use dcpi_client::prof::whoprof;
use parquet::errors::ParquetError;
pub use parquet_out::{SampleRow, SymbolRow};

/// Version of the manifest and of the tables' schema (EXPORT.md).
/// 2: the samples table has `slice_start` and `slice_seconds` (issue 36).
/// 3: and `command` (`--command`, from the per-command profiles; issue 38).
pub const EXPORT_VERSION: u32 = 3;
const MANIFEST: &str = "manifest.json";

/// Errors of an export run.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Select(#[from] ProfError),
    #[error(transparent)]
    Format(#[from] profile_format::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: writing Parquet: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: ParquetError,
    },
    #[error("{path}: not a dcpiexport manifest ({detail}); use another --output directory")]
    Manifest { path: PathBuf, detail: String },
    #[error("{0}; pass --keep-going to skip corrupt files")]
    Corrupt(String),
    /// A directory of the output layout that exists as something else: a symbolic link
    /// planted there would send the export (and the removal of replaced files) elsewhere.
    #[error(
        "{path}: is {kind}, not a directory (refused: dcpiexport writes only into directories \
         it created or that are real directories; remove it or use another --output directory)"
    )]
    NotADirectory { path: PathBuf, kind: &'static str },
}

impl ExportError {
    /// Process exit status: 2 for usage and data errors, 1 for failures to write the output.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Select(e) => e.exit_code(),
            Self::Io { .. } | Self::Parquet { .. } => 1,
            _ => 2,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io { path: path.to_owned(), source }
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Hive-partitioned Parquet (zstd), incremental.
    Parquet,
    /// Two CSV files (samples.csv, symbols.csv) with host and epoch columns; rewritten each
    /// run. For small selections.
    Csv,
}

/// What to export and where.
#[derive(Debug)]
pub struct Options<'a> {
    pub sel: &'a Selection,
    pub symbols: &'a SymbolSearch,
    pub format: Format,
    pub output: &'a Path,
    /// Skip the symbol table (no binaries are looked up).
    pub no_symbols: bool,
    /// One row per time slice (`slice_start`, `slice_seconds`) where the host-epoch has a
    /// `slices.log`; `false`: one row per offset for the whole epoch, slice columns null.
    pub slices: bool,
    /// Only this command's samples, from the per-command profiles (FORMAT.md §5.6, dcpid's
    /// `by_command`): whole-epoch rows (they have no time axis), `command` set.
    pub command: Option<&'a str>,
}

/// What a run did (printed by the binary, and used by tests).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// Host-epochs selected.
    pub host_epochs: usize,
    /// Host-epochs written by this run (the others were unchanged since the last one).
    pub exported: usize,
    pub rows: u64,
    pub samples: u64,
    pub symbol_rows: u64,
    pub files_written: Vec<PathBuf>,
    pub files_removed: Vec<PathBuf>,
}

/// `manifest.json`.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct Manifest {
    format: String,
    version: u32,
    database: String,
    /// Key `EPOCH/HOST`.
    partitions: BTreeMap<String, Partition>,
    /// Image ids whose symbols were exported, with the file holding them (relative path).
    symbols: BTreeMap<String, String>,
}

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct Partition {
    fingerprint: String,
    /// Relative to the output directory.
    file: String,
    rows: u64,
    samples: u64,
}

const MANIFEST_FORMAT: &str = "dcpiexport";

fn read_manifest(out: &Path) -> Result<Manifest, ExportError> {
    let path = out.join(MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Manifest {
                format: MANIFEST_FORMAT.into(),
                version: EXPORT_VERSION,
                ..Manifest::default()
            })
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let m: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| ExportError::Manifest { path: path.clone(), detail: e.to_string() })?;
    if m.format != MANIFEST_FORMAT || m.version == 0 || m.version > EXPORT_VERSION {
        return Err(ExportError::Manifest {
            path,
            detail: format!("format {:?} version {}", m.format, m.version),
        });
    }
    Ok(m)
}

/// `out/rel` made a directory one component at a time (`rel` is relative: `samples/epoch=E/
/// host=H`, `symbols`), refusing any component that exists as a symbolic link or anything but
/// a directory: a link planted in a shared output directory must not redirect the files
/// written (or the old partitions removed) into another directory. The output directory
/// itself is the user's choice and may be a link.
fn output_subdir(out: &Path, rel: &str) -> Result<PathBuf, ExportError> {
    let mut dir = out.to_path_buf();
    for comp in rel.split('/') {
        dir.push(comp);
        match std::fs::create_dir(&dir) {
            Ok(()) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&dir)(e)),
        }
        let ft = std::fs::symlink_metadata(&dir).map_err(io(&dir))?.file_type();
        if !ft.is_dir() {
            let kind = if ft.is_symlink() { "a symbolic link" } else { "not a directory" };
            return Err(ExportError::NotADirectory { path: dir, kind });
        }
    }
    Ok(dir)
}

/// Whether a manifest's `file` names a partition file of the layout
/// (`samples/epoch=E/host=H/part-FP.parquet`, no `..`, not absolute): only such a file is ever
/// removed when its partition is replaced (the manifest is a file anyone with write access to
/// the output directory may have edited).
fn is_partition_file(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let normal = |c: &str| !c.is_empty() && c != "." && c != "..";
    parts.len() == 4
        && parts.iter().all(|c| normal(c))
        && parts[0] == "samples"
        && parts[1].starts_with("epoch=")
        && parts[2].starts_with("host=")
        && parts[3].starts_with("part-")
        && parts[3].ends_with(".parquet")
}

fn write_manifest(out: &Path, m: &Manifest) -> Result<(), ExportError> {
    let mut bytes = serde_json::to_vec_pretty(m)
        .map_err(|e| ExportError::Manifest { path: out.join(MANIFEST), detail: e.to_string() })?;
    bytes.push(b'\n');
    profile_format::write_atomic(&out.join(MANIFEST), &bytes)?;
    Ok(())
}

/// Fingerprint of a host directory: the names, sizes and modification times of its profiles
/// and summary, and the event filter; with a time range, the range and the slice log; with
/// slice rows, the slice log. Any publish changes it (files are replaced by rename, the slice
/// log grows).
fn fingerprint(
    d: &HostDir,
    events: &[String],
    range: Option<select::TimeRange>,
    slices: bool,
    command: Option<&str>,
) -> Result<String, ExportError> {
    use std::os::unix::fs::MetadataExt;
    let mut h = Sha256::new();
    h.update(format!("dcpiexport {EXPORT_VERSION}\0{}\0{slices}\0", events.join(",")));
    let mut names: Vec<PathBuf> = d.profiles()?.into_iter().map(|e| e.path).collect();
    if let Some(c) = command {
        h.update(format!("command {c:?}\0"));
        names.extend(command_profiles(d, c)?);
    }
    if let Some(r) = range {
        h.update(format!("range {:?} {:?}\0", r.since, r.until));
    }
    names.push(d.summary_path());
    // Every slice file (FORMAT.md §14.5): a new segment or roll-up changes the answer.
    names.extend(d.slice_paths()?);
    names.push(d.kallsyms_path());
    names.push(d.kallsyms_ref_path());
    for p in names {
        match std::fs::metadata(&p) {
            Ok(m) => h.update(format!(
                "{}\0{}\0{}.{}\0",
                p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&p)(e)),
        }
    }
    Ok(hex::encode(&h.finalize()[..8]))
}

/// One image of the selection, for the symbol table.
#[derive(Debug)]
struct SymImage {
    kind: ImageKind,
    id: ImageId,
    paths: Vec<Vec<u8>>,
    /// A host directory whose kallsyms snapshot describes it (kernel and modules).
    dir: Option<usize>,
}

/// Events represented per sample of a profile: its mean period, times the multiplexing scale
/// of its event on that host (as dcpiprof weights it).
fn weight(h: &ProfileHeader, summary: Option<&HostSummary>) -> f64 {
    let mux = summary
        .and_then(|s| {
            s.events.iter().find(|e| e.desc.as_ref().is_some_and(|d| d.name == h.event.name))
        })
        .filter(|e| e.time_running_ns > 0 && e.time_enabled_ns > e.time_running_ns)
        .map_or(1.0, |e| e.time_enabled_ns as f64 / e.time_running_ns as f64);
    let per_sample = if h.total_samples > 0 && h.total_period > 0 {
        h.total_period as f64 / h.total_samples as f64
    } else {
        h.event.period_mean.max(1) as f64
    };
    per_sample * mux
}

/// The rows of one host directory, sorted by (image id, event, offset), each split by time
/// slice when `o.slices` and the directory has a `slices.log`.
fn host_rows(
    d: &HostDir,
    o: &Options<'_>,
    warn: &mut dyn FnMut(String),
    images: &mut BTreeMap<String, SymImage>,
    dir_index: usize,
    range: Option<&mut select::DirRange>,
) -> Result<Vec<SampleRow>, ExportError> {
    let rows = profile_rows(d, o, warn, images, dir_index, range)?;
    if !o.slices || o.command.is_some() {
        return Ok(rows);
    }
    let (since, until) = o.sel.time_range().map_or((None, None), |r| (r.since, r.until));
    let log = match d.read_slices_in(since, until) {
        // With --since/--until the rows are the range's: split them by the range's slices.
        Ok(Some(mut l)) => {
            if let Some(r) = o.sel.time_range() {
                l.slices.retain(|s| {
                    r.since.is_none_or(|a| s.end() > a) && r.until.is_none_or(|b| s.start < b)
                });
            }
            l
        }
        Ok(None) => return Ok(rows),
        // A planted FIFO, device or link is refused, not skipped (issue 34).
        Err(e) if e.is_hostile_file() => return Err(e.into()),
        Err(e) if o.sel.keep_going => {
            warn(format!("{e} (its samples are exported without slice_start)"));
            return Ok(rows);
        }
        Err(e) => return Err(ExportError::Corrupt(e.to_string())),
    };
    Ok(split_by_slices(&rows, &log))
}

/// `rows` (one per image, event and offset, the epoch's totals) split by the slices of `log`:
/// a row per slice holding the samples of that offset, then whatever the slices do not hold
/// with `slice_start` null. The slices are taken in time order and never beyond a row's
/// samples, so that the rows still sum exactly to the profiles: in the current epoch the
/// slices run up to a publish interval ahead of the published profiles (that excess is left
/// for the next export), and a killed dcpid loses its last slice (those samples are the null
/// row; FORMAT.md §14.3).
fn split_by_slices(rows: &[SampleRow], log: &SliceLog) -> Vec<SampleRow> {
    use std::collections::HashMap;
    // Per (image id, event): its rows by offset (rows are sorted by image id, event, offset).
    let mut at: HashMap<(&str, &str), Vec<(u64, usize)>> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        at.entry((r.image_id.as_str(), r.event.as_str())).or_default().push((r.offset, i));
    }
    let mut left: Vec<u64> = rows.iter().map(|r| r.samples).collect();
    let mut out = Vec::with_capacity(rows.len());
    let part = |r: &SampleRow, n: u64, slice: Option<(u64, u64)>| SampleRow {
        samples: n,
        // The row's weight per sample, as for the whole row.
        weight: if r.samples > 0 { r.weight * n as f64 / r.samples as f64 } else { 0.0 },
        slice_start: slice.map(|s| s.0),
        slice_seconds: slice.map(|s| s.1),
        ..r.clone()
    };
    let mut taken: Vec<(usize, u64)> = Vec::new();
    for s in log.range(None, None).slices {
        // A slice at a coarser offset resolution counts `res`-byte blocks (FORMAT.md §14.2):
        // a block's samples go to the rows inside it, in proportion to what each has left.
        let res = log.resolution_of(s);
        for (k, pairs) in &s.counts {
            let id = k.image.as_ref().map(ImageId::to_text).unwrap_or_default();
            let Some(list) = at.get(&(id.as_str(), k.event.as_str())) else { continue };
            let width = if k.image.is_some() { res } else { 1 };
            for &(offset, count) in pairs {
                let lo = list.partition_point(|&(o, _)| o < offset);
                let hi = list.partition_point(|&(o, _)| o < offset.saturating_add(width));
                share(count, &list[lo..hi], &mut left, &mut taken);
                for &(i, n) in &taken {
                    out.push(part(&rows[i], n, Some((s.start, s.len))));
                }
            }
        }
    }
    for (i, r) in rows.iter().enumerate() {
        if left[i] > 0 {
            out.push(part(r, left[i], None));
        }
    }
    out.sort_by(|a, b| {
        (&a.image_id, &a.event, a.offset, &a.image, a.slice_start).cmp(&(
            &b.image_id,
            &b.event,
            b.offset,
            &b.image,
            b.slice_start,
        ))
    });
    out
}

/// Share `count` samples among `rows` (offset, row index) up to what each has `left`: all of
/// it when they have no more, else in proportion to `left` by largest remainder. `taken`
/// receives (row, samples) with samples > 0; `left` is reduced by them.
fn share(count: u64, rows: &[(u64, usize)], left: &mut [u64], taken: &mut Vec<(usize, u64)>) {
    taken.clear();
    let have: u64 = rows.iter().map(|&(_, i)| left[i]).sum();
    if have == 0 || count == 0 {
        return;
    }
    if count >= have {
        taken.extend(rows.iter().filter(|&&(_, i)| left[i] > 0).map(|&(_, i)| (i, left[i])));
    } else {
        let mut rem: Vec<(u128, usize)> = Vec::with_capacity(rows.len());
        let mut given = 0u64;
        for (j, &(_, i)) in rows.iter().enumerate() {
            let exact = count as u128 * left[i] as u128;
            let n = (exact / have as u128) as u64;
            given += n;
            taken.push((i, n));
            rem.push((exact % have as u128, j));
        }
        rem.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, j) in rem.iter().take((count - given) as usize) {
            taken[j].1 += 1;
        }
        taken.retain(|&(_, n)| n > 0);
    }
    for &(i, n) in taken.iter() {
        left[i] -= n;
    }
}

/// The per-command profiles of `command` in `d` (FORMAT.md §5.6; their names hold a hash of
/// the command).
fn command_profiles(d: &HostDir, command: &str) -> Result<Vec<PathBuf>, ExportError> {
    let want = profile_format::command_file_component(command.as_bytes());
    Ok(d.who_profiles()?.into_iter().filter(|e| e.who_component == want).map(|e| e.path).collect())
}

/// The rows of one host directory's profiles (`--command`: that command's), sorted by
/// (image id, event, offset).
fn profile_rows(
    d: &HostDir,
    o: &Options<'_>,
    warn: &mut dyn FnMut(String),
    images: &mut BTreeMap<String, SymImage>,
    dir_index: usize,
    range: Option<&mut select::DirRange>,
) -> Result<Vec<SampleRow>, ExportError> {
    let (events, keep_going) = (&o.sel.events, o.sel.keep_going);
    let mut range = range;
    let summary = match HostSummary::read(&d.summary_path()) {
        Ok(s) => Some(s),
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        // A planted FIFO, device, link or oversized file: refused, not skipped (issue 34).
        Err(e) if e.is_hostile_file() => return Err(e.into()),
        Err(e) => {
            warn(format!("{e} (multiplexing scale unknown for this host/epoch)"));
            None
        }
    };
    let mut rows = Vec::new();
    let paths = match o.command {
        Some(c) => command_profiles(d, c)?,
        None => d.profiles()?.into_iter().map(|e| e.path).collect(),
    };
    for path in paths {
        let read = match o.command {
            // A sole-command stub reads as the flat profile it stands for (FORMAT.md §5.6.1).
            Some(_) => whoprof::read_command_profile(d, &path),
            None => Profile::read(&path).map(Some),
        };
        let mut p = match read {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(e) if keep_going => {
                warn(format!("skipping corrupt profile: {e}"));
                continue;
            }
            Err(e) => return Err(ExportError::Corrupt(e.to_string())),
        };
        if !events.is_empty() && !events.contains(&p.header.event.name) {
            continue;
        }
        // --since/--until: the profile's counts in the range, from the time slices.
        let key = select::slice_key(&p.header);
        if let Some(pairs) = range.as_mut().and_then(|r| r.take(&key, &p.counts)) {
            if pairs.is_empty() {
                continue;
            }
            p.counts = pairs.into_iter().collect();
        }
        let h = &p.header;
        let w = weight(h, summary.as_ref());
        let id_text = h.image_id.to_text();
        let unknown = h.kind == ImageKind::Unknown;
        let image = image_display(h);
        let build_id = match &h.image_id {
            ImageId::BuildId(b) if !unknown => Some(hex::encode(b)),
            _ => None,
        };
        if !unknown {
            let si = images.entry(id_text.clone()).or_insert_with(|| SymImage {
                kind: h.kind,
                id: h.image_id.clone(),
                paths: Vec::new(),
                dir: None,
            });
            if !si.paths.contains(&h.image_path) {
                si.paths.push(h.image_path.clone());
            }
            if si.dir.is_none()
                && matches!(h.kind, ImageKind::Kernel | ImageKind::KernelModule)
                && (d.kallsyms_path().exists() || d.kallsyms_ref_path().exists())
            {
                si.dir = Some(dir_index);
            }
        }
        for (&offset, &samples) in &p.counts {
            rows.push(SampleRow {
                image: image.clone(),
                image_id: if unknown { String::new() } else { id_text.clone() },
                build_id: build_id.clone(),
                kind: kind_name(h.kind),
                event: h.event.name.clone(),
                offset,
                samples,
                weight: samples as f64 * w,
                slice_start: None,
                slice_seconds: None,
                command: o.command.map(str::to_owned),
            });
        }
    }
    rows.sort_by(|a, b| {
        (&a.image_id, &a.event, a.offset, &a.image).cmp(&(
            &b.image_id,
            &b.event,
            b.offset,
            &b.image,
        ))
    });
    Ok(rows)
}

/// Non-overlapping (start, end, name) offset ranges of an image, from the one symbolizer
/// ([`Source::ranges`]), each named (demangled) as reports name the offsets inside it; adjacent
/// ranges that show the same name merge.
fn named_ranges(src: &Source) -> Option<Vec<(u64, u64, String)>> {
    let mut out: Vec<(u64, u64, String)> = Vec::new();
    for r in src.ranges()? {
        let name = demangle(r.raw);
        match out.last_mut() {
            Some(last) if last.1 == r.start && last.2 == name => last.1 = r.end,
            _ => out.push((r.start, r.end, name)),
        }
    }
    Some(out)
}

/// Symbol rows of the images not yet in `done` (image id text -> file).
fn symbol_rows(
    images: &BTreeMap<String, SymImage>,
    done: &BTreeMap<String, String>,
    dirs: &[HostDir],
    o: &Options<'_>,
    warn: &mut dyn FnMut(String),
) -> Result<(Vec<SymbolRow>, Vec<String>), ExportError> {
    let mut locator = o.symbols.locator(&o.sel.db);
    let mut cache = o.symbols.cache(warn);
    let mut rows = Vec::new();
    let mut covered = Vec::new();
    for (id_text, im) in images {
        if done.contains_key(id_text) {
            continue;
        }
        let src = match im.kind {
            ImageKind::Elf => {
                match elf_symbolizer(&mut locator, &mut cache, &im.id, &im.paths, warn) {
                    Some(s) => Source::Elf(ElfState::Ready(Box::new(s), None)),
                    // Tried again on the next run (the binary may be supplied by then).
                    None => continue,
                }
            }
            ImageKind::Kernel | ImageKind::KernelModule => {
                let Some(d) = im.dir.and_then(|i| dirs.get(i)) else { continue };
                let snap = match d.read_kallsyms() {
                    Ok(s) => s,
                    // A planted FIFO, device, link or oversized file: refused (issue 34).
                    Err(e) if e.is_hostile_file() => return Err(e.into()),
                    Err(e) => {
                        warn(format!("{e}: kernel symbols not exported"));
                        continue;
                    }
                };
                let module = if im.kind == ImageKind::KernelModule {
                    match im.paths.first() {
                        Some(p) => Some(display_path(p)),
                        None => continue,
                    }
                } else {
                    None
                };
                let image = im.paths.first().map(|p| display_path(p)).unwrap_or_default();
                let k = Kallsyms::new(
                    Some(Rc::new(snap)),
                    module.as_deref(),
                    &im.id,
                    &image,
                    &d.path,
                    warn,
                );
                if module.is_some() {
                    Source::Module(k)
                } else {
                    Source::Kernel(k)
                }
            }
            // vDSO, JIT and unknown samples have no stable file to name symbols from.
            _ => continue,
        };
        let Some(ranges) = named_ranges(&src) else { continue };
        let build_id = match &im.id {
            ImageId::BuildId(b) => Some(hex::encode(b)),
            ImageId::Fallback(_) => None,
        };
        let image = im.paths.first().map(|p| display_path(p)).unwrap_or_default();
        for (start, end, symbol) in ranges {
            rows.push(SymbolRow {
                image_id: id_text.clone(),
                build_id: build_id.clone(),
                image: image.clone(),
                start,
                end,
                symbol,
            });
        }
        covered.push(id_text.clone());
    }
    Ok((rows, covered))
}

/// `--command` needs per-command profiles, which have no time axis: refused with a time
/// range, and where no selected host directory holds any (dcpid ran without `by_command`),
/// as the report tools refuse them.
fn check_command(o: &Options<'_>, command: &str) -> Result<(), ExportError> {
    use dcpi_client::prof::whoprof::{recorded, WhoSel};
    if o.sel.time_range().is_some() {
        return Err(ProfError::Usage(
            "--since/--until select time slices, and the per-command profiles (--command) have              no time axis (they hold whole-epoch totals): select epochs with --epoch instead"
                .into(),
        )
        .into());
    }
    if !recorded(o.sel, &WhoSel::Command(command.to_owned()))? {
        return Err(ProfError::Empty(format!(
            "the selected epoch(s)/host(s) were recorded without by_command: they hold no              per-command profiles, so {command:?}'s samples cannot be exported (start dcpid              with `by_command = true`, the default since profile version 3)"
        ))
        .into());
    }
    Ok(())
}

fn host_sel_dirs(o: &Options<'_>) -> Result<Vec<HostDir>, ExportError> {
    let db = select::open_db(&o.sel.db)?;
    Ok(select::select_host_dirs(&db, &o.sel.epoch_sel(), &o.sel.host_sel())?)
}

/// With `--since`/`--until`: each selected directory's slices of the range (the rows are
/// then the range's counts; FORMAT.md §14), and the range covered, warned about once.
fn dir_ranges(
    o: &Options<'_>,
    dirs: &[HostDir],
    warn: &mut dyn FnMut(String),
) -> Result<Vec<Option<select::DirRange>>, ExportError> {
    let Some(r) = o.sel.time_range() else { return Ok(dirs.iter().map(|_| None).collect()) };
    let (ranges, cov) = select::range_of_dirs(dirs, r)?;
    for l in cov.lines() {
        warn(format!("note: {l}"));
    }
    if let Some(w) = select::left_out_warning(&cov) {
        warn(w);
    }
    Ok(ranges.into_iter().map(Some).collect())
}

/// Run an export.
pub fn export(o: &Options<'_>, warn: &mut dyn FnMut(String)) -> Result<Outcome, ExportError> {
    if let Some(c) = o.command {
        check_command(o, c)?;
    }
    match o.format {
        Format::Parquet => export_parquet(o, warn),
        Format::Csv => export_csv(o, warn),
    }
}

fn export_parquet(o: &Options<'_>, warn: &mut dyn FnMut(String)) -> Result<Outcome, ExportError> {
    let dirs = host_sel_dirs(o)?;
    let mut ranges = dir_ranges(o, &dirs, warn)?;
    std::fs::create_dir_all(o.output).map_err(io(o.output))?;
    let mut manifest = read_manifest(o.output)?;
    // An older manifest's partitions are exported again (their fingerprints name the version).
    manifest.version = EXPORT_VERSION;
    manifest.database = o.sel.db.display().to_string();
    let mut out = Outcome { host_epochs: dirs.len(), ..Outcome::default() };
    let mut images: BTreeMap<String, SymImage> = BTreeMap::new();
    for (i, d) in dirs.iter().enumerate() {
        let key = format!("{}/{}", d.epoch, d.host);
        let fp = fingerprint(d, &o.sel.events, o.sel.time_range(), o.slices, o.command)?;
        let unchanged = manifest.partitions.get(&key).is_some_and(|p| {
            p.fingerprint == fp && is_partition_file(&p.file) && o.output.join(&p.file).exists()
        });
        if unchanged && o.no_symbols {
            continue;
        }
        // Read also unchanged partitions when symbols are wanted, but only to learn images
        // whose symbols are still missing (cheap compared with writing).
        let range = ranges[i].as_mut();
        let rows = host_rows(d, o, warn, &mut images, i, range)?;
        if unchanged {
            continue;
        }
        let dir = output_subdir(o.output, &format!("samples/epoch={}/host={}", d.epoch, d.host))?;
        let rel = format!("samples/epoch={}/host={}/part-{fp}.parquet", d.epoch, d.host);
        let path = dir.join(format!("part-{fp}.parquet"));
        let bytes = parquet_out::samples(&rows)
            .map_err(|source| ExportError::Parquet { path: path.clone(), source })?;
        profile_format::write_atomic(&path, &bytes)?;
        let samples: u64 = rows.iter().map(|r| r.samples).sum();
        out.rows += rows.len() as u64;
        out.samples += samples;
        out.exported += 1;
        out.files_written.push(path);
        let old = manifest.partitions.insert(
            key,
            Partition { fingerprint: fp, file: rel.clone(), rows: rows.len() as u64, samples },
        );
        // The manifest first names the new file, then the old one goes.
        write_manifest(o.output, &manifest)?;
        if let Some(old) = old.filter(|p| p.file != rel) {
            if !is_partition_file(&old.file) {
                warn(format!(
                    "{}: partition {:?} names {:?}, not a partition file of the layout: not removed",
                    o.output.join(MANIFEST).display(),
                    format!("{}/{}", d.epoch, d.host),
                    old.file
                ));
                continue;
            }
            let p = o.output.join(&old.file);
            match std::fs::remove_file(&p) {
                Ok(()) => out.files_removed.push(p),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&p)(e)),
            }
        }
    }
    if !o.no_symbols {
        let (rows, covered) = symbol_rows(&images, &manifest.symbols, &dirs, o, warn)?;
        if !rows.is_empty() {
            let mut h = Sha256::new();
            for c in &covered {
                h.update(c.as_bytes());
                h.update(b"\0");
            }
            let name = format!("part-{}.parquet", hex::encode(&h.finalize()[..8]));
            let rel = format!("symbols/{name}");
            let path = output_subdir(o.output, "symbols")?.join(name);
            let bytes = parquet_out::symbols(&rows)
                .map_err(|source| ExportError::Parquet { path: path.clone(), source })?;
            profile_format::write_atomic(&path, &bytes)?;
            out.symbol_rows = rows.len() as u64;
            out.files_written.push(path);
            for c in covered {
                manifest.symbols.insert(c, rel.clone());
            }
        }
    }
    write_manifest(o.output, &manifest)?;
    Ok(out)
}

fn export_csv(o: &Options<'_>, warn: &mut dyn FnMut(String)) -> Result<Outcome, ExportError> {
    let dirs = host_sel_dirs(o)?;
    let mut ranges = dir_ranges(o, &dirs, warn)?;
    std::fs::create_dir_all(o.output).map_err(io(o.output))?;
    let mut out = Outcome { host_epochs: dirs.len(), ..Outcome::default() };
    let mut images: BTreeMap<String, SymImage> = BTreeMap::new();
    let mut buf: Vec<u8> = Vec::new();
    let w = |buf: &mut Vec<u8>, line: String| {
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
    };
    w(
        &mut buf,
        "epoch,host,image,image_id,build_id,kind,event,offset,samples,weight,slice_start,\
         slice_seconds,command"
            .into(),
    );
    for (i, d) in dirs.iter().enumerate() {
        let range = ranges[i].as_mut();
        let rows = host_rows(d, o, warn, &mut images, i, range)?;
        for r in &rows {
            w(
                &mut buf,
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    d.epoch,
                    d.host,
                    csv_field(&r.image),
                    csv_field(&r.image_id),
                    csv_field(r.build_id.as_deref().unwrap_or("")),
                    csv_field(r.kind),
                    csv_field(&r.event),
                    r.offset,
                    r.samples,
                    r.weight,
                    r.slice_start.map(timeline::utc).unwrap_or_default(),
                    r.slice_seconds.map(|n| n.to_string()).unwrap_or_default(),
                    r.command.as_deref().map(csv_field).unwrap_or_default()
                ),
            );
            out.samples += r.samples;
        }
        out.rows += rows.len() as u64;
        out.exported += 1;
    }
    let path = o.output.join("samples.csv");
    profile_format::write_atomic(&path, &buf)?;
    out.files_written.push(path);
    if !o.no_symbols {
        let (rows, _) = symbol_rows(&images, &BTreeMap::new(), &dirs, o, warn)?;
        let mut buf = Vec::new();
        w(&mut buf, "image_id,build_id,image,start,end,symbol".into());
        for r in &rows {
            w(
                &mut buf,
                format!(
                    "{},{},{},{},{},{}",
                    csv_field(&r.image_id),
                    csv_field(r.build_id.as_deref().unwrap_or("")),
                    csv_field(&r.image),
                    r.start,
                    r.end,
                    csv_field(&r.symbol)
                ),
            );
        }
        let path = o.output.join("symbols.csv");
        profile_format::write_atomic(&path, &buf)?;
        out.symbol_rows = rows.len() as u64;
        out.files_written.push(path);
    }
    Ok(out)
}

/// One line for stderr.
pub fn describe(o: &Outcome, mut w: impl Write) -> std::io::Result<()> {
    writeln!(
        w,
        "dcpiexport: {} host-epoch(s) selected, {} exported ({} unchanged), {} rows, {} samples, {} symbol ranges",
        o.host_epochs,
        o.exported,
        o.host_epochs - o.exported,
        o.rows,
        o.samples,
        o.symbol_rows
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile_format::{Slice, SliceKey};

    fn row(id: &str, offset: u64, samples: u64) -> SampleRow {
        SampleRow {
            image: "/x".into(),
            image_id: id.into(),
            build_id: None,
            kind: "elf",
            event: "cpu-clock".into(),
            offset,
            samples,
            weight: samples as f64 * 2.0,
            slice_start: None,
            slice_seconds: None,
            command: None,
        }
    }

    /// Slices ahead of the published profile (the current epoch) are cut at the profile's
    /// count, the earliest slices first; what no slice holds is a row without a slice; the
    /// rows still sum to the profile, and the weight follows the samples.
    #[test]
    fn split_rows_sum_to_the_profiles_whatever_the_slices_hold() {
        let id = ImageId::BuildId(vec![7; 20]);
        let key = SliceKey { event: "cpu-clock".into(), image: Some(id.clone()) };
        let slice = |start, pairs: Vec<(u64, u64)>| Slice {
            start,
            len: 60,
            seq: 0,
            counts: [(key.clone(), pairs)].into_iter().collect(),
        };
        let log = SliceLog {
            // File order is not time order: the reader sorts by start.
            slices: vec![slice(180, vec![(16, 9), (99, 5)]), slice(120, vec![(16, 4), (32, 1)])],
            ..SliceLog::default()
        };
        let rows = [row(&id.to_text(), 16, 10), row(&id.to_text(), 32, 3)];
        let out = split_by_slices(&rows, &log);
        let got: Vec<(u64, u64, Option<u64>)> =
            out.iter().map(|r| (r.offset, r.samples, r.slice_start)).collect();
        assert_eq!(
            got,
            [(16, 4, Some(120)), (16, 6, Some(180)), (32, 2, None), (32, 1, Some(120))],
            "offset 99 is in no profile yet: left for the next export"
        );
        for (o, want) in [(16, 10), (32, 3)] {
            let n: u64 = out.iter().filter(|r| r.offset == o).map(|r| r.samples).sum();
            assert_eq!(n, want);
        }
        assert!(out.iter().all(|r| (r.weight - 2.0 * r.samples as f64).abs() < 1e-9));
        assert!(out.iter().all(|r| r.slice_start.is_some() == r.slice_seconds.is_some()));
    }

    /// A slice log at 16 bytes of offset resolution (FORMAT.md §14.2): a block's samples go to
    /// the rows inside the block, so every row's samples are placed in their slices.
    #[test]
    fn coarse_slices_split_the_rows_of_their_blocks() {
        let id = ImageId::BuildId(vec![7; 20]);
        let key = SliceKey { event: "cpu-clock".into(), image: Some(id.clone()) };
        let slice = |start, pairs: Vec<(u64, u64)>| Slice {
            start,
            len: 60,
            seq: 0,
            counts: [(key.clone(), pairs)].into_iter().collect(),
        };
        let mut log = SliceLog {
            slices: vec![slice(120, vec![(0x10, 6), (0x20, 2)]), slice(180, vec![(0x10, 2)])],
            ..SliceLog::default()
        };
        for s in &mut log.slices {
            s.seq = s.start;
        }
        let bytes = log.rollup_at(u64::MAX, 60, 16).encode();
        let log = SliceLog::decode(&bytes, std::path::Path::new("slices.log")).unwrap();
        assert_eq!(log.resolution_of(&log.slices[0]), 16);
        let rows =
            [row(&id.to_text(), 0x14, 6), row(&id.to_text(), 0x1c, 2), row(&id.to_text(), 0x2a, 2)];
        let out = split_by_slices(&rows, &log);
        assert!(out.iter().all(|r| r.slice_start.is_some()), "every sample in a slice: {out:?}");
        let per_slice = |t: u64| -> u64 {
            out.iter().filter(|r| r.slice_start == Some(t)).map(|r| r.samples).sum()
        };
        assert_eq!((per_slice(120), per_slice(180)), (8, 2));
        for r in &rows {
            let n: u64 = out.iter().filter(|x| x.offset == r.offset).map(|x| x.samples).sum();
            assert_eq!(n, r.samples, "{:#x}", r.offset);
        }
    }
}
