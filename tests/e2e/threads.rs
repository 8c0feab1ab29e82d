//! End-to-end: thread names as a second level of the command (issue 38 item 1; who table
//! version 2, FORMAT.md §12).

use dcpi_e2e::{json, Sandbox};

/// Two threads named `hot70` and `hot30` by `pthread_setname_np`, spinning 70 % and 30 % of
/// the program's CPU time.
const NAMED_THREADS_C: &str = include_str!("named_threads.c");

/// `dcpiprof --by command --format json` shows the program's command with its two thread
/// names under it, in shares within a few points of 70/30, and the command's samples are
/// exactly the sum of the rows under it; `--thread NAME` narrows to one thread name and
/// `--threads` shows the second level in text.
#[dcpi_testkit::test(perf)]
fn named_threads_are_a_second_level_of_their_command() {
    let sb = Sandbox::new();
    let bin = dcpi_e2e::compile_c(sb.dir.path(), "thrnames", NAMED_THREADS_C, &["-O1", "-pthread"]);
    let host = "e2e-threads";
    // Default settings.
    let mut d = sb.start_daemon(host, &[]);
    let st = std::process::Command::new(&bin).arg("3.0").status().expect("run thrnames");
    assert!(st.success(), "thrnames: {st}");
    // A stop publishes everything it held.
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid: {status}: {err}");

    let v = json(sb.prof(&["--host", host, "--by", "command", "--format", "json"]));
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let cmd = rows
        .iter()
        .find(|r| r["command"] == "thrnames")
        .unwrap_or_else(|| panic!("no thrnames row: {v:#}"));
    let threads = cmd["threads"].as_array().unwrap_or_else(|| panic!("no threads: {cmd:#}"));
    let of = |name: &str| -> u64 {
        threads
            .iter()
            .find(|t| t["thread"] == name)
            .and_then(|t| t["samples"].as_u64())
            .unwrap_or(0)
    };
    let (hot70, hot30) = (of("hot70"), of("hot30"));
    let sum: u64 = threads.iter().filter_map(|t| t["samples"].as_u64()).sum();
    eprintln!("thrnames {cmd:#}");
    assert_eq!(cmd["samples"].as_u64(), Some(sum), "the command is the sum of its threads");
    assert!(hot70 + hot30 >= 200, "too few samples: {cmd:#}");
    let share = hot70 as f64 / (hot70 + hot30) as f64;
    assert!((0.65..=0.75).contains(&share), "hot70's share {share:.3}, not about 0.70: {cmd:#}");

    // --thread: that thread name only.
    let t = json(sb.prof(&["--host", host, "--thread", "hot30", "--format", "json"]));
    let only: Vec<_> = t["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(only.len(), 1, "{t:#}");
    assert_eq!(
        (only[0]["command"].as_str(), only[0]["samples"].as_u64()),
        (Some("thrnames"), Some(hot30))
    );

    // Text: folded by default, unfolded with --threads.
    let text = |extra: &[&str]| {
        let out = sb.prof(&[&["--host", host, "--by", "command"][..], extra].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(!text(&[]).contains("thrnames/hot70"), "folded by default");
    let unfolded = text(&["--threads"]);
    assert!(
        unfolded.contains("thrnames/hot70") && unfolded.contains("thrnames/hot30"),
        "{unfolded}"
    );
}
