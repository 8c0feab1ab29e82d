//! The `sched:sched_switch` tracepoint, as tracefs describes it: its event id (the `config`
//! of a `PERF_TYPE_TRACEPOINT` event), and the fields its filter names (`prev_pid`,
//! `prev_state`). Switch-ins come from switch records, not from this tracepoint (see
//! `crate::offcpu`), so no field of its raw record is read.
//!
//! The ids are assigned at boot, so they can only be read from tracefs; a machine without
//! tracefs mounted has no tracepoint events for perf (`crate::offcpu` then falls back to
//! switch records). systemd mounts it at `/sys/kernel/tracing` (`sys-kernel-tracing.mount`);
//! older systems have it under debugfs.

use profile_format::safeio;
use std::path::{Path, PathBuf};

/// Where tracefs is looked for, in order.
pub const TRACEFS_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
/// The event's directory under tracefs.
pub const EVENT_DIR: &str = "events/sched/sched_switch";

/// The kernel-side filter of the switch-out event: only a thread that *blocks* leaves a
/// record with its call chain. `prev_state` holds the task-state bits the tracepoint reports
/// (S D T t X Z P I, 0x01-0x80); a preempted thread reports 0x100 (`TASK_REPORT_MAX`, the
/// `+` of the event's print format) and a yield 0: neither is a wait. The idle task (pid 0)
/// never waits.
pub const OUT_FILTER: &std::ffi::CStr = c"prev_pid != 0 && prev_state & 255";

/// What the off-CPU source needs of the tracepoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedSwitch {
    /// The event id (`events/sched/sched_switch/id`).
    pub id: u64,
    /// The tracefs directory it was found in.
    pub tracefs: PathBuf,
}

/// Why the tracepoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TracepointError {
    #[error(
        "tracefs is not mounted (no {EVENT_DIR} under /sys/kernel/tracing or \
         /sys/kernel/debug/tracing; `mount -t tracefs nodev /sys/kernel/tracing` provides it)"
    )]
    NotMounted,
    #[error("{path}: {detail}")]
    Bad { path: PathBuf, detail: String },
}

/// The tracepoint from the first tracefs of [`TRACEFS_DIRS`] that has it.
pub fn find() -> Result<SchedSwitch, TracepointError> {
    let dirs: Vec<&Path> = TRACEFS_DIRS.iter().map(Path::new).collect();
    find_in(&dirs)
}

/// [`find`] over `dirs` (tests give their own).
pub fn find_in(dirs: &[&Path]) -> Result<SchedSwitch, TracepointError> {
    for dir in dirs {
        let ev = dir.join(EVENT_DIR);
        // A real directory only: a link planted there is not followed.
        if !std::fs::symlink_metadata(&ev).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let bad = |path: PathBuf, detail: String| TracepointError::Bad { path, detail };
        let id_path = ev.join("id");
        let id = safeio::read_small_string(&id_path, 64)
            .map_err(|e| bad(id_path.clone(), e.to_string()))?;
        let id = id
            .trim()
            .parse::<u64>()
            .map_err(|e| bad(id_path.clone(), format!("not an event id ({e}): {:?}", id.trim())))?;
        let fmt_path = ev.join("format");
        let format = safeio::read_small_string(&fmt_path, 64 * 1024)
            .map_err(|e| bad(fmt_path.clone(), e.to_string()))?;
        // The filters name these; a kernel without them would reject the filter anyway, but
        // this names the file.
        for f in ["prev_pid", "prev_state"] {
            if field(&format, f).is_none() {
                return Err(bad(fmt_path, format!("no field {f}")));
            }
        }
        return Ok(SchedSwitch { id, tracefs: dir.to_path_buf() });
    }
    Err(TracepointError::NotMounted)
}

/// Offset and size of the field `name` in a tracepoint's `format` text, whose field lines
/// read `field:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;`.
pub fn field(format: &str, name: &str) -> Option<(usize, usize)> {
    for line in format.lines() {
        let mut parts = line.trim().split(';').map(str::trim);
        let Some(decl) = parts.next().and_then(|d| d.strip_prefix("field:")) else { continue };
        let decl_name = decl.rsplit(|c: char| c.is_whitespace() || c == '*').next()?;
        let decl_name = decl_name.split('[').next().unwrap_or(decl_name);
        if decl_name != name {
            continue;
        }
        let (mut offset, mut size) = (None, None);
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        return Some((offset?, size?));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format of this kernel's (6.18) tracepoint, abridged.
    const FORMAT: &str = "name: sched_switch\nID: 372\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
        \tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
        \tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
        \tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n\
        \tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;\n\
        \tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n\
        \nprint fmt: \"prev_comm=%s\"\n";

    #[test]
    fn fields_are_found_by_name_with_their_offset_and_size() {
        assert_eq!(field(FORMAT, "next_pid"), Some((56, 4)));
        assert_eq!(field(FORMAT, "prev_state"), Some((32, 8)));
        assert_eq!(field(FORMAT, "prev_comm"), Some((8, 16)));
        assert_eq!(field(FORMAT, "pid"), None);
        assert_eq!(field(FORMAT, "next"), None);
    }

    #[test]
    fn the_event_is_read_from_the_first_tracefs_that_has_it_and_bad_files_are_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let ev = b.join(EVENT_DIR);
        std::fs::create_dir_all(&ev).expect("mkdir");
        std::fs::create_dir_all(&a).expect("mkdir");
        assert!(matches!(find_in(&[&a]), Err(TracepointError::NotMounted)));
        std::fs::write(ev.join("id"), "372\n").expect("write");
        std::fs::write(ev.join("format"), FORMAT).expect("write");
        let s = find_in(&[&a, &b]).expect("found");
        assert_eq!((s.id, s.tracefs.as_path()), (372, b.as_path()));

        std::fs::write(ev.join("id"), "banana").expect("write");
        let e = find_in(&[&b]).expect_err("bad id").to_string();
        assert!(e.contains("sched_switch/id") && e.contains("banana"), "{e}");
        std::fs::write(ev.join("id"), "372").expect("write");
        // A format without a field the filter names (a kernel whose tracepoint differs).
        std::fs::write(ev.join("format"), FORMAT.replace("long prev_state;", "long state;"))
            .expect("write");
        let e = find_in(&[&b]).expect_err("no prev_state").to_string();
        assert!(e.contains("sched_switch/format") && e.contains("no field prev_state"), "{e}");
        std::fs::remove_file(ev.join("id")).expect("rm");
        assert!(find_in(&[&b]).expect_err("no id").to_string().contains("sched_switch/id"));
        // A FIFO planted as the id file is refused, not waited on.
        assert!(std::process::Command::new("mkfifo")
            .arg(ev.join("id"))
            .status()
            .expect("run mkfifo")
            .success());
        assert!(find_in(&[&b]).expect_err("fifo").to_string().contains("sched_switch/id"));
    }
}
