//! Property tests: round trips and merge algebra.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use profile_format::{
    EpochId, EventDesc, ImageId, ImageKind, JitSymbol, KallsymsSnapshot, KernelModule,
    KernelSymbol, Profile, ProfileHeader,
};
use proptest::prelude::*;

fn image_id() -> impl Strategy<Value = ImageId> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 1..=64).prop_map(ImageId::BuildId),
        any::<[u8; 16]>().prop_map(ImageId::Fallback),
    ]
}

fn kind() -> impl Strategy<Value = ImageKind> {
    prop::sample::select(ImageKind::ALL.to_vec())
}

fn event() -> impl Strategy<Value = EventDesc> {
    (any::<String>(), any::<u32>(), any::<u64>(), any::<[u64; 3]>()).prop_map(
        |(name, perf_type, perf_config, mut p)| {
            p.sort();
            EventDesc {
                name,
                perf_type,
                perf_config,
                period_min: p[0],
                period_mean: p[1],
                period_max: p[2],
            }
        },
    )
}

fn counts() -> impl Strategy<Value = BTreeMap<u64, u64>> {
    prop::collection::btree_map(
        prop_oneof![0..4096u64, any::<u64>()],
        prop_oneof![1..200u64, 1..(1u64 << 50)],
        0..200,
    )
}

fn profile() -> impl Strategy<Value = Profile> {
    (
        kind(),
        image_id(),
        prop::collection::vec(any::<u8>(), 0..5000),
        event(),
        any::<String>(),
        0..253_402_300_799u64,
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<String>()), 0..5),
        counts(),
    )
        .prop_map(
            |(kind, image_id, image_path, event, host, secs, period, sequence, jit, counts)| {
                let jit_symbols = if kind == ImageKind::Anon {
                    jit.into_iter()
                        .map(|(start, size, name)| JitSymbol { start, size, name })
                        .collect()
                } else {
                    vec![]
                };
                Profile {
                    header: ProfileHeader {
                        kind,
                        image_id,
                        image_path,
                        event,
                        host,
                        epoch: EpochId::from_time(UNIX_EPOCH + Duration::from_secs(secs)),
                        total_samples: counts.values().sum(),
                        total_period: period,
                        sequence,
                        jit_symbols,
                    },
                    who: None,
                    counts,
                    sole: false,
                }
            },
        )
}

fn same_image(counts: BTreeMap<u64, u64>, period: u64, seq: u64) -> Profile {
    let mut p = Profile::new(common::header(ImageKind::Elf, b"/bin/x"));
    for (o, c) in counts {
        p.add(o, c, 0);
    }
    p.header.total_period = period;
    p.header.sequence = seq;
    p
}

fn snapshot() -> impl Strategy<Value = KallsymsSnapshot> {
    let module = (
        "[a-z_]{1,20}",
        any::<u64>(),
        any::<u64>(),
        prop::option::of(prop::collection::vec(any::<u8>(), 1..=64)),
    )
        .prop_map(|(name, base, size, build_id)| KernelModule { name, base, size, build_id });
    (
        any::<String>(),
        prop::option::of(prop::collection::vec(any::<u8>(), 1..=64)),
        any::<u64>(),
        prop::collection::vec(module, 0..4),
        prop::collection::vec(
            (
                any::<u64>(),
                prop::sample::select(b"tTwW".to_vec()),
                "[a-z_]{0,12}|\\PC{0,8}",
                any::<u32>(),
            ),
            0..100,
        ),
    )
        .prop_map(|(kernel_release, kernel_build_id, text_base, modules, syms)| {
            let nmod = modules.len() as u32;
            let symbols = syms
                .into_iter()
                .map(|(addr, kind, name, m)| KernelSymbol {
                    addr,
                    kind,
                    name,
                    module: (nmod > 0 && m % 3 == 0).then(|| m % nmod),
                })
                .collect();
            let mut s =
                KallsymsSnapshot { kernel_release, kernel_build_id, text_base, modules, symbols };
            s.sort();
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn profile_round_trip(p in profile()) {
        let bytes = p.encode();
        let q = Profile::decode(&bytes, Path::new("p.prof")).unwrap();
        prop_assert_eq!(&q, &p);
        prop_assert_eq!(q.encode(), bytes);
    }

    #[test]
    fn kallsyms_round_trip(s in snapshot()) {
        let bytes = s.encode();
        let back = KallsymsSnapshot::decode(&bytes, Path::new("k.snap")).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn merge_is_commutative_and_associative(
        ca in counts(), cb in counts(), cc in counts(),
        pa in 0..(1u64 << 60), pb in 0..(1u64 << 60), pc in 0..(1u64 << 60),
        sa in any::<u64>(), sb in any::<u64>(), sc in any::<u64>(),
    ) {
        let (a, b, c) = (same_image(ca, pa, sa), same_image(cb, pb, sb), same_image(cc, pc, sc));
        let mut ab = a.clone();
        ab.merge(&b).unwrap();
        let mut ba = b.clone();
        ba.merge(&a).unwrap();
        prop_assert_eq!(&ab.counts, &ba.counts);
        prop_assert_eq!(ab.header.total_samples, ba.header.total_samples);
        prop_assert_eq!(ab.header.total_period, ba.header.total_period);
        prop_assert_eq!(ab.header.sequence, ba.header.sequence);

        let mut ab_c = ab.clone();
        ab_c.merge(&c).unwrap();
        let mut bc = b.clone();
        bc.merge(&c).unwrap();
        let mut a_bc = a.clone();
        a_bc.merge(&bc).unwrap();
        prop_assert_eq!(&ab_c.counts, &a_bc.counts);
        prop_assert_eq!(ab_c.header.total_samples, a_bc.header.total_samples);
        prop_assert_eq!(ab_c.header.total_period, a_bc.header.total_period);
        prop_assert_eq!(ab_c.header.sequence, a_bc.header.sequence);

        // The merged profile is still a valid file.
        let sum: u64 = ab_c.counts.values().sum();
        prop_assert_eq!(sum, ab_c.header.total_samples);
        let bytes = ab_c.encode();
        prop_assert_eq!(Profile::decode(&bytes, Path::new("m.prof")).unwrap(), ab_c);
    }
}
