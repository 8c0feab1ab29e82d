//! Data generators shared by the integration tests and the codec benchmark.
#![allow(dead_code)]

use profile_format::{
    EpochId, EventDesc, ImageId, ImageKind, JitSymbol, KallsymsSnapshot, Profile, ProfileHeader,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

pub(crate) fn event() -> EventDesc {
    EventDesc {
        name: "cpu-clock".into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: 250_000,
        period_min: 225_000,
        period_max: 275_000,
    }
}

pub(crate) fn header(kind: ImageKind, image_path: &[u8]) -> ProfileHeader {
    ProfileHeader {
        kind,
        image_id: ImageId::from_build_id(&[
            0x4e, 0x1d, 0x2c, 0x3b, 0x4a, 0x59, 0x68, 0x77, 0x86, 0x95, 0xa4, 0xb3, 0xc2, 0xd1,
            0xe0, 0xff, 0x01, 0x12, 0x23, 0x34,
        ])
        .expect("valid build-id"),
        image_path: image_path.to_vec(),
        event: event(),
        host: "web-01".into(),
        epoch: EpochId::parse("20240521T093000Z").expect("valid epoch"),
        total_samples: 0,
        total_period: 0,
        sequence: 17,
        jit_symbols: vec![],
    }
}

/// A realistic small profile: a few hot spots in a 300 KB binary, ~40 offsets.
pub(crate) fn small_profile() -> Profile {
    let mut p = Profile::new(header(ImageKind::Elf, b"/usr/lib/x86_64-linux-gnu/libc.so.6"));
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..40 {
        let off = 0x28000 + rng.random_range(0..300_000u64);
        let c = rng.random_range(1..50);
        p.add(off, c, c * 250_000);
    }
    p
}

/// The benchmark's data set: `n` distinct offsets spread over a `text_size`-byte text section,
/// counts following Zipf's law (count of rank r proportional to 1/r, at least 1) so that they
/// add up to about `total` samples. Deterministic for a given seed.
pub(crate) fn zipf_profile(n: usize, text_size: u64, total: u64, seed: u64) -> Profile {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut offsets = std::collections::BTreeSet::new();
    while offsets.len() < n {
        offsets.insert(0x1000 + rng.random_range(0..text_size));
    }
    let mut offsets: Vec<u64> = offsets.into_iter().collect();
    offsets.shuffle(&mut rng);
    let harmonic: f64 = (1..=n).map(|r| 1.0 / r as f64).sum();
    let scale = total as f64 / harmonic;
    let mut p = Profile::new(header(ImageKind::Elf, b"/usr/bin/postgres"));
    for (rank, off) in offsets.into_iter().enumerate() {
        let c = ((scale / (rank + 1) as f64).round() as u64).max(1);
        p.add(off, c, c * 250_000);
    }
    p
}

/// Files for the fuzz seed corpus and the mutation tests: (name, bytes).
pub(crate) fn profile_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = vec![("small-elf.prof", small_profile().encode())];
    let empty = Profile::new(header(ImageKind::Kernel, b"[kernel.kallsyms]"));
    out.push(("empty-kernel.prof", empty.encode()));
    let mut weird = Profile::new(header(ImageKind::Elf, b"/tmp/../x\nwith newline\0and nul"));
    weird.header.image_id = ImageId::fallback(b"/tmp/../x", 1, 2, 3);
    weird.add(u64::MAX, 1, 1);
    weird.add(0, 2, 2);
    out.push(("weird-path.prof", weird.encode()));
    let mut anon = Profile::new(header(ImageKind::Anon, b"[anon:4242]"));
    anon.header.image_id = ImageId::special("[anon]", b"4242");
    anon.header.jit_symbols = vec![
        JitSymbol { start: 0x7f00_0000_1000, size: 64, name: "Interpreter::run".into() },
        JitSymbol { start: 0x7f00_0000_1040, size: 32, name: "λ::closure".into() },
    ];
    anon.add(0x7f00_0000_1004, 5, 5);
    out.push(("anon-jit.prof", anon.encode()));
    let mut unknown = Profile::new(header(ImageKind::Unknown, b"[unknown]"));
    unknown.header.image_id = ImageId::special("[unknown]", b"");
    unknown.add(0, 3, 3);
    unknown.add(2, 1, 1);
    out.push(("unknown.prof", unknown.encode()));
    let mut long = Profile::new(header(ImageKind::Elf, &vec![b'a'; 4096]));
    long.add(1, 1, 1);
    out.push(("long-path.prof", long.encode()));
    out.push(("edge-empty-file", Vec::new()));
    out.push(("edge-magic-only", b"DCPIPROF".to_vec()));
    let mut bad_crc = small_profile().encode();
    let n = bad_crc.len();
    bad_crc[n - 1] ^= 0x55;
    out.push(("edge-bad-crc", bad_crc));
    out
}

/// A small kallsyms snapshot with a module and a pseudo-module.
pub(crate) fn small_snapshot() -> KallsymsSnapshot {
    let kallsyms = "\
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000070 T secondary_startup_64
ffffffff81001000 t early_idt_handler_array
ffffffff81001120 t early_idt_handler_common
ffffffff81002000 W weak_fn
ffffffff82000000 D data_symbol
ffffffffc0a00000 t nft_do_chain\t[nf_tables]
ffffffffc0a00100 T nft_register_expr\t[nf_tables]
ffffffffc0b00000 t bpf_prog_6deef7357e7b4530\t[bpf]
";
    let modules = "nf_tables 364544 0 - Live 0xffffffffc0a00000\n";
    KallsymsSnapshot::from_proc_text(kallsyms, modules, "6.18.0".into(), Some(vec![7; 20]), &|m| {
        (m == "nf_tables").then(|| vec![3; 20])
    })
    .expect("valid kallsyms text")
}
