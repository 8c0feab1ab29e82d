//! Call-stack profiles (FORMAT.md §13): the sampled call stacks of one event on one host in one
//! epoch, each stack a sequence of interned frames (image, offset), leaf first, with its count.

use std::collections::{BTreeMap, BTreeSet};

// hashbrown's foldhash, not std's SipHash: a flush adds every new stack (tens of frames) to a
// profile, where SipHash was a fifth of dcpid's flush thread on a machine of distinct stacks.
use hashbrown::HashMap;
use std::path::{Path, PathBuf};

use crate::codec::{self, put_bytes, Reader};
use crate::db::HostDir;
use crate::error::{Error, Result};
use crate::ident::event_file_component;
use crate::profile::{read_jit_symbols, write_jit_symbols, ImageKind, JitSymbol};
use crate::safeio;
use crate::{varint, ImageId};

/// Magic of a stack profile file.
pub const STACKS_MAGIC: &[u8; 8] = b"DCPISTK\0";
/// Newest version this build reads and writes; a reader refuses larger ones
/// (`UnknownVersion`). A file is written as version 3 when some stack names its command,
/// else as version 2 when it has JIT symbols (version 2 adds their table), else as version 1,
/// so that older readers still read every file that needs nothing newer.
pub const STACKS_VERSION: u16 = 3;
/// Longest command name a file may hold (the kernel's comm is at most 15 bytes; dcpid names a
/// process it could not name `[pid N]`).
pub const MAX_COMMAND_LEN: usize = 255;
/// How reports name the command of a stack that has none (files before version 3, dcpid that
/// could not name the process).
pub const UNKNOWN_COMMAND: &str = "[unknown command]";
/// File name suffix (`stacks.<event component>.stk`).
pub const STACKS_SUFFIX: &str = ".stk";
/// File name prefix.
pub const STACKS_PREFIX: &str = "stacks.";
/// Deepest stack a file may hold (the kernel's own limit, `perf_event_max_stack`, is 127 by
/// default and at most 65535; deeper sampled stacks are cut by the writer and flagged truncated).
pub const MAX_STACK_DEPTH: usize = 1024;
/// Flag bit of a stack: it does not reach a root (depth limit hit, or the unwinder stopped).
const FLAG_TRUNCATED: u64 = 1;

/// The image of a frame, as profile headers describe it (§5).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackImage {
    pub kind: ImageKind,
    pub id: ImageId,
    /// Path as seen (arbitrary bytes).
    pub path: Vec<u8>,
}

/// A frame: index into [`StackProfile::images`] and the offset in that image (§5.1 rules; for
/// `Unknown` images an [`crate::UnknownReason`] code).
pub type Frame = (u32, u64);

/// One stack of a profile, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackRef<'a> {
    /// The command (comm) of the processes that ran it; `None` in files written before
    /// version 3 (and for stacks merged from them).
    pub command: Option<&'a [u8]>,
    /// Leaf (the sampled pc) first, root last.
    pub frames: &'a [Frame],
    /// The stack does not reach a root.
    pub truncated: bool,
    pub samples: u64,
}

/// The stack profile of one (host, epoch, event).
#[derive(Clone, Debug, Default)]
pub struct StackProfile {
    pub host: String,
    pub epoch: String,
    pub event: String,
    /// The highest spool sequence merged into the file (exactly-once publishing, as a
    /// profile's `sequence`, FORMAT.md §5.3).
    pub sequence: u64,
    images: Vec<StackImage>,
    image_ix: HashMap<StackImage, u32>,
    /// Interned commands; a stack's command indexes this (version 3).
    commands: Vec<Vec<u8>>,
    command_ix: HashMap<Vec<u8>, u32>,
    /// Samples per (command index, frames, truncated).
    stacks: HashMap<(Option<u32>, Vec<Frame>, bool), u64>,
    /// JIT symbols (perf map) of `Anon` images, by image index: a JIT region sampled only as
    /// a caller has no flat profile to carry them (version 2).
    jit: BTreeMap<u32, BTreeSet<JitSymbol>>,
}

impl PartialEq for StackProfile {
    fn eq(&self, other: &Self) -> bool {
        // Same content whatever the order images were interned in.
        self.host == other.host
            && self.epoch == other.epoch
            && self.event == other.event
            && self.sequence == other.sequence
            && self.encode_payload().0 == other.encode_payload().0
    }
}

impl Eq for StackProfile {}

impl StackProfile {
    pub fn new(host: &str, epoch: &str, event: &str) -> Self {
        Self {
            host: host.to_owned(),
            epoch: epoch.to_owned(),
            event: event.to_owned(),
            ..Default::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Interned images; frames index into this.
    pub fn images(&self) -> &[StackImage] {
        &self.images
    }

    /// Index of `image`, interning it if new.
    pub fn image_index(&mut self, image: &StackImage) -> u32 {
        if let Some(&i) = self.image_ix.get(image) {
            return i;
        }
        let i = self.images.len() as u32;
        self.images.push(image.clone());
        self.image_ix.insert(image.clone(), i);
        i
    }

    /// Index of command `command`, interning it if new. A command is cut to
    /// [`MAX_COMMAND_LEN`] bytes; an empty one is stored as `[unknown command]`
    /// ([`UNKNOWN_COMMAND`]).
    pub fn command_index(&mut self, command: &[u8]) -> u32 {
        let command = match command {
            [] => UNKNOWN_COMMAND.as_bytes(),
            c => &c[..c.len().min(MAX_COMMAND_LEN)],
        };
        if let Some(&i) = self.command_ix.get(command) {
            return i;
        }
        let i = self.commands.len() as u32;
        self.commands.push(command.to_vec());
        self.command_ix.insert(command.to_vec(), i);
        i
    }

    /// Record JIT symbols (from the process's perf map) of image `image`, which must be an
    /// `Anon` image (others are ignored). Symbols accumulate across calls and merges.
    pub fn add_jit_symbols<'a>(
        &mut self,
        image: u32,
        symbols: impl IntoIterator<Item = &'a JitSymbol>,
    ) {
        if self.images.get(image as usize).is_none_or(|i| i.kind != ImageKind::Anon) {
            return;
        }
        let set = self.jit.entry(image).or_default();
        set.extend(symbols.into_iter().cloned());
        if set.is_empty() {
            self.jit.remove(&image);
        }
    }

    /// The JIT symbols of image `image`, sorted by (start, size, name).
    pub fn jit_symbols(&self, image: u32) -> impl Iterator<Item = &JitSymbol> {
        self.jit.get(&image).into_iter().flatten()
    }

    /// Add `samples` to a stack (leaf first; frames index [`Self::images`]). An empty stack or
    /// 0 samples adds nothing; a stack deeper than [`MAX_STACK_DEPTH`] is cut there and marked
    /// truncated. Panics never: frames naming no image are the caller's bug and are dropped.
    pub fn add(&mut self, frames: &[Frame], truncated: bool, samples: u64) {
        self.add_command(None, frames, truncated, samples);
    }

    /// [`Self::add`] for a stack run by command `command` (an index of
    /// [`Self::command_index`]; `None`: not known, as in files before version 3).
    pub fn add_command(
        &mut self,
        command: Option<u32>,
        frames: &[Frame],
        truncated: bool,
        samples: u64,
    ) {
        if samples == 0 || frames.is_empty() {
            return;
        }
        if frames.iter().any(|f| f.0 as usize >= self.images.len())
            || command.is_some_and(|c| c as usize >= self.commands.len())
        {
            debug_assert!(false, "frame names an image, or a stack a command, not interned");
            return;
        }
        let (frames, truncated) = if frames.len() > MAX_STACK_DEPTH {
            (&frames[..MAX_STACK_DEPTH], true)
        } else {
            (frames, truncated)
        };
        let c = self.stacks.entry((command, frames.to_vec(), truncated)).or_insert(0);
        *c = c.saturating_add(samples);
    }

    /// Every stack, in no particular order.
    pub fn stacks(&self) -> impl Iterator<Item = StackRef<'_>> {
        self.stacks.iter().map(|((c, f, t), &n)| StackRef {
            command: c.map(|c| self.commands[c as usize].as_slice()),
            frames: f,
            truncated: *t,
            samples: n,
        })
    }

    /// Total samples over every stack.
    pub fn samples(&self) -> u64 {
        self.stacks.values().fold(0u64, |a, &n| a.saturating_add(n))
    }

    /// Samples of stacks flagged truncated.
    pub fn truncated_samples(&self) -> u64 {
        self.stacks.iter().filter(|((_, _, t), _)| *t).fold(0u64, |a, (_, &n)| a.saturating_add(n))
    }

    /// Add every count of `other` (host and epoch of `self` are kept; the sequence becomes the
    /// larger one). Commutative and
    /// associative on the counts. Stacks of another event are refused (`MergeMismatch`).
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        if self.event != other.event {
            return Err(Error::MergeMismatch(format!(
                "stack profiles of events {:?} and {:?}",
                self.event, other.event
            )));
        }
        self.sequence = self.sequence.max(other.sequence);
        let map: Vec<u32> = other.images.iter().map(|i| self.image_index(i)).collect();
        for (&i, syms) in &other.jit {
            self.add_jit_symbols(map[i as usize], syms);
        }
        let cmap: Vec<u32> = other.commands.iter().map(|c| self.command_index(c)).collect();
        let mut buf = Vec::new();
        for ((c, frames, t), &n) in &other.stacks {
            buf.clear();
            buf.extend(frames.iter().map(|&(i, o)| (map[i as usize], o)));
            self.add_command(c.map(|c| cmap[c as usize]), &buf, *t, n);
        }
        Ok(())
    }

    /// The uncompressed payload in canonical order (§13) and the version it is written as
    /// ([`STACKS_VERSION`]).
    fn encode_payload(&self) -> (Vec<u8>, u16) {
        // Used commands, sorted; old index -> new (0 is "no command", 1.. the dictionary).
        let mut cmds: Vec<u32> = {
            let mut used = vec![false; self.commands.len()];
            self.stacks.keys().filter_map(|k| k.0).for_each(|c| used[c as usize] = true);
            (0..self.commands.len() as u32).filter(|&c| used[c as usize]).collect()
        };
        cmds.sort_by(|&a, &b| self.commands[a as usize].cmp(&self.commands[b as usize]));
        let mut cremap = vec![0u64; self.commands.len()];
        for (new, &old) in cmds.iter().enumerate() {
            cremap[old as usize] = new as u64 + 1;
        }
        let has_commands = !cmds.is_empty();
        // Used images, sorted; old index -> new.
        let mut used = vec![false; self.images.len()];
        for (_, f, _) in self.stacks.keys() {
            f.iter().for_each(|&(i, _)| used[i as usize] = true);
        }
        let mut order: Vec<u32> =
            (0..self.images.len() as u32).filter(|&i| used[i as usize]).collect();
        order.sort_by(|&a, &b| self.images[a as usize].cmp(&self.images[b as usize]));
        let mut remap = vec![0u64; self.images.len()];
        for (new, &old) in order.iter().enumerate() {
            remap[old as usize] = new as u64;
        }
        let mut frames: Vec<(u64, u64)> = self
            .stacks
            .keys()
            .flat_map(|(_, f, _)| f.iter().map(|&(i, o)| (remap[i as usize], o)))
            .collect();
        frames.sort_unstable();
        frames.dedup();
        let frame_ix: HashMap<(u64, u64), u64> =
            frames.iter().enumerate().map(|(i, &f)| (f, i as u64)).collect();
        // Sorted by (command, frames, flags): a command's stacks are adjacent, which zlib likes.
        let mut stacks: Vec<(u64, Vec<u64>, bool, u64)> = self
            .stacks
            .iter()
            .map(|((c, f, t), &n)| {
                let c = c.map_or(0, |c| cremap[c as usize]);
                (c, f.iter().map(|&(i, o)| frame_ix[&(remap[i as usize], o)]).collect(), *t, n)
            })
            .collect();
        stacks.sort_unstable();

        let mut out = Vec::new();
        put_bytes(&mut out, self.host.as_bytes());
        put_bytes(&mut out, self.epoch.as_bytes());
        put_bytes(&mut out, self.event.as_bytes());
        varint::write_u64(&mut out, self.sequence);
        varint::write_u64(&mut out, order.len() as u64);
        for &i in &order {
            let img = &self.images[i as usize];
            out.push(img.kind as u8);
            codec::put_image_id(&mut out, &img.id);
            put_bytes(&mut out, &img.path);
        }
        varint::write_u64(&mut out, frames.len() as u64);
        let mut prev: Option<(u64, u64)> = None;
        for &(img, off) in &frames {
            match prev {
                Some((pi, po)) if pi == img => {
                    varint::write_u64(&mut out, 0);
                    varint::write_u64(&mut out, off - po - 1);
                }
                Some((pi, _)) => {
                    varint::write_u64(&mut out, img - pi);
                    varint::write_u64(&mut out, off);
                }
                None => {
                    varint::write_u64(&mut out, img);
                    varint::write_u64(&mut out, off);
                }
            }
            prev = Some((img, off));
        }
        if has_commands {
            // Version 3: the command dictionary (field 9a).
            varint::write_u64(&mut out, cmds.len() as u64);
            for &c in &cmds {
                put_bytes(&mut out, &self.commands[c as usize]);
            }
        }
        varint::write_u64(&mut out, stacks.len() as u64);
        for (c, f, t, n) in &stacks {
            if has_commands {
                varint::write_u64(&mut out, *c);
            }
            varint::write_u64(&mut out, if *t { FLAG_TRUNCATED } else { 0 });
            varint::write_u64(&mut out, f.len() as u64);
            f.iter().for_each(|&i| varint::write_u64(&mut out, i));
            varint::write_u64(&mut out, *n);
        }
        // Version 2: the JIT symbols of used images, by new image index.
        let mut jit: Vec<(u64, &BTreeSet<JitSymbol>)> = self
            .jit
            .iter()
            .filter(|(&i, syms)| used.get(i as usize).copied().unwrap_or(false) && !syms.is_empty())
            .map(|(&i, syms)| (remap[i as usize], syms))
            .collect();
        jit.sort_unstable_by_key(|(i, _)| *i);
        let has_jit = !jit.is_empty();
        // Version 3 always has the table (count 0 when empty); version 2 only when non-empty.
        if has_jit || has_commands {
            varint::write_u64(&mut out, jit.len() as u64);
            for (i, syms) in jit {
                varint::write_u64(&mut out, i);
                write_jit_symbols(&mut out, syms.iter());
            }
        }
        (out, Self::version_of(has_jit, has_commands))
    }

    /// The version a file is written as (see [`STACKS_VERSION`]).
    fn version_of(has_jit: bool, has_commands: bool) -> u16 {
        match (has_commands, has_jit) {
            (true, _) => 3,
            (false, true) => 2,
            (false, false) => 1,
        }
    }

    /// The file's bytes (FORMAT.md §13).
    pub fn encode(&self) -> Vec<u8> {
        let (payload, version) = self.encode_payload();
        // Stacks share long frame runs: zlib makes the file several times smaller.
        codec::finish_zlib(STACKS_MAGIC, version, &payload)
    }

    /// Parse and validate a file's bytes; `path` names it in errors. Accepts only the
    /// canonical encoding.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let payload = codec::open_zlib(bytes, path, STACKS_MAGIC, "stack profile", STACKS_VERSION)?;
        // open_zlib checked the container: magic, then the version (u16 LE), at most ours.
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let mut r = Reader::new(&payload, path);
        let host = r.string("host")?;
        let epoch = r.string("epoch")?;
        let event = r.string("event")?;
        let mut p = Self::new(&host, &epoch, &event);
        p.sequence = r.varint("sequence")?;
        // kind, tag, id length + >= 1 byte, path length.
        let nimages = r.count("images", 5)?;
        for _ in 0..nimages {
            let kind = r.image_kind("image kind")?;
            let id = r.image_id("image id")?.to_owned_id();
            let img = StackImage { kind, id, path: r.bytes("image path")?.to_vec() };
            if p.images.last().is_some_and(|l| *l >= img) {
                return Err(r.corrupt("images", "not sorted or not distinct"));
            }
            p.image_index(&img);
        }
        let nframes = r.count("frames", 2)?;
        let mut frames: Vec<Frame> = Vec::with_capacity(nframes);
        for _ in 0..nframes {
            let di = r.varint("frame image")?;
            let o = r.varint("frame offset")?;
            let (img, off) = match frames.last() {
                None => (di, o),
                Some(&(pi, po)) if di == 0 => {
                    let off = po
                        .checked_add(o)
                        .and_then(|x| x.checked_add(1))
                        .ok_or_else(|| r.corrupt("frame offset", "beyond 2^64-1"))?;
                    (u64::from(pi), off)
                }
                Some(&(pi, _)) => (
                    u64::from(pi)
                        .checked_add(di)
                        .ok_or_else(|| r.corrupt("frame image", "index overflow"))?,
                    o,
                ),
            };
            if img >= p.images.len() as u64 {
                return Err(r.corrupt(
                    "frame image",
                    format!("index {img} beyond {} images", p.images.len()),
                ));
            }
            frames.push((img as u32, off));
        }
        // Version 3: the command dictionary; every stack then names one of its commands.
        let ncommands = if version >= 3 { r.count("commands", 2)? } else { 0 };
        for _ in 0..ncommands {
            let c = r.bytes("command")?;
            if c.is_empty() || c.len() > MAX_COMMAND_LEN {
                return Err(
                    r.corrupt("command", format!("{} bytes (1..={MAX_COMMAND_LEN})", c.len()))
                );
            }
            if p.commands.last().is_some_and(|l| l.as_slice() >= c) {
                return Err(r.corrupt("commands", "not sorted or not distinct"));
            }
            p.command_index(c);
        }
        // [command], flags, depth, >= 1 frame, samples.
        let nstacks = r.count("stacks", if version >= 3 { 5 } else { 4 })?;
        let mut prev: Option<(u64, Vec<u64>, bool)> = None;
        let mut buf: Vec<Frame> = Vec::new();
        for _ in 0..nstacks {
            let command = if version >= 3 {
                let c = r.varint("stack command")?;
                if c > p.commands.len() as u64 {
                    return Err(r.corrupt(
                        "stack command",
                        format!("index {c} beyond {} commands", p.commands.len()),
                    ));
                }
                c
            } else {
                0
            };
            let flags = r.varint("stack flags")?;
            if flags & !FLAG_TRUNCATED != 0 {
                return Err(r.corrupt("stack flags", format!("unknown flags {flags:#x}")));
            }
            let depth = r.count("stack depth", 1)?;
            if depth == 0 || depth > MAX_STACK_DEPTH {
                return Err(
                    r.corrupt("stack depth", format!("{depth} frames (1..={MAX_STACK_DEPTH})"))
                );
            }
            let mut ix = Vec::with_capacity(depth);
            buf.clear();
            for _ in 0..depth {
                let i = r.varint("stack frame")?;
                let f = usize::try_from(i).ok().and_then(|i| frames.get(i)).ok_or_else(|| {
                    r.corrupt("stack frame", format!("index {i} beyond {} frames", frames.len()))
                })?;
                buf.push(*f);
                ix.push(i);
            }
            let n = r.varint("stack samples")?;
            if n == 0 {
                return Err(r.corrupt("stack samples", "zero count"));
            }
            let key = (command, ix, flags & FLAG_TRUNCATED != 0);
            if prev.as_ref().is_some_and(|p| *p >= key) {
                return Err(r.corrupt("stacks", "not sorted or not distinct"));
            }
            let command = command.checked_sub(1).map(|c| c as u32);
            p.stacks.insert((command, buf.clone(), key.2), n);
            prev = Some(key);
        }
        if version >= 2 {
            // image, symbol count, >= 1 symbol of start, size, name length.
            let njit = r.count("jit images", 5)?;
            let mut prev_image: Option<u64> = None;
            for _ in 0..njit {
                let i = r.varint("jit image")?;
                if prev_image.is_some_and(|p| p >= i) {
                    return Err(r.corrupt("jit image", "not sorted or not distinct"));
                }
                prev_image = Some(i);
                let img =
                    usize::try_from(i).ok().and_then(|i| p.images.get(i)).ok_or_else(|| {
                        r.corrupt(
                            "jit image",
                            format!("index {i} beyond {} images", p.images.len()),
                        )
                    })?;
                if img.kind != ImageKind::Anon {
                    return Err(
                        r.corrupt("jit image", format!("{:?} image with JIT symbols", img.kind))
                    );
                }
                let syms = read_jit_symbols(&mut r)?;
                if syms.is_empty() || syms.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(r.corrupt("jit_symbols", "empty, not sorted or not distinct"));
                }
                p.add_jit_symbols(i as u32, &syms);
            }
        }
        r.finish()?;
        // Unused images, frames or commands would make two encodings of one profile.
        let (canonical, want) = p.encode_payload();
        if canonical != payload {
            return Err(codec::corrupt(path, "frames", "entries no stack uses"));
        }
        // Version 2 only with JIT symbols, 3 only with commands: one encoding per content.
        if version != want {
            return Err(codec::corrupt(
                path,
                "version",
                format!("version {version} for content written as version {want}"),
            ));
        }
        Ok(p)
    }

    pub fn read(path: &Path) -> Result<Self> {
        let bytes = safeio::read_container(path, STACKS_MAGIC, "stack profile", STACKS_VERSION)?;
        Self::decode(&bytes, path)
    }

    /// Write atomically (FORMAT.md §2). Returns the bytes written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        let bytes = self.encode();
        crate::write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }
}

/// The event component of a stack file name (`stacks.cpu-clock.stk` → `cpu-clock`), if `name`
/// is one.
pub fn stacks_file_event_component(name: &str) -> Option<&str> {
    name.strip_prefix(STACKS_PREFIX)?.strip_suffix(STACKS_SUFFIX).filter(|c| !c.is_empty())
}

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// The stack profile of an event (FORMAT.md §13).
    pub fn stacks_path(&self, event_name: &str) -> PathBuf {
        self.path.join(format!(
            "{}{}{}",
            STACKS_PREFIX,
            event_file_component(event_name),
            STACKS_SUFFIX
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::ZlibEncoder;

    fn img(kind: ImageKind, name: &str) -> StackImage {
        StackImage { kind, id: ImageId::special(name, b""), path: name.as_bytes().to_vec() }
    }

    pub(crate) fn sample() -> StackProfile {
        let mut p = StackProfile::new("web-01", "20261125T000000Z", "cpu-clock");
        let exe = p.image_index(&StackImage {
            kind: ImageKind::Elf,
            id: ImageId::from_build_id(&[0xab; 20]).unwrap(),
            path: b"/usr/bin/app".to_vec(),
        });
        let k = p.image_index(&img(ImageKind::Kernel, "[kernel.kallsyms]"));
        p.add(&[(exe, 0x1130), (exe, 0x1160), (exe, 0x1190), (exe, 0x10a0)], false, 600);
        p.add(&[(exe, 0x1130), (exe, 0x1170), (exe, 0x1190), (exe, 0x10a0)], false, 400);
        p.add(&[(k, 0xffff), (k, 0x10), (exe, 0x1130), (exe, 0x1160)], true, 7);
        p.add(&[(exe, 0x1130)], true, 3);
        p
    }

    #[test]
    fn jit_symbols_of_caller_only_regions_make_version_2() {
        let path = Path::new("stacks.cpu-clock.stk");
        // Without JIT symbols a file stays version 1, readable by readers of version 1.
        assert_eq!(u16::from_le_bytes([sample().encode()[8], sample().encode()[9]]), 1);
        let mut p = sample();
        let exe = 0;
        let jit = p.image_index(&img(ImageKind::Anon, "[anon:4242]"));
        p.add(&[(exe, 0x1130), (jit, 0x7f00_0010), (exe, 0x10a0)], false, 5);
        let f = JitSymbol { start: 0x7f00_0000, size: 0x40, name: "LazyCompile:handler".into() };
        let g = JitSymbol { start: 0x7f00_0040, size: 0x10, name: "g".into() };
        p.add_jit_symbols(jit, [&f]);
        // Symbols of a non-anonymous image are not recorded.
        p.add_jit_symbols(exe, [&g]);
        assert_eq!(p.jit_symbols(exe).count(), 0);
        let b = p.encode();
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 2);
        let back = StackProfile::decode(&b, path).expect("decode v2");
        assert_eq!(back, p);
        assert_eq!(back.encode(), b);
        let ji = back.images().iter().position(|i| i.kind == ImageKind::Anon).unwrap() as u32;
        assert_eq!(back.jit_symbols(ji).collect::<Vec<_>>(), vec![&f]);
        // Merging unions the symbols.
        let mut other = StackProfile::new("web-01", "20261125T000000Z", "cpu-clock");
        let oj = other.image_index(&img(ImageKind::Anon, "[anon:4242]"));
        other.add(&[(oj, 0x7f00_0044)], false, 1);
        other.add_jit_symbols(oj, [&g]);
        let mut m = back.clone();
        m.merge(&other).unwrap();
        let mi = m.images().iter().position(|i| i.kind == ImageKind::Anon).unwrap() as u32;
        assert_eq!(m.jit_symbols(mi).collect::<Vec<_>>(), vec![&f, &g]);
        // A version 2 container around content without JIT symbols is not canonical.
        let v2 = codec::finish_zlib(STACKS_MAGIC, 2, &sample().encode_payload().0);
        assert!(matches!(StackProfile::decode(&v2, path), Err(Error::Corrupt { .. })));
        for n in 0..b.len() {
            assert!(StackProfile::decode(&b[..n], path).is_err(), "truncated at {n} accepted");
        }
    }

    /// A version 3 file written by hand from FORMAT.md §13: one image, one frame, the given
    /// commands, and one stack per entry of `stacks` (command index, frame index).
    fn hand_v3(commands: &[&[u8]], stacks: &[(u64, u64)]) -> Vec<u8> {
        let mut pl = Vec::new();
        for f in ["h", "20261125T000000Z", "cpu-clock"] {
            put_bytes(&mut pl, f.as_bytes());
        }
        varint::write_u64(&mut pl, 0);
        varint::write_u64(&mut pl, 1);
        pl.push(ImageKind::Elf as u8);
        pl.push(codec::ID_TAG_FALLBACK);
        put_bytes(&mut pl, &[1; 16]);
        put_bytes(&mut pl, b"/x");
        for v in [1u64, 0, 0x40] {
            varint::write_u64(&mut pl, v);
        }
        varint::write_u64(&mut pl, commands.len() as u64);
        commands.iter().for_each(|c| put_bytes(&mut pl, c));
        varint::write_u64(&mut pl, stacks.len() as u64);
        for &(c, f) in stacks {
            for v in [c, 0, 1, f, 9] {
                varint::write_u64(&mut pl, v);
            }
        }
        varint::write_u64(&mut pl, 0); // no JIT images
        codec::finish_zlib(STACKS_MAGIC, 3, &pl)
    }

    #[test]
    fn commands_make_version_3_and_old_versions_still_read() {
        let path = Path::new("stacks.cpu-clock.stk");
        let mut p = sample();
        let exe = 0;
        let pg = p.command_index(b"postgres");
        let bench = p.command_index(b"pgbench");
        // The same frames under two commands are two stacks; a third copy has no command.
        p.add_command(Some(pg), &[(exe, 0x1130), (exe, 0x10a0)], false, 5);
        p.add_command(Some(bench), &[(exe, 0x1130), (exe, 0x10a0)], false, 2);
        p.add_command(Some(bench), &[(exe, 0x1130), (exe, 0x10a0)], false, 1);
        let b = p.encode();
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 3);
        let back = StackProfile::decode(&b, path).expect("decode v3");
        assert_eq!(back, p);
        assert_eq!(back.encode(), b, "re-encoding changes the bytes");
        let mut by_cmd: Vec<(Option<&[u8]>, u64)> =
            back.stacks().filter(|s| s.frames.len() == 2).map(|s| (s.command, s.samples)).collect();
        by_cmd.sort();
        assert_eq!(by_cmd, [(Some(&b"pgbench"[..]), 3), (Some(&b"postgres"[..]), 5)]);
        // Stacks of a version 1 file have no command, and keep none when merged into version 3.
        let v1 = sample().encode();
        assert_eq!(u16::from_le_bytes([v1[8], v1[9]]), 1);
        let old = StackProfile::decode(&v1, path).expect("decode v1");
        assert!(old.stacks().all(|s| s.command.is_none()));
        let mut m = back.clone();
        m.merge(&old).unwrap();
        assert_eq!(m.samples(), back.samples() + old.samples());
        assert_eq!(m.stacks().filter(|s| s.command.is_none()).count(), old.stacks().count());
        let mb = m.encode();
        assert_eq!(StackProfile::decode(&mb, path).unwrap(), m);
        // Interning order does not change the bytes.
        let mut q = StackProfile::new(&p.host, &p.epoch, &p.event);
        q.merge(&back).unwrap();
        assert_eq!(q.encode(), b);
        for n in 0..b.len() {
            assert!(StackProfile::decode(&b[..n], path).is_err(), "truncated at {n} accepted");
        }
        // An empty command is stored as the unknown one, a long one cut.
        let mut e = StackProfile::new("h", "e", "cpu-clock");
        let i = e.image_index(&img(ImageKind::Elf, "/x"));
        let c = e.command_index(b"");
        let long = e.command_index(&[b'a'; 300]);
        e.add_command(Some(c), &[(i, 1)], false, 1);
        e.add_command(Some(long), &[(i, 1)], false, 1);
        let e = StackProfile::decode(&e.encode(), path).unwrap();
        let mut cmds: Vec<usize> = e.stacks().map(|s| s.command.unwrap().len()).collect();
        cmds.sort_unstable();
        assert_eq!(cmds, [UNKNOWN_COMMAND.len(), MAX_COMMAND_LEN]);
    }

    #[test]
    fn hostile_version_3_files_are_corrupt_naming_the_field() {
        let path = Path::new("stacks.cpu-clock.stk");
        let ok = StackProfile::decode(&hand_v3(&[b"a", b"b"], &[(1, 0), (2, 0)]), path)
            .expect("hand-written v3");
        assert_eq!(ok.samples(), 18);
        let field = |b: Vec<u8>| match StackProfile::decode(&b, path) {
            Err(Error::Corrupt { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        // A command index beyond the dictionary (index 0 is "no command", 1..=n the entries).
        assert_eq!(field(hand_v3(&[b"a"], &[(2, 0)])), "stack command");
        assert_eq!(field(hand_v3(&[b"a"], &[(u64::MAX, 0)])), "stack command");
        // The dictionary must be sorted, distinct and its entries 1..=255 bytes.
        assert_eq!(field(hand_v3(&[b"b", b"a"], &[(1, 0), (2, 0)])), "commands");
        assert_eq!(field(hand_v3(&[b"a", b"a"], &[(1, 0), (2, 0)])), "commands");
        assert_eq!(field(hand_v3(&[b""], &[(1, 0)])), "command");
        assert_eq!(field(hand_v3(&[&[b'x'; 256]], &[(1, 0)])), "command");
        // More commands than bytes left.
        let mut huge = hand_v3(&[b"a"], &[(1, 0)]);
        let pl = codec::open_zlib(&huge, path, STACKS_MAGIC, "t", 3).unwrap();
        // The command count: before "a" (2 bytes), the stack count, 5 varints and the JIT count.
        let at = pl.len() - 10;
        assert_eq!(pl[at], 1);
        let mut pl2 = pl[..at].to_vec();
        varint::write_u64(&mut pl2, 1 << 40);
        pl2.extend_from_slice(&pl[at + 1..]);
        huge = codec::finish_zlib(STACKS_MAGIC, 3, &pl2);
        assert_eq!(field(huge), "commands");
        // A command no stack uses, or a version 3 file without commands, is not canonical.
        assert_eq!(field(hand_v3(&[b"a", b"b"], &[(1, 0)])), "frames");
        assert_eq!(field(hand_v3(&[], &[(0, 0)])), "frames");
        // Stacks out of (command, frames, flags) order.
        assert_eq!(field(hand_v3(&[b"a", b"b"], &[(2, 0), (1, 0)])), "stacks");
    }

    #[test]
    fn roundtrip_merge_and_canonical() {
        let p = sample();
        let b = p.encode();
        let path = Path::new("stacks.cpu-clock.stk");
        let back = StackProfile::decode(&b, path).expect("decode");
        assert_eq!(back, p);
        assert_eq!(back.samples(), 1010);
        assert_eq!(back.truncated_samples(), 10);
        assert_eq!(back.encode(), b, "re-encoding changes the bytes");
        let mut m = p.clone();
        m.merge(&back).unwrap();
        assert_eq!(m.samples(), 2020);
        assert_eq!(m.stacks().count(), p.stacks().count());
        for n in 0..b.len() {
            assert!(StackProfile::decode(&b[..n], path).is_err(), "truncated at {n} accepted");
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x5a;
            assert!(StackProfile::decode(&c, path).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn interning_order_does_not_change_the_bytes() {
        let p = sample();
        // Same stacks, images interned in the other order, stacks added in reverse.
        let mut q = StackProfile::new(&p.host, &p.epoch, &p.event);
        let k = q.image_index(&img(ImageKind::Kernel, "[kernel.kallsyms]"));
        let exe = q.image_index(&p.images()[0]);
        q.add(&[(exe, 0x1130)], true, 3);
        q.add(&[(k, 0xffff), (k, 0x10), (exe, 0x1130), (exe, 0x1160)], true, 7);
        q.add(&[(exe, 0x1130), (exe, 0x1170), (exe, 0x1190), (exe, 0x10a0)], false, 400);
        q.add(&[(exe, 0x1130), (exe, 0x1160), (exe, 0x1190), (exe, 0x10a0)], false, 600);
        assert_eq!(q.encode(), p.encode());
        // An image no stack uses is not written.
        q.image_index(&img(ImageKind::Vdso, "[vdso]"));
        assert_eq!(q.encode(), p.encode());
    }

    #[test]
    fn merge_refuses_other_events_and_deep_stacks_are_cut() {
        let mut p = sample();
        let other = StackProfile::new("web-01", "20261125T000000Z", "page-faults");
        assert!(matches!(p.merge(&other), Err(Error::MergeMismatch(_))));
        let mut d = StackProfile::new("h", "20261125T000000Z", "cpu-clock");
        let i = d.image_index(&img(ImageKind::Elf, "/x"));
        let deep: Vec<Frame> = (0..MAX_STACK_DEPTH as u64 + 5).map(|o| (i, o)).collect();
        d.add(&deep, false, 1);
        let s = d.stacks().next().unwrap();
        assert_eq!((s.frames.len(), s.truncated), (MAX_STACK_DEPTH, true));
        let b = d.encode();
        assert_eq!(StackProfile::decode(&b, Path::new("x")).unwrap(), d);
    }

    #[test]
    fn newer_version_is_refused_cleanly() {
        let mut b = sample().encode();
        b[8..10].copy_from_slice(&(STACKS_VERSION + 1).to_le_bytes());
        match StackProfile::decode(&b, Path::new("x/stacks.cpu-clock.stk")) {
            Err(Error::UnknownVersion { version, supported, .. }) => {
                assert_eq!((version, supported), (STACKS_VERSION + 1, STACKS_VERSION))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn atomic_write_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stacks.cpu-clock.stk");
        let p = sample();
        let n = p.write(&path).unwrap();
        assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        assert_eq!(StackProfile::read(&path).unwrap(), p);
        // A payload written by hand from FORMAT.md §13: one image, one frame, one stack.
        let build = |extra_image: bool| {
            let mut pl = Vec::new();
            for f in ["h", "20261125T000000Z", "cpu-clock"] {
                put_bytes(&mut pl, f.as_bytes());
            }
            varint::write_u64(&mut pl, 0);
            varint::write_u64(&mut pl, 1 + u64::from(extra_image));
            for (kind, name) in [(ImageKind::Elf, "/x"), (ImageKind::Vdso, "[vdso]")]
                .iter()
                .take(1 + usize::from(extra_image))
            {
                pl.push(*kind as u8);
                pl.push(codec::ID_TAG_FALLBACK);
                put_bytes(&mut pl, &[*kind as u8; 16]);
                put_bytes(&mut pl, name.as_bytes());
            }
            for v in [1u64, 0, 0x40, 1, 0, 1, 0, 9] {
                // frames: 1, (image 0, offset 0x40); stacks: 1, (flags 0, depth 1, frame 0, 9)
                varint::write_u64(&mut pl, v);
            }
            let mut z = ZlibEncoder::new(Vec::new(), flate2::Compression::best());
            std::io::Write::write_all(&mut z, &pl).unwrap();
            let mut file = codec::begin(STACKS_MAGIC, 1);
            file.extend_from_slice(&z.finish().unwrap());
            codec::finish(file)
        };
        let ok = StackProfile::decode(&build(false), &path).expect("hand-written file");
        assert_eq!(ok.samples(), 9);
        assert_eq!(ok.stacks().next().unwrap().frames, &[(0, 0x40)]);
        // The same with an image no stack uses: valid checksum, not canonical, refused.
        match StackProfile::decode(&build(true), &path) {
            Err(Error::Corrupt { field: "frames", .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn file_names() {
        assert_eq!(stacks_file_event_component("stacks.cpu-clock.stk"), Some("cpu-clock"));
        assert_eq!(stacks_file_event_component("stacks..stk"), None);
        assert_eq!(stacks_file_event_component("b12.cpu-clock.prof"), None);
    }
}
