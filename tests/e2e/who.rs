//! End-to-end tests: who used the CPU (issue 16): the idle task, per-command, per-cgroup.

use std::time::{Duration, Instant};

use dcpi_e2e::{Daemon, Sandbox};

/// `dcpictl flush`, then the per-image JSON report (with `extra` arguments), until `done`
/// accepts it or 60 s pass.
fn report_until(
    sb: &Sandbox,
    d: &Daemon,
    extra: &[&str],
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let f = d.ctl(&["flush"]);
        assert!(f.status.success(), "flush: {}", String::from_utf8_lossy(&f.stderr));
        let out = sb.prof(extra);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "no {what} in 60 s: {v:#}");
        } else {
            assert!(
                Instant::now() < deadline,
                "no {what} in 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn row<'a>(v: &'a serde_json::Value, key: &str, name: &str) -> Option<&'a serde_json::Value> {
    v["rows"].as_array()?.iter().find(|r| r[key].as_str() == Some(name))
}

/// The idle task's samples are their own `[idle]` row (not the kernel's), the report says
/// that its percentages include idle, and `--no-idle` removes the row.
#[dcpi_testkit::test(perf)]
fn idle_task_is_its_own_image_and_no_idle_removes_it() {
    let sb = Sandbox::new();
    let host = "e2e-idle";
    let d = sb.start_daemon(host, &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    let json = ["--host", host, "--format", "json"];
    // The idle task runs only when a CPU is idle, and an idle CPU other than CPU 0 yields
    // almost no cpu-clock samples here (MACHINE-FACTS): wait for CPU 0 to have been idle for a
    // while (the machine may be shared and busy), then the row must be there.
    let idle0 = || -> u64 {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let line = stat.lines().find(|l| l.starts_with("cpu0 ")).unwrap_or_default();
        line.split_whitespace().nth(4).and_then(|x| x.parse().ok()).unwrap_or(0)
    };
    let start = idle0();
    let deadline = Instant::now() + Duration::from_secs(120);
    let v = loop {
        let f = d.ctl(&["flush"]);
        assert!(f.status.success(), "flush: {}", String::from_utf8_lossy(&f.stderr));
        // USER_HZ ticks: 200 = 2 s of idle time on CPU 0.
        let was_idle = idle0().saturating_sub(start) >= 200;
        let out = sb.prof(&json);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
            if row(&v, "image", "[idle]").is_some() {
                break v;
            }
            assert!(!was_idle, "CPU 0 was idle for 2 s but the report has no [idle] row: {v:#}");
        }
        if Instant::now() > deadline {
            eprintln!("SKIPPED: CPU 0 was never idle for 2 s in 120 s (busy machine)");
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let idle = row(&v, "image", "[idle]").expect("idle row");
    assert_eq!(idle["kind"], "kernel", "{idle:#}");
    assert_eq!(v["idle"]["included"], true, "{v:#}");
    let pct = idle["percent"].as_f64().expect("percent");
    assert!((v["idle"]["percent"].as_f64().expect("idle percent") - pct).abs() < 1e-6, "{v:#}");
    // Idle samples are not the kernel's: the kernel row (if any) holds the rest.
    if let Some(k) = row(&v, "image", "[kernel.kallsyms]") {
        assert_ne!(k["image_id"], idle["image_id"], "{v:#}");
    }

    let out = sb.prof(&["--host", host, "--format", "json", "--no-idle"]);
    assert!(out.status.success(), "--no-idle: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(row(&v, "image", "[idle]").is_none(), "--no-idle kept [idle]: {v:#}");
    assert_eq!(v["idle"]["included"], false, "{v:#}");

    let out = sb.prof(&["--host", host]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "table: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("% include the idle task ([idle]"), "{text}");
    if pct >= 50.0 {
        assert!(text.contains("the machine was mostly idle"), "{text}");
    }
    let out = sb.prof(&["--host", host, "--by", "pid"]);
    assert_eq!(out.status.code(), Some(2), "--by pid without by_pid");
    assert!(String::from_utf8_lossy(&out.stderr).contains("by_pid"), "{out:?}");
    // Nor per-process profiles: where a process ran cannot be told, and the report says why.
    let out = sb.prof(&["--host", host, "--pid", "1", "--by", "symbol"]);
    assert_eq!(out.status.code(), Some(2), "--pid --by symbol without by_pid");
    assert!(String::from_utf8_lossy(&out.stderr).contains("recorded without by_pid"), "{out:?}");
    let out = sb.prof(&["--host", host, "--by", "command", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(row(&v, "command", "swapper").is_some(), "the idle task is a command: {v:#}");

    let out = sb.prof(&["--host", host, "--no-idle"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("the idle task ([idle]) is left out"), "{text}");
    assert!(!text.lines().any(|l| !l.starts_with('#') && l.ends_with("[idle]")), "{text}");
}

/// A program that spins until it has used `argv[1]` seconds of CPU time (not wall time: the
/// machine may be shared, and a 2:1 split of CPU time must not depend on the load).
const CPU_SPIN_C: &str = r#"
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    double want = argc > 1 ? atof(argv[1]) : 1.0;
    static const char *volatile name = NAME;
    struct timespec t; volatile unsigned long s = 0;
    do { for (int i = 0; i < 100000; i++) s += i ^ (s >> 3);
         clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); }
    while (t.tv_sec + t.tv_nsec / 1e9 < want);
    return 0;
}
"#;

/// The cgroup v2 mount point, from /proc/self/mountinfo.
fn cgroup2_root() -> Option<std::path::PathBuf> {
    let m = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    m.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(std::path::PathBuf::from))
            .flatten()
    })
}

/// A cgroup made for a test, removed (once empty) on drop.
struct Group(std::path::PathBuf);

impl Drop for Group {
    fn drop(&mut self) {
        // Its processes have exited; a zombie may linger briefly.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Two busy programs in two cgroup v2 groups, one using twice the CPU time of the other:
/// `--by cgroup` splits their samples 2:1 (within 20 %), `--by command` names both, and the
/// filters select one of them.
#[dcpi_testkit::test(perf)]
fn two_cgroups_split_two_to_one_and_commands_are_named() {
    let Some(root) = cgroup2_root() else {
        dcpi_testkit::skip!("no cgroup v2 hierarchy mounted");
    };
    let tag = format!("dcpi-e2e-who-{}", std::process::id());
    let (a, b) = (root.join(format!("{tag}-a")), root.join(format!("{tag}-b")));
    if let Err(e) = std::fs::create_dir(&a) {
        dcpi_testkit::skip!("cannot create a cgroup under {}: {e}", root.display());
    }
    let ga = Group(a.clone());
    std::fs::create_dir(&b).expect("second cgroup");
    let gb = Group(b.clone());

    let sb = Sandbox::new();
    let src = sb.dir.path().join("spin.c");
    std::fs::write(&src, CPU_SPIN_C).expect("write source");
    // Two builds (distinct build-ids), so that each is its own image.
    let build = |name: &str| {
        let out = sb.dir.path().join(name);
        let st = std::process::Command::new("cc")
            .args(["-O1", &format!("-DNAME=\"{name}\""), "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("cc");
        assert!(st.success(), "cc failed");
        out
    };
    let (twice, once) = (build("whotwice"), build("whoonce"));

    let host = "e2e-who";
    let d = sb.start_daemon(
        host,
        &["--events", "cpu-clock:1000000", "--flush-interval", "1s", "--by-pid", "true"],
    );
    // Each program joins its group before it execs, so every sample of it is in the group.
    let spawn = |group: &std::path::Path, bin: &std::path::Path, secs: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" "$3""#)
            .args(["sh", &group.display().to_string(), &bin.display().to_string(), secs])
            .spawn()
            .expect("spawn")
    };
    let mut p2 = spawn(&a, &twice, "3");
    let mut p1 = spawn(&b, &once, "1.5");
    let pid2 = p2.id();
    assert!(p2.wait().expect("wait").success(), "whotwice failed");
    assert!(p1.wait().expect("wait").success(), "whoonce failed");

    let rel = |p: &std::path::Path| format!("/{}", p.file_name().unwrap().to_string_lossy());
    let (ra, rb) = (rel(&a), rel(&b));
    let by_cgroup = ["--host", host, "--by", "cgroup", "--format", "json"];
    let v = report_until(&sb, &d, &by_cgroup, "both cgroups", |v| {
        let n = |c: &str| row(v, "cgroup", c).and_then(|r| r["samples"].as_u64()).unwrap_or(0);
        // 1 ms period: the short program alone is ~1500 samples.
        n(&ra) > 2000 && n(&rb) > 1000
    });
    let n = |c: &str| row(&v, "cgroup", c).and_then(|r| r["samples"].as_u64()).unwrap_or(0);
    let ratio = n(&ra) as f64 / n(&rb) as f64;
    eprintln!("cgroup split {ra}: {}, {rb}: {}, ratio {ratio:.3}", n(&ra), n(&rb));
    assert!((1.6..=2.4).contains(&ratio), "2:1 expected, got {ratio:.3}: {v:#}");

    let out = sb.prof(&["--host", host, "--by", "command", "--format", "json"]);
    assert!(out.status.success(), "--by command: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let c = |name: &str| row(&v, "command", name).and_then(|r| r["samples"].as_u64());
    assert!(c("whotwice").is_some_and(|x| x > 2000), "{v:#}");
    assert!(c("whoonce").is_some_and(|x| x > 1000), "{v:#}");

    // Filters combine: the long program's group holds only its command, and perhaps a sample
    // or two of its last instructions after the harness reaped it, which the kernel gives pid
    // -1 (`[exiting]`, FORMAT.md §12; CI once saw 1 of 3 055).
    let out = sb.prof(&["--host", host, "--by", "command", "--cgroup", &ra, "--format", "json"]);
    assert!(out.status.success(), "--cgroup: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = v["rows"].as_array().expect("rows");
    let (exiting, named): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r["command"] == "[exiting]");
    assert_eq!(named.len(), 1, "{v:#}");
    assert_eq!(named[0]["command"], "whotwice", "{v:#}");
    let total = v["total_samples"].as_u64().unwrap_or(0);
    let late: u64 = exiting.iter().filter_map(|r| r["samples"].as_u64()).sum();
    assert!(late * 100 <= total, "{late} of {total} samples exiting: {v:#}");
    let out =
        sb.prof(&["--host", host, "--by", "image", "--command", "whoonce", "--format", "json"]);
    assert!(out.status.success(), "--command: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let path = once.display().to_string();
    assert!(row(&v, "image", &path).is_some(), "{v:#}");
    // by_pid: the long program's pid is a row, and --pid selects it.
    let pid = pid2.to_string();
    let out = sb.prof(&["--host", host, "--by", "command", "--pid", &pid, "--format", "json"]);
    assert!(out.status.success(), "--pid: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["rows"][0]["command"], "whotwice", "{v:#}");
    let out = sb.prof(&["--host", host, "--by", "pid", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let r = v["rows"].as_array().and_then(|r| r.iter().find(|r| r["pid"] == pid2));
    assert!(r.is_some_and(|r| r["samples"].as_u64().unwrap_or(0) > 2000), "{v:#}");
    drop(d);
    drop((ga, gb));
}

/// Two threads spinning in `spin_top` until killed: busier than any one-threaded process on
/// a two-CPU machine shared with other work.
const TOP_SPIN_C: &str = r#"
#include <pthread.h>
__attribute__((noinline, noipa)) unsigned long spin_top(unsigned long n) {
    volatile unsigned long s = 0;
    for (;;) for (unsigned long i = 0; i < n; i++) s += i ^ (s >> 3);
    return s;
}
static void *run(void *a) { (void)a; spin_top(1000000); return 0; }
int main(void) { pthread_t t; pthread_create(&t, 0, run, 0); run(0); return 0; }
"#;

/// `dcpictl top --once --format json` lists a running busy program first, with its function.
#[dcpi_testkit::test(perf)]
fn top_lists_a_busy_program_first() {
    let sb = Sandbox::new();
    let src = sb.dir.path().join("topspin.c");
    std::fs::write(&src, TOP_SPIN_C).expect("write source");
    let bin = sb.dir.path().join("topspin");
    let st = std::process::Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed");
    let d =
        sb.start_daemon("e2e-top", &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            drop(self.0.kill());
            drop(self.0.wait());
        }
    }
    let spinner = Kill(std::process::Command::new(&bin).spawn().expect("spawn"));
    let pid = spinner.0.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = d.ctl(&["top", "--once", "--format", "json", "--no-idle"]);
        assert!(out.status.success(), "top: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top JSON");
        let first = &v["rows"][0];
        if first["symbol"] == "spin_top" {
            assert_eq!(first["command"], "topspin", "{v:#}");
            assert_eq!(first["image"], bin.display().to_string(), "{v:#}");
            assert!(first["samples"].as_u64().unwrap_or(0) > 0, "{v:#}");
            break;
        }
        assert!(Instant::now() < deadline, "the spinner was never first in 60 s: {v:#}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Per process: its pid.
    let out = d.ctl(&["top", "--once", "--format", "json", "--by", "pid", "--command", "topspin"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top JSON");
    assert_eq!(v["rows"][0]["pid"], pid, "{v:#}");
    drop(spinner);
}

/// Four processes of one program spin in `hot4` (at -O1, so `hot4` has a symbol and no inlining);
/// a fifth program makes `getppid` system calls as fast as it can.
const FOUR_HOT_C: &str = r#"
#include <unistd.h>
__attribute__((noinline, noipa)) unsigned long hot4(unsigned long n) {
    volatile unsigned long s = 0;
    for (;;) for (unsigned long i = 0; i < n; i++) s += i ^ (s >> 3);
    return s;
}
int main(void) { fork(); fork(); hot4(1000000); return 0; }
"#;
const SYSCALLS_C: &str = r#"
#include <unistd.h>
#include <sys/syscall.h>
int main(void) { for (;;) syscall(SYS_getppid); }
"#;

/// Issue 38: `dcpictl top --once --format json` ranks a function that runs in four processes
/// first (one row over its pids, which per-pid rows never did: four processes on two CPUs
/// each get less than a fifth), and names the kernel functions of a syscall-heavy program.
#[dcpi_testkit::test(perf)]
fn top_ranks_a_function_of_four_processes_first_and_names_kernel_functions() {
    let sb = Sandbox::new();
    let build = |name: &str, src: &str| {
        let c = sb.dir.path().join(format!("{name}.c"));
        std::fs::write(&c, src).expect("write source");
        let bin = sb.dir.path().join(name);
        let st = std::process::Command::new("cc")
            .args(["-O1", "-o"])
            .arg(&bin)
            .arg(&c)
            .status()
            .expect("cc");
        assert!(st.success(), "cc {name} failed");
        bin
    };
    let hot = build("hot4", FOUR_HOT_C);
    let sys = build("sysloop", SYSCALLS_C);
    let d =
        sb.start_daemon("e2e-top4", &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    struct KillGroup(std::process::Child);
    impl Drop for KillGroup {
        fn drop(&mut self) {
            // The forked children share the process group the child leads.
            drop(
                std::process::Command::new("kill")
                    .args(["-9", "--", &format!("-{}", self.0.id())])
                    .status(),
            );
            drop(self.0.wait());
        }
    }
    use std::os::unix::process::CommandExt;
    let _hot = KillGroup(std::process::Command::new(&hot).process_group(0).spawn().expect("spawn"));
    let _sys = KillGroup(std::process::Command::new(&sys).process_group(0).spawn().expect("spawn"));
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut first_ok, mut kernel_named) = (false, false);
    let mut last = serde_json::Value::Null;
    while !(first_ok && kernel_named) {
        assert!(
            Instant::now() < deadline,
            "in 90 s: hot4 first over its four processes: {first_ok}; a kernel function of sysloop named: {kernel_named}; last: {last:#}"
        );
        let out = d.ctl(&["top", "--once", "--format", "json", "--no-idle", "--limit", "100"]);
        assert!(out.status.success(), "top: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top JSON");
        let first = &v["rows"][0];
        if first["symbol"] == "hot4" {
            assert_eq!(first["command"], "hot4", "{v:#}");
            assert_eq!(first["image"], hot.display().to_string(), "{v:#}");
            first_ok = true;
        }
        // The kernel rows of the window: the system call path is named from kallsyms
        // (`__x64_sys_getppid`, `do_syscall_64`, `entry_SYSCALL_64`...), not a page.
        kernel_named |= v["rows"].as_array().is_some_and(|rows| {
            rows.iter().any(|r| {
                r["image"] == "[kernel.kallsyms]"
                    && r["symbol"].as_str().is_some_and(|s| {
                        s.contains("getppid") || s.to_ascii_lowercase().contains("syscall")
                    })
            })
        });
        // Zoomed into the syscall program: its kernel time is there, as one row.
        let out = d.ctl(&["top", "--once", "--format", "json", "--command", "sysloop"]);
        let z: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top JSON");
        if let Some(rows) = z["rows"].as_array() {
            assert!(rows.iter().all(|r| r["command"] == "sysloop"), "zoom leaked: {z:#}");
        }
        last = v;
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The host pid of the (only) process named `comm`, if running.
fn pid_of(comm: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let c = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (c.trim_end() == comm).then_some(pid)
    })
}

/// A program in its own PID and mount namespaces (`unshare --pid --mount --fork`), run from a
/// tmpfs mounted only in that namespace: its samples carry its host pid and its image (found
/// through /`proc/PID/map_files`, with its build-id), and `dcpictl top` names its function
/// (binary read through /proc/PID/root).
#[dcpi_testkit::test(perf)]
fn a_process_in_other_namespaces_is_reported_with_its_host_pid() {
    let ok = std::process::Command::new("unshare")
        .args(["--pid", "--mount", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        dcpi_testkit::skip!("unshare --pid --mount --fork is not permitted here");
    }
    let sb = Sandbox::new();
    let src = sb.dir.path().join("spin.c");
    std::fs::write(&src, CPU_SPIN_C).expect("write source");
    let bin = sb.dir.path().join("nsspin");
    let st = std::process::Command::new("cc")
        .args(["-O1", "-DNAME=\"nsspin\"", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed");
    let mnt = sb.dir.path().join("private");
    std::fs::create_dir(&mnt).expect("mkdir");
    let host = "e2e-ns";
    let d = sb.start_daemon(
        host,
        &["--events", "cpu-clock:1000000", "--flush-interval", "1s", "--by-pid", "true"],
    );
    // Inside: a tmpfs the host does not see, the binary copied there, run for 4 s of CPU.
    let script = r#"mount -t tmpfs none "$1" && cp "$2" "$1/nsspin" && exec "$1/nsspin" 4"#;
    let mut child = std::process::Command::new("unshare")
        .args(["--pid", "--mount", "--fork", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(&mnt)
        .arg(&bin)
        .spawn()
        .expect("spawn unshare");
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        if let Some(p) = pid_of("nsspin") {
            break p;
        }
        assert!(Instant::now() < deadline, "nsspin never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    let inner = mnt.join("nsspin").display().to_string();
    assert!(!mnt.join("nsspin").exists(), "the tmpfs must be private to the namespace");
    // While it runs: top shows its host pid and names its function.
    let mut named = false;
    while !named && Instant::now() < deadline {
        let out = d.ctl(&["top", "--once", "--format", "json", "--command", "nsspin"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top JSON");
        if let Some(r) = v["rows"].as_array().and_then(|r| r.iter().find(|r| r["image"] == inner)) {
            assert_eq!(r["command"], "nsspin", "{v:#}");
            named = r["symbol"] == "main";
        }
        let out = d.ctl(&["top", "--once", "--format", "json", "--by", "pid"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top JSON");
        if let Some(r) = v["rows"].as_array().and_then(|r| r.iter().find(|r| r["pid"] == pid)) {
            assert_eq!(r["command"], "nsspin", "{v:#}");
        }
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(child.wait().expect("wait").success(), "nsspin failed");
    assert!(named, "top never named nsspin's function through /proc/{pid}/root");

    let v =
        report_until(&sb, &d, &["--host", host, "--by", "pid", "--format", "json"], "pid", |v| {
            row_num(v, "pid", pid).is_some_and(|r| r["samples"].as_u64().unwrap_or(0) > 1000)
        });
    assert!(row_num(&v, "pid", pid).is_some(), "{v:#}");
    let out = sb.prof(&["--host", host, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let img = row(&v, "image", &inner).unwrap_or_else(|| panic!("no row for {inner}: {v:#}"));
    assert!(img["build_id"].is_string(), "build-id through map_files: {img:#}");
}

fn row_num<'a>(v: &'a serde_json::Value, key: &str, n: u32) -> Option<&'a serde_json::Value> {
    v["rows"].as_array()?.iter().find(|r| r[key] == n)
}

/// One binary, two hot functions: `whospin a SECS` spins in `hot_a`, `whospin b SECS` in
/// `hot_b`, each until the process has used SECS of CPU time.
const TWO_HOT_C: &str = include_str!("two_hot_cpu.c");

/// Samples of `sym` in a JSON symbol report (0 if no row).
fn sym_samples(v: &serde_json::Value, sym: &str) -> u64 {
    row(v, "symbol", sym).and_then(|r| r["samples"].as_u64()).unwrap_or(0)
}

/// `by_pid` and `by_cgroup` (issue 16): two processes of one binary, each in its own cgroup v2
/// group, each spinning in its own function. `dcpiprof --pid A --by symbol` counts only A's
/// samples (its function, not B's; as many as the who table gives A, within 5 %), B's pid gives
/// B's, and `--cgroup` does the same per group. (Without `by_pid` the report is an error: see
/// `idle_task_is_its_own_image_and_no_idle_removes_it`.)
#[dcpi_testkit::test(perf)]
fn per_process_and_per_cgroup_profiles_split_one_binary() {
    let Some(root) = cgroup2_root() else {
        dcpi_testkit::skip!("no cgroup v2 hierarchy mounted");
    };
    let tag = format!("dcpi-e2e-whoprof-{}", std::process::id());
    let (a, b) = (root.join(format!("{tag}-a")), root.join(format!("{tag}-b")));
    if let Err(e) = std::fs::create_dir(&a) {
        dcpi_testkit::skip!("cannot create a cgroup under {}: {e}", root.display());
    }
    let ga = Group(a.clone());
    std::fs::create_dir(&b).expect("second cgroup");
    let gb = Group(b.clone());

    let sb = Sandbox::new();
    let src = sb.dir.path().join("whospin.c");
    std::fs::write(&src, TWO_HOT_C).expect("write source");
    let bin = sb.dir.path().join("whospin");
    let st = std::process::Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed");

    let host = "e2e-whoprof";
    let d = sb.start_daemon(
        host,
        &[
            "--events",
            "cpu-clock:1000000",
            "--flush-interval",
            "1s",
            "--by-pid",
            "true",
            "--by-cgroup",
            "true",
        ],
    );
    let spawn = |group: &std::path::Path, which: &str, secs: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" "$3" "$4""#)
            .args(["sh", &group.display().to_string(), &bin.display().to_string(), which, secs])
            .spawn()
            .expect("spawn")
    };
    let mut pa = spawn(&a, "a", "2.5");
    let mut pb = spawn(&b, "b", "1.5");
    let (pid_a, pid_b) = (pa.id(), pb.id());
    assert!(pa.wait().expect("wait").success(), "whospin a failed");
    assert!(pb.wait().expect("wait").success(), "whospin b failed");

    // The who table's count of each process, once both are published.
    let by_pid = ["--host", host, "--by", "pid", "--format", "json"];
    let who = report_until(&sb, &d, &by_pid, "both processes", |v| {
        let n = |p: u32| {
            v["rows"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["pid"] == p))
                .map_or(0, |r| r["samples"].as_u64().unwrap_or(0))
        };
        n(pid_a) > 1500 && n(pid_b) > 1000
    });
    let who_n = |p: u32| {
        who["rows"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["pid"] == p))
            .map_or(0, |r| r["samples"].as_u64().unwrap_or(0))
    };
    let json = |extra: &[&str]| -> serde_json::Value {
        let out = sb.prof(&[&["--host", host, "--format", "json"][..], extra].concat());
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let close = |got: u64, want: u64| (got as f64 - want as f64).abs() <= 0.05 * want as f64;
    for (pid, mine, other) in [(pid_a, "hot_a", "hot_b"), (pid_b, "hot_b", "hot_a")] {
        let v = json(&["--pid", &pid.to_string(), "--by", "symbol"]);
        let total = v["total_samples"].as_u64().unwrap_or(0);
        eprintln!("pid {pid}: {total} samples in its profiles, {} in the who table", who_n(pid));
        assert!(close(total, who_n(pid)), "pid {pid}: {total} vs who {}: {v:#}", who_n(pid));
        assert!(sym_samples(&v, mine) * 10 >= total * 8, "{mine} is most of pid {pid}: {v:#}");
        assert_eq!(sym_samples(&v, other), 0, "pid {pid} ran no {other}: {v:#}");
        let v = json(&["--pid", &pid.to_string(), "--by", "image"]);
        assert_eq!(v["report"], "images", "{v:#}");
        assert!(row(&v, "image", &bin.display().to_string()).is_some(), "{v:#}");
    }

    let by_cgroup = json(&["--by", "cgroup"]);
    let rel = |p: &std::path::Path| format!("/{}", p.file_name().unwrap().to_string_lossy());
    for (g, pid, mine, other) in
        [(rel(&a), pid_a, "hot_a", "hot_b"), (rel(&b), pid_b, "hot_b", "hot_a")]
    {
        let want = row(&by_cgroup, "cgroup", &g).and_then(|r| r["samples"].as_u64()).unwrap_or(0);
        let v = json(&["--cgroup", &g, "--by", "symbol"]);
        let total = v["total_samples"].as_u64().unwrap_or(0);
        eprintln!("cgroup {g}: {total} samples in its profiles, {want} in the who table");
        assert!(close(total, want), "cgroup {g}: {total} vs who {want}: {v:#}");
        // Its one process's samples: most of them. A batch gives each pid one cgroup, so a
        // batch with only the shell's samples before `echo $$ > cgroup.procs` counts them in
        // the parent group. (Until 'who: the seen cache keys the mode too', a whole batch of
        // the process could go to the root group under load: 13-18 % of its samples.)
        let n = who_n(pid);
        assert!(total <= n + n / 20 && total * 10 >= n * 8, "cgroup {g}: {total} vs pid {pid} {n}");
        assert!(sym_samples(&v, mine) * 10 >= total * 8, "{mine} is most of {g}: {v:#}");
        assert_eq!(sym_samples(&v, other), 0, "{g} ran no {other}: {v:#}");
    }
    drop(d);
    drop((ga, gb));
}
