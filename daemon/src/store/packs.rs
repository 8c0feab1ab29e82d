//! Per-command, per-process and per-cgroup profiles go into one pack per host-epoch
//! (`who-profiles.pack`, FORMAT.md §15), appended once per publish turn, instead of one file
//! each.
//!
//! Why: a `write_atomic` of a ~200-byte profile costs a data page, ~3 ext4 metadata blocks and
//! two fsyncs; on the busy mix ~500 such files made most of dcpid's disk writes (BENCHMARKS.md
//! "Where dcpid's writes go"). One append of a turn's new versions costs their bytes and one
//! `fdatasync`.
//!
//! Append, not rewrite: under exec churn new commands come at most turns, and a rewrite would
//! write every member at each of them; an append writes only the changed ones. The pack is
//! rewritten whole (atomically) when it holds more superseded bytes than live ones, so that it
//! stays below twice its live size, and after a torn append (a crash), which must not be
//! appended after.
//!
//! Exactly once: a staged profile's increments are marked published in the spool only after
//! the append is durable (`fdatasync`); a crash before leaves them spooled, and the member's
//! `sequence` skips what the pack holds already (FORMAT.md §5.3).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use profile_format::pack::{self, Pack, PACK_FILE};
use profile_format::{HostDir, Profile};

use super::spool::SpoolKey;

/// Rewrite whole when the superseded bytes exceed the live ones by this much.
const REWRITE_SLACK: u64 = 64 << 10;

/// What this daemon knows of one host directory's pack (it is its only writer).
#[derive(Default)]
struct State {
    /// Every member's current bytes.
    members: BTreeMap<String, Vec<u8>>,
    /// The pack's length on disk after the last complete record; 0: no pack yet.
    len: u64,
    /// A torn tail or an unknown state: rewrite whole at the next flush.
    rewrite: bool,
}

impl State {
    fn live(&self) -> u64 {
        self.members.iter().map(|(n, b)| (n.len() + b.len() + 10) as u64).sum::<u64>() + 12
    }
}

/// A profile staged for the next flush.
pub(super) struct Staged {
    pub dir: PathBuf,
    pub name: String,
    pub bytes: Vec<u8>,
    /// Spool keys and sequences to mark published once the pack is durable.
    pub published: Vec<(SpoolKey, u64)>,
    /// A file of the same name (older layout, or a sole-command stub's copy) that the member
    /// now stands for: removed after the flush.
    pub standalone: Option<PathBuf>,
}

/// The result of a flush.
pub(super) struct Flushed {
    pub bytes: u64,
    pub files: u64,
    /// Durable: mark these published.
    pub published: Vec<(SpoolKey, u64)>,
    /// Not written (`error`): keep them due.
    pub failed: Vec<SpoolKey>,
    pub error: Option<profile_format::Error>,
}

#[derive(Default)]
pub(super) struct Packs {
    dirs: HashMap<PathBuf, State>,
    staged: Vec<Staged>,
}

/// An unusable pack found where this daemon writes (damaged or planted).
pub(super) struct Unusable {
    pub path: PathBuf,
    pub error: profile_format::Error,
}

impl Packs {
    /// Load the pack of `hd` if not known yet. A damaged or planted pack is reported (the
    /// caller sets it aside) and replaced by an empty one.
    fn state(
        &mut self,
        hd: &HostDir,
        unusable: &mut Vec<Unusable>,
    ) -> Result<&mut State, profile_format::Error> {
        if !self.dirs.contains_key(&hd.path) {
            let path = hd.path.join(PACK_FILE);
            let st = match Pack::read(&path) {
                Ok(p) => State {
                    members: p.members().map(|(n, b)| (n.to_owned(), b.to_vec())).collect(),
                    len: p.valid_len(),
                    rewrite: p.torn(),
                },
                Err(profile_format::Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    State::default()
                }
                Err(e @ profile_format::Error::Io { .. }) => return Err(e),
                Err(error) => {
                    unusable.push(Unusable { path, error });
                    State { rewrite: true, ..State::default() }
                }
            };
            self.dirs.insert(hd.path.clone(), st);
        }
        Ok(self.dirs.get_mut(&hd.path).expect("inserted above"))
    }

    /// Load `hd`'s pack if not known yet (an unusable one is reported in `unusable`).
    pub(super) fn ensure(
        &mut self,
        hd: &HostDir,
        unusable: &mut Vec<Unusable>,
    ) -> Result<(), profile_format::Error> {
        self.state(hd, unusable).map(|_| ())
    }

    /// The member of `hd`'s pack named as `path` (a qualified profile's file path), decoded;
    /// `None` if the pack has none (the file of that name, if any, is the profile).
    pub(super) fn member(
        &mut self,
        hd: &HostDir,
        path: &Path,
        unusable: &mut Vec<Unusable>,
    ) -> Result<Option<Profile>, profile_format::Error> {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return Ok(None) };
        let st = self.state(hd, unusable)?;
        let Some(bytes) = st.members.get(name) else { return Ok(None) };
        let mpath = hd.path.join(PACK_FILE).join(name);
        match Profile::decode_member(bytes, &mpath) {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                // Its record's checksum was right: a writer's bug or a planted record.
                // Dropped; the next version of the profile replaces it.
                tracing::warn!(member = %mpath.display(), error = %e,
                    "store: unreadable profile in the pack dropped; starting a fresh one");
                st.members.remove(name);
                st.rewrite = true;
                Ok(None)
            }
        }
    }

    /// Stage a member for the next [`Packs::flush`]; it is what [`Packs::member`] returns
    /// from now on.
    pub(super) fn stage(&mut self, s: Staged) {
        if let Some(st) = self.dirs.get_mut(&s.dir) {
            st.members.insert(s.name.clone(), s.bytes.clone());
        }
        self.staged.push(s);
    }

    pub(super) fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Write every staged member: one append (and `fdatasync`) per host directory, or a whole
    /// rewrite when due. On an error the host directory's state is forgotten (read again at
    /// its next use) and its staged keys are returned in `failed`, not marked published.
    pub(super) fn flush(&mut self) -> Flushed {
        let staged = std::mem::take(&mut self.staged);
        let mut by_dir: BTreeMap<PathBuf, Vec<Staged>> = BTreeMap::new();
        for s in staged {
            by_dir.entry(s.dir.clone()).or_default().push(s);
        }
        let mut out =
            Flushed { bytes: 0, files: 0, published: Vec::new(), failed: Vec::new(), error: None };
        for (dir, list) in by_dir {
            let path = dir.join(PACK_FILE);
            let Some(st) = self.dirs.get_mut(&dir) else {
                // Not loaded (cannot happen: staging follows a lookup); never lose it.
                out.failed.extend(list.into_iter().flat_map(|s| s.published).map(|(k, _)| k));
                continue;
            };
            let new: u64 = list.iter().map(|s| (s.name.len() + s.bytes.len() + 10) as u64).sum();
            let live = st.live();
            let whole = st.len == 0 || st.rewrite || st.len + new > 2 * live + REWRITE_SLACK;
            let r = if whole {
                None
            } else {
                // The last staged version of a name wins, as readers take the last record.
                match pack::append(
                    &path,
                    st.len,
                    list.iter().map(|s| (s.name.as_str(), &s.bytes[..])),
                ) {
                    Ok(n) => Some(Ok(n)),
                    Err(profile_format::Error::Invalid { detail, .. }) => {
                        tracing::warn!(file = %path.display(), detail,
                            "store: profile pack changed behind this daemon; rewriting it whole");
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            };
            let r = match r {
                Some(r) => r.map(|n| (n, n - st.len)),
                None => {
                    pack::write_whole(&path, st.members.iter().map(|(n, b)| (n.as_str(), &b[..])))
                        .map(|n| (n, n))
                }
            };
            match r {
                Ok((len, written)) => {
                    st.len = len;
                    st.rewrite = false;
                    out.bytes += written;
                    out.files += 1;
                    for s in list {
                        out.published.extend(s.published);
                        if let Some(f) = s.standalone {
                            match std::fs::remove_file(&f) {
                                Ok(()) => {}
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                // Harmless: readers take the member, which stands for it.
                                Err(e) => tracing::debug!(file = %f.display(), error = %e,
                                    "store: file superseded by the pack not removed"),
                            }
                        }
                    }
                }
                Err(e) => {
                    self.dirs.remove(&dir);
                    out.failed.extend(list.into_iter().flat_map(|s| s.published).map(|(k, _)| k));
                    out.error.get_or_insert(e);
                }
            }
        }
        out
    }

    /// Forget the host directories of an epoch that is gone (retention).
    pub(super) fn forget_epoch(&mut self, epoch: &str) {
        let of = |p: &Path| p.parent().and_then(Path::file_name).is_some_and(|n| n == epoch);
        self.dirs.retain(|p, _| !of(p));
    }
}
