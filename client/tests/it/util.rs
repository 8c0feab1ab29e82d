//! Helpers shared by the client's integration tests.

use profile_format::{EventDesc, HostDir, ImageId, ImageKind, JitSymbol, Profile, ProfileHeader};

/// Write a profile: `counts` are (offset, count); every sample has period `period`.
pub fn write_profile(
    hd: &HostDir,
    kind: ImageKind,
    id: &ImageId,
    path: &[u8],
    ev: &EventDesc,
    counts: &[(u64, u64)],
    period: u64,
) {
    write_profile_jit(hd, kind, id, path, ev, counts, period, Vec::new());
}

#[allow(clippy::too_many_arguments)]
pub fn write_profile_jit(
    hd: &HostDir,
    kind: ImageKind,
    id: &ImageId,
    path: &[u8],
    ev: &EventDesc,
    counts: &[(u64, u64)],
    period: u64,
    jit_symbols: Vec<JitSymbol>,
) {
    let mut p = Profile::new(ProfileHeader {
        kind,
        image_id: id.clone(),
        image_path: path.to_vec(),
        event: ev.clone(),
        host: hd.host.clone(),
        epoch: hd.epoch.clone(),
        total_samples: 0,
        total_period: 0,
        sequence: 0,
        jit_symbols,
    });
    for &(off, c) in counts {
        p.add(off, c, c * period);
    }
    let file = if kind == ImageKind::Unknown {
        hd.unknown_path(&ev.name)
    } else {
        hd.profile_path(id, &ev.name)
    };
    p.write(&file).expect("write profile");
}
