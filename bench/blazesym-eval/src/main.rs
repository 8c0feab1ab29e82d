//! Side-by-side: dcpiprof's per-symbol report (cold/warm symbol cache) vs blazesym
//! (Input::FileOffset) on the same 4000 function-entry offsets of a large binary.
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use blazesym::symbolize::{source, Input, Symbolized, Symbolizer};
use clap::Parser;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use profile_format::{Database, EventDesc, ImageId, ImageKind, Profile, ProfileHeader};

struct Want { offsets: Vec<u64>, vaddrs: Vec<u64>, names: Vec<String>, bid: Vec<u8> }

fn sample(data: &[u8], want: usize) -> Want {
    let f = object::File::parse(data).unwrap();
    let bid = f.build_id().unwrap().unwrap().to_vec();
    let _ = f.sections().count();
    let mut syms: Vec<(u64, String)> = f
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.name().unwrap_or("").to_owned()))
        .collect();
    syms.sort();
    syms.dedup_by_key(|s| s.0);
    let step = (syms.len() / want).max(1);
    let mut w = Want { offsets: vec![], vaddrs: vec![], names: vec![], bid };
    for (a, n) in syms.iter().step_by(step) {
        if let Some(off) = f.segments().find_map(|seg| {
            let (off, size) = seg.file_range();
            (*a >= seg.address() && a - seg.address() < size).then(|| a - seg.address() + off)
        }) {
            w.offsets.push(off);
            w.vaddrs.push(*a);
            w.names.push(n.clone());
        }
    }
    w
}

fn make_db(root: &Path, bin: &Path, w: &Want) -> String {
    let db = Database::create(root).unwrap();
    let e = db.new_epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000), "bench").unwrap();
    let hd = db.host_dir(&e, "bench").unwrap();
    hd.create().unwrap();
    let ev = EventDesc { name: "cpu-clock".into(), perf_type: 1, perf_config: 0, period_mean: 1_000_000, period_min: 937_500, period_max: 1_000_000 };
    let id = ImageId::BuildId(w.bid.clone());
    let mut p = Profile::new(ProfileHeader {
        kind: ImageKind::Elf, image_id: id.clone(), image_path: bin.display().to_string().into_bytes(),
        event: ev, host: "bench".into(), epoch: e.clone(), total_samples: 0, total_period: 0, sequence: 0, jit_symbols: Vec::new(),
    });
    for (i, off) in w.offsets.iter().enumerate() { let c = 1 + (i as u64 % 7); p.add(*off, c, c * 1_000_000); }
    p.write(&hd.profile_path(&id, "cpu-clock")).unwrap();
    hex::encode(&w.bid)
}

fn report(db: &Path, image: &str, cache: &Path, lines: bool) -> Vec<u8> {
    report_opt(db, image, Some(cache), lines)
}

fn report_opt(db: &Path, image: &str, cache: Option<&Path>, lines: bool) -> Vec<u8> {
    let mut argv = vec!["dcpiprof".to_owned(), "--db".into(), db.display().to_string(), "--host".into(), "bench".into(),
        "--no-system-debug".into(), "--image".into(), image.into(), "--format".into(), "json".into(),
        ];
    match cache { Some(c) => { argv.push("--symbol-cache".into()); argv.push(c.display().to_string()); } None => argv.push("--no-symbol-cache".into()) }
    if lines { argv.push("--lines".into()); }
    let args = dcpi_client::prof::Args::parse_from(argv);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    dcpi_client::prof::run(&args, &mut out, &mut err).unwrap();
    out
}

fn median(mut v: Vec<f64>) -> f64 { v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2] }

fn blaze(bin: &Path, offs: &[u64], lines: bool, sym: Option<&Symbolizer>) -> (usize, Vec<(u64, String, Option<u32>)>) {
    let own;
    let s = match sym { Some(s) => s, None => { own = Symbolizer::builder().enable_code_info(lines).enable_inlined_fns(lines).build(); &own } };
    let mut src = source::Elf::new(bin);
    src.debug_syms = lines;
    let src = source::Source::Elf(src);
    let r = s.symbolize(&src, Input::FileOffset(offs)).unwrap();
    let mut found = 0;
    let mut out = Vec::new();
    for x in r {
        match x {
            Symbolized::Sym(sym) => {
                found += 1;
                let line = sym.inlined.last().and_then(|i| i.code_info.as_ref()).or(sym.code_info.as_deref()).and_then(|c| c.line);
                out.push((sym.addr, sym.name.to_string(), line));
            }
            Symbolized::Unknown(_) => out.push((0, String::new(), None)),
        }
    }
    (found, out)
}

fn main() {
    let bin = std::path::PathBuf::from(std::env::args().nth(1).expect("binary"));
    let runs: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(7);
    let data = std::fs::read(&bin).unwrap();
    let w = sample(&data, 4000);
    eprintln!("{}: {:.1} MB, {} offsets", bin.display(), data.len() as f64 / 1e6, w.offsets.len());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let image = make_db(&db, &bin, &w);
    let mut n = 0;
    for lines in [false, true] {
        let mode = if lines { "lines" } else { "symbols" };
        // dcpiprof cold (fresh symbol cache) and warm (populated cache)
        let mut cold = vec![]; let mut warm = vec![]; let mut nocache = vec![]; let mut bcold = vec![]; let mut bwarm = vec![];
        let warm_cache = dir.path().join(format!("warm-{mode}.sqlite"));
        let _ = report(&db, &image, &warm_cache, lines);
        for _ in 0..runs {
            n += 1;
            let c = dir.path().join(format!("cold-{n}.sqlite"));
            let t = Instant::now(); let _ = report(&db, &image, &c, lines); cold.push(t.elapsed().as_secs_f64());
            let t = Instant::now(); let _ = report(&db, &image, &warm_cache, lines); warm.push(t.elapsed().as_secs_f64());
            let t = Instant::now(); let _ = report_opt(&db, &image, None, lines); nocache.push(t.elapsed().as_secs_f64());
            let t = Instant::now(); let (found, _) = blaze(&bin, &w.offsets, lines, None); bcold.push(t.elapsed().as_secs_f64());
            assert!(found > 0);
            let s = Symbolizer::builder().enable_code_info(lines).enable_inlined_fns(lines).build();
            let _ = blaze(&bin, &w.offsets, lines, Some(&s));
            let t = Instant::now(); let _ = blaze(&bin, &w.offsets, lines, Some(&s)); bwarm.push(t.elapsed().as_secs_f64());
        }
        println!("{mode}: dcpiprof no cache {:.1} ms, cold {:.1} ms, warm {:.1} ms | blazesym new symbolizer {:.1} ms, same symbolizer again {:.1} ms (median of {runs})",
            median(nocache) * 1e3, median(cold) * 1e3, median(warm) * 1e3, median(bcold) * 1e3, median(bwarm) * 1e3);
        // correctness of symbols
        let (found, res) = blaze(&bin, &w.offsets, lines, None);
        let mut wrong_addr = 0; let mut name_diff = 0; let mut no_line = 0;
        for (i, (addr, name, line)) in res.iter().enumerate() {
            if *addr != w.vaddrs[i] { wrong_addr += 1; if wrong_addr <= 3 { eprintln!("  addr diff at {:#x}: got {:#x} {name}", w.vaddrs[i], addr); } }
            let want = format!("{:#}", rustc_demangle::demangle(&w.names[i]));
            if *name != want && *name != w.names[i] { name_diff += 1; if name_diff <= 3 { eprintln!("  name diff: {name} vs {want}"); } }
            if lines && line.is_none() { no_line += 1; }
        }
        println!("{mode}: blazesym found {found}/{}, wrong start address {wrong_addr}, other name {name_diff}, without line {no_line}", w.offsets.len());
    }
}
