//! Fresh by default (issue 36 item 6): the current epoch, before anything of it is published
//! or appended, is an empty report that says when data will appear, exit status 0.

use crate::util::{cpu_clock, json_ok, prof, stderr, stdout, TestDb};
use dcpi_testkit::db::{build_id, Image};

#[test]
fn an_empty_current_epoch_is_an_empty_report_that_says_when_data_appear() {
    let t = TestDb::new();
    let old = t.epoch(0);
    let hd = t.host(&old, "h1");
    let img = Image::elf(build_id(7, 20), "/usr/bin/app");
    img.profile(&cpu_clock()).count(0x40, 9).write(&hd);
    // `dcpictl epoch new`: the new epoch has this host's directory and nothing in it yet.
    let new = t.epoch(60);
    t.host(&new, "h1");
    let o = prof(&t.root(), &["--host", "h1"]);
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("nothing sampled in the current epoch yet"), "{out}");
    assert!(out.contains("within one slice"), "says when data appear: {out}");
    assert!(out.contains("# total samples: 0"), "{out}");
    let v = json_ok(&t.root(), &["--host", "h1"]);
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(0), "{v:#}");
    assert!(v["note"].as_str().is_some_and(|n| n.contains("within one slice")), "{v:#}");
    // The previous epoch, asked for, is reported as before.
    let o = prof(&t.root(), &["--host", "h1", "--epoch", old.as_str()]);
    // (Text tables name images by basename.)
    let listed = stdout(&o).lines().any(|l| l.split_whitespace().last() == Some("app"));
    assert!(o.status.success() && listed, "{}{}", stdout(&o), stderr(&o));
}
