//! Sole-command stubs (FORMAT.md §5.6.1): the per-command profile of an (image, event) that
//! one command ran alone so far this epoch is a stub standing for the flat profile, not a
//! copy of it.
//!
//! Why: on the busy mix 27–46 % of the per-command bytes were exact copies of a flat profile
//! (BENCHMARKS.md "Per-command profiles"), one per image only one command ran.
//!
//! The rule that keeps it exact: a stub for command C of (image, event) is written only when
//! C's samples up to the flat profile's `sequence` are exactly the flat profile's (same
//! offsets, counts and period), and it stays only while every increment the flat profile
//! takes is C's increment of the same flush (the spool writes one record, one sequence, per
//! flush, holding the flat and the per-command increments). Before the flat profile takes an
//! increment that is not all C's (a second command started running the image, `by_command`
//! was turned off, …), C's stub is replaced, atomically under the same name, by a copy of the
//! flat profile as it is *before* that increment, stamped with its `sequence`: C's later
//! increments are then merged into the copy as usual, and those the copy holds are skipped
//! by `sequence` (FORMAT.md §5.3). A kill -9 anywhere leaves either the stub (the flat file
//! does not hold the other command's samples yet) or the copy.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use profile_format::{event_file_component, HostDir, Profile, ProfileWho};

use super::spool::{Spool, SpoolError, SpoolKey, SpooledIncrement};

/// The stubs this daemon knows of, per host directory.
#[derive(Default)]
pub(super) struct SoleStubs {
    /// Host directories listed since the daemon started (a restart finds the stubs an
    /// earlier run wrote by their container version).
    listed: HashSet<PathBuf>,
    /// (host directory, image id text, event component) → the stub's path.
    stubs: HashMap<(PathBuf, String, String), PathBuf>,
}

/// Image id text and event component of a flat key, or of a per-command key with its
/// `cmd-HASH` component.
fn parts(key: &SpoolKey) -> Option<(&str, Option<&str>, String)> {
    let text = key.image.as_deref()?;
    let (image, who) = match text.split_once('.') {
        Some((i, w)) => (i, Some(w)),
        None => (text, None),
    };
    Some((image, who, event_file_component(&key.event)))
}

impl SoleStubs {
    fn ensure_listed(&mut self, hd: &HostDir) -> Result<(), profile_format::Error> {
        if self.listed.contains(&hd.path) {
            return Ok(());
        }
        for e in hd.who_profiles()? {
            if e.is_command() && Profile::is_sole_stub(&e.path) {
                self.stubs.insert(
                    (hd.path.clone(), e.image_id.to_text(), e.event_component.clone()),
                    e.path,
                );
            }
        }
        self.listed.insert(hd.path.clone());
        Ok(())
    }

    /// The stub of the (image, event) of `key` (a flat or a per-command key), if any.
    pub(super) fn stub_of(
        &mut self,
        hd: &HostDir,
        key: &SpoolKey,
    ) -> Result<Option<PathBuf>, profile_format::Error> {
        let Some((image, _, event)) = parts(key) else { return Ok(None) };
        self.ensure_listed(hd)?;
        Ok(self.stubs.get(&(hd.path.clone(), image.to_owned(), event)).cloned())
    }

    pub(super) fn insert(&mut self, hd: &HostDir, key: &SpoolKey, path: PathBuf) {
        if let Some((image, _, event)) = parts(key) {
            self.stubs.insert((hd.path.clone(), image.to_owned(), event), path);
        }
    }

    pub(super) fn remove(&mut self, hd: &HostDir, key: &SpoolKey) {
        if let Some((image, _, event)) = parts(key) {
            self.stubs.remove(&(hd.path.clone(), image.to_owned(), event));
        }
    }

    /// Forget the host directories of an epoch that is gone (retention).
    pub(super) fn forget_epoch(&mut self, epoch: &str) {
        let of = |p: &Path| p.parent().and_then(Path::file_name).is_some_and(|n| n == epoch);
        self.listed.retain(|p| !of(p));
        self.stubs.retain(|(p, _, _), _| !of(p));
    }
}

/// The spool key of the per-command profile a stub at `stub` stands in for, beside the flat
/// profile's `flat` key.
pub(super) fn command_key(flat: &SpoolKey, stub: &Path) -> Option<SpoolKey> {
    let name = stub.file_name()?.to_str()?;
    let stem = name.strip_suffix(profile_format::PROFILE_SUFFIX)?;
    let (_, who) = stem.rsplit_once('.')?;
    Some(SpoolKey {
        epoch: flat.epoch.clone(),
        image: Some(format!("{}.{who}", flat.image.as_deref()?)),
        event: flat.event.clone(),
    })
}

/// Whether every increment of `flat_incs` above `published_seq` (those the flat profile is
/// about to take) is matched by `cmd`'s increment of the same flush with the same counts and
/// period: then the flat profile stays that one command's.
pub(super) fn all_of_one_command(
    spool: &mut Spool,
    flat_incs: &[SpooledIncrement],
    published_seq: u64,
    cmd: &SpoolKey,
) -> Result<bool, SpoolError> {
    let cmd_incs = spool.increments(cmd);
    for inc in flat_incs.iter().filter(|i| i.seq > published_seq) {
        let Some(c) = cmd_incs.iter().find(|c| c.seq == inc.seq) else { return Ok(false) };
        let (Some(a), Some(b)) = (spool.counts(inc)?, spool.counts(c)?) else { return Ok(false) };
        if a != b {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Replace the stub at `stub` by what it stands for: `flat` (the flat profile *before* it
/// takes the increment that ends the stub) as its command's profile, with `flat`'s
/// `sequence`. With no flat profile (set aside as corrupt) the stub goes: it stood for
/// nothing. Returns the bytes written.
pub(super) fn replace_stub(
    stub: &Path,
    flat: Option<Profile>,
) -> Result<u64, profile_format::Error> {
    let command = match Profile::read(stub) {
        Ok(Profile { who: Some(ProfileWho::Command { command }), sole: true, .. }) => command,
        // Not a stub any more (a kill -9 after the copy was written, before our record of it
        // was updated): nothing to do.
        Ok(_) => return Ok(0),
        Err(e @ profile_format::Error::Io { .. }) => return Err(e),
        Err(e) => {
            super::publish::set_aside(stub, &e);
            return Ok(0);
        }
    };
    match flat.filter(|f| f.header.total_samples > 0) {
        Some(f) => Profile::as_sole_command(f, command).write(stub),
        None => match std::fs::remove_file(stub) {
            Ok(()) => Ok(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(source) => Err(profile_format::Error::Io { path: stub.to_path_buf(), source }),
        },
    }
}
