//! End-to-end tests: `dcpictl flush` and `dcpictl epoch new` are barriers at an instant.
//! Samples still in the per-CPU kernel rings when the request arrives are read before the
//! store flushes, and every sample lands in the epoch that contains its timestamp.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dcpi_e2e::{compile_c, Daemon, Sandbox};
use profile_format::{Database, EpochId, ImageId, Profile};

/// A program that burns CPU for ARGV[1] seconds of wall time; TAG makes each build distinct
/// (its own build-id, hence its own profile).
const SPIN_C: &str = r#"
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink = TAG;
int main(int argc, char **argv) {
    double secs = atof(argv[1]);
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 10000; i++) sink = sink * 6364136223846793005UL + i;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);
    return 0;
}
"#;

/// Build the spinner with a tag; returns its path and GNU build-id.
fn build(dir: &Path, tag: u32) -> (PathBuf, Vec<u8>) {
    let tag_flag = format!("-DTAG={tag}");
    let out = compile_c(dir, &format!("spin{tag}"), SPIN_C, &["-O1", &tag_flag]);
    let data = std::fs::read(&out).expect("read binary");
    let pat = [4u8, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, b'G', b'N', b'U', 0];
    let at = data.windows(pat.len()).position(|w| w == pat).expect("build-id note");
    (out, data[at + pat.len()..at + pat.len() + 20].to_vec())
}

fn run_for(bin: &Path, secs: f64) {
    let st = Command::new(bin).arg(secs.to_string()).status().expect("run spinner");
    assert!(st.success());
}

/// Samples of the image with this build-id in one epoch of `host` (None: every epoch).
fn samples_of(db: &Path, host: &str, epoch: Option<&EpochId>, id: &[u8]) -> u64 {
    let d = Database::open(db).expect("database");
    let want = ImageId::BuildId(id.to_vec());
    let mut total = 0;
    for e in d.epochs().expect("epochs") {
        if epoch.is_some_and(|x| *x != e) {
            continue;
        }
        let hd = d.host_dir(&e, host).expect("host dir");
        if !hd.path.exists() {
            continue;
        }
        for p in hd.profiles().expect("profiles") {
            let p = Profile::read(&p.path).unwrap_or_else(|e| panic!("unreadable profile: {e}"));
            if p.header.image_id == want {
                total += p.counts.values().sum::<u64>();
            }
        }
    }
    total
}

fn ctl_ok(d: &Daemon, args: &[&str]) -> String {
    let out = d.ctl(args);
    assert!(out.status.success(), "dcpictl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("did not read their rings"), "a CPU missed the barrier: {err}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Busy loops on every CPU while the guard lives (other work the daemon also samples).
struct Busy(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

fn busy(n: usize) -> Busy {
    let stop = Arc::new(AtomicBool::new(false));
    let hs = (0..n)
        .map(|_| {
            let s = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 1u64;
                while !s.load(Ordering::Relaxed) {
                    for i in 0..10_000u64 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(i),
                        );
                    }
                }
            })
        })
        .collect();
    Busy(stop, hs)
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for h in self.1.drain(..) {
            drop(h.join());
        }
    }
}

/// Five short programs in turn; after each, `dcpictl flush` must have published every sample
/// it got: a later flush (after the rings had every chance to be drained) adds none.
fn five_programs_complete_after_each_flush(busy_loops: usize) {
    let sb = Sandbox::new();
    let bins: Vec<_> = (1..=5).map(|t| build(sb.dir.path(), t)).collect();
    // A long flush interval: only the explicit flushes publish.
    let d = sb.start_daemon("fl", &["-e", "cpu-clock", "--flush-interval", "60s"]);
    let _busy = busy(busy_loops);
    let mut after_flush = Vec::new();
    for (bin, id) in &bins {
        run_for(bin, 0.3);
        ctl_ok(&d, &["flush"]);
        after_flush.push(samples_of(&sb.db(), "fl", None, id));
    }
    // Let every drain thread wake (re-arm windows are 1 s) before the check flush.
    std::thread::sleep(Duration::from_millis(2500));
    ctl_ok(&d, &["flush"]);
    let later: Vec<u64> = bins.iter().map(|(_, id)| samples_of(&sb.db(), "fl", None, id)).collect();
    eprintln!(
        "busy loops {busy_loops}: after each flush {after_flush:?}, after a later flush {later:?}"
    );
    for (i, (a, l)) in after_flush.iter().zip(&later).enumerate() {
        assert!(*a > 0, "program {} has no samples after its flush", i + 1);
        assert_eq!(a, l, "program {}: the flush after it missed {} samples", i + 1, l - a);
    }
}

#[dcpi_testkit::test(perf)]
fn flush_publishes_every_sample_taken_before_it() {
    five_programs_complete_after_each_flush(0);
}

#[dcpi_testkit::test(perf)]
fn flush_publishes_every_sample_taken_before_it_under_two_busy_loops() {
    five_programs_complete_after_each_flush(2);
}

/// A program that exited before `epoch new` has no sample in the new epoch; one running across
/// the boundary has samples in both, which together are all it got.
#[dcpi_testkit::test(perf)]
fn epoch_boundary_is_an_instant() {
    let sb = Sandbox::new();
    let d = sb.start_daemon("ep", &["-e", "cpu-clock", "--flush-interval", "60s"]);
    for round in 1..=3u32 {
        let (before, id) = build(sb.dir.path(), 10 + round);
        let e1 = EpochId::parse(&ctl_ok(&d, &["epoch", "show"])).expect("epoch id");
        run_for(&before, 0.3);
        let e2 = EpochId::parse(&ctl_ok(&d, &["epoch", "new"])).expect("new epoch id");
        assert_ne!(e1, e2);
        let old = samples_of(&sb.db(), "ep", Some(&e1), &id);
        // Every ring drained and flushed again: nothing of the program may appear in e2.
        std::thread::sleep(Duration::from_millis(1500));
        ctl_ok(&d, &["flush"]);
        let new = samples_of(&sb.db(), "ep", Some(&e2), &id);
        eprintln!(
            "round {round}: exited program: {old} samples in the old epoch, {new} in the new"
        );
        assert!(old > 0, "round {round}: the old epoch lacks the program's samples");
        assert_eq!(new, 0, "round {round}: samples taken before `epoch new` in the new epoch");
        assert_eq!(samples_of(&sb.db(), "ep", Some(&e1), &id), old, "old epoch changed");
    }

    // Across the boundary.
    let (across, id) = build(sb.dir.path(), 20);
    let e1 = EpochId::parse(&ctl_ok(&d, &["epoch", "show"])).expect("epoch id");
    let child = {
        let b = across.clone();
        std::thread::spawn(move || run_for(&b, 1.5))
    };
    std::thread::sleep(Duration::from_millis(700));
    let e2 = EpochId::parse(&ctl_ok(&d, &["epoch", "new"])).expect("new epoch id");
    let in_e1_at_boundary = samples_of(&sb.db(), "ep", Some(&e1), &id);
    child.join().expect("spinner");
    ctl_ok(&d, &["flush"]);
    std::thread::sleep(Duration::from_millis(1500));
    ctl_ok(&d, &["flush"]);
    let (a, b) =
        (samples_of(&sb.db(), "ep", Some(&e1), &id), samples_of(&sb.db(), "ep", Some(&e2), &id));
    let total = samples_of(&sb.db(), "ep", None, &id);
    eprintln!("across: {a} in the old epoch ({in_e1_at_boundary} at the boundary), {b} in the new, total {total}");
    assert!(a > 0 && b > 0, "a program running across the boundary has samples in both: {a}, {b}");
    assert_eq!(a, in_e1_at_boundary, "the old epoch got samples after it was closed");
    assert_eq!(a + b, total);
}
