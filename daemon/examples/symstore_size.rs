//! Symbol store size benchmark (BENCHMARKS.md "Symbol store"): the table dcpid would store for
//! every ELF image mapped executable by any running process of this machine, and what a fleet
//! of `--hosts N` hosts running the same images stores in one database (each build once).
//!
//! `cargo run --release -p dcpi-daemon --example symstore_size -- [--hosts 100] [--db DIR]`
//! Prints one JSON object. Reads /proc/*/maps (as root: every process but PID 1 here).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use dcpid::resolve::symtab::{extract, SYSTEM_DEBUG_DIR};
use object::Object;
use profile_format::{Database, SymtabOrigin};

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Executable file mappings of every readable process: path -> build-id.
fn running_images() -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        #[allow(clippy::disallowed_methods)]
        let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
                continue;
            }
            let p = PathBuf::from(f[5..].join(" "));
            if out.contains_key(&p) {
                continue;
            }
            #[allow(clippy::disallowed_methods)]
            let Ok(data) = std::fs::read(&p) else {
                continue;
            };
            let id = object::File::parse(&*data)
                .ok()
                .and_then(|o| o.build_id().ok().flatten().map(<[u8]>::to_vec));
            if let Some(id) = id {
                out.insert(p, id);
            }
        }
    }
    out
}

fn main() {
    let mut hosts = 100u32;
    let mut db_dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--hosts" => hosts = args.next().and_then(|v| v.parse().ok()).expect("--hosts N"),
            "--db" => db_dir = args.next().map(PathBuf::from),
            other => {
                eprintln!("symstore_size: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = db_dir.unwrap_or_else(|| tmp.path().join("db"));
    let db = Database::create(&root).expect("database");
    let images = running_images();
    let (mut tables, mut symbols, mut raw_names, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    let mut by_origin: BTreeMap<&str, u64> = BTreeMap::new();
    let mut largest: Vec<(u64, String)> = Vec::new();
    let (mut extract_s, mut first_bytes) = (0.0, 0u64);
    let mut stored = Vec::new();
    for (path, id) in &images {
        let c0 = thread_cpu_s();
        let t = match extract(path, id, std::path::Path::new(SYSTEM_DEBUG_DIR)) {
            Ok(t) => t,
            Err(_) => {
                skipped += 1;
                continue;
            }
        };
        let n = db.put_symtab(&t).expect("store");
        extract_s += thread_cpu_s() - c0;
        first_bytes += n;
        tables += 1;
        symbols += t.symbols.len() as u64;
        raw_names += t.symbols.iter().map(|s| s.name.len() as u64).sum::<u64>();
        *by_origin
            .entry(match t.origin {
                SymtabOrigin::Symtab => "symtab",
                SymtabOrigin::Dynsym => "dynsym",
                SymtabOrigin::DebugFile => "debug-file",
            })
            .or_default() += 1;
        largest.push((n, path.display().to_string()));
        stored.push(t);
    }
    largest.sort_unstable_by(|a, b| b.cmp(a));
    largest.truncate(5);
    // The other hosts of the fleet run the same builds: each put is a stat that finds the table.
    let t0 = Instant::now();
    let c0 = thread_cpu_s();
    let mut fleet_more = 0u64;
    for _ in 1..hosts {
        for t in &stored {
            fleet_more += db.put_symtab(t).expect("store");
        }
    }
    let fleet_cpu = thread_cpu_s() - c0;
    let on_disk: u64 = walk(&root.join("binaries"));
    println!(
        "{}",
        serde_json::json!({
            "images": images.len(),
            "tables": tables,
            "skipped": skipped,
            "by_origin": by_origin,
            "symbols": symbols,
            "name_bytes": raw_names,
            "bytes_one_host": first_bytes,
            "bytes_per_symbol": first_bytes as f64 / symbols.max(1) as f64,
            "cpu_s_one_host": extract_s,
            "hosts": hosts,
            "bytes_more_for_fleet": fleet_more,
            "bytes_on_disk_fleet": on_disk,
            "fleet_other_hosts_cpu_s": fleet_cpu,
            "fleet_other_hosts_wall_s": t0.elapsed().as_secs_f64(),
            "largest": largest,
        })
    );
}

fn walk(dir: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
