//! The requirement checks and the one switch. Compiled twice from this one file: into the
//! `#[dcpi_testkit::test]` macro, which checks while the test crate compiles, and into the kit,
//! whose [`guard`](crate::guard) checks again when the test runs. Keep it free of dependencies
//! other than `std` and `libc`, since the macro crate includes it with `#[path]`.

use std::ffi::OsStr;
use std::path::Path;

/// The one switch: `DCPI_REQUIRE_ALL=1` turns every skip into a failure (`.ci/run` sets it).
pub const SWITCH: &str = "DCPI_REQUIRE_ALL";

/// Names of requirements to treat as missing whatever this machine can do (comma- or
/// space-separated, e.g. `perf,root`, or `all`), to see what a machine without them shows.
pub const PRETEND: &str = "DCPI_TESTKIT_PRETEND_MISSING";

/// Whether skips are failures. The only place that reads [`SWITCH`].
pub fn strict() -> bool {
    std::env::var_os(SWITCH).is_some_and(|v| v == "1")
}

/// Something a test needs from the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Req<'a> {
    /// `perf_event_open` of cpu-clock, system-wide on the first online CPU (what `dcpid --probe`
    /// opens first, and what every sampling test needs).
    Perf,
    /// Effective uid 0.
    Root,
    /// An executable of this name on `PATH`.
    Tool(&'a str),
    /// A hardware PMU: `cycles` opens on the first online CPU. A kind of machine rather than a
    /// capability, so the switch does not demand it (see [`Req::is_variant`]).
    Pmu,
    /// No hardware PMU (`cycles` does not open): the fallback to cpu-clock. A kind of machine.
    NoPmu,
}

impl Req<'_> {
    /// The name used in [`PRETEND`] and in the macro's arguments.
    pub fn name(&self) -> &str {
        match self {
            Self::Perf => "perf",
            Self::Root => "root",
            Self::Tool(t) => t,
            Self::Pmu => "pmu",
            Self::NoPmu => "no_pmu",
        }
    }

    /// Whether this describes a kind of machine (with or without a PMU) rather than something
    /// a test machine should provide: no machine has both, so the switch cannot demand these,
    /// and a test that needs the other kind stays ignored (with its reason) under it.
    pub fn is_variant(&self) -> bool {
        matches!(self, Self::Pmu | Self::NoPmu)
    }

    /// What the test needs, for messages ("needs `perf_event_open`: ...").
    pub fn what(&self) -> String {
        match self {
            Self::Perf => "perf_event_open".to_string(),
            Self::Root => "root".to_string(),
            Self::Tool(t) => format!("`{t}` on PATH"),
            Self::Pmu => "a hardware PMU".to_string(),
            Self::NoPmu => "a machine without a hardware PMU".to_string(),
        }
    }

    /// `Err(why)` when this machine (or [`PRETEND`]) lacks it.
    pub fn check(&self) -> Result<(), String> {
        if let Some(list) = std::env::var_os(PRETEND) {
            let list = list.to_string_lossy().into_owned();
            if list
                .split(|c: char| c == ',' || c.is_whitespace())
                .any(|n| n == "all" || n == self.name())
            {
                return Err(format!("{PRETEND}={list} pretends it is missing"));
            }
        }
        match self {
            Self::Perf => perf(),
            Self::Root => root(),
            Self::Tool(t) => tool(t),
            Self::Pmu => open_on_first_cpu(0, 0).map_err(|e| format!("cycles does not open: {e}")),
            Self::NoPmu => match open_on_first_cpu(0, 0) {
                Ok(()) => Err("cycles opens here".into()),
                Err(_) => Ok(()),
            },
        }
    }
}

fn root() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Ok(())
    } else {
        Err(format!("runs as euid {euid}"))
    }
}

fn tool(name: &str) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| is_executable(&dir.join(OsStr::new(name))));
    if found {
        Ok(())
    } else {
        Err(format!("no `{name}` on PATH (install it)"))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64 bytes): the kernel accepts
/// this size and treats the later fields as zero.
#[repr(C)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// The same check as `dcpid --probe` (daemon/src/perf/sampler.rs `probe`): open a sampling
/// cpu-clock event (`PERF_TYPE_SOFTWARE` 1, `PERF_COUNT_SW_CPU_CLOCK` 0) for all processes on the
/// first online CPU. That needs `perf_event_paranoid` <= 0 or `CAP_PERFMON` (root has it).
fn perf() -> Result<(), String> {
    open_on_first_cpu(1, 0).map_err(|e| {
        let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        format!(
            "cpu-clock for all processes: {e} (perf_event_paranoid={paranoid}; \
             needs root, CAP_PERFMON or perf_event_paranoid <= 0)"
        )
    })
}

/// Opens (and closes) a sampling event of `type_`/`config` for all processes on the first
/// online CPU (`Pmu` uses `PERF_TYPE_HARDWARE` 0, `PERF_COUNT_HW_CPU_CYCLES` 0, as `dcpid --probe`).
fn open_on_first_cpu(type_: u32, config: u64) -> Result<(), String> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpu: i32 = online.trim().split([',', '-']).next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let attr = PerfEventAttr {
        type_,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        sample_period: 1_000_000,
        sample_type: 0,
        read_format: 0,
        flags: 1, // disabled
        wakeup_events: 0,
        bp_type: 0,
        config1: 0,
    };
    // SAFETY: attr is a valid, initialised perf_event_attr of the size it declares, alive for
    // the call; pid -1 with a CPU and group fd -1 are valid arguments; the fd, if any, is ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1_i32, // pid_t: any process
            cpu,
            -1_i32,                   // group fd: none
            libc::c_ulong::from(8u8), // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return Err(format!("on CPU {cpu}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a descriptor we just opened and own; nothing else uses it.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}
