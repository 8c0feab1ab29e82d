//! Kernel code bytes: from a vmlinux file, or from /proc/kcore when the profiled kernel is the
//! running one (same build-id and, because of KASLR, the same `_text` address).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::KallsymsSnapshot;

/// Bytes of `size` at the kernel address `addr` (as the snapshot gives it).
pub fn read_kernel_code(
    vmlinux: Option<&Path>,
    snap: &KallsymsSnapshot,
    addr: u64,
    size: u64,
    _warnings: &mut Vec<String>,
) -> Result<Vec<u8>, String> {
    match vmlinux {
        Some(p) => from_vmlinux(p, snap, addr, size),
        None => from_kcore(snap, addr, size),
    }
}

fn from_vmlinux(
    path: &Path,
    snap: &KallsymsSnapshot,
    addr: u64,
    size: u64,
) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let mut f = File::open(path).map_err(|e| format!("--vmlinux {shown}: {e}"))?;
    let (file_off, avail) = {
        let cache = object::ReadCache::new(&mut f);
        let elf = object::File::parse(&cache).map_err(|e| format!("--vmlinux {shown}: {e}"))?;
        if let (Ok(Some(have)), Some(want)) = (elf.build_id(), &snap.kernel_build_id) {
            if have != want.as_slice() {
                return Err(format!(
                    "--vmlinux {shown} has build-id {}, the profiled kernel {}",
                    hex::encode(have),
                    hex::encode(want)
                ));
            }
        }
        let text = elf
            .symbols()
            .find(|s| s.name() == Ok("_text"))
            .map(|s| s.address())
            .ok_or_else(|| format!("--vmlinux {shown}: no _text symbol (not a vmlinux?)"))?;
        let link_addr = text.wrapping_add(addr.wrapping_sub(snap.text_base));
        segment_offset(&elf, link_addr, size)
            .ok_or_else(|| format!("--vmlinux {shown}: {link_addr:#x} is not in a segment"))?
    };
    read_at(&mut f, file_off, size.min(avail)).map_err(|e| format!("--vmlinux {shown}: {e}"))
}

fn from_kcore(snap: &KallsymsSnapshot, addr: u64, size: u64) -> Result<Vec<u8>, String> {
    let why = "no code bytes for the kernel: pass --vmlinux FILE";
    let live_text =
        live_text_base().ok_or_else(|| format!("{why} (cannot read /proc/kallsyms)"))?;
    if live_text != snap.text_base {
        return Err(format!(
            "{why} (the profile is of another boot or kernel than the running one)"
        ));
    }
    if let (Some(want), Some(have)) = (&snap.kernel_build_id, live_kernel_build_id()) {
        if *want != have {
            return Err(format!("{why} (the running kernel is another build)"));
        }
    }
    let mut f = File::open("/proc/kcore").map_err(|e| format!("{why} (/proc/kcore: {e})"))?;
    let (off, avail) = {
        let cache = object::ReadCache::new(&mut f);
        let elf = object::File::parse(&cache).map_err(|e| format!("{why} (/proc/kcore: {e})"))?;
        segment_offset(&elf, addr, size)
            .ok_or_else(|| format!("{why} (/proc/kcore does not map {addr:#x})"))?
    };
    read_at(&mut f, off, size.min(avail)).map_err(|e| format!("{why} (/proc/kcore: {e})"))
}

/// File offset of `addr` and how many bytes of `size` the segment holds.
fn segment_offset<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    addr: u64,
    size: u64,
) -> Option<(u64, u64)> {
    elf.segments().find_map(|s| {
        let (off, filesz) = s.file_range();
        let start = s.address();
        (addr >= start && addr - start < filesz)
            .then(|| (off + (addr - start), size.min(filesz - (addr - start))))
    })
}

fn read_at(f: &mut File, off: u64, size: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    f.seek(SeekFrom::Start(off))?;
    f.read_exact(&mut buf)?;
    Ok(buf)
}

fn live_text_base() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (a, k, n) = (it.next()?, it.next()?, it.next()?);
        (n == "_text" && k.eq_ignore_ascii_case("t"))
            .then(|| u64::from_str_radix(a, 16).ok())
            .flatten()
            .filter(|&a| a != 0)
    })
}

/// The running kernel's build-id from /sys/kernel/notes (an ELF note list).
fn live_kernel_build_id() -> Option<Vec<u8>> {
    let d = std::fs::read("/sys/kernel/notes").ok()?;
    let mut r = &d[..];
    let u32_at = |b: &[u8], i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
    };
    let align = |n: usize| n.checked_add(3).map(|x| x & !3);
    while r.len() >= 12 {
        let namesz = u32_at(r, 0)? as usize;
        let descsz = u32_at(r, 4)? as usize;
        let kind = u32_at(r, 8)?;
        let name_end = 12usize.checked_add(align(namesz)?)?;
        let desc_end = name_end.checked_add(align(descsz)?)?;
        let name = r.get(12..12 + namesz)?;
        if kind == 3 && name.starts_with(b"GNU") {
            return r.get(name_end..name_end + descsz).map(<[u8]>::to_vec);
        }
        r = r.get(desc_end..)?;
    }
    None
}
