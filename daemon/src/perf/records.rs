//! Parsing of the records our events produce. The layout is fixed by
//! [`crate::sys::perf::SAMPLE_TYPE`] (IDENTIFIER, IP, TID, TIME, CPU, with
//! `sample_id_all`), so a small parser reads exactly that and nothing else; it allocates only for
//! side-band records (file names, comm), never for samples.

use crate::perf::ring::RawRecord;
use crate::sys::perf as sp;
use crate::types::{SideBand, TimedSideBand};

/// A `PERF_RECORD_SAMPLE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub identifier: u64,
    pub ip: u64,
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: u32,
    pub kernel: bool,
    /// `PERF_SAMPLE_CGROUP`, when the events were opened with it (0 otherwise).
    pub cgroup: u64,
    /// `PERF_SAMPLE_CALLCHAIN`, when asked for: where its u64s lie in the record body (offset,
    /// byte length); (0, 0) otherwise. Read them with [`sample_callchain`].
    pub chain: (u32, u32),
    /// `PERF_SAMPLE_REGS_USER` with [`USER_REGS_MASK`] (`callchains = "dwarf"`): the user bp,
    /// sp and ip at the sample (or at kernel entry); `None` when not asked for, or for a
    /// kernel thread (`ABI_NONE`: no user registers).
    pub user_regs: Option<UserRegs>,
    /// `PERF_SAMPLE_STACK_USER`: where the copied user stack lies in the record body (offset,
    /// byte length, already cut to the kernel's `dyn_size`: the bytes it really copied).
    /// Read it with [`sample_user_stack`]; (0, 0) when absent.
    pub user_stack: (u32, u32),
}

/// The user registers dcpid asks for (x86-64 `perf_regs.h` numbers): BP = 6, SP = 7, IP = 8,
/// all a CFI unwinder needs to find return addresses (framehop recovers only these).
pub const USER_REGS_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 8);

/// The user registers of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegs {
    pub bp: u64,
    pub sp: u64,
    pub ip: u64,
}

/// What a sample record holds beyond the fixed fields (what the events were opened with).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleLayout {
    /// `PERF_SAMPLE_CALLCHAIN`.
    pub callchain: bool,
    /// `PERF_SAMPLE_REGS_USER` (with [`USER_REGS_MASK`]) and `PERF_SAMPLE_STACK_USER`.
    pub user_stack: bool,
}

/// What a record means to the sampler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Sample(RawSample),
    SideBand(TimedSideBand),
    /// `PERF_RECORD_LOST` / `LOST_SAMPLES`: `lost` samples were dropped by the kernel.
    Lost {
        lost: u64,
    },
    Throttle {
        time: u64,
    },
    Unthrottle {
        time: u64,
    },
    /// A record type we did not ask for or do not use.
    Other,
    /// Too short for its type.
    Malformed,
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    let s = b.get(off..off + 8)?;
    Some(u64::from_ne_bytes(s.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off + 4)?;
    Some(u32::from_ne_bytes(s.try_into().ok()?))
}

/// The `sample_id` trailer: TID, TIME, CPU, IDENTIFIER.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleId {
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: u32,
    pub identifier: u64,
}

/// Split a non-sample record body into its own fields and the `sample_id` trailer.
pub fn split_trailer(body: &[u8]) -> Option<(&[u8], SampleId)> {
    let n = body.len().checked_sub(sp::SAMPLE_ID_TRAILER)?;
    let (own, t) = body.split_at(n);
    Some((
        own,
        SampleId {
            pid: u32_at(t, 0)?,
            tid: u32_at(t, 4)?,
            time: u64_at(t, 8)?,
            cpu: u32_at(t, 16)?,
            identifier: u64_at(t, 24)?,
        },
    ))
}

/// A sample body (header removed), of events opened without `PERF_SAMPLE_CALLCHAIN`.
pub fn parse_sample(misc: u16, body: &[u8]) -> Option<RawSample> {
    parse_sample_cc(misc, body, false)
}

/// The callchain bytes of a sample parsed with `callchain`.
pub fn sample_callchain<'a>(s: &RawSample, body: &'a [u8]) -> &'a [u8] {
    let (off, len) = (s.chain.0 as usize, s.chain.1 as usize);
    body.get(off..off + len).unwrap_or(&[])
}

/// The copied user stack of a sample parsed with [`SampleLayout::user_stack`].
pub fn sample_user_stack<'a>(s: &RawSample, body: &'a [u8]) -> &'a [u8] {
    let (off, len) = (s.user_stack.0 as usize, s.user_stack.1 as usize);
    body.get(off..off + len).unwrap_or(&[])
}

/// A sample body; `callchain`: the events were opened with `PERF_SAMPLE_CALLCHAIN`, which lies
/// between CPU and CGROUP (`nr`, then `nr` u64s).
pub fn parse_sample_cc(misc: u16, body: &[u8], callchain: bool) -> Option<RawSample> {
    parse_sample_layout(misc, body, SampleLayout { callchain, user_stack: false })
}

/// A sample body of events opened with `layout`. The kernel's order after CPU is CALLCHAIN,
/// `REGS_USER` (`abi`, then one u64 per mask bit, lowest bit first, only if `abi` is not
/// NONE), `STACK_USER` (`size`, `size` bytes, then `dyn_size` only if `size` is not 0), CGROUP.
/// Every length is checked against the record: a malformed one gives `None`, never a read
/// past the record.
pub fn parse_sample_layout(misc: u16, body: &[u8], layout: SampleLayout) -> Option<RawSample> {
    let (chain, mut at) = if layout.callchain {
        let nr = usize::try_from(u64_at(body, 40)?).ok()?;
        let len = nr.checked_mul(8)?;
        let end = 48usize.checked_add(len)?;
        if end > body.len() {
            return None;
        }
        ((48, u32::try_from(len).ok()?), end)
    } else {
        ((0, 0), 40)
    };
    let mut user_regs = None;
    let mut user_stack = (0, 0);
    if layout.user_stack {
        let abi = u64_at(body, at)?;
        at += 8;
        if abi != 0 {
            // Mask bits 6, 7, 8 in order: bp, sp, ip.
            let (bp, sp_, ip) = (u64_at(body, at)?, u64_at(body, at + 8)?, u64_at(body, at + 16)?);
            at += 24;
            user_regs = Some(UserRegs { bp, sp: sp_, ip });
        }
        let size = usize::try_from(u64_at(body, at)?).ok()?;
        at += 8;
        if size != 0 {
            let data = at;
            let end = data.checked_add(size)?;
            let dyn_size = usize::try_from(u64_at(body, end)?).ok()?;
            user_stack = (u32::try_from(data).ok()?, u32::try_from(dyn_size.min(size)).ok()?);
            at = end + 8;
        }
    }
    let cgroup_at = at;
    Some(RawSample {
        identifier: u64_at(body, 0)?,
        ip: u64_at(body, 8)?,
        pid: u32_at(body, 16)?,
        tid: u32_at(body, 20)?,
        time: u64_at(body, 24)?,
        cpu: u32_at(body, 32)?,
        kernel: misc & sp::MISC_CPUMODE_MASK == sp::MISC_KERNEL,
        // PERF_SAMPLE_CGROUP is the only field after CPU (and the callchain) that the daemon
        // may ask for, so the record's length says whether it is there.
        cgroup: u64_at(body, cgroup_at).unwrap_or(0),
        chain,
        user_regs,
        user_stack,
    })
}

fn cstr(b: &[u8]) -> Vec<u8> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    b[..end].to_vec()
}

fn parse_sideband(kind: u32, misc: u16, body: &[u8]) -> Option<TimedSideBand> {
    let (own, id) = split_trailer(body)?;
    let record = match kind {
        sp::PERF_RECORD_MMAP2 => {
            let pid = u32_at(own, 0)?;
            let tid = u32_at(own, 4)?;
            let addr = u64_at(own, 8)?;
            let len = u64_at(own, 16)?;
            let pgoff = u64_at(own, 24)?;
            let (dev, ino, ino_generation, build_id) =
                if u32::from(misc) & sp::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                    let n = (*own.get(32)? as usize).min(20);
                    (None, None, None, Some(own.get(36..36 + n)?.to_vec()))
                } else {
                    let maj = u32_at(own, 32)?;
                    let min = u32_at(own, 36)?;
                    (Some((maj, min)), Some(u64_at(own, 40)?), Some(u64_at(own, 48)?), None)
                };
            let prot = u32_at(own, 56)?;
            let flags = u32_at(own, 60)?;
            SideBand::Mmap2 {
                pid,
                tid,
                addr,
                len,
                pgoff,
                dev,
                ino,
                ino_generation,
                prot,
                flags,
                build_id,
                filename: cstr(own.get(64..)?),
                kernel: misc & sp::MISC_CPUMODE_MASK == sp::MISC_KERNEL,
            }
        }
        sp::PERF_RECORD_COMM => SideBand::Comm {
            pid: u32_at(own, 0)?,
            tid: u32_at(own, 4)?,
            comm: cstr(own.get(8..)?),
            exec: u32::from(misc) & sp::PERF_RECORD_MISC_COMM_EXEC != 0,
        },
        sp::PERF_RECORD_FORK | sp::PERF_RECORD_EXIT => {
            let (pid, ppid, tid, ptid) =
                (u32_at(own, 0)?, u32_at(own, 4)?, u32_at(own, 8)?, u32_at(own, 12)?);
            if kind == sp::PERF_RECORD_FORK {
                SideBand::Fork { pid, ppid, tid, ptid }
            } else {
                SideBand::Exit { pid, ppid, tid, ptid }
            }
        }
        sp::PERF_RECORD_CGROUP => {
            SideBand::Cgroup { id: u64_at(own, 0)?, path: cstr(own.get(8..)?) }
        }
        _ => return None,
    };
    Some(TimedSideBand { time: id.time, cpu: id.cpu, record })
}

/// Classify and parse one record (events opened without `PERF_SAMPLE_CALLCHAIN`).
pub fn parse_record(rec: RawRecord<'_>) -> Record {
    parse_record_cc(rec, false)
}

/// Classify and parse one record; `callchain`: samples carry `PERF_SAMPLE_CALLCHAIN`.
pub fn parse_record_cc(rec: RawRecord<'_>, callchain: bool) -> Record {
    parse_record_layout(rec, SampleLayout { callchain, user_stack: false })
}

/// Classify and parse one record of events opened with `layout`.
pub fn parse_record_layout(rec: RawRecord<'_>, layout: SampleLayout) -> Record {
    match rec.kind {
        sp::PERF_RECORD_SAMPLE => match parse_sample_layout(rec.misc, rec.body, layout) {
            Some(s) => Record::Sample(s),
            None => Record::Malformed,
        },
        sp::PERF_RECORD_MMAP2
        | sp::PERF_RECORD_COMM
        | sp::PERF_RECORD_FORK
        | sp::PERF_RECORD_EXIT
        | sp::PERF_RECORD_CGROUP => match parse_sideband(rec.kind, rec.misc, rec.body) {
            Some(s) => Record::SideBand(s),
            None => Record::Malformed,
        },
        sp::PERF_RECORD_LOST => match u64_at(rec.body, 8) {
            Some(lost) => Record::Lost { lost },
            None => Record::Malformed,
        },
        sp::PERF_RECORD_LOST_SAMPLES => match u64_at(rec.body, 0) {
            Some(lost) => Record::Lost { lost },
            None => Record::Malformed,
        },
        sp::PERF_RECORD_THROTTLE | sp::PERF_RECORD_UNTHROTTLE => match u64_at(rec.body, 0) {
            Some(time) if rec.kind == sp::PERF_RECORD_THROTTLE => Record::Throttle { time },
            Some(time) => Record::Unthrottle { time },
            None => Record::Malformed,
        },
        _ => Record::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailer(pid: u32, tid: u32, time: u64, cpu: u32, id: u64) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&pid.to_ne_bytes());
        v.extend_from_slice(&tid.to_ne_bytes());
        v.extend_from_slice(&time.to_ne_bytes());
        v.extend_from_slice(&cpu.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&id.to_ne_bytes());
        v
    }

    #[test]
    fn sample_layout() {
        let mut b = Vec::new();
        for x in [7u64, 0xffff_ffff_8100_0000, (42u64 << 32) | 41, 123456, 1] {
            b.extend_from_slice(&x.to_ne_bytes());
        }
        // pid/tid: pid first in memory.
        b[16..20].copy_from_slice(&41u32.to_ne_bytes());
        b[20..24].copy_from_slice(&42u32.to_ne_bytes());
        let r = parse_record(RawRecord { kind: sp::PERF_RECORD_SAMPLE, misc: 1, body: &b });
        let Record::Sample(s) = r else { panic!("{r:?}") };
        assert_eq!(
            s,
            RawSample {
                identifier: 7,
                ip: 0xffff_ffff_8100_0000,
                pid: 41,
                tid: 42,
                time: 123456,
                cpu: 1,
                kernel: true,
                cgroup: 0,
                chain: (0, 0),
                user_regs: None,
                user_stack: (0, 0),
            }
        );
        // The same sample with a 2-frame callchain and a cgroup after it.
        let mut c = b.clone();
        for x in [2u64, 0xffff_ffff_ffff_ff80, 0xffff_ffff_8100_0000, 77] {
            c.extend_from_slice(&x.to_ne_bytes());
        }
        let s = parse_sample_cc(1, &c, true).expect("parses");
        assert_eq!((s.chain, s.cgroup), ((48, 16), 77));
        assert_eq!(sample_callchain(&s, &c).len(), 16);
        // The same sample with a cgroup and no callchain.
        let mut g = b.clone();
        g.extend_from_slice(&77u64.to_ne_bytes());
        assert_eq!(parse_sample(1, &g).map(|s| (s.cgroup, s.chain)), Some((77, (0, 0))));
        // nr beyond the record: malformed, never a read past it.
        c[40..48].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(parse_sample_cc(1, &c, true), None);
        let r = parse_record(RawRecord { kind: sp::PERF_RECORD_SAMPLE, misc: 2, body: &b[..32] });
        assert_eq!(r, Record::Malformed);
    }

    /// A `callchains = "dwarf"` sample: kernel chain, user registers, a copied stack whose
    /// `dyn_size` is smaller than its `size`, then a cgroup.
    #[test]
    fn user_regs_and_stack_layout() {
        let mut b = Vec::new();
        for x in [7u64, 0x40_1000, (42u64 << 32) | 41, 123456, 1] {
            b.extend_from_slice(&x.to_ne_bytes());
        }
        let layout = SampleLayout { callchain: true, user_stack: true };
        // Callchain: one kernel frame.
        for x in [2u64, 0xffff_ffff_ffff_ff80, 0xffff_ffff_8100_0000] {
            b.extend_from_slice(&x.to_ne_bytes());
        }
        // REGS_USER: abi 64, bp, sp, ip.
        for x in [2u64, 0x7ffd_0000_0100, 0x7ffd_0000_0000, 0x40_1234] {
            b.extend_from_slice(&x.to_ne_bytes());
        }
        // STACK_USER: size 32, 32 bytes, dyn_size 16.
        b.extend_from_slice(&32u64.to_ne_bytes());
        let stack_at = b.len();
        for i in 0..32u8 {
            b.push(i);
        }
        b.extend_from_slice(&16u64.to_ne_bytes());
        b.extend_from_slice(&77u64.to_ne_bytes());
        let s = parse_sample_layout(2, &b, layout).expect("parses");
        assert_eq!(
            s.user_regs,
            Some(UserRegs { bp: 0x7ffd_0000_0100, sp: 0x7ffd_0000_0000, ip: 0x40_1234 })
        );
        assert_eq!(s.user_stack, (stack_at as u32, 16));
        assert_eq!(sample_user_stack(&s, &b), &(0..16u8).collect::<Vec<_>>()[..]);
        assert_eq!((s.chain, s.cgroup), ((48, 16), 77));
        let r = parse_record_layout(
            RawRecord { kind: sp::PERF_RECORD_SAMPLE, misc: 2, body: &b },
            layout,
        );
        assert_eq!(r, Record::Sample(s));

        // A kernel thread: ABI_NONE, no registers, size 0 and no dyn_size.
        let mut k = b[..64].to_vec();
        k.extend_from_slice(&0u64.to_ne_bytes());
        k.extend_from_slice(&0u64.to_ne_bytes());
        let s = parse_sample_layout(1, &k, layout).expect("parses");
        assert_eq!((s.user_regs, s.user_stack, s.cgroup), (None, (0, 0), 0));

        // A stack size beyond the record, or a record cut inside the registers or before
        // dyn_size: malformed, never a read past it.
        let mut bad = b.clone();
        bad[stack_at - 8..stack_at].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(parse_sample_layout(2, &bad, layout), None);
        assert_eq!(parse_sample_layout(2, &b[..90], layout), None);
        assert_eq!(parse_sample_layout(2, &b[..stack_at + 32], layout), None);
    }

    #[test]
    fn mmap2_with_build_id_and_comm_exec() {
        let mut b = Vec::new();
        b.extend_from_slice(&10u32.to_ne_bytes());
        b.extend_from_slice(&11u32.to_ne_bytes());
        for x in [0x4000u64, 0x2000, 0x1000] {
            b.extend_from_slice(&x.to_ne_bytes());
        }
        b.push(20);
        b.extend_from_slice(&[0, 0, 0]);
        b.extend_from_slice(&[0xab; 20]);
        b.extend_from_slice(&5u32.to_ne_bytes());
        b.extend_from_slice(&2u32.to_ne_bytes());
        b.extend_from_slice(b"/usr/bin/x\n y\0\0");
        b.extend_from_slice(&trailer(10, 11, 999, 1, 3));
        let misc = sp::PERF_RECORD_MISC_MMAP_BUILD_ID as u16 | 2;
        let r = parse_record(RawRecord { kind: sp::PERF_RECORD_MMAP2, misc, body: &b });
        let Record::SideBand(TimedSideBand { time: 999, cpu: 1, record }) = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            record,
            SideBand::Mmap2 {
                pid: 10,
                tid: 11,
                addr: 0x4000,
                len: 0x2000,
                pgoff: 0x1000,
                dev: None,
                ino: None,
                ino_generation: None,
                prot: 5,
                flags: 2,
                build_id: Some(vec![0xab; 20]),
                filename: b"/usr/bin/x\n y".to_vec(),
                kernel: false,
            }
        );

        let mut c = Vec::new();
        c.extend_from_slice(&10u32.to_ne_bytes());
        c.extend_from_slice(&10u32.to_ne_bytes());
        c.extend_from_slice(b"bash\0\0\0\0");
        c.extend_from_slice(&trailer(10, 10, 5, 0, 3));
        let misc = sp::PERF_RECORD_MISC_COMM_EXEC as u16;
        let r = parse_record(RawRecord { kind: sp::PERF_RECORD_COMM, misc, body: &c });
        assert_eq!(
            r,
            Record::SideBand(TimedSideBand {
                time: 5,
                cpu: 0,
                record: SideBand::Comm { pid: 10, tid: 10, comm: b"bash".to_vec(), exec: true }
            })
        );
        // Truncated: no trailer room.
        let r = parse_record(RawRecord { kind: sp::PERF_RECORD_COMM, misc, body: &c[..20] });
        assert_eq!(r, Record::Malformed);
    }

    #[test]
    fn lost_and_throttle() {
        let mut b = Vec::new();
        b.extend_from_slice(&3u64.to_ne_bytes());
        b.extend_from_slice(&17u64.to_ne_bytes());
        b.extend_from_slice(&trailer(0, 0, 1, 0, 3));
        assert_eq!(
            parse_record(RawRecord { kind: sp::PERF_RECORD_LOST, misc: 0, body: &b }),
            Record::Lost { lost: 17 }
        );
        assert_eq!(
            parse_record(RawRecord { kind: sp::PERF_RECORD_THROTTLE, misc: 0, body: &b }),
            Record::Throttle { time: 3 }
        );
        assert_eq!(
            parse_record(RawRecord { kind: sp::PERF_RECORD_UNTHROTTLE, misc: 0, body: &b }),
            Record::Unthrottle { time: 3 }
        );
    }
}
