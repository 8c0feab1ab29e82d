//! The query targets of issue 36, cold (page cache dropped before each run) and warm:
//! - one host, 24 hours of 1-minute slices: the per-image report (≤ 0.2 s cold), the
//!   per-symbol report of the hottest image (≤ 0.5 s cold), `--by time` (≤ 0.3 s), each over
//!   the whole epoch and over its last hour (`--since/--until`);
//! - 100 hosts, each a day as dcpid keeps it by default (18 h rolled up into hour slices at
//!   256 bytes, the last 6 h in minutes at 16 bytes), a 1-hour range: per-image (≤ 1 s cold).
//!
//! Slices are stored as dcpid stores them (minutes at 16-byte offset resolution, FORMAT.md
//! §14.2): 200 images (build-ids), 120 000 samples a minute in ~20 000 distinct pairs,
//! Zipf-distributed over the images; the hottest image is this machine's libc (its real
//! build-id, so that the per-symbol report symbolizes it), its offsets in its text.
//!
//! Run (root, for the cold runs): `DCPI_BENCH_DROP_CACHES=1 cargo bench -p dcpi-client --bench
//! time_queries`. Without `DCPI_BENCH_DROP_CACHES=1` only warm runs are timed. With
//! `DCPI_BENCH_KEEP=1` the databases are kept (their directory is printed), to profile a
//! query on them with `dcpiprof` alone.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use dcpi_client::prof::{run, Args};
use dcpi_testkit::db::base_time;
use dcpi_testkit::db::{cpu_clock, single_host, write_summaries, Image};
use object::{Object, ObjectSection};
use profile_format::{ImageId, Slice, SliceKey, SliceLog};

const IMAGES: u64 = 200;
const MINUTES: u64 = 1440;
const PAIRS: u64 = 20_000;
const SAMPLES: u64 = 120_000;
const HOSTS: usize = 100;
const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// libc's build-id and the [start, end) of its .text.
fn libc() -> (Vec<u8>, u64, u64) {
    let data = std::fs::read(LIBC).expect("read libc");
    let f = object::File::parse(&*data).expect("parse libc");
    let id = f.build_id().expect("build-id").expect("libc has a build-id").to_vec();
    let t = f.section_by_name(".text").expect(".text");
    (id, t.address(), t.address() + t.size())
}

fn t0() -> u64 {
    let t = base_time(0).duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    t - t % 3600
}

fn id_of(i: usize, libc_id: &[u8]) -> ImageId {
    if i == 0 {
        ImageId::BuildId(libc_id.to_vec())
    } else {
        ImageId::BuildId(vec![i as u8; 20])
    }
}

/// A day of one host in `root`/`host`, slices as dcpid keeps them: minutes at 16 bytes, and,
/// with `rollup`, the first 18 h rolled up into hours at 256 bytes. Returns the samples.
fn build(root: &Path, host: &str, rollup: bool) -> u64 {
    let hd = single_host(root, host);
    let t0 = t0();
    let (libc_id, text, text_end) = libc();
    let weights: Vec<f64> = (0..IMAGES).map(|i| 1.0 / (i + 1) as f64).collect();
    let wsum: f64 = weights.iter().sum();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut totals: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); IMAGES as usize];
    let mut slices = Vec::with_capacity(MINUTES as usize);
    for m in 0..MINUTES {
        let mut s = Slice { start: t0 + 60 * m, len: 60, seq: m + 1, ..Slice::default() };
        for (i, w) in weights.iter().enumerate() {
            let pairs = ((PAIRS as f64 * w / wsum) as u64).max(1);
            let per = ((SAMPLES as f64 * w / wsum) as u64 / pairs).max(1);
            let base = (m * 7 + i as u64 * 13) % 4096 * 16;
            let mut v: Vec<(u64, u64)> = (0..pairs)
                .map(|j| {
                    let o = base + j * 16 + rng.next() % 16;
                    let o = if i == 0 { text + o % (text_end - text) } else { o };
                    (o, 1 + rng.next() % (2 * per))
                })
                .collect();
            v.sort_unstable();
            v.dedup_by_key(|p| p.0);
            for &(o, c) in &v {
                *totals[i].entry(o).or_default() += c;
            }
            let key = SliceKey { event: "cpu-clock".into(), image: Some(id_of(i, &libc_id)) };
            s.counts.insert(key, v);
        }
        slices.push(s);
    }
    let log = SliceLog { slices, ..SliceLog::default() };
    // Every minute its own bucket at 16 bytes: what dcpid appends.
    let mut log = log.rollup_at(u64::MAX, 60, 16);
    if rollup {
        log = log.rollup_at(t0 + 18 * 3600, 3600, 256);
    }
    hd.write_slices(&log).expect("write the slice segments");
    let ev = cpu_clock();
    let mut total = 0;
    for (i, t) in totals.iter().enumerate() {
        let counts: Vec<(u64, u64)> = t.iter().map(|(&o, &c)| (o, c)).collect();
        total += counts.iter().map(|c| c.1).sum::<u64>();
        let path = if i == 0 { LIBC.to_owned() } else { format!("/usr/lib/lib{i}.so") };
        Image::elf(id_of(i, &libc_id), path).profile(&ev).counts(&counts).write(&hd);
    }
    write_summaries(&hd, total);
    total
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dst = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).expect("copy");
        }
    }
}

fn utc(t: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn query(args: &[String]) -> usize {
    let a = Args::try_parse_from(args).expect("args");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run(&a, &mut out, &mut err).unwrap_or_else(|e| {
        panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&err));
    });
    assert!(!out.is_empty(), "{args:?}: no output");
    out.len()
}

fn timed(name: &str, args: &[String], cold: bool, target: Option<f64>) {
    let mut cold_s = None;
    if cold {
        std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");
        let t = Instant::now();
        query(args);
        cold_s = Some(t.elapsed().as_secs_f64());
    }
    let mut warm: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            query(args);
            t.elapsed().as_secs_f64()
        })
        .collect();
    warm.sort_by(f64::total_cmp);
    let goal = target.map(|g| format!(" (target {g} s cold)")).unwrap_or_default();
    match cold_s {
        Some(c) => {
            eprintln!("time_queries: {name}: cold {c:.3} s, warm median {:.3} s{goal}", warm[2])
        }
        None => eprintln!("time_queries: {name}: warm median {:.3} s{goal}", warm[2]),
    }
}

/// The epoch directory of `db` that holds `host` (`<db>/epochs/<epoch>/`, FORMAT.md §2; the
/// bench once looked directly under the root and panicked "epoch dir").
fn epoch_of(db: &Path, host: &str) -> PathBuf {
    [db.join("epochs"), db.to_path_buf()]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.filter_map(Result::ok).map(|e| e.path()))
        .find(|p| p.join(host).is_dir())
        .unwrap_or_else(|| panic!("no epoch directory of {host} in {}", db.display()))
}

fn main() {
    // `cargo bench` passes --bench; nothing else is taken.
    let cold = std::env::var_os("DCPI_BENCH_DROP_CACHES").is_some_and(|v| v == "1");
    let keep = std::env::var_os("DCPI_BENCH_KEEP").is_some_and(|v| v == "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let one = dir.path().join("one");
    let fleet = dir.path().join("fleet");
    let t = Instant::now();
    let total = build(&one, "h1", false);
    build(&fleet, "h000", true);
    // The fleet: the same day under 100 host names (one epoch directory).
    let epoch_dir = epoch_of(&fleet, "h000");
    for h in 1..HOSTS {
        copy_dir(&epoch_dir.join("h000"), &epoch_dir.join(format!("h{h:03}")));
    }
    // The host directory's slice files (FORMAT.md §14.5), in MB.
    let size = |p: &Path| {
        let files = std::fs::read_dir(p).expect("host dir").filter_map(Result::ok).filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("slices.") && n.ends_with(".log")
        });
        files.map(|e| e.metadata().map(|m| m.len()).unwrap_or(0)).sum::<u64>() as f64 / 1e6
    };
    let one_epoch = epoch_of(&one, "h1");
    eprintln!(
        "time_queries: built in {:.1} s: {total} samples a host; slice files {:.1} MB (24 h of \
         16-byte minutes), {:.1} MB a host of the fleet (18 h of 256-byte hours + 6 h of \
         minutes), {HOSTS} hosts",
        t.elapsed().as_secs_f64(),
        size(&one_epoch.join("h1")),
        size(&epoch_dir.join("h000")),
    );
    let t0 = t0();
    let last =
        ["--since".to_owned(), utc(t0 + 23 * 3600), "--until".to_owned(), utc(t0 + 24 * 3600)];
    let db1 = one.display().to_string();
    let dbf = fleet.display().to_string();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<String>>();
    let base = s(&["dcpiprof", "--db", &db1, "--host", "h1", "--format", "json"]);
    let with = |extra: &[String]| {
        let mut v = base.clone();
        v.extend_from_slice(extra);
        v
    };
    timed("one host, day, per-image", &base, cold, Some(0.2));
    timed("one host, last hour, per-image", &with(&last), cold, Some(0.2));
    let sym = s(&["--image", "libc.so.6"]);
    timed("one host, day, per-symbol of libc (hottest)", &with(&sym), cold, Some(0.5));
    let mut v = sym.clone();
    v.extend_from_slice(&last);
    timed("one host, last hour, per-symbol of libc", &with(&v), cold, Some(0.5));
    timed("one host, day, --by time", &with(&s(&["--by", "time"])), cold, Some(0.3));
    let mut v = s(&["--by", "time"]);
    v.extend_from_slice(&sym);
    timed("one host, day, --by time --image libc.so.6", &with(&v), cold, None);
    let mut fl = s(&["dcpiprof", "--db", &dbf, "--host", "all", "--format", "json"]);
    fl.extend_from_slice(&last);
    timed("100 hosts, last hour, per-image", &fl, cold, Some(1.0));
    if keep {
        let kept = dir.keep();
        eprintln!("time_queries: databases kept in {} (one/, fleet/)", kept.display());
    }
}
