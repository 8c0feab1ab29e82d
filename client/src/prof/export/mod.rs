//! Exports for the tools performance engineers already use: pprof (`go tool pprof`, Parca,
//! Pyroscope), folded stacks (flamegraph.pl, inferno, speedscope), a flame graph SVG and a
//! self-contained HTML report.
//!
//! Every format is written from one [`Export`]: the selected profiles symbolized image by image
//! into locations (image, offset) with their function, and samples keyed by (stack, host,
//! epoch, event). A stack is a list of locations, leaf first; without call stacks it has one
//! location, and the image is the frame under the function in folded stacks and flame graphs.
//! Call stacks will add locations to the same list.

pub mod flame;
pub mod html;
mod model;
pub mod pprof;
pub mod speedscope;

pub use model::{xml, Export, Function, Image, Location, Sample};

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::Path;

use profile_format::{ImageId, ImageKind};

use crate::args::SymbolSearch;
use dcpi_report::error::ProfError;
use dcpi_report::escape::controls;
use dcpi_report::report::{self, display_path, ImageReport, SymbolContext, SymbolMode, Weights};
use dcpi_report::select::Loaded;
use dcpi_report::select::LoadedProfile;
use dcpi_report::stats;
use dcpi_report::stats::PROFILES_READ;

/// An export format (`--format folded|pprof|svg|html|speedscope`). Every match on it is
/// exhaustive, so a new format does not compile until each place writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Folded stacks for flame graph tools: `image;symbol count` per line.
    Folded,
    /// Gzipped pprof profile.proto (go tool pprof, Parca, Pyroscope).
    Pprof,
    /// Flame graph SVG (searchable, zoomable).
    Svg,
    /// Self-contained HTML report (tables, flame graph, trend).
    Html,
    /// speedscope JSON (speedscope.app, also read by Firefox Profiler's importer).
    Speedscope,
}

impl ExportFormat {
    /// Every format, in `--format`'s order. The derived `clap::ValueEnum::value_variants` lists
    /// every variant by construction, and a test checks this list against it, so it cannot
    /// miss one.
    pub const ALL: &'static [Self] =
        &[Self::Folded, Self::Pprof, Self::Svg, Self::Html, Self::Speedscope];

    /// Whether the format is binary (never written to a terminal).
    pub fn is_binary(self) -> bool {
        match self {
            Self::Pprof => true,
            Self::Folded | Self::Svg | Self::Html | Self::Speedscope => false,
        }
    }

    /// Write `x` in this format; `limit` bounds the HTML report's tables.
    pub fn write(
        self,
        x: &Export,
        limit: Option<usize>,
        out: &mut dyn Write,
    ) -> Result<(), ProfError> {
        match self {
            Self::Folded => flame::write_folded(out, x)?,
            Self::Pprof => out.write_all(&pprof::encode(x)?)?,
            Self::Svg => {
                let svg = flame::svg(&x.folded(), &flame::title(x), flame::unit(x), true);
                out.write_all(svg.as_bytes())?
            }
            Self::Html => out.write_all(html::page(x, limit).as_bytes())?,
            Self::Speedscope => {
                serde_json::to_writer(&mut *out, &speedscope::document(x))
                    .map_err(std::io::Error::from)?;
                writeln!(out)?
            }
        }
        Ok(())
    }
}

/// What to export and how to find symbols.
#[derive(Debug)]
pub struct Request<'a> {
    pub db: &'a Path,
    pub symbols: &'a SymbolSearch,
    pub mode: SymbolMode,
    /// Only this image's profiles (`--image`), as [`report::resolve_image`] chose them.
    pub only: Option<Vec<usize>>,
    pub keep_going: bool,
}

/// Profiles (indices) per image identity, the images in per-image report order.
fn groups(loaded: &Loaded, w: &Weights, only: Option<&[usize]>) -> Vec<Vec<usize>> {
    type Key = (ImageKind, Option<ImageId>);
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut out: Vec<(f64, Vec<usize>)> = Vec::new();
    let all: Vec<usize> = (0..loaded.profiles.len()).collect();
    for &i in only.unwrap_or(&all) {
        let Some((_, wt)) = w.per_profile[i] else { continue };
        let h = &loaded.profiles[i].profile.header;
        let key = match h.kind {
            ImageKind::Unknown => (ImageKind::Unknown, None),
            k => (k, Some(h.image_id.clone())),
        };
        let g = *index.entry(key).or_insert_with(|| {
            out.push((0.0, Vec::new()));
            out.len() - 1
        });
        out[g].0 += wt * loaded.profiles[i].samples as f64;
        out[g].1.push(i);
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out.into_iter().map(|(_, v)| v).collect()
}

/// Progress over profile files, drawn only on a terminal and only for long exports (a fleet
/// database): a pipe or a log never sees it.
fn progress(files: usize) -> indicatif::ProgressBar {
    const LONG: usize = 500;
    if files < LONG || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let style = indicatif::ProgressStyle::with_template(
        "dcpiprof: symbolizing {bar:40} {pos}/{len} profiles ({eta} left)",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    indicatif::ProgressBar::new(files as u64).with_style(style)
}

/// Symbolize the selection into an [`Export`]. Counts are read one image at a time (the
/// per-image load leaves them out), so a fleet database is never held in memory at once.
pub fn build(
    loaded: &mut Loaded,
    w: &Weights,
    req: &Request<'_>,
    warn: &mut dyn FnMut(String),
) -> Result<Export, ProfError> {
    let db = req.db.display().to_string();
    let image_report = report::image_report(loaded, w, &db, None);
    let scope = image_report.head.scope.clone();
    let hosts = scope.hosts.clone();
    let epochs = scope.epochs.clone();
    let groups = groups(loaded, w, req.only.as_deref());
    let mut locator = req.symbols.locator(req.db);
    let mut cache = req.symbols.cache(warn);

    let mut images: Vec<Image> = Vec::new();
    let mut functions: Vec<Function> = Vec::new();
    let mut fn_index: HashMap<Function, usize> = HashMap::new();
    let mut locations: Vec<Location> = Vec::new();
    let mut loc_index: HashMap<(usize, u64), usize> = HashMap::new();
    let mut stacks: Vec<Vec<usize>> = Vec::new();
    let mut sample_index: HashMap<(u32, u32, u32, u32), u32> = HashMap::new();
    let mut samples: Vec<Sample> = Vec::new();
    let host_of: Vec<u32> = loaded
        .dirs
        .iter()
        .map(|d| hosts.iter().position(|h| *h == d.host).unwrap_or(0) as u32)
        .collect();
    let epoch_of: Vec<u32> = loaded
        .dirs
        .iter()
        .map(|d| epochs.iter().position(|e| e == d.epoch.as_str()).unwrap_or(0) as u32)
        .collect();

    let bar = progress(groups.iter().map(Vec::len).sum());
    for group in &groups {
        // Read this image's counts (dropped by the per-image load).
        for &i in group {
            let p = &mut loaded.profiles[i];
            if p.profile.counts.is_empty() && p.samples > 0 {
                stats::count(&PROFILES_READ);
                match profile_format::Profile::read(&p.path) {
                    Ok(fresh) => p.profile.counts = fresh.counts,
                    Err(e) if req.keep_going => warn(format!("skipping corrupt profile: {e}")),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let gi = images.len();
        let first = &loaded.profiles[group[0]];
        let h = &first.profile.header;
        let name = image_report
            .rows
            .iter()
            .find(|r| {
                r.kind == report::kind_name(h.kind)
                    && (h.kind == ImageKind::Unknown
                        || r.image_id.as_deref() == Some(id_text(&h.image_id).as_str()))
            })
            .map_or_else(|| display_path(&h.image_path), |r| r.image.clone());
        images.push(Image {
            name,
            kind: report::kind_name(h.kind),
            build_id: match &h.image_id {
                ImageId::BuildId(b) if h.kind != ImageKind::Unknown => Some(hex::encode(b)),
                _ => None,
            },
            symbolized: false,
            max_offset: 0,
        });
        let cx = SymbolContext {
            loaded,
            weights: w,
            locator: &mut locator,
            cache: &mut cache,
            mode: req.mode,
            warn: &mut *warn,
        };
        let mut visit = |hit: report::Hit<'_>| {
            let Some((ei, wt)) = w.per_profile[hit.profile] else { return };
            let dir = loaded.profiles[hit.profile].dir;
            let img = &mut images[gi];
            img.max_offset = img.max_offset.max(hit.offset);
            img.symbolized |= hit.system_name.is_some();
            let loc = *loc_index.entry((gi, hit.offset)).or_insert_with(|| {
                let (name, source) = hit.key.clone();
                let (file, line) = split_source(source.as_deref());
                let f = Function {
                    name: controls(&name).into_owned(),
                    system_name: hit.system_name.map(|n| controls(n).into_owned()),
                    file: file.map(|f| controls(&f).into_owned()),
                };
                let function = *fn_index.entry(f.clone()).or_insert_with(|| {
                    functions.push(f);
                    functions.len() - 1
                });
                locations.push(Location { image: gi, offset: hit.offset, function, line });
                // Without call stacks each location is its own one-frame stack.
                stacks.push(vec![locations.len() - 1]);
                stacks.len() - 1
            });
            let key = (loc as u32, host_of[dir], epoch_of[dir], ei as u32);
            let si = *sample_index.entry(key).or_insert_with(|| {
                samples.push(Sample {
                    stack: key.0,
                    host: key.1,
                    epoch: key.2,
                    event: key.3,
                    samples: 0,
                    events: 0.0,
                });
                (samples.len() - 1) as u32
            }) as usize;
            samples[si].samples += hit.count;
            samples[si].events += hit.count as f64 * wt;
        };
        report::symbolize_image(cx, group, &mut visit);
        for &i in group {
            loaded.profiles[i].profile.counts = Default::default();
        }
        bar.inc(group.len() as u64);
    }
    bar.finish_and_clear();

    let mut per_epoch: Vec<HashMap<String, f64>> = vec![HashMap::new(); epochs.len()];
    let only: Option<std::collections::HashSet<usize>> =
        req.only.as_ref().map(|o| o.iter().copied().collect());
    for (i, p) in loaded.profiles.iter().enumerate() {
        let Some((ei, wt)) = w.per_profile[i] else { continue };
        if ei != 0 || only.as_ref().is_some_and(|o| !o.contains(&i)) {
            continue;
        }
        let name = image_name_of(&image_report, p);
        *per_epoch[epoch_of[p.dir] as usize].entry(name).or_default() += wt * p.samples as f64;
    }
    let (time_nanos, duration_nanos) = times(loaded);
    Ok(Export {
        scope,
        events: w.infos.clone(),
        images,
        functions,
        locations,
        stacks,
        commands: Vec::new(),
        stack_commands: HashMap::new(),
        samples,
        hosts,
        epochs,
        time_nanos,
        duration_nanos,
        image_report,
        per_epoch,
        timeline: Vec::new(),
    })
}

fn id_text(id: &ImageId) -> String {
    match id {
        ImageId::BuildId(b) => format!("b{}", hex::encode(b)),
        ImageId::Fallback(f) => format!("f{}", hex::encode(f)),
    }
}

fn image_name_of(r: &ImageReport, p: &LoadedProfile) -> String {
    let h = &p.profile.header;
    if h.kind == ImageKind::Unknown {
        return "[unknown]".to_owned();
    }
    let id = id_text(&h.image_id);
    r.rows
        .iter()
        .find(|row| row.image_id.as_deref() == Some(id.as_str()))
        .map_or_else(|| display_path(&h.image_path), |row| row.image.clone())
}

/// The selection's real time range: from the start of its earliest epoch to the latest end of
/// a host directory's sampling, where a directory's sampling ends at its epoch's start plus
/// the time its counters ran (summary.json `time_running_ns` over its CPUs, the longest
/// event). Not `last_written`: a restarted daemon rewrites that long after the epoch's
/// samples (issue 39: 140 s for a 62 s epoch). A directory without recorded times falls
/// back to `last_written`.
fn times(loaded: &Loaded) -> (i64, i64) {
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
    };
    let start = loaded.dirs.iter().map(|d| secs(d.epoch.start_time())).reduce(f64::min);
    let end = loaded
        .dirs
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let s = loaded.summaries.get(i)?.as_ref()?;
            let ran = s.events.iter().map(|e| e.time_running_ns).max().unwrap_or(0);
            if ran > 0 && !s.cpus.is_empty() {
                Some(secs(d.epoch.start_time()) + ran as f64 / 1e9 / s.cpus.len() as f64)
            } else {
                (s.last_written > 0).then_some(s.last_written as f64)
            }
        })
        .reduce(f64::max);
    let nanos = |s: f64| (s * 1e9).round() as i64;
    match (start, end) {
        (Some(s), Some(e)) if e > s => (nanos(s), nanos(e - s)),
        (Some(s), _) => (nanos(s), 0),
        _ => (0, 0),
    }
}

/// `file:line` (from `--lines`) split; `??:0` means unknown.
fn split_source(s: Option<&str>) -> (Option<String>, Option<u32>) {
    let Some(s) = s else { return (None, None) };
    let (file, line) = match s.rsplit_once(':') {
        Some((f, l)) => (f, l.parse::<u32>().ok().filter(|&l| l > 0)),
        None => (s, None),
    };
    ((!file.is_empty() && file != "??").then(|| file.to_owned()), line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcpi_report::report::{EventInfo, Scope};
    use flate2::read::GzDecoder;

    #[test]
    fn sources_split_and_unknown_lines_dropped() {
        assert_eq!(split_source(Some("a/b.c:12")), (Some("a/b.c".into()), Some(12)));
        assert_eq!(split_source(Some("??:0")), (None, None));
        assert_eq!(split_source(None), (None, None));
    }

    /// Two samples of `/usr/bin/app` (`main`, `hot`) on one host in one epoch.
    fn tiny() -> Export {
        let scope = Scope {
            database: "/db".into(),
            epochs: vec!["20261129T000000Z".into()],
            hosts: vec!["h".into()],
            newest_data: 0,
            time: None,
        };
        let events = vec![EventInfo {
            name: "cpu-clock".into(),
            samples: 5,
            events: 5_000_000,
            mean_period: 1e6,
            nominal_period: 1_000_000,
            multiplex_scale: 1.0,
        }];
        let function = |name: &str| Function { name: name.into(), system_name: None, file: None };
        let sample = |stack: u32, samples: u64| Sample {
            stack,
            host: 0,
            epoch: 0,
            event: 0,
            samples,
            events: samples as f64 * 1e6,
        };
        Export {
            scope: scope.clone(),
            events: events.clone(),
            images: vec![Image {
                name: "/usr/bin/app".into(),
                kind: "elf",
                build_id: Some("ab".repeat(20)),
                symbolized: true,
                max_offset: 0x1100,
            }],
            functions: vec![function("main"), function("hot")],
            locations: vec![
                Location { image: 0, offset: 0x1000, function: 0, line: None },
                Location { image: 0, offset: 0x1100, function: 1, line: None },
            ],
            stacks: vec![vec![0], vec![1, 0]],
            commands: Vec::new(),
            stack_commands: HashMap::new(),
            samples: vec![sample(0, 2), sample(1, 3)],
            hosts: scope.hosts.clone(),
            epochs: scope.epochs.clone(),
            time_nanos: 0,
            duration_nanos: 0,
            image_report: ImageReport {
                head: report::Head {
                    report: "images",
                    scope,
                    events,
                    total_samples: 5,
                    rows_omitted: 0,
                },
                idle: report::IdleShare::default(),
                rows: Vec::new(),
            },
            per_epoch: vec![HashMap::new()],
            timeline: Vec::new(),
        }
    }

    /// Every export format writes its own format (no format falls through to another's
    /// writer): each output is checked for its format's signature, the check chosen by an
    /// exhaustive match, over [`ExportFormat::ALL`], which is the derived list of variants.
    #[test]
    fn every_export_format_writes_its_own_format() {
        use clap::ValueEnum;
        assert_eq!(ExportFormat::ALL, ExportFormat::value_variants(), "ALL lists every format");
        let x = tiny();
        let mut seen: Vec<Vec<u8>> = Vec::new();
        for &f in ExportFormat::ALL {
            let mut out = Vec::new();
            f.write(&x, None, &mut out).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            let text = String::from_utf8_lossy(&out);
            match f {
                ExportFormat::Folded => {
                    let lines: Vec<&str> = text.lines().collect();
                    assert_eq!(lines, ["/usr/bin/app;main 2", "/usr/bin/app;main;hot 3"]);
                }
                ExportFormat::Pprof => {
                    assert_eq!(out[..2], [0x1f, 0x8b], "gzip magic");
                    let mut raw = Vec::new();
                    std::io::Read::read_to_end(&mut GzDecoder::new(&out[..]), &mut raw)
                        .expect("a gzip stream");
                    let raw = String::from_utf8_lossy(&raw);
                    assert!(raw.contains("hot") && raw.contains("/usr/bin/app"), "{raw:?}");
                }
                ExportFormat::Svg => {
                    assert!(text.contains("<svg") && text.trim_end().ends_with("</svg>"), "{text}");
                    assert!(!text.contains("<!DOCTYPE html"), "an SVG, not a page");
                }
                ExportFormat::Html => {
                    assert!(text.starts_with("<!DOCTYPE html"), "{text}");
                    assert!(text.trim_end().ends_with("</html>"));
                }
                ExportFormat::Speedscope => {
                    let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
                    let schema = v["$schema"].as_str().unwrap_or_default();
                    assert!(schema.contains("speedscope"), "{v:#}");
                    assert_eq!(v["profiles"][0]["samples"].as_array().map(Vec::len), Some(2));
                }
            }
            assert!(!seen.contains(&out), "{f:?} writes what another format wrote");
            seen.push(out);
        }
    }

    /// Call stacks start at their command: folded lines and speedscope stacks put it first,
    /// pprof samples end in a location named by it and carry a `comm` label; a flat sample's
    /// stack keeps its image as root.
    #[test]
    fn stacks_are_rooted_at_their_command() {
        let mut x = tiny();
        x.commands = vec!["postgres".into()];
        x.stack_commands.insert(1, 0);
        assert_eq!(
            x.folded(),
            [
                (vec!["/usr/bin/app".to_owned(), "main".to_owned()], 2),
                (vec!["postgres".to_owned(), "main".to_owned(), "hot".to_owned()], 3)
            ]
        );
        let p = pprof::profile(&x);
        let s = |i: i64| p.string_table[i as usize].as_str();
        let fname = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).expect("location");
            s(p.function.iter().find(|f| f.id == l.line[0].function_id).expect("function").name)
        };
        for sample in &p.sample {
            let comm: Vec<&str> =
                sample.label.iter().filter(|l| s(l.key) == "comm").map(|l| s(l.str)).collect();
            let root = fname(*sample.location_id.last().expect("a stack"));
            if sample.location_id.len() == 3 {
                assert_eq!((comm.as_slice(), root), (&["postgres"][..], "postgres"));
                assert_eq!(fname(sample.location_id[0]), "hot");
            } else {
                assert_eq!((comm.len(), root), (0, "main"));
            }
        }
        let v = speedscope::document(&x);
        let names: Vec<&str> = v["shared"]["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f["name"].as_str().expect("name"))
            .collect();
        assert!(names.contains(&"postgres") && names.contains(&"/usr/bin/app"), "{names:?}");
    }

    #[test]
    fn only_pprof_is_binary() {
        for &f in ExportFormat::ALL {
            assert_eq!(f.is_binary(), f == ExportFormat::Pprof, "{f:?}");
        }
    }

    #[test]
    fn xml_quoted() {
        assert_eq!(xml("<a & 'b'>"), "&lt;a &amp; &#39;b&#39;&gt;");
    }
}
