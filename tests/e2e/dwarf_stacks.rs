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
/// `via_a` and `via_b` and hot's samples in all, and dcpid's `status --json` taken after the
/// last flush.
fn callers_of_hot_status(fp_flag: &str, callchains: &str) -> ((u64, u64, u64), serde_json::Value) {
    // One daemon at a time: each samples and unwinds the whole machine, the other's too.
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let bin = build(dir, "dwarf_callers", fp_flag);
    let host = "e2e-dwarf";
    let mut d = sb.start_daemon(host, &dcpi_e2e::stack_daemon_args(callchains));
    let st = Command::new(&bin).arg("6").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    dcpi_e2e::flush_until_done(&d);
    let st = d.status_json();
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
    ((samples("via_a"), samples("via_b"), through), st)
}

fn assert_split(fp_flag: &str) {
    assert_split_with(fp_flag, "dwarf");
}

/// hot's callers split 60/40 under `callchains`; dcpid's status.
fn assert_split_with(fp_flag: &str, callchains: &str) -> serde_json::Value {
    let ((a, b, through), st) = callers_of_hot_status(fp_flag, callchains);
    assert!(a + b >= 500, "too few samples to judge: via_a {a} + via_b {b} of {through}");
    let share = 100.0 * a as f64 / (a + b) as f64;
    eprintln!("callers of hot: via_a {a}, via_b {b} ({share:.1}% via_a) of {through}");
    assert!((share - 60.0).abs() <= 4.0, "via_a has {share:.1}% of hot's samples, not 60 ± 4");
    // The two callers are (nearly) all of hot's samples: the leaf's caller was found.
    assert!((a + b) as f64 >= 0.9 * through as f64, "via_a {a} + via_b {b} of {through}");
    st
}

/// `callchains = "auto"`, code built without frame pointers: none of its functions keeps a
/// frame pointer, so its frames go through CFI and hot's callers are found.
#[dcpi_testkit::test(perf)]
fn auto_finds_callers_without_frame_pointers() {
    let st = assert_split_with("-fomit-frame-pointer", "auto");
    assert_eq!(st["stacks"]["dwarf"]["auto"], true, "{}", st["stacks"]);
}

/// `callchains = "auto"`, code built with frame pointers whose leaf `hot` has no frame: the
/// leaf is stepped through CFI (a frame-pointer walk would skip its caller), and its callers
/// `via_a`/`via_b` (functions with a frame pointer) by frame pointer: the split is right and
/// frames were stepped by frame pointer. (The count is the machine's: dcpid samples
/// every process; an image of this program's kind is what the test runs, though, and the
/// test fails if none was stepped so.)
#[dcpi_testkit::test(perf)]
fn auto_steps_frame_pointer_code_by_frame_pointer_and_finds_callers() {
    let st = assert_split_with("-fno-omit-frame-pointer", "auto");
    let d = &st["stacks"]["dwarf"];
    assert_eq!(d["auto"], true, "{d}");
    let fp = d["fp_steps"].as_u64().expect("fp_steps");
    assert!(fp >= 500, "frames stepped by frame pointer: {fp} ({d})");
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

/// `copy_a` calls memcpy for 3 blocks a round, `copy_b` for 2 (60/40), built without frame
/// pointers: libc's memcpy is a frameless leaf in an image without frame pointers.
const LIBC_CALLERS_C: &str = include_str!("libc_callers.c");

/// The share of `copy_a` among the immediate callers of libc functions, in folded stacks
/// (`...;caller;leaf count`, the leaf in libc), and the stacks counted.
fn copy_a_share<'a>(stacks: impl Iterator<Item = (Vec<&'a str>, u64)>) -> (f64, u64, u64, u64) {
    let (mut a, mut b, mut all) = (0u64, 0u64, 0u64);
    for (frames, n) in stacks {
        all += n;
        match frames.iter().rev().nth(1).copied() {
            Some("copy_a") => a += n,
            Some("copy_b") => b += n,
            _ => {}
        }
    }
    (100.0 * a as f64 / all.max(1) as f64, a, b, all)
}

/// The hot path runs in libc (memcpy): the immediate caller of the libc function as dcpid's
/// DWARF stacks name it agrees with `perf record --call-graph dwarf` on the same run within 3
/// points (issue 37's acceptance). perf records the workload (dcpid the whole machine, as
/// always) with `--buildid-mmap -N`: Debian's perf 6.1 aborts in the build-id pass at the end
/// of `perf record` ("assertion failed at util/build-id.c:1010", seen here even recording one
/// process), and `-B`, which skips that pass, also stops `perf script`'s DWARF unwinding
/// (measured: no libc sample kept its caller); `--buildid-mmap` takes the build-ids from the
/// MMAP2 records instead, with no pass, and unwinds. Both count the samples whose leaf is in
/// libc, and the share whose next frame is `copy_a`.
#[dcpi_testkit::test(perf)]
fn the_caller_of_a_libc_function_agrees_with_perf_dwarf() {
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let src = dir.join("libc_callers.c");
    std::fs::write(&src, LIBC_CALLERS_C).expect("write source");
    let bin = dir.join("libc_callers");
    let st = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let host = "e2e-dwarf-libc";
    let mut d = sb.start_daemon(host, &dcpi_e2e::stack_daemon_args("dwarf"));
    let data = dir.join("perf.data");
    // 10 s of the workload's CPU at 500 Hz: ~5 000 samples each, so the two shares' sampling
    // noise (σ ≈ 1 point for their difference) stays well inside 3 points.
    let perf = Command::new("perf")
        .args([
            "record",
            "--buildid-mmap",
            "-N",
            "--call-graph",
            "dwarf",
            "-e",
            "cpu-clock",
            "-c",
            "2000000",
            "-o",
        ])
        .arg(&data)
        .arg("--")
        .arg(&bin)
        .arg("10")
        .output()
        .expect("run perf record");
    assert!(
        perf.status.success() || perf.status.code() == Some(1),
        "perf record: {}",
        String::from_utf8_lossy(&perf.stderr)
    );
    dcpi_e2e::flush_until_done(&d);
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    // perf: each sample is a header line, then its frames leaf first, `\t addr sym+off (dso)`.
    let script = Command::new("perf")
        .args(["script", "--no-inline", "-F", "ip,sym,dso", "-i"])
        .arg(&data)
        .output()
        .expect("run perf script");
    assert!(script.status.success(), "perf script: {}", String::from_utf8_lossy(&script.stderr));
    let text = String::from_utf8_lossy(&script.stdout);
    let mut perf_stacks = Vec::new();
    for sample in text.split("\n\n") {
        // (symbol, dso) of each frame, leaf first.
        let frames: Vec<(&str, &str)> = sample
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (_addr, sym) = (w.next()?, w.next()?);
                let dso = l.rsplit_once(" (")?.1.trim_end_matches(')');
                Some((sym.split('+').next().unwrap_or(sym), dso))
            })
            .collect();
        if frames.first().is_some_and(|(_, dso)| dso.ends_with("/libc.so.6")) {
            // Root first, as folded stacks are.
            perf_stacks.push((frames.iter().rev().map(|(s, _)| *s).collect::<Vec<_>>(), 1));
        }
    }
    let (perf_share, pa, pb, pall) = copy_a_share(perf_stacks.into_iter());

    let cache = dir.join("symbols.sqlite").display().to_string();
    let out = sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        cache.as_str(),
        "--command",
        "libc_callers",
        "--image",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "--format",
        "folded",
    ]);
    assert!(out.status.success(), "folded: {}", String::from_utf8_lossy(&out.stderr));
    let folded = String::from_utf8_lossy(&out.stdout);
    let dcpi_stacks = folded.lines().filter_map(|l| {
        let (stack, n) = l.rsplit_once(' ')?;
        Some((stack.split(';').collect::<Vec<_>>(), n.parse::<u64>().ok()?))
    });
    let (dcpi_share, da, db, dall) = copy_a_share(dcpi_stacks);
    eprintln!(
        "callers of libc leaves: dcpi copy_a {da} copy_b {db} of {dall} ({dcpi_share:.1}% \
         copy_a); perf copy_a {pa} copy_b {pb} of {pall} ({perf_share:.1}% copy_a)"
    );
    assert!(
        pall >= 1000 && dall >= 1000,
        "too few libc samples to judge: perf {pall}, dcpi {dall}"
    );
    // The callers were found at all (not `[unknown]`): the workload is 60/40 by design.
    assert!(pa + pb >= pall * 9 / 10, "perf found callers of {} of {pall}", pa + pb);
    assert!(
        (dcpi_share - perf_share).abs() <= 3.0,
        "dcpi names copy_a the caller of {dcpi_share:.1}% of libc samples, perf \
         {perf_share:.1}%:\n{folded}"
    );
}

/// `via_a` and `via_b` read the clock in a loop: the time is spent in the vDSO.
const VDSO_CALLERS_C: &str = include_str!("vdso_callers.c");

/// vDSO frames are named in DWARF stacks (issue 37, item 5), and the unwind goes through the
/// vDSO's own CFI to the program's functions: the stacks whose leaf is in `[vdso]` name the
/// leaf by the vDSO's symbols (not `[vdso]+0x…`) and reach `main` through `via_a` or `via_b`.
#[dcpi_testkit::test(perf)]
fn vdso_frames_are_named_and_unwound_through() {
    let _one = dcpi_e2e::machine_wide_stacks();
    let clocksource =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    if !matches!(clocksource.trim(), "tsc" | "kvm-clock") {
        dcpi_testkit::skip!(
            "clocksource {:?}: clock_gettime may not run in the vDSO",
            clocksource.trim()
        );
    }
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let src = dir.join("vdso_callers.c");
    std::fs::write(&src, VDSO_CALLERS_C).expect("write source");
    let bin = dir.join("vdso_callers");
    let st = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let host = "e2e-dwarf-vdso";
    let mut d = sb.start_daemon(host, &dcpi_e2e::stack_daemon_args("dwarf"));
    let st = Command::new(&bin).arg("4").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    dcpi_e2e::flush_until_done(&d);
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");
    let cache = dir.join("symbols.sqlite").display().to_string();
    let out = sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        cache.as_str(),
        "--command",
        "vdso_callers",
        "--image",
        "[vdso]",
        "--format",
        "folded",
    ]);
    assert!(out.status.success(), "folded: {}", String::from_utf8_lossy(&out.stderr));
    let folded = String::from_utf8_lossy(&out.stdout);
    let (mut all, mut named, mut reached) = (0u64, 0u64, 0u64);
    for l in folded.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else { continue };
        let n: u64 = n.parse().expect("count");
        let frames: Vec<&str> = stack.split(';').collect();
        all += n;
        let leaf = frames.last().copied().unwrap_or("");
        if leaf.contains("clock_gettime") || leaf.contains("vdso") && !leaf.contains('+') {
            named += n;
        }
        if frames.windows(2).any(|w| w[0] == "main" && matches!(w[1], "via_a" | "via_b")) {
            reached += n;
        }
    }
    eprintln!("vDSO stacks: {all}, leaf named {named}, through via_a|via_b to main {reached}");
    assert!(all >= 300, "too few vDSO samples to judge ({all}):\n{folded}");
    assert!(named * 10 >= all * 9, "vDSO leaves unnamed: {named} of {all}:\n{folded}");
    assert!(reached * 10 >= all * 9, "vDSO stacks cut short: {reached} of {all}:\n{folded}");
}
