//! `dcpiprof --pid N` / `--cgroup PATH` with `--by symbol`, `--by image` or `--image`: read
//! from the per-process and per-cgroup profiles (FORMAT.md §5.6), and a clear error when the
//! database was recorded without them.

use dcpi_testkit::db::Image;
use profile_format::{HostDir, ImageId, ImageKind, ProfileWho};

use crate::util::*;

fn write_who(hd: &HostDir, id: &ImageId, who: ProfileWho, counts: &[(u64, u64)]) {
    let image = Image::elf(id.clone(), "/opt/none/app");
    image.profile(&cpu_clock()).who(who).counts(counts).period(1_000_000).write(hd);
}

/// /opt/none/app run by pid 10 (cgroup /a/x.service: 5 samples at 0x1000) and pid 11
/// (cgroup /b: 7 at 0x3000, 1 at 0x1000); the flat profile has them all.
fn db(with_who: bool) -> TestDb {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "h1");
    let id = ImageId::from_build_id(&[0x5a; 20]).expect("id");
    let flat = [(0x1000, 6), (0x3000, 7)];
    Image::new(ImageKind::Elf, id.clone(), b"/opt/none/app")
        .profile(&cpu_clock())
        .counts(&flat)
        .period(1_000_000)
        .write(&hd);
    if with_who {
        let pid = |pid: u32| ProfileWho::Pid { pid, command: b"app".to_vec() };
        write_who(&hd, &id, pid(10), &[(0x1000, 5)]);
        write_who(&hd, &id, pid(11), &[(0x1000, 1), (0x3000, 7)]);
        write_who(&hd, &id, ProfileWho::Cgroup { path: "/a/x.service".into() }, &[(0x1000, 5)]);
        write_who(&hd, &id, ProfileWho::Cgroup { path: "/b".into() }, &[(0x1000, 1), (0x3000, 7)]);
    }
    t
}

fn total(v: &serde_json::Value) -> u64 {
    v["total_samples"].as_u64().expect("total_samples")
}

#[test]
fn pid_and_cgroup_reports_count_only_their_samples() {
    let t = db(true);
    let root = t.root();
    let h = ["--host", "h1"];
    let run = |extra: &[&str]| json_ok(&root, &[&h[..], extra].concat());
    // Every sample, without a filter.
    assert_eq!(total(&run(&["--by", "symbol"])), 13);
    let v = run(&["--pid", "10", "--by", "symbol"]);
    assert_eq!(total(&v), 5, "{v}");
    assert_eq!(rows(&v).len(), 1, "{v}");
    let v = run(&["--pid", "11", "--by", "symbol", "--image", "app"]);
    assert_eq!(total(&v), 8, "{v}");
    let v = run(&["--pid", "11", "--by", "image"]);
    assert_eq!(v["report"], "images", "{v}");
    assert_eq!(row(&v, "image", "/opt/none/app")["samples"], 7 + 1, "{v}");
    // A cgroup by path prefix, by unit, and the root taking both.
    assert_eq!(total(&run(&["--cgroup", "/a", "--by", "symbol"])), 5);
    assert_eq!(total(&run(&["--cgroup", "x.service", "--image", "app"])), 5);
    assert_eq!(total(&run(&["--cgroup", "/", "--by", "symbol"])), 13);
    // Exports too: the folded lines of pid 10 add up to its samples.
    let o = prof(&root, &["--host", "h1", "--pid", "10", "--format", "folded"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n: u64 = stdout(&o)
        .lines()
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, c)| c.parse::<u64>().ok()))
        .sum();
    assert_eq!(n, 5, "{}", stdout(&o));
    // Nothing of a process that did not run: an error, not an empty report.
    let o = prof(&root, &["--host", "h1", "--pid", "12", "--by", "symbol"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no samples of process 12"), "{}", stderr(&o));
}

#[test]
fn without_by_pid_or_by_cgroup_the_report_says_so() {
    let t = db(false);
    let root = t.root();
    for (args, key) in [
        (&["--pid", "10", "--by", "symbol"][..], "by_pid"),
        (&["--pid", "10", "--image", "app"][..], "by_pid"),
        (&["--cgroup", "/a", "--symbols"][..], "by_cgroup"),
    ] {
        let o = prof(&root, &[&["--host", "h1"][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("recorded without {key}")),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    // --by image is answered by the who tables instead (this database has none).
    let o = prof(&root, &["--host", "h1", "--cgroup", "/a", "--by", "image"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no who table"), "{}", stderr(&o));
}

#[test]
fn a_corrupt_qualified_profile_is_named() {
    let t = db(true);
    let root = t.root();
    let e = t.db.epochs().expect("epochs").pop().expect("epoch");
    let hd = t.host(&e, "h1");
    let id = ImageId::from_build_id(&[0x5a; 20]).expect("id");
    let path = hd.who_profile_path(&id, "cpu-clock", &ProfileWho::Pid { pid: 10, command: vec![] });
    let mut b = std::fs::read(&path).expect("read");
    let n = b.len();
    b[n - 1] ^= 0xff;
    std::fs::write(&path, b).expect("write");
    let o = prof(&root, &["--host", "h1", "--pid", "10", "--by", "symbol"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("pid-10.prof"), "{}", stderr(&o));
}
