//! Spool records of kind 3: a flush's call-stack increments (`callchains = "fp"`).
//!
//! ```text
//! kind 3 (a flush's stacks):
//! seq, epoch (bytes), n, each: event (name, perf_type, perf_config, period_mean, period_min,
//!       period_max), stack profile (bytes: a whole `stacks.*.stk` file, FORMAT.md §13, with
//!       its own CRC; host empty)
//! ```
//!
//! Each entry is indexed under the key (epoch, image [`STACKS_KEY_IMAGE`], event), which no
//! image id text can be (those start with `b` or `f` and are hex), so that the marks of kind 2
//! and segment deletion treat stack increments like any other; a reader of an older build
//! quarantines the record (unknown kind) and publishes the rest. Kinds 1 and 2 are unchanged.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use profile_format::{varint, EventDesc, StackProfile};

use super::{
    decode_event, encode_event, put_bytes, Cursor, Loc, Parsed, Spool, SpoolError, SpoolKey,
    SpooledIncrement, RECORD_HEADER,
};

/// Record kind of stack increments.
pub(super) const KIND_STACKS: u64 = 3;

/// The image text of stack increments' spool keys.
pub const STACKS_KEY_IMAGE: &str = "stacks";

/// Parse a kind-3 record (the kind already read) far enough to index it.
pub(super) fn parse_stacks(mut c: Cursor<'_>) -> Result<Parsed, String> {
    let seq = c.u()?;
    let epoch = c.string()?;
    let n = c.u()?;
    let mut entries = Vec::new();
    for _ in 0..n {
        let start = c.pos;
        let desc = decode_event(&mut c)?;
        c.bytes()?;
        entries.push((
            Some(STACKS_KEY_IMAGE.to_owned()),
            start as u64,
            (c.pos - start) as u32,
            Arc::new(desc),
            None,
        ));
    }
    if c.pos != c.buf.len() {
        return Err(format!("{} bytes after the stack increments", c.buf.len() - c.pos));
    }
    Ok(Parsed { seq, epoch, delta: Default::default(), entries })
}

impl Spool {
    /// Append one record of stack increments of `epoch` (one profile per event). Returns its
    /// sequence number.
    pub fn append_stacks(
        &mut self,
        epoch: &str,
        stacks: &[(&EventDesc, &StackProfile)],
        now: Instant,
    ) -> Result<u64, SpoolError> {
        self.writer(now)?;
        let seq = self.next_seq();
        let mut p = Vec::new();
        varint::write_u64(&mut p, KIND_STACKS);
        varint::write_u64(&mut p, seq);
        put_bytes(&mut p, epoch.as_bytes());
        varint::write_u64(&mut p, stacks.len() as u64);
        let mut spans = Vec::with_capacity(stacks.len());
        for (desc, profile) in stacks {
            let start = p.len();
            encode_event(&mut p, desc);
            put_bytes(&mut p, &profile.encode());
            spans.push((start, p.len() - start));
        }
        let segment = self.writer.as_ref().expect("writer opened").segment;
        let start = self.write_record(segment, &p)?;
        let payload_at = start + RECORD_HEADER;
        let seg = self.segments.get_mut(&segment).expect("writer's segment is open");
        for ((desc, _), (off, len)) in stacks.iter().zip(spans) {
            let key = SpoolKey {
                epoch: epoch.to_owned(),
                image: Some(STACKS_KEY_IMAGE.to_owned()),
                event: desc.name.clone(),
            };
            self.keys.entry(key).or_default().push(Loc {
                seq,
                segment,
                offset: payload_at + off as u64,
                len: len as u32,
                desc: Arc::new((*desc).clone()),
                image: None,
            });
            seg.refs += 1;
        }
        Ok(seq)
    }

    /// The stack profile of a stack increment. `None` if it can no longer be decoded: it is
    /// then counted as quarantined and the caller goes on without it.
    pub fn stack_profile(&mut self, inc: &SpooledIncrement) -> Option<StackProfile> {
        let loc = &inc.loc;
        let seg = self.segments.get(&loc.segment)?;
        let mut buf = vec![0u8; loc.len as usize];
        let decoded =
            seg.file.read_exact_at(&mut buf, loc.offset).map_err(|e| e.to_string()).and_then(
                |()| {
                    let mut c = Cursor { buf: &buf, pos: 0 };
                    decode_event(&mut c)?;
                    let bytes = c.bytes()?;
                    StackProfile::decode(bytes, Path::new("spool stack increment"))
                        .map_err(|e| e.to_string())
                },
            );
        match decoded {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(file = %seg.path.display(), offset = loc.offset, error = %e,
                    "spool: stack increment unreadable; quarantined");
                self.quarantine_increment(loc.segment);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile_format::{ImageId, ImageKind, StackImage};
    use std::time::Duration;

    fn desc() -> EventDesc {
        EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1_000_000,
            period_min: 937_500,
            period_max: 1_000_000,
        }
    }

    fn profile(n: u64) -> StackProfile {
        let mut p = StackProfile::new("", "20261125T000000Z", "cpu-clock");
        let i = p.image_index(&StackImage {
            kind: ImageKind::Elf,
            id: ImageId::from_build_id(&[7; 20]).unwrap(),
            path: b"/bin/app".to_vec(),
        });
        p.add(&[(i, 0x10), (i, 0x40)], false, n);
        p
    }

    #[test]
    fn stack_increments_survive_a_restart_and_marks_retire_them() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        let d = desc();
        let (mut sp, _) = Spool::open(dir.path(), Duration::from_secs(60)).unwrap();
        let s1 = sp.append_stacks("20261125T000000Z", &[(&d, &profile(3))], now).unwrap();
        let s2 = sp.append_stacks("20261125T000000Z", &[(&d, &profile(4))], now).unwrap();
        assert!(s2 > s1);
        drop(sp);
        // As after kill -9: everything is found again, in order.
        let (mut sp, rec) = Spool::open(dir.path(), Duration::from_secs(60)).unwrap();
        assert_eq!(rec.quarantined, 0);
        let key = SpoolKey {
            epoch: "20261125T000000Z".into(),
            image: Some(STACKS_KEY_IMAGE.into()),
            event: "cpu-clock".into(),
        };
        assert_eq!(rec.keys, vec![key.clone()]);
        let incs = sp.increments(&key);
        let counts: Vec<u64> =
            incs.iter().map(|i| sp.stack_profile(i).expect("readable").samples()).collect();
        assert_eq!(counts, [3, 4]);
        sp.published(&key, s1);
        sp.write_marks(now).unwrap();
        drop(sp);
        let (sp, _) = Spool::open(dir.path(), Duration::from_secs(60)).unwrap();
        let left: Vec<u64> = sp.increments(&key).iter().map(|i| i.seq).collect();
        assert_eq!(left, [s2], "the published increment is not offered again");
    }
}
