//! The disk cost of the who table's thread rows (FORMAT.md §12 version 2): for each `who.tbl`
//! given, its size as written, and the size of the same table without its thread rows (the
//! version 1 table a dcpid without thread names writes). Used by `bench/who_threads_size.sh`.
//!
//! `cargo run -p dcpi-profile-format --example who_threads_size -- [--names N] WHO.TBL...`
//! (`--names N`: also the N thread rows with most samples, and how many thread rows each
//! command has).

#![forbid(unsafe_code)]

use std::path::Path;

use profile_format::WhoTable;

fn main() {
    let mut failed = false;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut names = 0usize;
    if args.first().is_some_and(|a| a == "--names") && args.len() > 1 {
        names = args[1].parse().unwrap_or(0);
        args.drain(..2);
    }
    for arg in args {
        let path = Path::new(&arg);
        match WhoTable::read(path) {
            Ok(t) => {
                let with = t.encode().len();
                let mut without = t.clone();
                without.threads.clear();
                let without_len = without.encode().len();
                let distinct: std::collections::BTreeSet<&[u8]> =
                    t.threads.keys().map(|k| k.thread.as_slice()).collect();
                println!(
                    "{arg}: version {} {with} bytes; without thread rows {without_len} bytes \
                     (+{} bytes, {:+.1} %); {} rows, {} thread rows, {} thread names",
                    t.version(),
                    with.saturating_sub(without_len),
                    (with as f64 / without_len.max(1) as f64 - 1.0) * 100.0,
                    t.rows.len(),
                    t.threads.len(),
                    distinct.len(),
                );
                show(&t, names);
            }
            Err(e) => {
                eprintln!("who_threads_size: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// The `n` thread rows with most samples, and the commands with most thread rows.
fn show(t: &WhoTable, n: usize) {
    if n == 0 {
        return;
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut rows: Vec<_> = t.threads.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    for (k, s) in rows.iter().take(n) {
        println!("  {s:>8}  {}/{}  ({})", text(&k.command), text(&k.thread), k.cgroup);
    }
    let mut per: std::collections::BTreeMap<String, usize> = Default::default();
    for k in t.threads.keys() {
        *per.entry(text(&k.command)).or_default() += 1;
    }
    let mut per: Vec<_> = per.into_iter().collect();
    per.sort_by_key(|p| std::cmp::Reverse(p.1));
    for (c, k) in per.iter().take(n) {
        println!("  {k:>8} thread rows  {c}");
    }
}
