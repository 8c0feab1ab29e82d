use std::path::Path;

use crate::atomic;
use crate::db::HostDir;
use crate::error::{Error, Result};
use crate::ident::ImageId;
use crate::profile::{EventDesc, ImageKind, Profile, ProfileHeader};
use crate::safeio;
use crate::safeio::MAX_SUMMARY_FILE;

/// Per-event part of a host summary.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct EventSummary {
    pub desc: Option<EventDesc>,
    /// `hardware`, `software`, or `fallback` (a hardware event was asked for with `auto` but
    /// the machine had no PMU, so cpu-clock was used).
    pub source: String,
    pub samples: u64,
    pub total_period: u64,
    /// Sums over CPUs of the counters' enabled and running times (ns), for multiplex scaling.
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
}

/// Value of [`HostSummary::format_version`] written by this build.
pub const SUMMARY_FORMAT_VERSION: u32 = 1;

/// `summary.json` in each host directory of an epoch. Unknown fields are ignored and missing
/// ones default, so that newer and older writers stay readable.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HostSummary {
    pub format_version: u32,
    pub host: String,
    pub epoch: String,
    pub kernel_release: String,
    pub cpus: Vec<u32>,
    pub events: Vec<EventSummary>,
    pub samples: u64,
    pub lost: u64,
    pub throttled: u64,
    pub unknown: u64,
    /// Unix seconds of the first and last write of this summary.
    pub first_written: u64,
    pub last_written: u64,
    pub dcpid_version: String,
    /// The writer's spool sequence number up to which this summary includes the counts (0 =
    /// not recorded). After a crash the daemon adds only what its spool holds beyond it.
    pub spool_sequence: u64,
    /// Totals of the published profiles (FORMAT.md §7.1); absent in summaries written before
    /// the index existed, or when a profile could not be read when the summary was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<SummaryIndex>,
    /// Where the published profiles end on the time axis (FORMAT.md §7.3): a profile whose
    /// `sequence` is one of these marks holds exactly the samples of the slices that end at or
    /// before its `slice_end`, so that a reader adds the later slices of `slices.log` to it.
    /// Oldest first. Absent (empty): no such guarantee (written before §7.3, slices off, or
    /// samples were published around the spool); readers then take the profiles as they are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fresh: Vec<FreshMark>,
}

/// One freshness mark of [`HostSummary::fresh`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FreshMark {
    /// A slice boundary (Unix seconds): the end of a slice of `slices.log`.
    pub slice_end: u64,
    /// The spool sequence up to which the samples of the slices ending at or before
    /// `slice_end` were spooled; profiles published with this `sequence` hold exactly those.
    pub sequence: u64,
}

/// Per-(image, event) totals of the profiles of one host directory, so that a per-image report
/// reads one small file per host and epoch instead of every profile (FORMAT.md §7.1).
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SummaryIndex {
    /// Event descriptions, referred to by [`ImageTotal::event`].
    pub events: Vec<EventDesc>,
    /// One entry per profile file, in the order of the file names.
    pub images: Vec<ImageTotal>,
}

/// The header totals of one profile file.
#[derive(Clone, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ImageTotal {
    /// Image id text (`b<hex>` / `f<hex>`), as in the profile header.
    pub id: String,
    /// `ImageKind` code (FORMAT.md §5).
    pub kind: u8,
    /// The image path when it is valid UTF-8 (else empty and `path_hex` is set).
    pub path: String,
    /// Lowercase hex of the path's bytes when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// Index into [`SummaryIndex::events`].
    pub event: u32,
    pub samples: u64,
    pub period: u64,
}

impl SummaryIndex {
    /// Build the index from the profile files of `hd` (read and checked in full). Any
    /// unreadable profile is an error: an index must never disagree with the files.
    pub fn of_host_dir(hd: &HostDir) -> Result<Self> {
        let mut idx = Self::default();
        for entry in hd.profiles()? {
            let p = Profile::read(&entry.path)?;
            idx.push(&p.header);
        }
        Ok(idx)
    }

    /// Add one profile's totals (call in file-name order).
    pub fn push(&mut self, h: &ProfileHeader) {
        let event = match self.events.iter().position(|e| *e == h.event) {
            Some(i) => i,
            None => {
                self.events.push(h.event.clone());
                self.events.len() - 1
            }
        };
        let (path, path_hex) = match std::str::from_utf8(&h.image_path) {
            Ok(s) => (s.to_owned(), None),
            Err(_) => (String::new(), Some(hex::encode(&h.image_path))),
        };
        self.images.push(ImageTotal {
            id: h.image_id.to_text(),
            kind: h.kind as u8,
            path,
            path_hex,
            event: event as u32,
            samples: h.total_samples,
            period: h.total_period,
        });
    }
}

impl ImageTotal {
    /// The profile header this entry stands for (without sequence or JIT symbols, which the
    /// index does not keep). Errors name the field.
    pub fn header(
        &self,
        idx: &SummaryIndex,
        host: &str,
        epoch: &crate::EpochId,
    ) -> Result<ProfileHeader> {
        let bad = |field: &'static str, detail: String| Error::Invalid {
            what: "summary index",
            value: field.to_owned(),
            detail,
        };
        let kind = ImageKind::from_code(self.kind)
            .ok_or_else(|| bad("kind", format!("unknown image kind {}", self.kind)))?;
        let image_id = ImageId::parse(&self.id).map_err(|e| bad("id", e.to_string()))?;
        let event = idx
            .events
            .get(self.event as usize)
            .ok_or_else(|| bad("event", format!("no event #{}", self.event)))?
            .clone();
        let image_path = match &self.path_hex {
            Some(h) => hex::decode(h).map_err(|e| bad("path_hex", e.to_string()))?,
            None => self.path.clone().into_bytes(),
        };
        Ok(ProfileHeader {
            kind,
            image_id,
            image_path,
            event,
            host: host.to_owned(),
            epoch: epoch.clone(),
            total_samples: self.samples,
            total_period: self.period,
            sequence: 0,
            jit_symbols: Vec::new(),
        })
    }
}

/// `<host dir>/fresh.json` (FORMAT.md §7.3): the names (image path, kind, event) of the keys
/// the current epoch's slices hold that have no published profile yet, so that a fresh report
/// names a new image before its first publication. A JSON [`SummaryIndex`] whose totals are 0.
pub const FRESH_NAMES_FILE: &str = "fresh.json";

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// The host directory's names of not yet published keys ([`FRESH_NAMES_FILE`]).
    pub fn fresh_names_path(&self) -> std::path::PathBuf {
        self.path.join(FRESH_NAMES_FILE)
    }

    /// [`HostDir::fresh_names_path`] read safely (§6.1); `Ok(None)`: there is none.
    pub fn read_fresh_names(&self) -> Result<Option<SummaryIndex>> {
        let path = self.fresh_names_path();
        let bytes = match safeio::read_small(&path, MAX_SUMMARY_FILE) {
            Ok(b) => b,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| Error::Json { path: path.clone(), source })
    }

    /// Write [`HostDir::fresh_names_path`] atomically (§2); returns the bytes written.
    pub fn write_fresh_names(&self, names: &SummaryIndex) -> Result<u64> {
        let path = self.fresh_names_path();
        let mut bytes = serde_json::to_vec(names)
            .map_err(|source| Error::Json { path: path.clone(), source })?;
        bytes.push(b'\n');
        atomic::write_atomic(&path, &bytes)?;
        Ok(bytes.len() as u64)
    }
}

impl HostSummary {
    /// Read and parse; errors name the file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = safeio::read_small(path, MAX_SUMMARY_FILE)?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Json { path: path.into(), source })
    }
    /// [`HostSummary::read`] without the index: its entries are skipped, not built. For readers
    /// of many summaries that need only the host facts (e.g. multiplexing times).
    pub fn read_facts(path: &Path) -> Result<Self> {
        #[derive(Default, serde::Deserialize)]
        #[serde(default)]
        struct Facts {
            format_version: u32,
            host: String,
            epoch: String,
            kernel_release: String,
            cpus: Vec<u32>,
            events: Vec<EventSummary>,
            samples: u64,
            lost: u64,
            throttled: u64,
            unknown: u64,
            first_written: u64,
            last_written: u64,
            dcpid_version: String,
        }
        let bytes = safeio::read_small(path, MAX_SUMMARY_FILE)?;
        let f: Facts = serde_json::from_slice(&bytes)
            .map_err(|source| Error::Json { path: path.into(), source })?;
        Ok(Self {
            format_version: f.format_version,
            host: f.host,
            epoch: f.epoch,
            kernel_release: f.kernel_release,
            cpus: f.cpus,
            events: f.events,
            samples: f.samples,
            lost: f.lost,
            throttled: f.throttled,
            unknown: f.unknown,
            first_written: f.first_written,
            last_written: f.last_written,
            dcpid_version: f.dcpid_version,
            index: None,
            spool_sequence: 0,
            fresh: Vec::new(),
        })
    }

    /// Write atomically as pretty-printed JSON; returns the bytes written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        let mut bytes = serde_json::to_vec_pretty(self)
            .map_err(|source| Error::Json { path: path.into(), source })?;
        bytes.push(b'\n');
        atomic::write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors_name_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("summary.json");
        let s = HostSummary {
            format_version: SUMMARY_FORMAT_VERSION,
            host: "h1".into(),
            epoch: "20240101T000000Z".into(),
            cpus: vec![0, 1],
            events: vec![EventSummary {
                source: "software".into(),
                samples: 5,
                ..Default::default()
            }],
            samples: 5,
            ..Default::default()
        };
        s.write(&p).unwrap();
        assert_eq!(HostSummary::read(&p).unwrap(), s);
        std::fs::write(&p, b"{\"samples\": \"many\"}").unwrap();
        let e = HostSummary::read(&p).unwrap_err();
        assert!(matches!(e, Error::Json { .. }), "{e}");
        assert!(e.to_string().contains("summary.json"), "{e}");
        let missing = dir.path().join("nope.json");
        assert!(HostSummary::read(&missing).unwrap_err().to_string().contains("nope.json"));
    }

    #[test]
    fn index_matches_profiles_and_old_files_stay_readable() {
        use crate::{Database, EpochId};
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        let epoch = EpochId::parse("20240101T000000Z").unwrap();
        let hd = db.host_dir(&epoch, "h1").unwrap();
        hd.create().unwrap();
        let event = EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1000,
            period_min: 900,
            period_max: 1100,
        };
        let mut written = Vec::new();
        for (i, path) in
            [b"/usr/bin/a".to_vec(), b"/tmp/\xff\nodd".to_vec()].into_iter().enumerate()
        {
            let id = ImageId::from_build_id(&[i as u8 + 1; 20]).unwrap();
            let mut p = Profile::new(ProfileHeader {
                kind: ImageKind::Elf,
                image_id: id.clone(),
                image_path: path,
                event: event.clone(),
                host: "h1".into(),
                epoch: epoch.clone(),
                total_samples: 0,
                total_period: 0,
                sequence: 7,
                jit_symbols: Vec::new(),
            });
            p.add(0x10, 3 + i as u64, 3000);
            p.add(0x20, 5, 5100);
            p.write(&hd.profile_path(&id, &event.name)).unwrap();
            written.push(p);
        }
        let idx = SummaryIndex::of_host_dir(&hd).unwrap();
        assert_eq!(idx.images.len(), 2);
        for (t, p) in idx.images.iter().zip(&written) {
            let mut want = p.header.clone();
            want.sequence = 0;
            assert_eq!(t.header(&idx, "h1", &epoch).unwrap(), want);
        }
        assert!(idx.images[1].path_hex.is_some(), "non-UTF-8 path kept exactly");
        let s = HostSummary { index: Some(idx.clone()), ..Default::default() };
        let p = hd.summary_path();
        s.write(&p).unwrap();
        assert_eq!(HostSummary::read(&p).unwrap().index, Some(idx));
        let facts = HostSummary::read_facts(&p).unwrap();
        assert_eq!(facts, HostSummary { index: None, ..s.clone() });
        // A summary from before the index: no `index` key.
        std::fs::write(&p, b"{\"format_version\": 1, \"samples\": 3}").unwrap();
        assert_eq!(HostSummary::read(&p).unwrap().index, None);
        // A bad entry is an error naming the field, not a panic.
        let bad = ImageTotal { kind: 99, ..Default::default() };
        let e = bad.header(&SummaryIndex::default(), "h1", &epoch).unwrap_err();
        assert!(e.to_string().contains("kind"), "{e}");
        // An unreadable profile means no index.
        std::fs::write(
            hd.profile_path(&ImageId::from_build_id(&[9; 20]).unwrap(), "cpu-clock"),
            b"junk",
        )
        .unwrap();
        assert!(SummaryIndex::of_host_dir(&hd).is_err());
    }
}
