//! End-to-end tests of `dcpiprof --stack-health` (issue 37, item 4) and of the share of DWARF
//! stacks that reach a root (item 1): gcc-built programs with and without frame pointers,
//! sampled by dcpid with `--callchains fp` or `dwarf`.

use std::process::Command;

use dcpi_e2e::json;
use dcpi_e2e::Sandbox;

/// `hot()` reached through `via_a` and `via_b` from `main`.
const CALLERS_C: &str = include_str!("dwarf_callers.c");

/// Build [`CALLERS_C`] as `dir/name` with `flags`.
fn build(dir: &std::path::Path, name: &str, flags: &[&str]) -> std::path::PathBuf {
    dcpi_e2e::compile_c(dir, name, CALLERS_C, flags)
}

/// Run each of `bins` for `secs` of its CPU time under a daemon recording `callchains`, then
/// return `dcpiprof --stack-health --format json`.
fn health(
    sb: &Sandbox,
    host: &str,
    callchains: &str,
    bins: &[&std::path::Path],
) -> serde_json::Value {
    let mut d = sb.start_daemon(host, &dcpi_e2e::stack_daemon_args(callchains));
    for bin in bins {
        let st = Command::new(bin).arg("3").status().expect("run workload");
        assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    }
    dcpi_e2e::flush_until_done(&d);
    let status = d.status_json();
    let (st, err) = d.terminate();
    assert!(st.success(), "dcpid exit {st}: {err}");
    let cache = sb.dir.path().join("symbols.sqlite").display().to_string();
    let r = json(sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        cache.as_str(),
        "--stack-health",
        "--format",
        "json",
    ]));
    eprintln!("status stacks: {}", status["stacks"]);
    r
}

/// The row of the image at `bin`.
fn row<'a>(r: &'a serde_json::Value, bin: &std::path::Path) -> &'a serde_json::Value {
    let want = bin.display().to_string();
    r["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row["image"].as_str().is_some_and(|i| i == want))
        .unwrap_or_else(|| panic!("no row for {want}: {r:#}"))
}

fn count(row: &serde_json::Value, k: &str) -> u64 {
    row[k].as_u64().unwrap_or_else(|| panic!("{k}: {row}"))
}

/// With frame pointers recorded (`callchains = "fp"`), a program built without them is named
/// as such (its stacks stop at its own frames), one built with them as sound.
#[dcpi_testkit::test(perf)]
fn names_the_frame_pointer_less_image_and_the_sound_one() {
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let nofp = build(dir, "nofp_prog", &["-O2", "-fomit-frame-pointer"]);
    // Every function with a frame (no inlining, no tail calls, leaf frames too): the kernel's
    // frame-pointer walk sees each call.
    let fp = build(
        dir,
        "fp_prog",
        &[
            "-O1",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
            "-fno-inline",
            "-fno-optimize-sibling-calls",
        ],
    );
    let r = health(&sb, "e2e-health-fp", "fp", &[&nofp, &fp]);
    eprintln!("stack health: {r:#}");
    let bad = row(&r, &nofp);
    assert!(count(bad, "stack_samples") >= 300, "too few samples to judge: {bad}");
    assert_eq!(bad["verdict"], "no-frame-pointers", "{bad}");
    assert!(bad["percent"].as_f64().expect("percent") >= 50.0, "{bad}");
    assert!(bad["advice"].as_str().is_some_and(|a| a.contains("-fno-omit-frame-pointer")), "{bad}");
    let good = row(&r, &fp);
    assert!(count(good, "stack_samples") >= 300, "too few samples to judge: {good}");
    assert_eq!(good["verdict"], "sound", "{good}");

    // The same through the text and CSV forms of the one renderer.
    let cache = dir.join("symbols.sqlite").display().to_string();
    let base = ["--host", "e2e-health-fp", "--symbol-cache", cache.as_str(), "--stack-health"];
    let text = sb.prof(&base);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let text = String::from_utf8_lossy(&text.stdout);
    // The table fits 100 columns: a long image path is cut in its middle (`/tmp/dcpi-e2…P/
    // nofp_prog`) whenever a long path (a test binary, ld.so) got samples, as on a machine
    // running other tests; its end, the file name, stays.
    let line = |bin: &std::path::Path| {
        let name = bin.file_name().expect("file name").to_string_lossy();
        let tail = format!("/{name}");
        text.lines()
            // Text tables name images by basename (issue 39), or cut a long path in its middle.
            .find(|l| l.ends_with(&tail) || l.split_whitespace().last() == Some(&*name))
            .unwrap_or_else(|| panic!("no line ends with {tail}: {text}"))
            .to_owned()
    };
    assert!(line(&nofp).contains("no-frame-pointers"), "{text}");
    assert!(line(&fp).contains("sound"), "{text}");
    let mut csv = base.to_vec();
    csv.extend(["--format", "csv"]);
    let csv = sb.prof(&csv);
    assert!(csv.status.success(), "{}", String::from_utf8_lossy(&csv.stderr));
    let csv = String::from_utf8_lossy(&csv.stdout);
    assert!(csv.starts_with("image,kind,stack_samples,"), "{csv}");
    assert!(
        csv.lines().any(|l| l.contains("nofp_prog") && l.contains(",no-frame-pointers,")),
        "{csv}"
    );
}

/// With DWARF stacks, a program built without frame pointers has (nearly) all of its stacks
/// reach a root: `hot <- via_a|via_b <- main <- __libc_start_call_main <-
/// __libc_start_main_impl <- _start`.
#[dcpi_testkit::test(perf)]
fn dwarf_stacks_of_a_simple_program_reach_a_root() {
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let bin = build(sb.dir.path(), "nofp_dwarf", &["-O2", "-fomit-frame-pointer"]);
    let r = health(&sb, "e2e-health-dwarf", "dwarf", &[&bin]);
    eprintln!("stack health: {r:#}");
    let me = row(&r, &bin);
    let (n, early) = (count(me, "stack_samples"), count(me, "ended_early"));
    assert!(n >= 300, "too few samples to judge: {me}");
    let share = 100.0 * early as f64 / n as f64;
    assert!(share <= 5.0, "{share:.1}% of the program's stacks ended early: {me}");
    assert_eq!(me["verdict"], "sound", "{me}");
}
