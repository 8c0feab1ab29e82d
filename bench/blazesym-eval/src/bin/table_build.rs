//! Ways to build dcpi's symbol table for one binary, timed side by side (BENCHMARKS.md,
//! "Symbol tables from the symbol sections only"): the whole file read, `object::ReadCache`,
//! a memory map, the symbol sections only (`SymbolTable::from_files`, what dcpiprof uses), and
//! blazesym's `Inspector::for_each`. Each dcpi way must give the same table.
//!
//! `cargo run --release --bin table_build -- BINARY [RUNS]`

use std::time::{Duration, Instant};

use blazesym::inspect::source::{Elf, Source};
use blazesym::inspect::Inspector;
use dcpi_client::prof::symbolize::SymbolTable;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let p = std::path::PathBuf::from(std::env::args().nth(1).expect("binary"));
    let runs: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(9);
    let (mut read, mut parts, mut cache, mut map, mut blaze) = (vec![], vec![], vec![], vec![], vec![]);
    let mut functions = 0;
    let mut want = None;
    for _ in 0..runs {
        let t = Instant::now();
        let data = std::fs::read(&p).expect("read");
        let a = SymbolTable::build(&data, None).expect("whole file");
        read.push(t.elapsed());
        drop(data);

        let t = Instant::now();
        let b = SymbolTable::from_files(&p, None).expect("symbol sections");
        parts.push(t.elapsed());
        assert_eq!(a, b);

        let t = Instant::now();
        let rc = object::ReadCache::new(std::fs::File::open(&p).expect("open"));
        let c = SymbolTable::build_from(&rc, None::<&[u8]>).expect("ReadCache");
        cache.push(t.elapsed());
        assert_eq!(a, c);

        let t = Instant::now();
        let f = std::fs::File::open(&p).expect("open");
        // SAFETY: a benchmark on a file nobody writes while it runs (a truncation would SIGBUS).
        let m = unsafe { memmap2::Mmap::map(&f) }.expect("map");
        let d = SymbolTable::build(&m, None).expect("mapped");
        map.push(t.elapsed());
        assert_eq!(a, d);

        let t = Instant::now();
        let mut n = 0;
        Inspector::new()
            .for_each(&Source::Elf(Elf::new(&p)), |s| {
                if s.sym_type == blazesym::SymType::Function {
                    n += 1;
                }
                std::ops::ControlFlow::Continue(())
            })
            .expect("blazesym for_each");
        blaze.push(t.elapsed());
        functions = n;
        want = Some(a.symbols.len());
    }
    println!(
        "{}: dcpi table {} functions; blazesym Inspector {functions} functions (before alias reduction)",
        p.display(),
        want.unwrap_or(0)
    );
    println!(
        "median of {runs}: whole-file read {:?} | ReadCache {:?} | mmap {:?} | symbol sections (from_files) {:?} | blazesym Inspector::for_each {:?}",
        median(read),
        median(cache),
        median(map),
        median(parts),
        median(blaze)
    );
}
