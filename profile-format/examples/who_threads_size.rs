//! The disk cost of the who table's thread rows (FORMAT.md §12 version 2): for each `who.tbl`
//! given, its size as written, and the size of the same table without its thread rows (the
//! version 1 table a dcpid without thread names writes). Used by `bench/who_threads_size.sh`.
//!
//! `cargo run -p dcpi-profile-format --example who_threads_size -- DB/epochs/*/HOST/who.tbl`

#![forbid(unsafe_code)]

use std::path::Path;

use profile_format::WhoTable;

fn main() {
    let mut failed = false;
    for arg in std::env::args().skip(1) {
        let path = Path::new(&arg);
        match WhoTable::read(path) {
            Ok(t) => {
                let with = t.encode().len();
                let mut without = t.clone();
                without.threads.clear();
                let without_len = without.encode().len();
                let names: std::collections::BTreeSet<&[u8]> =
                    t.threads.keys().map(|k| k.thread.as_slice()).collect();
                println!(
                    "{arg}: version {} {with} bytes; without thread rows {without_len} bytes \
                     (+{} bytes, {:+.1} %); {} rows, {} thread rows, {} thread names",
                    t.version(),
                    with.saturating_sub(without_len),
                    (with as f64 / without_len.max(1) as f64 - 1.0) * 100.0,
                    t.rows.len(),
                    t.threads.len(),
                    names.len(),
                );
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
