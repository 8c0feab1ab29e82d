//! The committed fuzz seed corpus (`fuzz/corpus/`) is generated from `common::profile_seeds`;
//! this test checks that it is present and current. Regenerate with
//! `DCPI_WRITE_SEEDS=1 cargo test -p dcpi-profile-format --test it seeds::`.

use crate::common;

use std::path::{Path, PathBuf};

use profile_format::{
    kallsyms_from_columns, kallsyms_to_columns, pack_kallsyms, unpack_kallsyms, KallsymsSnapshot,
    Profile,
};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

fn check(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = corpus(target);
    let write = std::env::var_os("DCPI_WRITE_SEEDS").is_some_and(|v| v == "1");
    for (name, bytes) in seeds {
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{}: {e}; regenerate with DCPI_WRITE_SEEDS=1", path.display())
        });
        assert_eq!(
            &on_disk,
            bytes,
            "{} is stale; regenerate with DCPI_WRITE_SEEDS=1",
            path.display()
        );
    }
}

#[test]
fn profile_seed_corpus_is_current() {
    let seeds = common::profile_seeds();
    for (name, bytes) in &seeds {
        let result = Profile::decode(bytes, Path::new(name));
        assert_eq!(result.is_ok(), name.ends_with(".prof"), "{name}: {result:?}");
    }
    check("read_profile", &seeds);
}

#[test]
fn kallsyms_seed_corpus_is_current() {
    let snap = common::small_snapshot();
    let empty = KallsymsSnapshot { kernel_release: "6.18.0".into(), ..Default::default() };
    let small = snap.encode();
    let p = Path::new("small.snap.zst");
    let seeds = vec![
        ("small.snap", small.clone()),
        ("empty.snap", empty.encode()),
        // The stored form and its decompressed columns (the target reads both).
        ("small.snap.zst", pack_kallsyms(&small, p).unwrap()),
        ("small.cols", kallsyms_to_columns(&small, p).unwrap()),
    ];
    for (name, bytes) in &seeds {
        let canonical = match *name {
            "small.snap.zst" => unpack_kallsyms(bytes, p).unwrap(),
            "small.cols" => kallsyms_from_columns(bytes, p).unwrap(),
            _ => bytes.clone(),
        };
        assert!(KallsymsSnapshot::decode(&canonical, Path::new(name)).is_ok(), "{name}");
    }
    check("read_kallsyms", &seeds);
}
