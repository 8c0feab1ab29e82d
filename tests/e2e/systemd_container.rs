//! End-to-end tests: the unit under a real systemd. A Debian root file system (debootstrap,
//! cached under /var/tmp) is booted once per test run with `systemd-nspawn -b`, systemd as its
//! PID 1; `make install` puts the binaries this test run built into it, and the README's steps
//! (systemd-sysusers, systemd-tmpfiles, daemon-reload) set the service up. The tests then drive
//! `dcpid.service` with systemctl through `nsenter` into the container: `Type=notify` start,
//! the watchdog restart, `ExecReload`, the final publish on stop, and the unprivileged daemon
//! with exactly the unit's capabilities.
//!
//! The container is a copy-on-write overlay over the cached root (its changes go to a per-run
//! directory), so the cache stays pristine and a second run skips debootstrap (~80 s here). It
//! is powered off when the test process exits (atexit), and killed with it in any case
//! (`PR_SET_PDEATHSIG`). The tests share one `dcpid.service`, so they take turns (a mutex) and
//! each leaves the service stopped with the shipped unit and configuration.
//!
//! Without perf, root or a tool it needs (systemd-nspawn, debootstrap, nsenter, make), each test
//! is listed as ignored with the reason (`#[dcpi_testkit::test]`). Where the container still
//! cannot boot (no Debian mirror, a kernel or cgroup setup nspawn refuses), each test prints
//! `SKIPPED:` and the reason; with `DCPI_REQUIRE_ALL=1` (set by .ci/run, whose machines boot it)
//! both fail instead. Variables: `DCPI_CT_SUITE` (Debian suite; default: the host's codename on
//! Debian, else bookworm: the binaries under test must run with the container's libc),
//! `DCPI_CT_MIRROR` (debootstrap's mirror; default: debootstrap's own).

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, require_fault_injection};
use profile_format::{Database, Profile};

use crate::repo_root;
use crate::systemd::{unique_busy_binary, CAPABILITIES};

/// Where cached root file systems and per-run overlays live (kept across `cargo clean`).
const CACHE: &str = "/var/tmp/dcpi-e2e-rootfs";
/// Bump when the debootstrap command below changes, so that a stale cache is not reused.
const ROOTFS_VERSION: u32 = 2;
/// Packages on top of the minimal base: systemd as init, D-Bus so that the boot is clean, and
/// procps for /bin/kill, which the unit's `ExecReload`= runs (every Debian system but the
/// minimal base has it: its priority is "important").
const INCLUDE: &str = "systemd,systemd-sysv,dbus,procps";

/// The shipped configuration, kept aside at setup so that each test restores it.
const CONFIG: &str = "/etc/dcpi/dcpid.toml";
const CONFIG_ORIG: &str = "/etc/dcpi/dcpid.toml.e2e-orig";
/// Drop-ins the tests add (and remove).
const DROPIN_DIR: &str = "/etc/systemd/system/dcpid.service.d";
/// The root-owned busy loop of the capability test runs as this transient unit.
const BUSY_UNIT: &str = "dcpi-e2e-busy";

/// A booted container: the nspawn process and the container's PID 1 (its "leader").
struct Container {
    leader: u32,
    run_dir: PathBuf,
    log: PathBuf,
}

static CONTAINER: OnceLock<Result<Container, String>> = OnceLock::new();
/// The nspawn process, reaped at exit.
static NSPAWN: Mutex<Option<Child>> = Mutex::new(None);
/// The tests share one dcpid.service: one at a time.
static SERVICE: Mutex<()> = Mutex::new(());

/// The booted container, or None (after `dcpi_testkit::skipped`: prints `SKIPPED: reason`, or
/// panics under `DCPI_REQUIRE_ALL=1`) where it cannot boot.
fn container() -> Option<&'static Container> {
    match CONTAINER.get_or_init(boot) {
        Ok(c) => Some(c),
        Err(why) => {
            dcpi_testkit::skipped(format_args!("cannot boot a systemd container here: {why}"));
            None
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// The tail of a log file, for error messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn suite() -> String {
    if let Ok(s) = std::env::var("DCPI_CT_SUITE") {
        return s;
    }
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |k: &str| {
        os.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim_matches('"').to_string())
    };
    match (field("ID="), field("VERSION_CODENAME=")) {
        (Some(id), Some(codename)) if id == "debian" && !codename.is_empty() => codename,
        _ => "bookworm".to_string(),
    }
}

/// An exclusive lock on `path` while the returned file is open (two test processes must not
/// debootstrap into the same cache at once).
fn lock_file(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; it blocks until the lock is free.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!("flock {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    Ok(f)
}

/// The cached root file system, made by debootstrap on first use.
fn rootfs() -> Result<PathBuf, String> {
    let suite = suite();
    std::fs::create_dir_all(CACHE).map_err(|e| format!("{CACHE}: {e}"))?;
    let _lock = lock_file(&Path::new(CACHE).join(".lock"))?;
    let name = format!("{suite}-v{ROOTFS_VERSION}");
    let root = Path::new(CACHE).join(&name);
    if root.join("usr/lib/systemd/systemd").exists() {
        return Ok(root);
    }
    // Earlier versions of this suite's root are stale now.
    for old in 1..ROOTFS_VERSION {
        drop(std::fs::remove_dir_all(Path::new(CACHE).join(format!("{suite}-v{old}"))));
    }
    let tmp = Path::new(CACHE).join(format!(".{name}.partial"));
    drop(std::fs::remove_dir_all(&tmp));
    let log = Path::new(CACHE).join(format!("{name}.debootstrap.log"));
    let logf = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut cmd = Command::new("debootstrap");
    cmd.args(["--variant=minbase", &format!("--include={INCLUDE}"), &suite])
        .arg(&tmp)
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    if let Ok(m) = std::env::var("DCPI_CT_MIRROR") {
        cmd.arg(m);
    }
    let t = Instant::now();
    eprintln!("systemd container: debootstrap {suite} into {} (once; cached)", root.display());
    let status = cmd.status().map_err(|e| format!("cannot run debootstrap: {e}"))?;
    if !status.success() {
        drop(std::fs::remove_dir_all(&tmp));
        return Err(format!(
            "debootstrap {suite} failed ({status}); {}:\n{}",
            log.display(),
            tail(&log, 15)
        ));
    }
    std::fs::rename(&tmp, &root).map_err(|e| format!("rename to {}: {e}", root.display()))?;
    eprintln!("systemd container: debootstrap took {:.0?}", t.elapsed());
    Ok(root)
}

/// Remove the overlays of earlier runs whose process is gone (a run killed before its atexit).
fn remove_stale_runs() {
    let Ok(dir) = std::fs::read_dir(CACHE) else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            drop(std::fs::remove_dir_all(e.path()));
        }
    }
}

/// The parent pid of `pid`, from /proc/PID/stat.
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| ppid(p) == Some(parent))
}

/// Spawn nspawn from a thread that lives as long as the process: `PR_SET_PDEATHSIG` fires when
/// the spawning *thread* exits, and nspawn answers SIGTERM by shutting the container down.
fn spawn_nspawn(mut cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: the closure runs in the child between fork and exec and only calls prctl,
        // which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        drop(tx.send(cmd.spawn()));
        loop {
            std::thread::park();
        }
    });
    rx.recv().expect("nspawn spawner thread")
}

fn boot() -> Result<Container, String> {
    if !is_root() {
        return Err("not root (systemd-nspawn and nsenter need it)".into());
    }
    for tool in ["systemd-nspawn", "debootstrap", "nsenter", "make"] {
        if !have(tool) {
            return Err(format!(
                "{tool} is not installed (Debian: apt-get install debootstrap systemd-container)"
            ));
        }
    }
    let root = rootfs()?;
    remove_stale_runs();
    let run_dir = Path::new(CACHE).join(format!("run-{}", std::process::id()));
    drop(std::fs::remove_dir_all(&run_dir));
    let upper = run_dir.join("upper");
    std::fs::create_dir_all(&upper).map_err(|e| format!("{}: {e}", upper.display()))?;
    let log = run_dir.join("nspawn.log");
    let logf = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;

    let mut cmd = Command::new("systemd-nspawn");
    cmd.arg("--quiet")
        .arg("-D")
        .arg(&root)
        // Copy-on-write: the container's changes go to `upper`, the cache stays as it was.
        .arg(format!("--overlay={}:{}:/", root.display(), upper.display()))
        .arg("--boot")
        .arg(format!("--machine=dcpi-e2e-{}", std::process::id()))
        // nspawn's default bounding set lacks these four of the unit's capabilities.
        .arg("--capability=CAP_PERFMON,CAP_BPF,CAP_SYSLOG,CAP_CHECKPOINT_RESTORE")
        // nspawn's seccomp filter denies perf_event_open and bpf (EPERM) unless allowed.
        .arg("--system-call-filter=perf_event_open bpf")
        .arg("--console=read-only")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    if !Path::new("/run/systemd/system").exists() {
        // The host's PID 1 is not systemd: no machined or system bus to register with or to
        // get a scope from; the container runs in the test's own cgroup.
        cmd.args(["--register=no", "--keep-unit"]);
    }
    let t = Instant::now();
    let mut child = spawn_nspawn(cmd).map_err(|e| format!("cannot run systemd-nspawn: {e}"))?;
    let nspawn_pid = child.id();
    let deadline = t + Duration::from_secs(60);
    let leader = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            let why = format!("systemd-nspawn exited with {st}:\n{}", tail(&log, 20));
            drop(std::fs::remove_dir_all(&run_dir));
            return Err(why);
        }
        // nspawn's direct child is the container's PID 1 (systemd, once it has exec'ed).
        if let Some(p) = child_of(nspawn_pid).filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "systemd")
        }) {
            break p;
        }
        if Instant::now() > deadline {
            drop(child.kill());
            drop(child.wait());
            let why = format!("no systemd in the container after 60 s:\n{}", tail(&log, 20));
            drop(std::fs::remove_dir_all(&run_dir));
            return Err(why);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    *NSPAWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(child);
    let ct = Container { leader, run_dir, log };
    match set_up(&ct, t) {
        Ok(()) => {
            // SAFETY: registers a plain extern "C" function; it runs once at normal exit.
            unsafe { libc::atexit(power_off_at_exit) };
            Ok(ct)
        }
        Err(e) => {
            ct.shut_down();
            Err(e)
        }
    }
}

/// Wait for the boot to finish, then install dcpi as the README says.
fn set_up(ct: &Container, t: Instant) -> Result<(), String> {
    // Boot: systemd says running (or degraded: some unit of the minimal system failed, which
    // does not concern dcpid; listed for the record).
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let out = ct.try_sh("systemctl is-system-running");
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if state == "running" || state == "degraded" {
            if state == "degraded" {
                let failed = ct.try_sh("systemctl --failed --no-legend");
                eprintln!(
                    "systemd container degraded: {}",
                    String::from_utf8_lossy(&failed.stdout)
                );
            }
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the container's systemd is '{state}' after 180 s:\n{}",
                tail(&ct.log, 30)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("systemd container: booted in {:.1?} (PID 1 = host pid {})", t.elapsed(), ct.leader);

    // Install as the README says: make install, then sysusers, tmpfiles and daemon-reload.
    let bindir_src = bin("dcpid").parent().expect("bin dir").to_path_buf();
    let out = Command::new("make")
        .arg("-C")
        .arg(repo_root())
        .arg("install")
        .arg(format!("DESTDIR={}", ct.root().display()))
        .arg(format!("BINDIR_SRC={}", bindir_src.display()))
        .arg(format!("GENDIR={}", ct.run_dir.join("gen").display()))
        .output()
        .map_err(|e| format!("cannot run make: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "make install into the container failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let script = format!(
        "systemd-sysusers && systemd-tmpfiles --create dcpid.conf && systemctl daemon-reload \
         && cp {CONFIG} {CONFIG_ORIG}"
    );
    let out = ct.try_sh(&script);
    if !out.status.success() {
        return Err(format!(
            "`{script}` failed in the container: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

extern "C" fn power_off_at_exit() {
    if let Some(Ok(ct)) = CONTAINER.get() {
        ct.shut_down();
    }
}

impl Container {
    /// Power the container off (killing nspawn if that takes over a minute) and remove the
    /// run's overlay.
    fn shut_down(&self) {
        drop(self.try_sh("systemctl poweroff"));
        let mut guard = NSPAWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(child) = guard.as_mut() {
            let deadline = Instant::now() + Duration::from_secs(60);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    drop(child.kill());
                    drop(child.wait());
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        drop(std::fs::remove_dir_all(&self.run_dir));
    }

    /// The container's root as the host sees it.
    fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.leader))
    }

    /// A path inside the container, as the host sees it.
    fn path(&self, p: &str) -> PathBuf {
        self.root().join(p.trim_start_matches('/'))
    }

    /// Run a shell script inside the container (all its namespaces), bounded to 4 minutes.
    fn try_sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "--"])
            .args(["timeout", "-k", "10", "240", "/bin/sh", "-c", script])
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .env("SYSTEMD_COLORS", "0")
            .env("SYSTEMD_PAGER", "")
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter")
    }

    /// As [`Self::try_sh`], panicking (with the output) unless the script succeeds; its stdout.
    fn sh(&self, script: &str) -> String {
        let out = self.try_sh(script);
        assert!(
            out.status.success(),
            "in the container, `{script}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `systemctl show dcpid -p ...` as a map.
    fn show(&self, unit: &str, props: &[&str]) -> BTreeMap<String, String> {
        let text = self.sh(&format!("systemctl show {unit} -p {}", props.join(",")));
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn prop(&self, prop: &str) -> String {
        self.show("dcpid", &[prop]).remove(prop).unwrap_or_default()
    }

    /// `dcpictl status --json` inside the container (as root, over the unit's socket).
    fn status_json(&self) -> serde_json::Value {
        let text = self.sh("dcpictl status --json");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("status --json: {e}: {text}"))
    }

    /// The journal's newest cursor: later lines are read with [`Self::journal_after`].
    fn cursor(&self) -> String {
        let text = self.sh("journalctl -q -n 1 -o json");
        let v: serde_json::Value = serde_json::from_str(text.trim()).expect("journal entry");
        v["__CURSOR"].as_str().expect("__CURSOR").to_string()
    }

    /// dcpid.service's journal entries after `cursor`, as JSON objects.
    fn journal_after(&self, cursor: &str) -> Vec<serde_json::Value> {
        let text = self.sh(&format!("journalctl -q -u dcpid -o json --after-cursor='{cursor}'"));
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// The MESSAGE lines of [`Self::journal_after`].
    fn messages_after(&self, cursor: &str) -> Vec<String> {
        self.journal_after(cursor)
            .iter()
            .filter_map(|e| e["MESSAGE"].as_str().map(str::to_string))
            .collect()
    }

    /// Take the service for one test; it is reset now and again when the guard drops.
    fn service(&self) -> ServiceGuard<'_> {
        let lock = SERVICE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        reset(self);
        ServiceGuard { ct: self, _lock: lock }
    }
}

/// Stop the service and the busy loop, remove the tests' drop-ins, restore the shipped config.
fn reset(ct: &Container) {
    ct.sh(&format!(
        "systemctl stop dcpid {BUSY_UNIT} 2>/dev/null; rm -rf {DROPIN_DIR}; \
         cp {CONFIG_ORIG} {CONFIG}; systemctl daemon-reload; \
         systemctl reset-failed dcpid {BUSY_UNIT} 2>/dev/null; true"
    ));
}

struct ServiceGuard<'a> {
    ct: &'a Container,
    _lock: MutexGuard<'static, ()>,
}

impl Drop for ServiceGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What systemd saw, for the failure's record.
            let out = self.ct.try_sh("systemctl status dcpid --no-pager -n 40");
            eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        }
        reset(self.ct);
    }
}

/// Add a drop-in for dcpid.service and reload systemd.
fn drop_in(ct: &Container, name: &str, text: &str) {
    let dir = ct.path(DROPIN_DIR);
    std::fs::create_dir_all(&dir).expect("mkdir drop-in dir");
    std::fs::write(dir.join(format!("{name}.conf")), text).expect("write drop-in");
    ct.sh("systemctl daemon-reload");
}

fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn position(msgs: &[String], needle: &str) -> Option<usize> {
    msgs.iter().position(|m| m.contains(needle))
}

/// `systemctl start` returns once dcpid said READY=1, which it does only when every CPU is
/// sampling: at that instant the unit is active and the daemon has samples, and its journal
/// shows sampling start before systemd's "Started". A daemon that cannot sample (the unit
/// without `CAP_PERFMON`) never becomes active: the start fails, naming the reason.
#[dcpi_testkit::test(
    perf,
    root,
    tool("systemd-nspawn"),
    tool("debootstrap"),
    tool("nsenter"),
    tool("make")
)]
fn start_is_active_only_once_sampling() {
    let Some(ct) = container() else { return };
    let _svc = ct.service();
    assert_eq!(ct.prop("ActiveState"), "inactive");
    let cursor = ct.cursor();
    ct.sh("systemctl enable --now dcpid");
    let s = ct.show("dcpid", &["ActiveState", "SubState", "Type", "MainPID"]);
    assert_eq!(s["ActiveState"], "active", "{s:?}");
    assert_eq!(s["SubState"], "running", "{s:?}");
    assert_eq!(s["Type"], "notify", "{s:?}");
    // Every CPU's event is open and enabled (its samples are counted once its drain thread
    // first wakes, within a second or so).
    let v = ct.status_json();
    assert_eq!(v["pid"].as_u64().map(|p| p.to_string()), Some(s["MainPID"].clone()), "{v}");
    assert_eq!(v["condition"], "ok", "{v}");
    let cpus = v["cpus"].as_array().expect("cpus");
    assert!(!cpus.is_empty(), "{v}");
    for c in cpus {
        assert!(c["online"] == true && c["error"].is_null(), "CPU not sampling: {c}");
    }
    let mut v = serde_json::Value::Null;
    wait_for(30, "samples from every drain thread", || {
        v = ct.status_json();
        v["cpus"].as_array().is_some_and(|c| c.iter().all(|c| c["wakeups"].as_u64() > Some(0)))
            && v["samples"].as_u64() > Some(0)
    });
    assert_eq!(ct.prop("NRestarts"), "0");
    let mut msgs = Vec::new();
    wait_for(30, "systemd's Started line in the journal", || {
        msgs = ct.messages_after(&cursor);
        position(&msgs, "Started dcpid.service").is_some()
    });
    // "sampling started" is logged before READY=1 is sent, to the same journal socket as
    // systemd's "Started" line (which READY=1 causes). ("dcpid ready" is logged just after
    // READY=1, so it may land on either side.)
    let sampling = position(&msgs, "sampling started").expect("no 'sampling started'");
    let started = position(&msgs, "Started dcpid.service").expect("started");
    assert!(sampling < started, "start order: {msgs:#?}");
    assert_eq!(ct.sh("systemctl is-enabled dcpid").trim(), "enabled");
    ct.sh("systemctl stop dcpid");

    // Without CAP_PERFMON the unit must fail to start rather than claim to be active.
    let before = ct.prop("ActiveEnterTimestampMonotonic");
    let kept: Vec<&str> = CAPABILITIES.iter().copied().filter(|c| *c != "CAP_PERFMON").collect();
    let kept = kept.join(" ");
    drop_in(
        ct,
        "no-perfmon",
        &format!(
            "[Service]\nCapabilityBoundingSet=\nCapabilityBoundingSet={kept}\n\
             AmbientCapabilities=\nAmbientCapabilities={kept}\n"
        ),
    );
    let cursor = ct.cursor();
    let out = ct.try_sh("systemctl start dcpid");
    assert!(!out.status.success(), "the unit started without CAP_PERFMON");
    let s = ct.show("dcpid", &["ActiveState", "ExecMainStatus", "ActiveEnterTimestampMonotonic"]);
    assert_ne!(s["ActiveState"], "active", "{s:?}");
    assert_eq!(s["ActiveEnterTimestampMonotonic"], before, "it was active for a while: {s:?}");
    assert_eq!(s["ExecMainStatus"], "2", "dcpid's exit status for 'sampling not permitted'");
    let mut msgs = Vec::new();
    wait_for(30, "the reason in the journal", || {
        msgs = ct.messages_after(&cursor);
        position(&msgs, "sampling not permitted").is_some()
    });
}

/// A drain thread that stops draining stops the keep-alives: systemd's watchdog kills dcpid
/// and `Restart=on-failure` starts it again, sampling. (`WatchdogSec` is shortened to 10 s by a
/// drop-in, to keep the test short; the mechanism is the shipped unit's.)
#[dcpi_testkit::test(
    perf,
    root,
    tool("systemd-nspawn"),
    tool("debootstrap"),
    tool("nsenter"),
    tool("make")
)]
fn watchdog_restarts_the_service_when_a_drain_thread_stalls() {
    let Some(ct) = container() else { return };
    require_fault_injection();
    let _svc = ct.service();
    // CPU 0's drain thread stops 15 s after it started: time for READY=1 and a few healthy
    // keep-alives first, even on a loaded machine.
    drop_in(ct, "stall", "[Service]\nEnvironment=DCPI_TEST_STALL_DRAIN=0:15000\nWatchdogSec=10s\n");
    let cursor = ct.cursor();
    ct.sh("systemctl start dcpid");
    let first = ct.show("dcpid", &["MainPID", "NRestarts"]);
    assert_eq!(first["NRestarts"], "0");
    let mut s = BTreeMap::new();
    wait_for(180, "a watchdog restart", || {
        s = ct.show("dcpid", &["MainPID", "NRestarts", "ActiveState"]);
        s["NRestarts"] != "0" && s["MainPID"] != first["MainPID"] && s["ActiveState"] == "active"
    });
    let msgs = ct.messages_after(&cursor);
    let stalled = position(&msgs, "drain thread stalled").expect("no stall in the journal");
    let timeout = position(&msgs, "Watchdog timeout").unwrap_or_else(|| panic!("{msgs:#?}"));
    assert!(stalled < timeout, "the watchdog fired before the stall: {msgs:#?}");
    assert!(
        msgs[timeout..].iter().any(|m| m.contains("Failed with result 'watchdog'")),
        "{msgs:#?}"
    );
    // The new instance samples (counted once its drain threads first wake).
    let mut v = serde_json::Value::Null;
    wait_for(30, "samples from the restarted dcpid", || {
        v = ct.status_json();
        v["samples"].as_u64() > Some(0)
    });
    assert_eq!(v["pid"].as_u64().map(|p| p.to_string()), Some(s["MainPID"].clone()), "{v}");
}

/// `systemctl reload` (`ExecReload`: SIGHUP) applies a reloadable key in the running process and
/// reports a key that needs a restart, keeping its running value.
#[dcpi_testkit::test(
    perf,
    root,
    tool("systemd-nspawn"),
    tool("debootstrap"),
    tool("nsenter"),
    tool("make")
)]
fn systemctl_reload_applies_a_reloadable_key() {
    let Some(ct) = container() else { return };
    let _svc = ct.service();
    ct.sh("systemctl start dcpid");
    let pid = ct.prop("MainPID");
    let v = ct.status_json();
    assert_eq!(v["config"]["flush_interval_s"], 15.0, "{}", v["config"]);
    assert!(v["last_reload"].is_null(), "{v}");
    let events = v["config"]["events"].clone();

    let cfg = ct.path(CONFIG);
    let text = std::fs::read_to_string(&cfg).expect("config");
    assert!(
        text.contains("\nflush_interval = \"15s\"\n") && text.contains("\nevents = \"auto\"\n")
    );
    let text = text
        .replace("\nflush_interval = \"15s\"\n", "\nflush_interval = \"2s\"\n")
        .replace("\nevents = \"auto\"\n", "\nevents = [\"cpu-clock:2000000\"]\n");
    std::fs::write(&cfg, text).expect("write config");
    ct.sh("systemctl reload dcpid");
    // ExecReload only sends the signal: the daemon applies it just after.
    let mut v = serde_json::Value::Null;
    wait_for(30, "the SIGHUP reload in status", || {
        v = ct.status_json();
        v["last_reload"]["trigger"] == "SIGHUP"
    });
    assert_eq!(v["last_reload"]["ok"], true, "{}", v["last_reload"]);
    assert_eq!(v["config"]["flush_interval_s"], 2.0, "{}", v["config"]);
    assert_eq!(v["config"]["events"], events, "events need a restart: {}", v["config"]);
    let restart = v["last_reload"]["restart_required"].as_array().expect("restart_required");
    assert!(restart.iter().any(|k| k == "events"), "{}", v["last_reload"]);
    let s = ct.show("dcpid", &["MainPID", "NRestarts", "ActiveState"]);
    assert_eq!(s["MainPID"], pid, "reload restarted the process");
    assert_eq!(s["ActiveState"], "active");
    assert_eq!(s["NRestarts"], "0");
}

/// The unit as shipped lets dcpid load the off-CPU BPF program (`off_cpu = true`, source
/// `auto`): its capabilities (`CAP_BPF`), system-call filter (`bpf`) and sandboxing allow it,
/// and the waits come in.
#[dcpi_testkit::test(
    perf,
    root,
    tool("systemd-nspawn"),
    tool("debootstrap"),
    tool("nsenter"),
    tool("make")
)]
fn the_unit_times_waits_with_the_bpf_program() {
    let Some(ct) = container() else { return };
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        dcpi_testkit::skip!("the kernel has no BTF (/sys/kernel/btf/vmlinux): no BPF source");
    }
    let _svc = ct.service();
    let cfg = ct.path(CONFIG);
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    assert!(!text.contains("off_cpu"), "the shipped config sets off_cpu already:\n{text}");
    text.push_str("\noff_cpu = true\n");
    std::fs::write(&cfg, text).expect("write config");
    ct.sh("systemctl start dcpid");
    let mut v = serde_json::Value::Null;
    wait_for(30, "off-CPU waits in status", || {
        v = ct.status_json();
        v["off_cpu"]["waits"].as_u64().unwrap_or(0) > 0
    });
    assert_eq!(v["off_cpu"]["source"], "bpf", "{}", v["off_cpu"]);
}

/// `systemctl stop` (SIGTERM) publishes everything: with the shipped `publish_interval` (15 min)
/// nothing of a short run is published before the stop, and after it the database holds
/// exactly the samples dcpid's closing log line counts.
#[dcpi_testkit::test(
    perf,
    root,
    tool("systemd-nspawn"),
    tool("debootstrap"),
    tool("nsenter"),
    tool("make")
)]
fn systemctl_stop_publishes_everything() {
    let Some(ct) = container() else { return };
    let _svc = ct.service();
    // A host name of its own: an earlier run's spool (e.g. the watchdog test's killed daemon)
    // is published at the next start and would be counted too.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let host = format!("stoptest-{nanos}");
    let cfg = ct.path(CONFIG);
    let text = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(&cfg, format!("{text}\nhost = \"{host}\"\n")).expect("write config");
    ct.sh("systemctl start dcpid");
    let invocation = ct.prop("InvocationID");
    // A few flushes' worth of samples in the spool.
    wait_for(60, "samples in the spool", || {
        ct.status_json()["store"]["spool_rows"].as_u64().unwrap_or(0) > 0
    });
    let db = ct.path("/var/lib/dcpi");
    let total = |db: &Path| -> u64 {
        let d = Database::open(db).expect("database readable");
        let mut sum = 0;
        for e in d.epochs().expect("epochs") {
            let hd = d.host_dir(&e, &host).expect("host dir");
            if !hd.path.exists() {
                continue;
            }
            for p in hd.profiles().expect("profiles") {
                sum += Profile::read(&p.path).expect("profile readable").header.total_samples;
            }
        }
        sum
    };
    let before = total(&db);
    ct.sh("systemctl stop dcpid");
    let s = ct.show("dcpid", &["ActiveState", "Result", "ExecMainStatus"]);
    assert_eq!(s["ActiveState"], "inactive", "{s:?}");
    assert_eq!(s["Result"], "success", "{s:?}");
    assert_eq!(s["ExecMainStatus"], "0", "{s:?}");
    let text = ct.sh(&format!(
        "journalctl -q -o json _SYSTEMD_INVOCATION_ID={invocation} MESSAGE='dcpid stopped'"
    ));
    let entry: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no 'dcpid stopped' line ({e}): {text}"));
    let counted: u64 = entry["F_SAMPLES"].as_str().and_then(|s| s.parse().ok()).expect("F_SAMPLES");
    let after = total(&db);
    assert!(counted > 0, "{entry}");
    assert!(before < counted, "everything was published before the stop ({before}): prove nothing");
    assert_eq!(after, counted, "published {after} samples of the {counted} dcpid counted");
}

/// The capabilities a process holds, from /proc/PID/status (hex masks).
fn cap_masks(status: &str) -> BTreeMap<String, u64> {
    status
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.starts_with("Cap"))
        .filter_map(|(k, v)| Some((k.to_string(), u64::from_str_radix(v.trim(), 16).ok()?)))
        .collect()
}

fn cap_bit(name: &str) -> u32 {
    match name {
        "CAP_DAC_READ_SEARCH" => 2,
        "CAP_SYS_PTRACE" => 19,
        "CAP_SYSLOG" => 34,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        "CAP_CHECKPOINT_RESTORE" => 40,
        other => panic!("no bit number for {other}"),
    }
}

/// The daemon as the unit runs it — user dcpi, exactly the documented capabilities, the
/// sandboxing — samples, records kernel symbol addresses and identifies by build-id the binary
/// of a root process that was running before it started (so only the /proc scan, through
/// `map_files`, can have found it).
#[dcpi_testkit::test(
    perf,
    root,
    tool("systemd-nspawn"),
    tool("debootstrap"),
    tool("nsenter"),
    tool("make")
)]
fn unit_runs_unprivileged_with_exactly_its_capabilities_and_sees_everything() {
    let Some(ct) = container() else { return };
    let _svc = ct.service();
    let dir = ct.path("/opt/dcpi-e2e");
    let Some((busy_host, build_id)) = unique_busy_binary(&dir) else {
        panic!("cc could not build the busy-loop program this test needs");
    };
    let busy = format!("/{}", Path::new(&busy_host).strip_prefix(ct.root()).expect("in").display());
    ct.sh(&format!("systemd-run --unit={BUSY_UNIT} --collect {busy}"));
    wait_for(30, "the busy loop to run", || {
        ct.try_sh(&format!("systemctl is-active {BUSY_UNIT}")).status.success()
    });
    ct.sh("systemctl start dcpid");
    let pid = ct.prop("MainPID");
    let status = std::fs::read_to_string(ct.path(&format!("/proc/{pid}/status"))).expect("status");
    let uid = ct.sh("id -u dcpi").trim().to_string();
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:")).expect("Uid:");
    assert!(uids.split_whitespace().all(|u| u == uid), "dcpid is not user dcpi ({uid}): {uids}");
    let want: u64 = CAPABILITIES.iter().map(|c| 1u64 << cap_bit(c)).sum();
    let masks = cap_masks(&status);
    for set in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(masks.get(set), Some(&want), "{set} of dcpid: {masks:x?}, want {want:#x}");
    }
    // The sandboxing is in force: no new privileges, a seccomp filter, a read-only file system
    // but for the database and the runtime directories, no network but loopback.
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
    assert_eq!(field("NoNewPrivs:"), Some("1"), "{status}");
    assert_eq!(field("Seccomp:"), Some("2"), "{status}");
    let mountinfo =
        std::fs::read_to_string(ct.path(&format!("/proc/{pid}/mountinfo"))).expect("mountinfo");
    // Field 5 is the mount point, field 6 its options; a later mount shadows an earlier one.
    let opts = |point: &str| {
        mountinfo
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(4) == Some(&point)).then(|| f.get(5).copied().unwrap_or(""))
            })
            .next_back()
            .map(|o| o.split(',').next().unwrap_or("").to_string())
    };
    for (point, want) in
        [("/", "ro"), ("/var/lib/dcpi", "rw"), ("/run/dcpi", "rw"), ("/proc/sys", "ro")]
    {
        assert_eq!(
            opts(point).as_deref(),
            Some(want),
            "{point} in dcpid's namespace:\n{mountinfo}"
        );
    }
    let netdev =
        std::fs::read_to_string(ct.path(&format!("/proc/{pid}/net/dev"))).expect("net/dev");
    let ifaces: Vec<&str> =
        netdev.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    assert_eq!(ifaces, ["lo"], "PrivateNetwork=yes: {netdev}");
    // Publish now rather than at the 5 min publish interval; the /proc scan ran at start.
    wait_for(60, "samples", || ct.status_json()["samples"].as_u64().unwrap_or(0) > 0);
    ct.sh("dcpictl flush");
    let host = ct.status_json()["host"].as_str().expect("host").to_string();
    let db = Database::open(&ct.path("/var/lib/dcpi")).expect("database");
    let epoch = db.current_epoch().expect("epochs").expect("an epoch");
    let hd = db.host_dir(&epoch, &host).expect("host dir");
    let snap = hd.read_kallsyms().expect("kallsyms snapshot");
    let nonzero = snap.symbols.iter().filter(|s| s.addr != 0).count();
    assert!(
        nonzero * 2 > snap.symbols.len() && !snap.symbols.is_empty(),
        "kernel symbol addresses hidden ({nonzero} of {} non-zero): CAP_SYSLOG not effective",
        snap.symbols.len()
    );
    let want_id = format!("b{build_id}");
    let profiles = hd.profiles().expect("profiles");
    assert!(
        profiles.iter().any(|p| p.image_id.as_ref().is_some_and(|i| i.to_text() == want_id)),
        "no profile for {busy} (build-id {build_id}) of a root process; profiles: {:#?}",
        profiles.iter().map(|p| p.path.file_name()).collect::<Vec<_>>()
    );
    // And the report names the kernel functions the samples fell in: rows are "samples events
    // % cum% symbol"; nearly all of them must be names from the snapshot. One event: the
    // container is shared, and a test that turned off-CPU on adds off-cpu and wall columns
    // (which also narrow the symbol column) to a report of every event.
    let report = ct
        .sh(&format!("dcpiprof --db /var/lib/dcpi --host {host} --image kernel --event cpu-clock"));
    let names: std::collections::HashSet<&str> =
        snap.symbols.iter().map(|s| s.name.as_str()).collect();
    let (mut named, mut all) = (0u64, 0u64);
    for row in report.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = row.split_whitespace().collect();
        let Some(n) = f.first().and_then(|n| n.parse::<u64>().ok()) else { continue };
        all += n;
        if f.len() == 5 && names.contains(f[4]) {
            named += n;
        }
    }
    assert!(all > 0 && named * 10 >= all * 9, "{named} of {all} kernel samples named:\n{report}");
}
