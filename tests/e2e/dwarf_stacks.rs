//! End-to-end tests of DWARF call stacks (`dcpid --callchains dwarf`): code whose frames the
//! kernel's frame-pointer walk cannot follow (built without frame pointers, or a frameless
//! leaf at -O2) unwound by dcpid from a copy of the user stack with the image's `.eh_frame`.
//! With `--callchains fp` the same programs give `hot` no caller but `main` (issue 37).

use std::process::Command;

use dcpi_e2e::json;
use dcpi_e2e::Sandbox;

/// `hot()` does all the work in a frameless leaf; `via_a` gives it 3 units per round and `via_b` 2.
const CALLERS_C: &str = include_str!("dwarf_callers.c");

/// Build `source` as `dir/name` at -O2 with `fp_flag` (`-fomit-frame-pointer` or
/// `-fno-omit-frame-pointer`).
fn build(dir: &std::path::Path, name: &str, fp_flag: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, CALLERS_C).expect("write source");
    let bin = dir.join(name);
    let st = Command::new("cc")
        .args(["-O2", fp_flag, "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    bin
}

/// Run the workload under a daemon with `callchains`, and return `--callers hot` samples of
/// `via_a` and `via_b` and hot's samples in all.
fn callers_of_hot(fp_flag: &str, callchains: &str) -> (u64, u64, u64) {
    // One daemon at a time: each samples and unwinds the whole machine, the other's too.
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let bin = build(dir, "dwarf_callers", fp_flag);
    let host = "e2e-dwarf";
    let mut d = sb.start_daemon(
        host,
        &[
            "--events",
            // 500 Hz: every sample of the machine (loaded by builds while tests run) is
            // unwound, and a debug dcpid's drain threads (framehop and gimli instantiated
            // unoptimized in the daemon crate) must keep up.
            "cpu-clock:2000000",
            "--flush-interval",
            "1s",
            "--callchains",
            callchains,
            // 8 KiB a sample: a ring of 1 MiB per CPU holds 128 samples.
            "--ring-pages",
            "256",
        ],
    );
    let st = Command::new(&bin).arg("6").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    // A loaded machine (every CPU sampled and unwound, builds beside) can hold a flush past
    // dcpictl's 20 s: ask again until it is done, within a generous deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let fl = d.ctl(&["flush"]);
        if fl.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "flush: {}",
            String::from_utf8_lossy(&fl.stderr)
        );
    }
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let cache = dir.join("symbols.sqlite").display().to_string();
    let image = bin.display().to_string();
    let r = json(sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        cache.as_str(),
        "--callers",
        "hot",
        "--format",
        "json",
    ]));
    let rows = r["rows"].as_array().expect("rows");
    let samples = |name: &str| {
        rows.iter()
            .find(|row| row["symbol"] == name)
            .and_then(|row| row["samples"].as_u64())
            .unwrap_or(0)
    };
    let through = r["samples"].as_u64().expect("samples");
    eprintln!("{image} ({fp_flag}, callchains {callchains}): callers of hot {r}");
    (samples("via_a"), samples("via_b"), through)
}

fn assert_split(fp_flag: &str) {
    let (a, b, through) = callers_of_hot(fp_flag, "dwarf");
    assert!(a + b >= 500, "too few samples to judge: via_a {a} + via_b {b} of {through}");
    let share = 100.0 * a as f64 / (a + b) as f64;
    eprintln!("callers of hot: via_a {a}, via_b {b} ({share:.1}% via_a) of {through}");
    assert!((share - 60.0).abs() <= 4.0, "via_a has {share:.1}% of hot's samples, not 60 ± 4");
    // The two callers are (nearly) all of hot's samples: the leaf's caller was found.
    assert!((a + b) as f64 >= 0.9 * through as f64, "via_a {a} + via_b {b} of {through}");
}

/// Built without frame pointers: only CFI finds hot's callers.
#[dcpi_testkit::test(perf)]
fn callers_of_hot_split_60_40_without_frame_pointers() {
    assert_split("-fomit-frame-pointer");
}

/// Built with frame pointers, but hot is a leaf without a frame: a frame-pointer walk from it
/// skips its caller (`main` 100 %); CFI does not.
#[dcpi_testkit::test(perf)]
fn callers_of_a_frameless_leaf_split_60_40_with_frame_pointers() {
    assert_split("-fno-omit-frame-pointer");
}
