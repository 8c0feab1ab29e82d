//! Writes a synthetic dcpi profile database through the profile-format crate, for timing
//! `dcpiprof` over large databases (a simulated fleet, or one busy host for one hour).
//!
//! Usage:
//!   dcpi-fleetgen --out DIR --images FILE --hosts N --epochs N --images-per-host N
//!                 [--samples-per-host-epoch N] [--max-offsets N] [--period NS] [--seed N]
//!                 [--index 0|1] [--bin-index 0|1] [--profiles 0|1]
//!
//! `--images` is a TSV file, one real ELF image per line:
//!   `build_id_hex \t text_file_offset \t text_size \t path`
//! so that profiles name images that exist on this machine and `dcpiprof --image` can
//! symbolize them. Image rank r (0-based, per host a rotation of the list) gets a share of the
//! samples proportional to 1/(r+1) (Zipf) and up to `max_offsets/(r+1)` distinct offsets
//! (at least 8), drawn inside its text section with a Zipf-like skew.
//!
//! Each host directory gets the binary `summary.idx` the daemon writes (FORMAT.md §7.2) unless
//! `--bin-index 0`, and each summary.json the JSON index (§7.1) that daemons wrote before it
//! unless `--index 0` (a database from before any index). With both, old and new readers can
//! be compared on the same files. `--profiles 0` writes the summaries
//! (with their index) but no profile file: enough for the per-image report, which then opens
//! none, at a scale (1,000 hosts x 30 epochs) whose profiles would not fit the disk.
//!
//! Files are written with plain `write` (no fsync): generation speed is not what is measured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use profile_format::{
    Database, EpochId, EventDesc, EventSummary, HostSummary, ImageId, ImageKind, Profile,
    ProfileHeader, SummaryIndex,
};

struct Args {
    out: PathBuf,
    images: PathBuf,
    hosts: u32,
    epochs: u32,
    images_per_host: usize,
    samples: u64,
    max_offsets: u64,
    period: u64,
    seed: u64,
    index: bool,
    bin_index: bool,
    profiles: bool,
}

struct Image {
    build_id: Vec<u8>,
    text_off: u64,
    text_size: u64,
    path: String,
}

/// xorshift64*: deterministic and dependency-free; statistical quality is irrelevant here.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        out: PathBuf::new(),
        images: PathBuf::new(),
        hosts: 100,
        epochs: 24,
        images_per_host: 200,
        samples: 7_200_000,
        max_offsets: 4000,
        period: 1_000_000,
        seed: 1,
        index: true,
        bin_index: true,
        profiles: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().ok_or_else(|| format!("{flag}: missing value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag.as_str() {
            "--out" => a.out = PathBuf::from(val),
            "--images" => a.images = PathBuf::from(val),
            "--hosts" => a.hosts = num(&val)? as u32,
            "--epochs" => a.epochs = num(&val)? as u32,
            "--images-per-host" => a.images_per_host = num(&val)? as usize,
            "--samples-per-host-epoch" => a.samples = num(&val)?,
            "--max-offsets" => a.max_offsets = num(&val)?,
            "--period" => a.period = num(&val)?,
            "--seed" => a.seed = num(&val)?,
            "--index" => a.index = num(&val)? != 0,
            "--bin-index" => a.bin_index = num(&val)? != 0,
            "--profiles" => a.profiles = num(&val)? != 0,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    if a.out.as_os_str().is_empty() || a.images.as_os_str().is_empty() {
        return Err("--out and --images are required".into());
    }
    Ok(a)
}

fn read_images(path: &PathBuf) -> Result<Vec<Image>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.splitn(4, '\t').collect();
        let bad = |what: &str| format!("{}:{}: bad {what}", path.display(), n + 1);
        if f.len() != 4 {
            return Err(bad("line (want 4 tab-separated fields)"));
        }
        let build_id = hex_decode(f[0]).ok_or_else(|| bad("build id"))?;
        let text_off = f[1].parse().map_err(|_| bad("text offset"))?;
        let text_size: u64 = f[2].parse().map_err(|_| bad("text size"))?;
        if text_size < 16 {
            return Err(bad("text size"));
        }
        v.push(Image { build_id, text_off, text_size, path: f[3].to_string() });
    }
    if v.is_empty() {
        return Err(format!("{}: no images", path.display()));
    }
    Ok(v)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

fn run(a: &Args) -> Result<(), String> {
    let images = read_images(&a.images)?;
    let db = Database::create(&a.out).map_err(|e| e.to_string())?;
    let event = EventDesc {
        name: "cpu-clock".into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: a.period - a.period / 32,
        period_min: a.period - a.period / 16,
        period_max: a.period,
    };
    let harmonic: f64 = (1..=a.images_per_host).map(|r| 1.0 / r as f64).sum();
    let mut rng = Rng(a.seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    // Epochs one hour apart, ending now.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs();
    let base = now - now % 3600 - 3600 * u64::from(a.epochs);
    let (mut files, mut bytes) = (0u64, 0u64);
    for e in 0..a.epochs {
        let t = UNIX_EPOCH + Duration::from_secs(base + 3600 * u64::from(e));
        let epoch: EpochId = db.new_epoch(t, "fleetgen").map_err(|e| e.to_string())?;
        for h in 0..a.hosts {
            let host = format!("host{h:04}");
            let dir = db.host_dir(&epoch, &host).map_err(|e| e.to_string())?;
            dir.create().map_err(|e| e.to_string())?;
            let rot = (h as usize * 7 + e as usize) % images.len();
            let mut host_samples = 0u64;
            // By file name, the order of the index entries.
            let mut headers: BTreeMap<PathBuf, ProfileHeader> = BTreeMap::new();
            for r in 0..a.images_per_host.min(images.len()) {
                let img = &images[(rot + r) % images.len()];
                let share = 1.0 / ((r + 1) as f64 * harmonic);
                let n_samples = ((a.samples as f64 * share) as u64).max(1);
                let n_offsets = (a.max_offsets / (r as u64 + 1)).max(8).min(img.text_size / 4);
                let header = ProfileHeader {
                    kind: ImageKind::Elf,
                    image_id: ImageId::BuildId(img.build_id.clone()),
                    image_path: img.path.as_bytes().to_vec(),
                    event: event.clone(),
                    host: host.clone(),
                    epoch: epoch.clone(),
                    total_samples: 0,
                    total_period: 0,
                    sequence: 0,
                    jit_symbols: Vec::new(),
                };
                let mut p = Profile::new(header);
                // Distinct offsets, then the samples spread over them with a skew: offset k
                // gets weight ~1/(k+1).
                let mut offs: BTreeMap<u64, ()> = BTreeMap::new();
                while (offs.len() as u64) < n_offsets {
                    let o = img.text_off + (rng.below(img.text_size) & !3);
                    offs.insert(o, ());
                }
                let offs: Vec<u64> = offs.into_keys().collect();
                let h_off: f64 = (1..=offs.len()).map(|k| 1.0 / k as f64).sum();
                let mut left = n_samples;
                for (k, &o) in offs.iter().enumerate() {
                    let c = ((n_samples as f64 / ((k + 1) as f64 * h_off)) as u64).max(1).min(left);
                    if c == 0 {
                        break;
                    }
                    p.add(o, c, c * event.period_mean);
                    left -= c;
                }
                if left > 0 {
                    p.add(offs[0], left, left * event.period_mean);
                }
                host_samples += n_samples;
                let enc = p.encode();
                let path = dir.profile_path(&p.header.image_id, &event.name);
                if a.profiles {
                    std::fs::write(&path, &enc).map_err(|e| format!("{}: {e}", path.display()))?;
                    files += 1;
                    bytes += enc.len() as u64;
                }
                headers.insert(path, p.header);
            }
            let summary = HostSummary {
                format_version: 1,
                host: host.clone(),
                epoch: epoch.to_string(),
                kernel_release: "fleetgen".into(),
                cpus: vec![0, 1],
                events: vec![EventSummary {
                    desc: Some(event.clone()),
                    source: "software".into(),
                    samples: host_samples,
                    total_period: host_samples * event.period_mean,
                    time_enabled_ns: 3_600_000_000_000 * 2,
                    time_running_ns: 3_600_000_000_000 * 2,
                }],
                samples: host_samples,
                lost: 0,
                throttled: 0,
                unknown: 0,
                first_written: base + 3600 * u64::from(e),
                last_written: base + 3600 * u64::from(e + 1),
                dcpid_version: "fleetgen".into(),
                spool_sequence: 0,
                index: None,
            };
            let mut idx = SummaryIndex::default();
            headers.values().for_each(|h| idx.push(h));
            let with_index = HostSummary { index: Some(idx), ..summary.clone() };
            if a.bin_index {
                let bin = profile_format::sumidx::encode(&with_index).map_err(|e| e.to_string())?;
                let p = dir.summary_index_path();
                std::fs::write(&p, bin).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            let summary = if a.index { with_index } else { summary };
            let json = serde_json::to_vec_pretty(&summary).map_err(|e| e.to_string())?;
            std::fs::write(dir.summary_path(), json)
                .map_err(|e| format!("{}: {e}", dir.summary_path().display()))?;
        }
    }
    println!("{{\"profiles\": {files}, \"profile_bytes\": {bytes}}}");
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dcpi-fleetgen: {e}");
            ExitCode::FAILURE
        }
    }
}
