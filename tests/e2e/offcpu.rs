//! End-to-end test of off-CPU time (`dcpid --off-cpu true`, event `off-cpu`, issue 40): a
//! thread that blocks 60 % of its blocked time in `read()` on a pipe through `wait_a` and 40 % in
//! `nanosleep` through `wait_b`, and a busy loop that never blocks.

use std::process::Command;

use dcpi_e2e::{Daemon, Sandbox};

/// The main thread alternates `wait_a` (pipe read, a feeder thread writes 6 ms later) and
/// `wait_b` (nanosleep, 2/3 of `wait_a`'s total); prints both totals in nanoseconds.
const WAIT_C: &str = include_str!("offcpu_wait.c");
/// Spins for argv[1] seconds of wall time; prints the wall nanoseconds.
const BUSY_C: &str = include_str!("busy_loop.c");

/// `-O0` with frame pointers: every function keeps its frame, so the kernel's frame-pointer
/// walk of the user stack finds `wait_a` / `wait_b` / `spin`.
fn build(dir: &std::path::Path, name: &str, source: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write source");
    let bin = dir.join(name);
    let st = Command::new("cc")
        .args(["-O0", "-fno-omit-frame-pointer", "-pthread", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    bin
}

/// The numbers a workload printed on its stdout.
fn printed(bin: &std::path::Path, arg: &str) -> Vec<u64> {
    let out = Command::new(bin).arg(arg).output().expect("run workload");
    assert!(out.status.success(), "{}: {}", bin.display(), out.status);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|w| w.parse().expect("a number"))
        .collect()
}

/// Nanoseconds of the folded stacks (`frame;frame;... count`) that contain `frames`.
fn folded_ns(folded: &str, frames: &str) -> u64 {
    folded
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(stack, _)| format!("{stack};").contains(frames))
        .map(|(_, n)| n.parse::<u64>().expect("folded count"))
        .sum()
}

/// Why the BPF source cannot run here (each BPF test's skip reason), or None.
fn bpf_unavailable() -> Option<&'static str> {
    (!std::path::Path::new("/sys/kernel/btf/vmlinux").exists())
        .then_some("the kernel has no BTF (/sys/kernel/btf/vmlinux): no BPF source")
}

/// Why the tracepoint source cannot run here (each tracepoint test's skip reason), or None.
fn tracepoint_unavailable() -> Option<&'static str> {
    (!std::path::Path::new("/sys/kernel/tracing/events/sched/sched_switch/id").exists()).then_some(
        "tracefs is not mounted at /sys/kernel/tracing (mount -t tracefs nodev /sys/kernel/tracing)",
    )
}

/// The default source where the BPF program loads (root, or `CAP_BPF` and `CAP_PERFMON`; Linux
/// 5.18 or later with BTF): waits paired in the kernel, summed per thread and stack.
#[dcpi_testkit::test(perf, root)]
fn off_cpu_time_from_bpf_splits_by_blocking_stack_and_a_busy_loop_has_none() {
    if let Some(why) = bpf_unavailable() {
        dcpi_testkit::skip!("{why}");
    }
    splits_by_blocking_stack("bpf");
}

/// The source where the BPF program cannot load and tracefs is mounted (`.ci/run` mounts it):
/// the filtered `sched:sched_switch` tracepoint.
#[dcpi_testkit::test(perf)]
fn off_cpu_time_splits_by_blocking_stack_and_a_busy_loop_has_none() {
    if let Some(why) = tracepoint_unavailable() {
        dcpi_testkit::skip!("{why}");
    }
    splits_by_blocking_stack("tracepoint");
}

/// The fallback where tracefs is not mounted: perf's context-switch records.
#[dcpi_testkit::test(perf)]
fn off_cpu_time_from_switch_records_splits_the_same() {
    splits_by_blocking_stack("switch-records");
}

/// dcpid sampling at 1 kHz with frame-pointer stacks and off-CPU time from `source`, flushing
/// each second, with `extra` arguments.
fn start_off_cpu_daemon(sb: &Sandbox, host: &str, source: &str, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--events",
        "cpu-clock:1000000",
        "--flush-interval",
        "1s",
        "--callchains",
        "fp",
        "--off-cpu",
        "true",
        "--off-cpu-source",
        source,
    ];
    args.extend_from_slice(extra);
    sb.start_daemon(host, &args)
}

fn splits_by_blocking_stack(source: &str) {
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let wait = build(dir, "offcpu_wait", WAIT_C);
    let busy = build(dir, "busy_loop", BUSY_C);
    let host = "e2e-offcpu";
    let mut d = start_off_cpu_daemon(&sb, host, source, &[]);
    // ~250 rounds of 6 ms + 4 ms: 2.5 s on an idle machine, more on a loaded one.
    let w = printed(&wait, "250");
    let (a_wall, b_wall) = (w[0], w[1]);
    let busy_wall = printed(&busy, "2")[0];
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    // dcpictl status shows the source's rate and its own cost.
    let status = d.status_json();
    let oc = &status["off_cpu"];
    let num = |k: &str| oc[k].as_f64().unwrap_or_else(|| panic!("off_cpu.{k}: {status:#}"));
    assert!(num("switches") >= 500.0 && num("switches_per_s") > 0.0, "{oc}");
    assert!(num("waits") >= 500.0 && num("off_cpu_s") > 0.0, "{oc}");
    assert!(num("cpu_s") >= 0.0 && num("ns_per_switch") >= 0.0, "{oc}");
    assert_eq!(oc["source"], source, "{oc}");
    let text = d.ctl(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("off-cpu:    ({source}) ")) && text.contains(" switches/s"),
        "{text}"
    );
    let (st, err) = d.terminate();
    assert!(st.success(), "dcpid exit {st}: {err}");

    let cache = dir.join("symbols.sqlite").display().to_string();
    let o = sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        &cache,
        "--event",
        "off-cpu",
        "--format",
        "folded",
    ]);
    assert!(o.status.success(), "folded: {}", String::from_utf8_lossy(&o.stderr));
    let folded = String::from_utf8_lossy(&o.stdout);
    let a = folded_ns(&folded, ";main;wait_a;");
    let b = folded_ns(&folded, ";main;wait_b;");
    let spin = folded_ns(&folded, ";spin;");
    eprintln!(
        "off-cpu: wait_a {a} ns (wall {a_wall}), wait_b {b} ns (wall {b_wall}); \
         spin {spin} ns of {busy_wall} ns wall"
    );
    assert!(a > 0 && b > 0, "no off-CPU time through wait_a/wait_b in:\n{folded}");
    // The split is the program's 60/40 (its measured one is within a round of it).
    let share = 100.0 * a as f64 / (a + b) as f64;
    assert!((share - 60.0).abs() <= 4.0, "wait_a has {share:.1}% of the off-CPU time, not 60%");
    // The total is the blocked wall time, within 5 % (the wall time around the calls also
    // holds their few microseconds on CPU per round).
    let wall = (a_wall + b_wall) as f64;
    let ratio = (a + b) as f64 / wall;
    assert!((ratio - 1.0).abs() <= 0.05, "off-CPU {} ns vs blocked wall {wall} ns", a + b);
    // A busy loop never blocks: being preempted (this machine is loaded) is not off-CPU time.
    assert!(
        (spin as f64) < 0.01 * busy_wall as f64,
        "busy loop: {spin} ns off CPU in spin of {busy_wall} ns wall"
    );
    // The blocking stack reaches into the kernel: the pipe read and the sleep.
    assert!(folded.lines().any(|l| l.contains(";wait_a;") && l.contains("pipe_read")), "{folded}");
    assert!(folded.lines().any(|l| l.contains(";wait_b;") && l.contains("nanosleep")), "{folded}");

    // The flat profiles count nanoseconds too: the workload's off-CPU time is at libc's
    // syscall sites (the user pc where the thread entered the kernel).
    let r = dcpi_e2e::json(sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        &cache,
        "--event",
        "off-cpu",
        "--format",
        "json",
    ]));
    let total = r["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|row| row["samples"].as_u64())
        .sum::<u64>();
    assert!(total >= a + b, "flat off-cpu total {total} < {a} + {b}: {r:#}");

    // Every report shows time for the time-weighted event, never samples (issue 40 item 3).
    let text = |args: &[&str]| {
        let mut all = vec!["--host", host, "--symbol-cache", &cache];
        all.extend_from_slice(args);
        let o = sb.prof(&all);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // Seconds in a text cell ("2.494 s"), read back as nanoseconds.
    let secs_ns = |line: &str| -> u64 {
        let w: Vec<&str> = line.split_whitespace().collect();
        let i = w.iter().position(|x| *x == "s").unwrap_or_else(|| panic!("no seconds: {line}"));
        (w[i - 1].parse::<f64>().expect("seconds") * 1e9) as u64
    };
    let near = |got: u64, want: u64| (got as f64 - want as f64).abs() <= 0.02 * want as f64 + 2e6;
    let images = text(&["--event", "off-cpu"]);
    assert!(images.contains("# total off-cpu: ") && !images.contains("samples"), "{images}");
    // Per command (the who tables): the workload's off-CPU time is its blocked time.
    let cmds = text(&["--event", "off-cpu", "--by", "command"]);
    let line =
        cmds.lines().find(|l| l.ends_with("offcpu_wait")).unwrap_or_else(|| panic!("{cmds}"));
    assert!(secs_ns(line) >= a + b - 2_000_000, "{line} < {} ns:\n{cmds}", a + b);
    assert!(!cmds.contains("samples"), "{cmds}");
    // --callers: wait_a's caller is main, for wait_a's time.
    let callers = text(&["--event", "off-cpu", "--callers", "wait_a"]);
    let line =
        callers.lines().find(|l| l.ends_with(" main")).unwrap_or_else(|| panic!("{callers}"));
    assert!(near(secs_ns(line), a), "{line} vs {a} ns:\n{callers}");
    assert!(!callers.contains("samples"), "{callers}");
    // The flame graph's unit is nanoseconds.
    let svg = text(&["--event", "off-cpu", "--format", "svg"]);
    assert!(svg.contains("data-unit=\"ns\"") && svg.contains("off-cpu time (ns)"), "svg header");
    // The wall view: both events, on-CPU samples converted to time, the conversion stated.
    let wall = text(&["--event", "cpu-clock", "--event", "off-cpu"]);
    assert!(wall.contains("# wall = on-CPU time + off-CPU time: cpu-clock samples"), "{wall}");
    assert!(wall.lines().any(|l| l.contains(" wall ") && l.contains("cum%")), "{wall}");
}

/// Without `CAP_BPF` (and `CAP_SYS_ADMIN`, which would stand in for it) and without tracefs
/// (hidden here by a tmpfs in a private mount namespace), the default source says why for
/// each and falls back to the switch records, which time the waits all the same.
#[dcpi_testkit::test(root, tool("setpriv"))]
fn without_bpf_and_tracefs_the_default_source_falls_back_to_switch_records_and_says_why() {
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let mut args = sb.daemon_args("e2e-offcpu-fallback");
    args.extend(["--off-cpu", "true", "--duration", "3s"].map(String::from));
    // The tmpfs hides both places tracefs is looked for; `exec` keeps the namespace; setpriv
    // drops the capabilities that allow loading a BPF program from the bounding set (root
    // keeps the others, CAP_PERFMON included).
    let script = "mount -t tmpfs none /sys/kernel/tracing && \
                  { ! [ -d /sys/kernel/debug/tracing ] || mount -t tmpfs none /sys/kernel/debug; } && \
                  exec setpriv --bounding-set=-bpf,-sys_admin --inh-caps=-bpf,-sys_admin -- \"$0\" \"$@\"";
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(dcpi_e2e::bin("dcpid"))
        .args(&args)
        .output()
        .expect("run unshare");
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && err.contains("unshare failed") {
        dcpi_testkit::skip!("no private mount namespace here: {err}");
    }
    assert!(o.status.success(), "dcpid: {}\n{err}", o.status);
    assert!(
        err.contains("BPF program cannot be used") && err.contains("Operation not permitted"),
        "no warning naming why the BPF program was not used:\n{err}"
    );
    assert!(
        err.contains("tracepoint cannot be used") && err.contains("tracefs is not mounted"),
        "no warning naming the reason:\n{err}"
    );
    assert!(
        err.contains("source=\"switch-records\"") || err.contains("source=switch-records"),
        "{err}"
    );
    // The waits of those 3 s were published as the off-CPU event.
    let r = dcpi_e2e::json(sb.prof(&[
        "--host",
        "e2e-offcpu-fallback",
        "--event",
        "off-cpu",
        "--format",
        "json",
    ]));
    let total: u64 =
        r["rows"].as_array().expect("rows").iter().filter_map(|row| row["samples"].as_u64()).sum();
    assert!(total > 0, "no off-CPU time published: {r:#}");
}

/// A pipe ping-pong between two threads pinned to CPUs 0 and 1: every round, each thread
/// blocks once and runs again once. On this kernel a thread woken on a CPU that just went idle
/// runs again without a `sched_switch` from the idle task, so a source that took switch-ins
/// from the tracepoint left half these waits unpaired (BENCHMARKS.md, sixth session).
#[dcpi_testkit::test(perf)]
fn every_wait_of_a_pinned_ping_pong_is_paired_with_its_switch_in() {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    if !(online.trim() == "0-1" || online.trim().starts_with("0-")) {
        dcpi_testkit::skip!("needs CPUs 0 and 1 online, has {online:?}");
    }
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let exe = sb.dir.path().join("pingpong");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/workloads/pingpong.c");
    let cc = Command::new("cc").args(["-O2", "-pthread", "-o"]).arg(&exe).arg(src).status();
    assert!(cc.expect("run cc").success(), "cc {src}");
    let mut d = sb.start_daemon(
        "e2e-offcpu-pingpong",
        &["--events", "cpu-clock:1000000", "--callchains", "fp", "--off-cpu", "true"],
    );
    let before = d.status_json()["off_cpu"].clone();
    // 2 s at 2 000 round trips/s: ~8 000 waits of its two threads.
    let o = Command::new(&exe).args(["2", "2000"]).output().expect("run pingpong");
    assert!(o.status.success(), "pingpong: {}", String::from_utf8_lossy(&o.stderr));
    let rounds: u64 = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("round trips printed");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    // The BPF source reads its counters once a second: wait (up to a generous deadline) for
    // the waits of the run to show; the assertions below then say what was missing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut after = d.status_json()["off_cpu"].clone();
    while n(&after, "waits") - n(&before, "waits") < 2 * rounds
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = d.status_json()["off_cpu"].clone();
    }
    let (waits, unpaired) =
        (n(&after, "waits") - n(&before, "waits"), n(&after, "unpaired") - n(&before, "unpaired"));
    eprintln!("{rounds} round trips: {waits} waits, {unpaired} unpaired ({})", after["source"]);
    // As root on a kernel with BTF, the default source is the BPF program.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && bpf_unavailable().is_none() {
        assert_eq!(after["source"], "bpf", "{after}");
    }
    assert!(waits >= 2 * rounds, "{waits} waits for {rounds} round trips of two threads");
    assert!(unpaired * 100 <= waits, "{unpaired} of {waits} waits unpaired");
    let (st, err) = d.terminate();
    assert!(st.success(), "dcpid exit {st}: {err}");
}

/// `off_cpu_threshold` above every wait of the workload (6 and 4 ms against 50 ms): its waits
/// are still timed and counted in the flat profiles, but none gets a stack (issue 40 item 2).
#[dcpi_testkit::test(perf, root)]
fn waits_below_the_threshold_from_bpf_count_without_a_stack() {
    if let Some(why) = bpf_unavailable() {
        dcpi_testkit::skip!("{why}");
    }
    waits_below_the_threshold_count_without_a_stack("bpf");
}

/// The same with perf's context-switch records, which dcpid pairs itself.
#[dcpi_testkit::test(perf)]
fn waits_below_the_threshold_from_switch_records_count_without_a_stack() {
    waits_below_the_threshold_count_without_a_stack("switch-records");
}

fn waits_below_the_threshold_count_without_a_stack(source: &str) {
    let _one = dcpi_e2e::machine_wide_stacks();
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let wait = build(dir, "offcpu_wait", WAIT_C);
    let host = "e2e-offcpu-threshold";
    let mut d = start_off_cpu_daemon(&sb, host, source, &["--off-cpu-threshold", "50ms"]);
    let before = d.status_json()["off_cpu"]["waits_without_stack"].as_u64().unwrap_or(0);
    let w = printed(&wait, "250");
    let blocked = w[0] + w[1];
    // The BPF source hands its waits over once a second: wait for the workload's 500.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let without = || d.status_json()["off_cpu"]["waits_without_stack"].as_u64().unwrap_or(0);
    while without() < before + 500 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let n = without() - before;
    assert!(n >= 500, "{n} waits without a stack for the workload's 500 short waits");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    let (st, err) = d.terminate();
    assert!(st.success(), "dcpid exit {st}: {err}");

    let cache = dir.join("symbols.sqlite").display().to_string();
    // The workload's blocked time is all there, per command (the who table): at least the main
    // thread's (the command's time also holds its feeder thread's sleeps, about as long).
    let r = dcpi_e2e::json(sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        &cache,
        "--event",
        "off-cpu",
        "--by",
        "command",
        "--format",
        "json",
    ]));
    let rows = r["rows"].as_array().expect("rows");
    let ns: u64 = rows
        .iter()
        .filter(|row| row.to_string().contains("offcpu_wait"))
        .filter_map(|row| row["samples"].as_u64())
        .sum();
    eprintln!("threshold 50 ms ({source}): {ns} ns off CPU of {blocked} ns blocked, {n} waits");
    assert!(ns as f64 >= 0.95 * blocked as f64, "{ns} ns counted of {blocked} ns blocked: {r:#}");
    // ...and none of it has a stack through wait_a or wait_b.
    let o = sb.prof(&[
        "--host",
        host,
        "--symbol-cache",
        &cache,
        "--event",
        "off-cpu",
        "--format",
        "folded",
    ]);
    let folded = String::from_utf8_lossy(&o.stdout);
    let stacked = folded_ns(&folded, ";wait_a;") + folded_ns(&folded, ";wait_b;");
    assert_eq!(stacked, 0, "waits below the threshold have stacks:\n{folded}");
}
