//! The kit's promises, checked on a small crate built with it: a missing requirement shows as
//! `ignored, <reason>` in the summary; `DCPI_REQUIRE_ALL=1` turns every skip into a failure
//! (except a test for the other kind of machine, PMU or not); the
//! run-time guard fails a test run with `--include-ignored`; and changing the pretend variable
//! recompiles the crate (so the compile-time answer is not stale).
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;

const FIXTURE: &str = r#"
#[dcpi_testkit::test(perf)]
fn needs_perf() {}

#[dcpi_testkit::test(tool("dcpi-no-such-tool"))]
fn needs_tool() {}

#[dcpi_testkit::test(tool("sh"))]
fn needs_sh() {}

// Kinds of machine: exactly one of these two is ignored anywhere, under the switch too.
#[dcpi_testkit::test(pmu)]
fn with_pmu() {}

#[dcpi_testkit::test(no_pmu)]
fn without_pmu() {}

#[test]
fn run_time_skip() {
    dcpi_testkit::skip!("no widget {}", 7);
}
"#;

struct Run {
    ok: bool,
    out: String,
}

fn cargo_test(dir: &Path, env: &[(&str, &str)], extra: &[&str]) -> Run {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args(["test", "--offline", "--test", "t", "--"])
        .args(extra)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove(dcpi_testkit::SWITCH)
        .env_remove(dcpi_testkit::PRETEND);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run cargo");
    let out =
        format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    Run { ok: o.status.success(), out }
}

fn has(run: &Run, needle: &str) {
    assert!(run.out.contains(needle), "expected {needle:?} in:\n{}", run.out);
}

#[test]
fn skips_show_as_ignored_and_the_switch_fails_them() {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ws = kit.parent().expect("workspace");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(
        d.join("Cargo.toml"),
        format!(
            "[package]\nname = \"kit-fixture\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n[dev-dependencies]\ndcpi-testkit = {{ path = {:?} }}\n\
             [[test]]\nname = \"t\"\npath = \"t.rs\"\n[workspace]\n",
            kit.display().to_string()
        ),
    )
    .unwrap();
    std::fs::create_dir(d.join("src")).unwrap();
    std::fs::write(d.join("src/lib.rs"), "").unwrap();
    std::fs::write(d.join("t.rs"), FIXTURE).unwrap();
    // The workspace's lock, so that --offline finds the same libc.
    std::fs::copy(ws.join("Cargo.lock"), d.join("Cargo.lock")).unwrap();

    // A machine without perf: the test is listed as ignored with the reason, and counted.
    let a = cargo_test(d, &[(dcpi_testkit::PRETEND, "perf")], &[]);
    assert!(a.ok, "{}", a.out);
    has(
        &a,
        "test needs_perf ... ignored, needs perf_event_open: DCPI_TESTKIT_PRETEND_MISSING=perf",
    );
    has(
        &a,
        "test needs_tool ... ignored, needs `dcpi-no-such-tool` on PATH: no `dcpi-no-such-tool`",
    );
    has(&a, "test needs_sh ... ok");
    has(&a, "3 ignored");

    // Changing the pretend variable alone recompiles: `sh` is now missing too.
    let b = cargo_test(d, &[(dcpi_testkit::PRETEND, "perf,sh")], &[]);
    assert!(b.ok, "{}", b.out);
    has(&b, "test needs_sh ... ignored, needs `sh` on PATH");
    has(&b, "4 ignored");

    // Run on purpose with --include-ignored, the run-time guard fails them with the reason.
    let c = cargo_test(d, &[(dcpi_testkit::PRETEND, "perf")], &["--include-ignored"]);
    assert!(!c.ok, "{}", c.out);
    has(&c, "needs perf_event_open: DCPI_TESTKIT_PRETEND_MISSING=perf pretends it is missing");
    has(&c, "test needs_perf ... FAILED");

    // The switch: nothing is ignored, every skip fails, the run-time one included.
    let s = cargo_test(d, &[(dcpi_testkit::PRETEND, "perf"), (dcpi_testkit::SWITCH, "1")], &[]);
    assert!(!s.ok, "{}", s.out);
    has(&s, "test needs_perf ... FAILED");
    has(&s, "test needs_tool ... FAILED");
    has(&s, "test run_time_skip ... FAILED");
    has(
        &s,
        "needs perf_event_open: DCPI_TESTKIT_PRETEND_MISSING=perf pretends it is missing \
              (DCPI_REQUIRE_ALL=1 makes skips failures)",
    );
    has(&s, "DCPI_REQUIRE_ALL=1 makes skips failures: no widget 7");
    has(&s, "1 ignored");
    assert_eq!(s.out.matches("... ignored, needs a").count(), 1, "{}", s.out);

    // Without the switch, the run-time skip prints its reason and returns.
    let r = cargo_test(d, &[], &["--nocapture", "run_time_skip"]);
    assert!(r.ok, "{}", r.out);
    has(&r, "SKIPPED: no widget 7");
}
