//! Files the report tools write are never written through a symbolic link planted in the
//! target directory (issue 35, defect 1). Every file is created `O_CREAT|O_EXCL|O_NOFOLLOW`
//! under an unpredictable name and renamed into place (`profile_format::write_atomic`).
//!
//! The tests plant links at the temporary names the tools used to pick (`.NAME.tmp<PID>` for
//! `--output`, `<db>/binaries/XX/.tmp-<rest>-<PID>` for `--cache-binary`) for the next few
//! hundred PIDs, each pointing at a victim file, and check that the victim is unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use profile_format::{ImageId, ImageKind, JitSymbol};

use crate::util;
use crate::util::{compile, event, prof, stderr, TestDb};
use dcpi_testkit::db::Image;

const VICTIM: &[u8] = b"precious: must never be overwritten\n";

/// How many PIDs after the last one the kernel handed out get a planted link: the tool's PID
/// is among them unless more than this many processes start between planting and spawning.
const PIDS: u32 = 500;

/// The next `PIDS` PIDs the kernel will hand out (after wrapping at `pid_max`, to 300 and up).
fn next_pids() -> Vec<u32> {
    let read = |p: &str| -> u32 {
        std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    };
    let last = read("/proc/sys/kernel/ns_last_pid");
    let max = read("/proc/sys/kernel/pid_max").max(32_768);
    let mut pid = if last == 0 { std::process::id() } else { last };
    (0..PIDS)
        .map(|_| {
            pid += 1;
            if pid >= max {
                pid = 300;
            }
            pid
        })
        .collect()
}

/// A victim file and `names(pid)` planted as links to it for the next PIDs.
fn plant(dir: &Path, names: impl Fn(u32) -> PathBuf) -> PathBuf {
    let victim = dir.join("victim");
    std::fs::write(&victim, VICTIM).expect("write victim");
    for pid in next_pids() {
        let link = names(pid);
        drop(std::fs::remove_file(&link));
        std::os::unix::fs::symlink(&victim, &link).expect("plant link");
    }
    victim
}

fn assert_victim_intact(victim: &Path, what: &str) {
    let now = std::fs::read(victim).expect("read victim");
    let start: String = String::from_utf8_lossy(&now).chars().take(80).collect();
    assert!(
        now == VICTIM,
        "{what} wrote through a planted symbolic link: the victim now holds {} bytes: {start:?}",
        now.len()
    );
}

/// A database with one JIT region (symbols stored in the profile: no binary needed).
fn small_db() -> TestDb {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let jit = vec![JitSymbol { start: 0x1000, size: 0x100, name: "jitted_fn".into() }];
    let id = ImageId::special("[anon]", b"42");
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Anon, id.clone(), b"[anon:42:node]")
        .profile(&ev)
        .counts(&[(0x1010, 7)])
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);
    t
}

/// `dcpiprof --format FORMAT -o DIR/report.EXT` with links planted at the old temporary names.
fn output_through_planted_links(format: &str, ext: &str) {
    let t = small_db();
    let out_dir = t.tmp().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let name = format!("report.{ext}");
    let victim = plant(t.tmp(), |pid| out_dir.join(format!(".{name}.tmp{pid}")));
    let report = out_dir.join(&name);
    let o = prof(
        &t.root(),
        &["--host", "all", "--format", format, "-o", report.to_str().expect("utf8")],
    );
    assert!(o.status.success(), "dcpiprof --format {format}: {}", stderr(&o));
    assert_victim_intact(&victim, &format!("dcpiprof --format {format} -o"));
    let md = std::fs::symlink_metadata(&report).expect("report written");
    assert!(md.file_type().is_file(), "{} is not a regular file: {md:?}", report.display());
    let text = std::fs::read_to_string(&report).expect("read report");
    assert!(text.contains("anon:42:node"), "{format} report: {text}");
    // Only the report and the planted links: no temporary file is left behind.
    let stray: Vec<_> = std::fs::read_dir(&out_dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != &name && !n.starts_with(&format!(".{name}.tmp")))
        .collect();
    assert!(stray.is_empty(), "left behind: {stray:?}");
}

#[test]
fn html_output_never_writes_through_planted_links() {
    output_through_planted_links("html", "html");
}

#[test]
fn csv_output_never_writes_through_planted_links() {
    output_through_planted_links("csv", "csv");
}

#[test]
fn cache_binary_never_writes_through_planted_links() {
    let t = TestDb::new();
    let bin = compile(t.tmp(), "prog", "int main(void) { return 0; }\n", "c", &[]);
    let data = std::fs::read(&bin).expect("read binary");
    let hexid = {
        use object::Object;
        let obj = object::File::parse(&*data).expect("parse");
        hex::encode(obj.build_id().expect("build-id").expect("has build-id"))
    };
    let dir = t.root().join("binaries").join(&hexid[..2]);
    std::fs::create_dir_all(&dir).expect("mkdir cache dir");
    let rest = hexid[2..].to_owned();
    let victim = plant(t.tmp(), |pid| dir.join(format!(".tmp-{rest}-{pid}")));
    let o = prof(&t.root(), &["--cache-binary", bin.to_str().expect("utf8")]);
    assert!(o.status.success(), "--cache-binary: {}", stderr(&o));
    assert_victim_intact(&victim, "dcpiprof --cache-binary");
    let dest = dir.join(&rest);
    let md = std::fs::symlink_metadata(&dest).expect("cached");
    assert!(md.file_type().is_file(), "{md:?}");
    assert_eq!(std::fs::read(&dest).expect("read cached"), data);
}

/// `-o` naming an existing symbolic link: the link is replaced by the report (rename does not
/// follow it); its target is never written.
#[test]
fn output_replaces_a_link_at_the_target_name_and_never_writes_its_target() {
    let t = small_db();
    let victim = t.tmp().join("victim");
    std::fs::write(&victim, VICTIM).expect("write victim");
    for (name, format) in [("report.html", "html"), ("report.json", "json")] {
        let report = t.tmp().join(name);
        std::os::unix::fs::symlink(&victim, &report).expect("link");
        let o = prof(
            &t.root(),
            &["--host", "all", "--format", format, "-o", report.to_str().expect("utf8")],
        );
        assert!(o.status.success(), "{format}: {}", stderr(&o));
        assert_victim_intact(&victim, &format!("-o LINK ({format})"));
        let md = std::fs::symlink_metadata(&report).expect("report");
        assert!(md.file_type().is_file(), "the link was not replaced: {md:?}");
    }
    // A dangling link too (a link to a file that does not exist yet is not created).
    let absent = t.tmp().join("absent");
    let report = t.tmp().join("dangling.csv");
    std::os::unix::fs::symlink(&absent, &report).expect("link");
    let o = prof(&t.root(), &["--host", "all", "--format", "csv", "-o", report.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!absent.exists(), "the dangling link's target was created");
    assert!(std::fs::symlink_metadata(&report).expect("report").file_type().is_file());
}

/// `-o` naming a FIFO: replaced by the report, without opening it (which would block until a
/// reader came).
#[test]
fn output_replaces_a_fifo_without_opening_it() {
    let t = small_db();
    let fifo = t.tmp().join("report.csv");
    let o = Command::new("mkfifo").arg(&fifo).output().expect("run mkfifo");
    assert!(o.status.success(), "mkfifo: {}", String::from_utf8_lossy(&o.stderr));
    let mut child = util::prof_command(
        &t.root(),
        &["--host", "all", "--format", "csv", "-o", fifo.to_str().expect("utf8")],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            drop(child.kill());
            panic!("dcpiprof -o FIFO hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let md = std::fs::symlink_metadata(&fifo).expect("report");
    assert!(md.file_type().is_file(), "{md:?}");
}
