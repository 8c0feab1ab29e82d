//! End-to-end tests of time slices (issue 36 item 2, FORMAT.md §14): the real daemon's
//! `slices.log` holds exactly the samples of the epoch's profiles after a clean stop, and a
//! kill -9 at any instant leaves it readable, never with a half slice, never counting a
//! sample twice.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, Daemon, Sandbox};
use profile_format::{Database, HostDir, Profile, SliceKey, SliceLog};

/// Per (key, offset): counts.
type Counts = BTreeMap<(SliceKey, u64), u64>;

/// Keep one CPU busy, and exec short processes, while the guard lives.
struct Load(std::sync::Arc<std::sync::atomic::AtomicBool>, Vec<std::thread::JoinHandle<()>>);

fn load() -> Load {
    use std::sync::atomic::Ordering;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s1 = std::sync::Arc::clone(&stop);
    let spin = std::thread::spawn(move || {
        let mut x = 1u64;
        while !s1.load(Ordering::Relaxed) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
    });
    let s2 = std::sync::Arc::clone(&stop);
    let churn = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            drop(
                Command::new("sh")
                    .args(["-c", "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done"])
                    .status(),
            );
        }
    });
    Load(stop, vec![spin, churn])
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in self.1.drain(..) {
            drop(h.join());
        }
    }
}

fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn host_dirs(db: &Path, host: &str) -> Vec<HostDir> {
    let d = Database::open(db).expect("db");
    d.epochs().expect("epochs").iter().map(|e| d.host_dir(e, host).expect("host dir")).collect()
}

/// Per (key, offset): the profiles' counts, image offsets rounded down to the resolution of
/// `log`'s slices (dcpid appends them at 16 bytes, FORMAT.md §14.2).
fn profile_counts(hd: &HostDir, log: &SliceLog) -> Counts {
    let res = log.range_resolution(&log.range(None, None));
    let mut t = Counts::new();
    for e in hd.profiles().unwrap_or_default() {
        let p = Profile::read(&e.path).expect("profile reads");
        let key = SliceKey { event: p.header.event.name.clone(), image: e.image_id.clone() };
        for (o, c) in &p.counts {
            let o = if key.image.is_some() { o - o % res } else { *o };
            *t.entry((key.clone(), o)).or_insert(0) += c;
        }
    }
    t
}

fn slice_counts(log: &SliceLog) -> Counts {
    let mut t = Counts::new();
    for (k, v) in log.range(None, None).sum() {
        for (o, c) in v {
            t.insert((k.clone(), o), c);
        }
    }
    t
}

fn slice_log(hd: &HostDir) -> Option<SliceLog> {
    hd.read_slices().unwrap_or_else(|e| panic!("slices.log must always read: {e}"))
}

/// [`Sandbox::start_daemon`] with a deadline for loaded machines (a debug dcpid took over
/// 20 s to scan /proc at load average 26).
fn start(sb: &Sandbox) -> Daemon {
    let child = Command::new(bin("dcpid"))
        .args(sb.daemon_args("h1"))
        .args(ARGS)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dcpid");
    let mut d = Daemon { child: Some(child), socket: sb.socket() };
    wait_for(180, "dcpid ready", || {
        if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("dcpid exited early with {st}");
        }
        sb.socket().exists() && d.ctl(&["status"]).status.success()
    });
    d
}

const ARGS: [&str; 6] = ["-e", "cpu-clock", "--flush-interval", "200ms", "--slice-interval", "1s"];

#[dcpi_testkit::test(perf)]
fn slices_of_a_run_add_up_to_the_epoch_totals() {
    let sb = Sandbox::new();
    let mut d = start(&sb);
    let _load = load();
    // Several one-second slices appended while the daemon runs, not only at the stop.
    wait_for(60, "three slices appended", || {
        host_dirs(&sb.db(), "h1")
            .iter()
            .filter_map(slice_log)
            .map(|l| l.slices.len())
            .sum::<usize>()
            >= 3
    });
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    let mut checked = 0;
    for hd in host_dirs(&sb.db(), "h1") {
        let log = slice_log(&hd).expect("a slice log in every host-epoch with samples");
        let totals = profile_counts(&hd, &log);
        assert_eq!(log.torn_tail, 0);
        let slices = slice_counts(&log);
        assert_eq!(slices.len(), totals.len(), "same (image, event, 16-byte bucket) pairs");
        assert!(slices == totals, "the slices of {} add up to its profiles", hd.path.display());
        // One-second slices, none overlapping.
        let r = log.range(None, None);
        for w in r.slices.windows(2) {
            assert!(w[0].end() <= w[1].start);
        }
        assert!(r.slices.iter().all(|s| s.len == 1), "one-second slices");
        checked += totals.values().sum::<u64>();
    }
    assert!(checked > 100, "samples compared: {checked}");
}

#[dcpi_testkit::test(perf)]
fn kill9_while_slices_are_appended_leaves_no_half_slice_nor_a_double_count() {
    let sb = Sandbox::new();
    // Pseudo-random kill instants, different on every run.
    let mut r = u64::from(std::process::id()).wrapping_mul(2654435761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into());
    for _ in 0..3 {
        let mut d = start(&sb);
        let load = load();
        r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // The kill instant itself is what is tested: not a wait for a condition.
        std::thread::sleep(Duration::from_millis(1200 + (r >> 33) % 2500));
        d.kill9();
        drop(load);
        // Readable at any instant: at most a torn tail, never an error.
        for hd in host_dirs(&sb.db(), "h1") {
            slice_log(&hd);
        }
    }
    // A clean run after the crashes: it cuts any torn tail and publishes what the spool kept.
    let mut d = start(&sb);
    let out = d.ctl(&["flush"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    let mut in_slices = 0;
    for hd in host_dirs(&sb.db(), "h1") {
        let Some(log) = slice_log(&hd) else { continue };
        let totals = profile_counts(&hd, &log);
        assert_eq!(log.torn_tail, 0, "the last writer cut the torn tail");
        // A crash loses the open slice from the time axis (the totals keep it), and never
        // counts a sample twice: for every pair, slices <= totals.
        for ((k, o), c) in slice_counts(&log) {
            let t = totals.get(&(k.clone(), o)).copied().unwrap_or(0);
            assert!(c <= t, "{k:?} offset {o:#x}: {c} in slices, {t} in the profiles");
            in_slices += c;
        }
    }
    assert!(in_slices > 0, "slices were written");
}
