//! The stored form of shared kernel symbol snapshots (FORMAT.md §8.1): `.snap.zst` (columns,
//! zstd) written and read, `.snap.z` (zlib) of older databases still read, hostile files.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use flate2::write::ZlibEncoder;
use profile_format::{
    kallsyms_from_columns, kallsyms_id, kallsyms_to_columns, pack_kallsyms, unpack_kallsyms,
    Database, Error, KallsymsSnapshot, KALLSYMS_ZST_MAGIC,
};

/// A kallsyms text shaped like a 6.x kernel's: every function preceded by its `__pfx_`
/// padding symbol, names from shared subsystem prefixes, some data symbols, and module
/// symbols (with their own `__pfx_`s) at module addresses. Deterministic.
fn realistic_kallsyms(functions: usize) -> (String, String) {
    const SUBSYS: [&str; 12] = [
        "tcp_",
        "ext4_",
        "xfs_",
        "sched_",
        "mm_",
        "kvm_",
        "drm_",
        "netif_",
        "bpf_",
        "acpi_",
        "__x64_sys_",
        "pci_",
    ];
    const VERBS: [&str; 10] =
        ["init", "alloc", "free", "get", "put", "update", "read", "write", "lock", "handle"];
    const NOUNS: [&str; 10] =
        ["page", "inode", "buffer", "queue", "entry", "state", "node", "work", "skb", "ctx"];
    let seed = std::cell::Cell::new(0x2545_f491_4f6c_dd1du64);
    let rnd = |n: u64| {
        let mut x = seed.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        seed.set(x);
        x % n
    };
    let mut text = String::from("ffffffff81000000 T _text\n");
    let mut addr = 0xffff_ffff_8100_0000u64;
    let emit = |text: &mut String, addr: &mut u64, name: &str, module: Option<&str>| {
        let kind = if rnd(3) == 0 { 'T' } else { 't' };
        let m = module.map(|m| format!("\t[{m}]")).unwrap_or_default();
        writeln!(text, "{:016x} t __pfx_{name}{m}", *addr - 16).unwrap();
        writeln!(text, "{:016x} {kind} {name}{m}", *addr).unwrap();
        *addr += 16 * (2 + rnd(40));
        if rnd(10) == 0 {
            writeln!(text, "{:016x} d {name}_data{m}", *addr).unwrap();
        }
    };
    for i in 0..functions {
        let name = format!(
            "{}{}_{}{}",
            SUBSYS[(i / 50) % SUBSYS.len()],
            VERBS[rnd(10) as usize],
            NOUNS[rnd(10) as usize],
            if rnd(4) == 0 { format!("_{}", rnd(100)) } else { String::new() }
        );
        addr += 16;
        emit(&mut text, &mut addr, &name, None);
    }
    let mut modules = String::new();
    for (mi, m) in ["nf_tables", "virtio_net", "ext4", "kvm_amd"].iter().enumerate() {
        let base = 0xffff_ffff_c000_0000u64 + (mi as u64) * 0x10_0000;
        writeln!(modules, "{m} 1048576 0 - Live {base:#x}").unwrap();
        let mut a = base + 16;
        for i in 0..functions / 20 {
            let name = format!("{m}_{}_{}", VERBS[rnd(10) as usize], i);
            emit(&mut text, &mut a, &name, Some(m));
        }
    }
    (text, modules)
}

fn realistic_snapshot(functions: usize) -> KallsymsSnapshot {
    let (text, modules) = realistic_kallsyms(functions);
    KallsymsSnapshot::from_proc_text(&text, &modules, "6.18.0".into(), Some(vec![5; 20]), &|m| {
        (m == "ext4").then(|| vec![6; 20])
    })
    .expect("generated kallsyms parse")
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    let mut z = ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(bytes).unwrap();
    z.finish().unwrap()
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn zst_form_round_trips_and_is_smaller_than_zlib() {
    let snap = realistic_snapshot(20_000);
    assert!(snap.symbols.len() > 40_000, "{} symbols", snap.symbols.len());
    assert!(snap.symbols.iter().any(|s| s.module.is_some() && s.name.starts_with("__pfx_")));
    let bytes = snap.to_file_bytes(Path::new("s")).unwrap();
    let p = Path::new("x.snap.zst");
    // The columns are a permutation of the records, exactly undone.
    let cols = kallsyms_to_columns(&bytes, p).unwrap();
    assert_ne!(cols, bytes);
    assert_eq!(kallsyms_from_columns(&cols, p).unwrap(), bytes);
    let packed = pack_kallsyms(&bytes, p).unwrap();
    assert_eq!(&packed[..8], KALLSYMS_ZST_MAGIC);
    assert_eq!(unpack_kallsyms(&packed, p).unwrap(), bytes);
    let z = zlib(&bytes).len();
    assert!(
        (packed.len() as f64) < 0.9 * z as f64,
        "zstd columns {} bytes, zlib {z} bytes (canonical {})",
        packed.len(),
        bytes.len()
    );

    // Through the database: stored once, read back equal, referenced with version 2.
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    let (id, written) = db.put_kallsyms(&bytes).unwrap();
    assert_eq!(id, kallsyms_id(&bytes));
    assert_eq!(written, packed.len() as u64);
    assert!(db.kallsyms_store_path(&id).to_string_lossy().ends_with(".snap.zst"));
    assert!(!db.kallsyms_store_path_zlib(&id).exists(), "writers write only the new form");
    let e = db.new_epoch(at(1_700_000_000), "a").unwrap();
    let hd = db.host_dir(&e, "a").unwrap();
    hd.create().unwrap();
    hd.write_kallsyms_ref(&id).unwrap();
    let text = fs::read_to_string(hd.kallsyms_ref_path()).unwrap();
    assert!(text.starts_with("dcpi-kallsyms-ref 2\n"), "{text}");
    assert_eq!(hd.read_kallsyms().unwrap(), snap);
}

#[test]
fn names_with_the_suffix_terminator_and_escape_round_trip() {
    let mut snap = common::small_snapshot();
    for (s, name) in snap.symbols.iter_mut().zip(["a\nb", "a\0", "\0\n\0", "\n", "x\0\0\n"]) {
        s.name = name.into();
    }
    snap.sort();
    let bytes = snap.to_file_bytes(Path::new("s")).unwrap();
    let p = Path::new("x.snap.zst");
    let cols = kallsyms_to_columns(&bytes, p).unwrap();
    assert_eq!(kallsyms_from_columns(&cols, p).unwrap(), bytes);
    let back = unpack_kallsyms(&pack_kallsyms(&bytes, p).unwrap(), p).unwrap();
    assert_eq!(KallsymsSnapshot::decode(&back, p).unwrap(), snap);
}

#[test]
fn zlib_form_of_older_databases_is_read_and_collected() {
    let snap = realistic_snapshot(500);
    let bytes = snap.to_file_bytes(Path::new("s")).unwrap();
    let id = kallsyms_id(&bytes);
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    fs::create_dir_all(dir.path().join("db/kallsyms")).unwrap();
    fs::write(db.kallsyms_store_path_zlib(&id), zlib(&bytes)).unwrap();
    let e = db.new_epoch(at(1_700_000_000), "a").unwrap();
    let hd = db.host_dir(&e, "a").unwrap();
    hd.create().unwrap();
    fs::write(hd.kallsyms_ref_path(), format!("dcpi-kallsyms-ref 1\nsnapshot {id}\n")).unwrap();
    assert_eq!(hd.read_kallsyms().unwrap(), snap);
    // A corrupt old form is refused, naming its file.
    fs::write(db.kallsyms_store_path_zlib(&id), b"not zlib").unwrap();
    let err = hd.read_kallsyms().unwrap_err();
    assert!(matches!(err, Error::Corrupt { field: "compressed data", .. }), "{err}");
    assert!(err.to_string().contains(".snap.z"), "{err}");
    fs::write(db.kallsyms_store_path_zlib(&id), zlib(&bytes)).unwrap();
    // Storing it again writes the new form, which readers then prefer.
    let (id2, written) = db.put_kallsyms(&bytes).unwrap();
    assert_eq!((id2.as_str(), written > 0), (id.as_str(), true));
    fs::write(db.kallsyms_store_path_zlib(&id), b"not zlib").unwrap();
    assert_eq!(hd.read_kallsyms().unwrap(), snap, "the .snap.zst form is read first");
    // Retention covers both names: referenced, both stay; unreferenced, both go, one id.
    let later = SystemTime::now() + Duration::from_secs(7200);
    assert!(db.gc_kallsyms(later, Duration::from_secs(3600)).unwrap().is_empty());
    assert!(db.kallsyms_store_path_zlib(&id).exists() && db.kallsyms_store_path(&id).exists());
    db.remove_host_epoch(&e, "a").unwrap();
    assert_eq!(db.gc_kallsyms(later, Duration::from_secs(3600)).unwrap(), vec![id.clone()]);
    assert!(!db.kallsyms_store_path_zlib(&id).exists() && !db.kallsyms_store_path(&id).exists());
    // Neither form: NotFound naming the new form.
    let hd2 = db.host_dir(&db.new_epoch(at(1_700_000_100), "a").unwrap(), "a").unwrap();
    hd2.create().unwrap();
    hd2.write_kallsyms_ref(&id).unwrap();
    let err = hd2.read_kallsyms().unwrap_err();
    assert!(
        matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert!(err.to_string().contains(".snap.zst"), "{err}");
}

#[test]
fn corrupt_truncated_and_oversized_zst_files_are_errors() {
    let snap = common::small_snapshot();
    let bytes = snap.to_file_bytes(Path::new("s")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    let (id, _) = db.put_kallsyms(&bytes).unwrap();
    let path = db.kallsyms_store_path(&id);
    let good = fs::read(&path).unwrap();
    let named = |e: &Error| assert!(e.to_string().contains(&id), "unnamed: {e}");
    // Every truncation and every single-bit flip: an error (or, for a flip zstd cannot see,
    // the same snapshot or a content id mismatch), never a panic.
    for n in 0..good.len() {
        fs::write(&path, &good[..n]).unwrap();
        let e = db.read_kallsyms(&id).unwrap_err();
        named(&e);
    }
    for i in 0..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[i] ^= 1 << bit;
            fs::write(&path, &bad).unwrap();
            match db.read_kallsyms(&id) {
                Ok(s) => assert_eq!(s, snap, "byte {i} bit {bit}"),
                Err(e) => named(&e),
            }
        }
    }
    // Header: a foreign file, a newer version.
    fs::write(&path, b"\x28\xb5\x2f\xfd not ours").unwrap();
    assert!(matches!(db.read_kallsyms(&id), Err(Error::BadMagic { .. })));
    let mut newer = good.clone();
    newer[8] = 9;
    fs::write(&path, &newer).unwrap();
    assert!(matches!(db.read_kallsyms(&id), Err(Error::UnknownVersion { version: 9, .. })));
    // Trailing garbage after the frame.
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"garbage");
    fs::write(&path, &trailing).unwrap();
    assert!(matches!(db.read_kallsyms(&id), Err(Error::Corrupt { field: "compressed data", .. })));
    // A valid frame of hostile columns: lengths past the end, records that do not add up.
    let p = Path::new("h.snap.zst");
    for cols in [
        vec![200u8, 1, 0],
        vec![0, 2, 0x05, 0x01, 0, 0, 0, 0],
        vec![0, 1, 0x00, 0, 0, 0, 0],
        vec![0, 1, 0x00, 1, 0x10, 1, 0x00, 2, 0x41, 0x42, 0],
        vec![0, 1, 0x00, 1, 0x10, 1, 0x00, 2, 0x41, 0x0a, 0, 1],
        vec![0, 1, 0x00, 1, 0x10, 1, 0x00, 3, 0x00, 0x41, 0x0a, 0],
        vec![0, 1, 0x00, 1, 0x10, 1, 0x00, 4, 0x41, 0x0a, 0x42, 0x0a, 0],
        vec![0, 1, 0x00, 1, 0x10, 2, 0x00, 0x00, 2, 0x41, 0x0a, 0],
    ] {
        let mut f = good[..10].to_vec();
        f.extend_from_slice(&zstd::encode_all(&cols[..], 1).unwrap());
        let e = unpack_kallsyms(&f, p).unwrap_err();
        assert!(matches!(&e, Error::Corrupt { field, .. } if field.starts_with("columns")), "{e}");
    }
    // A tiny file that would decompress to more than 256 MiB stops at the bound.
    let mut bomb = good[..10].to_vec();
    let mut enc = zstd::stream::write::Encoder::new(&mut bomb, 3).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..257 {
        enc.write_all(&zeros).unwrap();
    }
    enc.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    fs::write(&path, &bomb).unwrap();
    let e = db.read_kallsyms(&id).unwrap_err();
    assert!(e.to_string().contains("256 MiB"), "{e}");
    named(&e);
}
