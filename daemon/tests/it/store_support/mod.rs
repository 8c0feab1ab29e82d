//! Shared by the store's integration tests: one configuration, one event, one batch shape.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dcpid::aggregate::OffsetCounts;
use dcpid::aggregate::{ImageInfo, Resolved, ResolvedProfile};
use dcpid::store::{EventInfo, Store, StoreConfig};
use profile_format::{EventDesc, ImageId, ImageKind};

/// Host `h1`, database `root/db`, spool `root/spool`, flush 2 s, publish 60 s.
pub(crate) fn cfg(root: &Path) -> StoreConfig {
    StoreConfig {
        db: root.join("db"),
        spool: root.join("spool"),
        host: "h1".into(),
        flush_interval: Duration::from_secs(2),
        publish_interval: Duration::from_secs(60),
        publish_max_delay: Duration::from_secs(360),
        max_memory_bytes: 64 << 20,
        retention_days: 7,
        retention_keep: 3,
    }
}

/// The one event of these tests: cpu-clock, mean period 1000.
pub(crate) fn desc() -> EventDesc {
    EventDesc {
        name: "cpu-clock".into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: 1000,
        period_min: 938,
        period_max: 1000,
    }
}

/// Tell the store its events (what the service does after opening the sampler).
pub(crate) fn events(s: &mut Store) {
    s.set_events(vec![EventInfo { desc: desc(), source: "software".into() }]);
}

/// [`Store::open`] with [`cfg`] and [`events`].
pub(crate) fn open(root: &Path) -> Store {
    let mut s = Store::open(cfg(root));
    events(&mut s);
    s
}

/// `count` samples of event 0 at `off` in the ELF image with build-id `[img; 20]`.
pub(crate) fn batch(img: u8, off: u64, count: u64) -> Resolved {
    let mut r = Resolved::default();
    let id = ImageId::BuildId(vec![img; 20]);
    let info = Arc::new(ImageInfo {
        kind: ImageKind::Elf,
        id: id.clone(),
        path: format!("/usr/bin/img{img}").into_bytes(),
        jit_symbols: vec![],
    });
    let mut counts = OffsetCounts::default();
    counts.insert(off, (count, count * 1000));
    r.profiles.insert((id, 0), ResolvedProfile { image: info, event: 0, counts });
    r.samples = count;
    r
}
