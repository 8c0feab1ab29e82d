//! The parts of an ELF file that a symbol table needs, read instead of the whole file: the file
//! and program headers, the section headers, and the symbol, string, extended-index and note
//! sections. [`super::symbolize::SymbolTable::build_from`] parses them with `object` exactly as
//! it parses a whole file; a read outside them is an error, so nothing is guessed from zeros.
//!
//! Why: a debug build is mostly DWARF (80 MB for `dcpid`, of which the symbol and string tables
//! are ~6 MB), and reading and copying all of it was most of a cold symbol report (BENCHMARKS.md,
//! "blazesym"). A memory map would skip the copy as well, but needs `unsafe` in this crate (it
//! has none) and kills the process with SIGBUS when the file is truncated while mapped; `pread`
//! of a few ranges cannot: a file that shrank gives an error, one rewritten in place while it was
//! read (size or times changed) gives an error, and one replaced by rename is the file that was
//! opened, read through one descriptor.
// Reads the parts of ELF binaries (and its tests read a whole one), never database files.
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use object::pod;
use object::read::elf::{FileHeader, SectionHeader};
use object::{elf, Endianness, FileKind, ReadCache, ReadRef};

/// Errors while reading an ELF file.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not a readable ELF file: {0}")]
    Parse(#[from] object::Error),
    #[error("not an ELF file (format {0:?})")]
    NotElf(object::BinaryFormat),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Bytes of an ELF file at their offsets, for the ranges a symbol table reads.
#[derive(Debug)]
pub struct ElfParts {
    len: u64,
    /// Sorted by start, disjoint.
    regions: Vec<Region>,
}

#[derive(Debug)]
struct Region {
    start: u64,
    len: usize,
    /// `u64` storage: `object` checks alignment of the structures it reads, and a region
    /// starting at an 8-aligned offset in 8-aligned memory keeps the file's alignment.
    words: Vec<u64>,
}

impl Region {
    fn bytes(&self) -> &[u8] {
        &pod::bytes_of_slice(&self.words)[..self.len]
    }
}

/// Identity of the open file's content, to notice a rewrite in place while it is read.
fn stamp(f: &File) -> std::io::Result<(u64, i64, i64, i64, i64)> {
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok((m.len(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

impl ElfParts {
    /// Read the headers and symbol tables of the ELF file at `path`.
    pub fn read(path: &Path) -> Result<Self, ElfError> {
        let file = File::open(path)?;
        let before = stamp(&file)?;
        let len = before.0;
        // The headers first, through a cache that reads only what is asked (a few KB).
        let ranges = {
            let cache = ReadCache::new(&file);
            match FileKind::parse(&cache)? {
                FileKind::Elf32 => wanted::<elf::FileHeader32<Endianness>>(&cache)?,
                FileKind::Elf64 => wanted::<elf::FileHeader64<Endianness>>(&cache)?,
                _ => return Err(ElfError::NotElf(object::File::parse(&cache)?.format())),
            }
        };
        let mut regions = Vec::new();
        for r in merge(ranges, len) {
            let n = usize::try_from(r.end - r.start)
                .map_err(|_| std::io::Error::other("section too large for memory"))?;
            let mut words = vec![0u64; n.div_ceil(8)];
            file.read_exact_at(&mut pod::bytes_of_slice_mut(&mut words)[..n], r.start)?;
            regions.push(Region { start: r.start, len: n, words });
        }
        if stamp(&file)? != before {
            return Err(std::io::Error::other("file changed while its symbols were read").into());
        }
        Ok(Self { len, regions })
    }

    fn region(&self, offset: u64) -> Option<&Region> {
        let i = self.regions.partition_point(|r| r.start <= offset);
        self.regions.get(i.checked_sub(1)?)
    }
}

/// File ranges that `object::File::parse`, symbols, sections, segments and notes read.
fn wanted<Elf: FileHeader<Endian = Endianness>>(
    data: &ReadCache<&File>,
) -> object::Result<Vec<Range<u64>>> {
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let span = |start: u64, n: u64, size: usize| {
        start..start.saturating_add(n.saturating_mul(size as u64))
    };
    let mut out = Vec::new();
    out.push(0..std::mem::size_of::<Elf>() as u64);
    let phoff: u64 = header.e_phoff(endian).into();
    if phoff != 0 {
        let n = header.phnum(endian, data)?;
        out.push(span(phoff, n.into(), std::mem::size_of::<Elf::ProgramHeader>()));
    }
    let shoff: u64 = header.e_shoff(endian).into();
    let sections = header.section_headers(endian, data)?;
    if shoff != 0 {
        // At least section 0, which holds the extended counts when there are many sections.
        let n = sections.len().max(1) as u64;
        out.push(span(shoff, n, std::mem::size_of::<Elf::SectionHeader>()));
    }
    for s in sections {
        if matches!(
            s.sh_type(endian),
            elf::SHT_SYMTAB
                | elf::SHT_DYNSYM
                | elf::SHT_STRTAB
                | elf::SHT_SYMTAB_SHNDX
                | elf::SHT_NOTE
        ) {
            if let Some((off, size)) = s.file_range(endian) {
                out.push(off..off.saturating_add(size));
            }
        }
    }
    Ok(out)
}

/// Clamp to the file, align starts down to 8 bytes, sort and join overlapping ranges.
fn merge(mut ranges: Vec<Range<u64>>, len: u64) -> Vec<Range<u64>> {
    for r in &mut ranges {
        r.start = r.start.min(len) & !7;
        r.end = r.end.min(len);
    }
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

impl<'a> ReadRef<'a> for &'a ElfParts {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            // As for a whole file in memory: an empty read inside the file succeeds.
            return if offset <= self.len { Ok(&[]) } else { Err(()) };
        }
        let r = self.region(offset).ok_or(())?;
        let from = usize::try_from(offset - r.start).map_err(|_| ())?;
        let to = from.checked_add(usize::try_from(size).map_err(|_| ())?).ok_or(())?;
        r.bytes().get(from..to).ok_or(())
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        if range.start > range.end || range.end > self.len {
            return Err(());
        }
        let r = self.region(range.start).ok_or(())?;
        let bytes = r.bytes();
        let from = usize::try_from(range.start - r.start).map_err(|_| ())?;
        let to = usize::try_from(range.end - r.start).map_or(bytes.len(), |e| e.min(bytes.len()));
        let s = bytes.get(from..to).ok_or(())?;
        let n = s.iter().position(|&b| b == delimiter).ok_or(())?;
        Ok(&s[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::pod;

    #[test]
    #[allow(clippy::reversed_empty_ranges, reason = "an inverted range is dropped, not read")]
    fn ranges_are_clamped_aligned_and_joined() {
        let got = merge(vec![30..40, 0..10, 9..20, 100..90, 200..300, 41..45], 250);
        assert_eq!(got, vec![0..20, 24..45, 200..250]);
    }

    #[test]
    fn reads_outside_the_loaded_parts_fail() {
        let mut words = vec![0u64; 2];
        pod::bytes_of_slice_mut(&mut words)[..12].copy_from_slice(b"abc\0defghijk");
        let p = ElfParts { len: 100, regions: vec![Region { start: 16, len: 12, words }] };
        assert_eq!(p.read_bytes_at(16, 3), Ok(&b"abc"[..]));
        assert_eq!(p.read_bytes_at(20, 8), Ok(&b"defghijk"[..]));
        assert_eq!(p.read_bytes_at(20, 9), Err(()), "past the region");
        assert_eq!(p.read_bytes_at(8, 4), Err(()), "before it");
        assert_eq!(p.read_bytes_at(50, 0), Ok(&b""[..]));
        assert_eq!(p.read_bytes_at(101, 0), Err(()));
        assert_eq!(p.read_bytes_at_until(16..28, 0), Ok(&b"abc"[..]));
        assert_eq!(p.read_bytes_at_until(20..28, 0), Err(()), "no terminator");
        assert_eq!(p.read_bytes_at_until(17..18, 0), Err(()), "terminator outside the range");
    }
}
