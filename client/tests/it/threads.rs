//! Thread names as a second level of `--by command` (issue 38 item 1; who table version 2,
//! FORMAT.md §12): `rustc` ran 100 samples in its image and 20 in the kernel, of which its
//! threads `opt cgu.00` had 70 and `opt cgu.01` 30 (its threads named `rustc`: 20); `make`
//! 40, with no thread named apart.

use dcpi_testkit::db::{who_key, TestDb};
use profile_format::{ThreadKey, WhoTable};

use crate::util::*;

fn thread(command: &str, name: &str, n: u64) -> (ThreadKey, u64) {
    let key = ThreadKey {
        cgroup: "/".into(),
        command: command.into(),
        pid: 0,
        thread: name.into(),
        event: "cpu-clock".into(),
    };
    (key, n)
}

fn db() -> TestDb {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let mut who = WhoTable::new(&hd.host, hd.epoch.as_str());
    who.add(who_key("rustc", "/usr/lib/librustc_driver.so", "cpu-clock"), 100);
    who.add(who_key("rustc", "[kernel.kallsyms]", "cpu-clock"), 20);
    who.add(who_key("make", "/usr/bin/make", "cpu-clock"), 40);
    for (k, n) in [thread("rustc", "opt cgu.00", 70), thread("rustc", "opt cgu.01", 30)] {
        who.add_thread(k, n);
    }
    who.write(&hd.who_path()).expect("who table");
    t
}

#[test]
fn by_command_nests_thread_names_under_their_command() {
    let t = db();
    let v = json_ok(&t.root(), &["--host", "alpha", "--by", "command"]);
    let rustc = row(&v, "command", "rustc");
    assert_eq!(rustc["samples"], 120);
    let threads: Vec<(&str, u64)> = rustc["threads"]
        .as_array()
        .expect("threads under rustc")
        .iter()
        .map(|t| (t["thread"].as_str().unwrap_or(""), t["samples"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(threads, [("opt cgu.00", 70), ("opt cgu.01", 30), ("rustc", 20)]);
    assert_eq!(threads.iter().map(|t| t.1).sum::<u64>(), 120, "they add up to the command");
    assert!(row(&v, "command", "make").get("threads").is_none(), "no thread named apart");
    assert_eq!(v["total_samples"], 160);

    // Text: folded by default; --threads shows the second level under its command.
    let text = |extra: &[&str]| {
        let o = prof(&t.root(), &[&["--host", "alpha", "--by", "command"][..], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    assert!(!text(&[]).contains("rustc/opt cgu.00"));
    let unfolded = text(&["--threads"]);
    let lines: Vec<&str> = unfolded.lines().filter(|l| l.contains("rustc")).collect();
    assert_eq!(lines.len(), 4, "{unfolded}");
    fn cells(l: &str) -> Vec<&str> {
        l.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect()
    }
    assert_eq!(cells(lines[0]), ["120", "75.00", "rustc"], "{unfolded}");
    assert_eq!(cells(lines[1]), ["70", "43.75", "rustc/opt cgu.00"], "{unfolded}");
    assert_eq!(cells(lines[2]), ["30", "18.75", "rustc/opt cgu.01"], "{unfolded}");
    assert_eq!(cells(lines[3]), ["20", "12.50", "rustc/rustc"], "{unfolded}");
}

#[test]
fn thread_selects_one_thread_name() {
    let t = db();
    let v = json_ok(&t.root(), &["--host", "alpha", "--thread", "opt cgu.01"]);
    assert_eq!(v["by"], "command", "--by command is the default with --thread");
    assert_eq!(rows(&v).len(), 1, "{v:#}");
    assert_eq!((row(&v, "command", "rustc")["samples"].as_u64()), Some(30));
    assert_eq!(v["filters"]["thread"], "opt cgu.01");
    // A process's own name: its threads named as it is (the leader's), as perf --comms.
    let v = json_ok(&t.root(), &["--host", "alpha", "--thread", "rustc"]);
    assert_eq!(row(&v, "command", "rustc")["samples"].as_u64(), Some(20));
    let v = json_ok(&t.root(), &["--host", "alpha", "--thread", "make", "--by", "cgroup"]);
    assert_eq!(row(&v, "cgroup", "/")["samples"].as_u64(), Some(40));
    let v = json_ok(&t.root(), &["--host", "alpha", "--thread", "nothing"]);
    assert!(rows(&v).is_empty(), "{v:#}");
}

#[test]
fn thread_flags_refuse_reports_thread_rows_cannot_answer() {
    let t = db();
    for (args, needle) in [
        (&["--thread", "x", "--by", "symbol"][..], "--thread"),
        (&["--thread", "x", "--image", "/usr/bin/make"][..], "not per image"),
        (&["--threads", "--by", "cgroup"][..], "--threads"),
        (&["--thread", "x", "--format", "folded"][..], "folded"),
    ] {
        let o = prof(&t.root(), &[&["--host", "alpha"][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}
