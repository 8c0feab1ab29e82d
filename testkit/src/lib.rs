//! Test kit for dcpi's test crates (dev-only): tests that need something of the machine say so,
//! and a machine without it shows them as **ignored, with the reason**, in every test summary,
//! instead of passing them silently.
//!
//! ```text
//! #[dcpi_testkit::test(perf)]                  // perf_event_open of cpu-clock works
//! fn samples_arrive() { ... }
//!
//! #[dcpi_testkit::test(perf, root, tool("setpriv"))]
//! fn runs_as_nobody() { ... }
//! ```
//!
//! # How
//!
//! Stable libtest cannot ignore a test once it runs, so the decision is made when the test
//! crate **compiles**: the attribute macro checks each requirement (the same code as the run-time
//! check, `src/probe.rs`, compiled into both) and emits `#[test]`, plus
//! `#[ignore = "needs perf_event_open: <why>"]` when one is missing. libtest then prints
//! `test foo ... ignored, needs perf_event_open: <why>` and counts it in `N ignored`.
//!
//! Requirements: `perf` (a sampling cpu-clock event for all processes on the first online CPU:
//! the syscall `dcpid --probe` makes first, so tests of the `dcpid` binary decide the same way
//! without running it), `root` (euid 0), `tool("name")` (an executable on `PATH`), and two
//! kinds of machine: `pmu` (a hardware PMU: `cycles` opens) and `no_pmu` (it does not).
//!
//! The body of every such test starts with [`guard`], which checks again at run time and
//! **panics** with the reason if a requirement is missing. That covers the two cases the
//! compile-time answer cannot: a test run on purpose with `--ignored`/`--include-ignored`, and a
//! binary compiled where the requirement held but run where it does not (cargo reuses a test
//! binary until its sources change, e.g. after `sysctl kernel.perf_event_paranoid=2`, or when
//! built as root and run as another user). Such a test fails loudly rather than passing; rebuild
//! the test crate (`touch` one of its files, or `cargo clean -p CRATE`) to check again. Changing
//! `DCPI_REQUIRE_ALL` or `DCPI_TESTKIT_PRETEND_MISSING` needs nothing: the expansion reads both
//! with `option_env!`, so rustc lists them in the crate's dep-info and cargo recompiles it.
//!
//! # The switch
//!
//! `DCPI_REQUIRE_ALL=1` (read only by [`strict`]) turns every skip into a failure: the macro
//! then does not ignore for a missing capability (`perf`, `root`, a tool), so it panics in
//! [`guard`], and [`skip!`] panics instead of returning. `.ci/run` sets it: CI fails on a skip.
//! The exception is `pmu`/`no_pmu`: no machine is both, so a test for the other kind of machine
//! stays ignored, with its reason, under the switch too.
//!
//! # Conditions only a test can find
//!
//! Some conditions show up only while a test runs (a container that does not boot, a tmpfs that
//! cannot be mounted, setpriv refused by the kernel). [`skip!`] reports them: it prints
//! `SKIPPED: <why>` and returns, or panics under the switch. Those tests count as passed in the
//! summary (libtest offers no other outcome at run time); the switch is what keeps them honest
//! in CI.
//!
//! # Seeing it
//!
//! `DCPI_TESTKIT_PRETEND_MISSING=perf` (or `root`, a tool name, `all`; comma-separated) makes
//! the checks fail as on a machine without it. `testkit/tests/kit.rs` builds a small crate with
//! it and checks the summary, the switch and the rebuild.
//!
//! # Fixtures
//!
//! [`db`]: databases built through profile-format's own writers (profiles, who tables, stack
//! files, summaries, kernel symbol snapshots). [`Hostile`]: a FIFO, a link, `/dev/zero` or a
//! sparse 3 GiB file planted as a database file. [`Tmpfs`]: a small file system to fill.
//! [`spin`]: one CPU kept busy while a guard lives. [`modgraph`]: a crate's module import graph,
//! to assert it has no cycle.

pub mod db;
pub mod hostile;
pub mod modgraph;
mod probe;
mod spin;
pub mod tmpfs;

pub use hostile::Hostile;
pub use spin::{spin, Spin};
pub use tmpfs::Tmpfs;

pub use dcpi_testkit_macros::test;
pub use probe::{strict, Req, PRETEND, SWITCH};

/// Run-time half of `#[dcpi_testkit::test]`: panics, naming the requirement and why, when one
/// is missing (see the crate documentation for when a test that runs can find one missing).
#[track_caller]
pub fn guard(reqs: &[Req<'_>]) {
    for r in reqs {
        if let Err(why) = r.check() {
            if strict() && !r.is_variant() {
                panic!("needs {}: {why} ({SWITCH}=1 makes skips failures)", r.what());
            }
            panic!(
                "needs {}: {why}. (The check also runs when the test crate compiles, and marks the \
                 test ignored where the requirement is missing; a test that runs anyway was run \
                 with --ignored, or compiled where the requirement held: rebuild it, e.g. \
                 `cargo clean -p CRATE`, to check again.)",
                r.what()
            );
        }
    }
}

/// Whether `req` holds here now (for tests that adapt rather than skip).
pub fn has(req: &Req<'_>) -> bool {
    req.check().is_ok()
}

/// Reports a skip found at run time: prints `SKIPPED: <why>` to stderr, or panics with it when
/// [`strict`] (`DCPI_REQUIRE_ALL=1`). Prefer `#[dcpi_testkit::test(...)]`, which shows in the
/// summary; use this (or [`skip!`]) only for conditions a compile-time check cannot see.
#[track_caller]
pub fn skipped(why: std::fmt::Arguments<'_>) {
    if strict() {
        panic!("cannot run, and {SWITCH}=1 makes skips failures: {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// `skip!("why {x}")`: [`skipped`] with a format string, then `return` from the test.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        $crate::skipped(::std::format_args!($($arg)*));
        return;
    }};
}
