//! `dcpilist --top N`: the hottest instructions of every image (DCPI's dcpitopcounts).

use std::collections::HashMap;

use profile_format::{ImageId, ImageKind};
use serde::Serialize;

use super::cli::{Args, ListError};
use super::disasm;
use super::listing::{event_counts, pct, Counts};
use dcpi_report::debuginfo::live_vdso;
use dcpi_report::error::ProfError;
use dcpi_report::escape::controls;
use dcpi_report::image::{build_id_hex, display_path, image_display};
use dcpi_report::report::{self, ElfRequest, EventCount, EventInfo, ImageInfo, Scope, SymbolMode};
use dcpi_report::select::Loaded;
use dcpi_report::symbolizer::{JitTable, Kallsyms, Snapshots, Source};

/// One of the hottest instructions.
#[derive(Clone, Debug, Serialize)]
pub struct TopRow {
    pub image: String,
    pub build_id: Option<String>,
    pub symbol: Option<String>,
    pub offset: u64,
    pub instruction: Option<String>,
    pub source: Option<String>,
    pub samples: u64,
    pub percent: f64,
    pub events: Vec<EventCount>,
}

/// `--top` report.
#[derive(Clone, Debug, Serialize)]
pub struct TopReport {
    pub report: &'static str,
    #[serde(flatten)]
    pub scope: Scope,
    pub events: Vec<EventInfo>,
    pub total_samples: u64,
    pub rows: Vec<TopRow>,
}

type ImageKey = (ImageKind, ImageId);

pub fn run(args: &Args, n: usize, warnings: &mut Vec<String>) -> Result<TopReport, ListError> {
    let loaded = super::load::load_for(args, None, warnings)?;
    if loaded.profiles.is_empty() {
        return Err(ProfError::Empty(
            "no profiles in the selected epoch(s)/host(s): nothing sampled yet (run `dcpictl \
             flush`), or pick another --epoch / --host"
                .into(),
        )
        .into());
    }
    let w = report::weights(&loaded, &args.sel.events)?;
    // --image: that image's instructions only (chosen as a listing chooses it); the percent
    // stays of the machine's total.
    let only: Option<std::collections::HashSet<usize>> = match args.image.as_deref() {
        Some(spec) => Some(report::resolve_image(&loaded, &w, spec)?.into_iter().collect()),
        None => None,
    };
    let ne = w.events.len();
    let mut per: HashMap<(ImageKey, u64), Counts> = HashMap::new();
    let mut first_of: HashMap<ImageKey, usize> = HashMap::new();
    let mut totals = Counts::new(ne);
    for (i, p) in loaded.profiles.iter().enumerate() {
        let Some((ei, wt)) = w.per_profile[i] else { continue };
        let h = &p.profile.header;
        for (&off, &c) in &p.profile.counts {
            totals.add(ei, c, wt);
            if h.kind == ImageKind::Unknown || only.as_ref().is_some_and(|o| !o.contains(&i)) {
                continue;
            }
            let key: ImageKey = (h.kind, h.image_id.clone());
            first_of.entry(key.clone()).or_insert(i);
            per.entry((key, off)).or_insert_with(|| Counts::new(ne)).add(ei, c, wt);
        }
    }
    let mut v: Vec<((ImageKey, u64), Counts)> = per.into_iter().collect();
    v.sort_by(|a, b| {
        b.1.events[0]
            .total_cmp(&a.1.events[0])
            .then(b.1.samples[0].cmp(&a.1.samples[0]))
            .then(a.0 .1.cmp(&b.0 .1))
    });
    v.retain(|(_, c)| !c.is_zero());
    v.truncate(n);
    let mut resolver =
        Resolver { args, loaded: &loaded, elf: HashMap::new(), snaps: Snapshots::default() };
    let mut rows = Vec::with_capacity(v.len());
    for ((key, off), c) in v {
        let pi = first_of[&key];
        let p = &loaded.profiles[pi];
        let (symbol, instruction, source) = resolver.describe(pi, &key, off, warnings);
        let ev = event_counts(&c, &w.events, &totals.events);
        rows.push(TopRow {
            image: image_display(&p.profile.header),
            build_id: build_id_hex(&key.1),
            symbol,
            offset: off,
            instruction,
            source,
            samples: c.samples[0],
            percent: pct(c.events[0], totals.events[0]),
            events: ev,
        });
    }
    Ok(TopReport {
        report: "top",
        scope: report::scope(&loaded, &args.sel.db.display().to_string()),
        total_samples: w.infos.first().map_or(0, |i| i.samples),
        events: w.infos,
        rows,
    })
}

struct Resolver<'a> {
    args: &'a Args,
    loaded: &'a Loaded,
    /// ELF and vDSO sources, and whether their code is x86-64 (disassembled).
    elf: HashMap<ImageKey, Option<(Source, bool)>>,
    snaps: Snapshots,
}

impl Resolver<'_> {
    /// Symbol (with its offset, `f+0x12`), instruction text and source line of one offset:
    /// the symbol as the one symbolizer names it for every report.
    fn describe(
        &mut self,
        pi: usize,
        key: &ImageKey,
        off: u64,
        warnings: &mut Vec<String>,
    ) -> (Option<String>, Option<String>, Option<String>) {
        let p = &self.loaded.profiles[pi];
        let h = &p.profile.header;
        let mode = SymbolMode::default();
        match h.kind {
            ImageKind::Elf | ImageKind::Vdso => {
                let args = self.args;
                let s = self.elf.entry(key.clone()).or_insert_with(|| {
                    let mut info = ImageInfo::default();
                    let mut locator = args.names.symbols.locator(&args.sel.db);
                    let want = SymbolMode { lines: true, inlines: false, raw_names: false };
                    let src = if h.kind == ImageKind::Vdso {
                        Source::Vdso(report::load_vdso(&mut locator, &h.image_id, want, &mut info))
                    } else {
                        let mut cache = args.names.symbols.cache(&mut |w| warnings.push(w));
                        let rec = [h.image_path.clone()];
                        let r = ElfRequest { id: &h.image_id, recorded: &rec, mode: want };
                        Source::Elf(report::load_elf(
                            &mut locator,
                            &mut cache,
                            &r,
                            &mut info,
                            &mut |w| warnings.push(w),
                        ))
                    };
                    let x86 = match src.elf()?.binary_path() {
                        Some(b) => is_x86_64(Some(b), None),
                        None => live_vdso().is_some_and(|d| is_x86_64(None, Some(&d))),
                    };
                    Some((src, x86))
                });
                let Some((src, x86)) = s else { return (None, None, None) };
                let x86 = *x86;
                let Some(s) = src.elf() else { return (None, None, None) };
                let Some(vaddr) = s.offset_to_vaddr(off) else { return (None, None, None) };
                let sym = src.symbolize(off, mode, "").with_offset();
                let code = match s.binary_path() {
                    Some(b) => read_bytes(b, off),
                    None => live_vdso().and_then(|d| {
                        d.get(off as usize..d.len().min(off as usize + 16)).map(<[u8]>::to_vec)
                    }),
                };
                let insn = code.filter(|_| x86).and_then(|c| {
                    disasm::decode(&c, vaddr, self.args.syntax).into_iter().next().map(|i| i.text)
                });
                let src = s.frame(vaddr).and_then(|f| {
                    f.file.map(|file| {
                        format!("{}:{}", controls(&file).into_owned(), f.line.unwrap_or(0))
                    })
                });
                (sym, insn, src)
            }
            ImageKind::Kernel | ImageKind::KernelModule => {
                // As before, `--top` says nothing about snapshots it cannot use: their rows
                // just have no symbol.
                let snap = self.snaps.get(self.loaded, p.dir, "samples", &mut |_| {});
                let module =
                    (h.kind == ImageKind::KernelModule).then(|| display_path(&h.image_path));
                let dir = &self.loaded.dirs[p.dir].path;
                let image = image_display(h);
                let k =
                    Kallsyms::new(snap, module.as_deref(), &h.image_id, &image, dir, &mut |_| {});
                let (Some(snap), Some(addr)) = (k.snapshot(), k.address(off)) else {
                    return (None, None, None);
                };
                let insn = if k.module().is_none() {
                    let mut ignore = Vec::new();
                    super::kernel::read_kernel_code(
                        self.args.vmlinux.as_deref(),
                        snap,
                        addr,
                        16,
                        &mut ignore,
                    )
                    .ok()
                    .and_then(|c| {
                        disasm::decode(&c, addr, self.args.syntax)
                            .into_iter()
                            .next()
                            .map(|i| i.text)
                    })
                } else {
                    None
                };
                let src = if module.is_some() { Source::Module(k) } else { Source::Kernel(k) };
                (src.symbolize(off, mode, "").with_offset(), insn, None)
            }
            ImageKind::Anon => {
                let src = Source::Jit(JitTable::new(h.jit_symbols.clone()));
                (src.symbolize(off, mode, "").with_offset(), None, None)
            }
            ImageKind::Unknown => (None, None, None),
        }
    }
}

/// Up to 16 bytes (the longest x86 instruction is 15) at `off` of a file.
fn read_bytes(path: &std::path::Path, off: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::Start(off)).ok()?;
    let mut buf = Vec::with_capacity(16);
    f.take(16).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// Whether an ELF file holds x86-64 code (anything else is not disassembled).
pub(crate) fn is_x86_64(data_path: Option<&std::path::Path>, data: Option<&[u8]>) -> bool {
    use object::Object;
    let arch = match (data_path, data) {
        (Some(p), _) => std::fs::File::open(p).ok().and_then(|mut f| {
            let cache = object::ReadCache::new(&mut f);
            object::File::parse(&cache).ok().map(|o| o.architecture())
        }),
        (None, Some(d)) => object::File::parse(d).ok().map(|o| o.architecture()),
        _ => None,
    };
    arch == Some(object::Architecture::X86_64)
}
