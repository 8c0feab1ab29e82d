//! Kernel and module images.
//!
//! Conventions (FORMAT.md, `ImageKind`):
//! - kernel: path `[kernel.kallsyms]`, id = GNU build-id from `/sys/kernel/notes` (else
//!   `ImageId::special("[kernel.kallsyms]", release)`), offset = pc - `_text` (from
//!   /proc/kallsyms), so that offsets survive KASLR;
//! - module: path = module name, id = build-id from
//!   `/sys/module/NAME/notes/.note.gnu.build-id` (else
//!   `ImageId::special("[module]", name + "\0" + size as decimal)`), offset = pc - module base (from
//!   /proc/modules).
//!
//! The module list is re-read when a kernel MMAP2 (module load) arrives or when a kernel pc
//! falls outside every known image, at most once per second.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use profile_format::{ImageId, ImageKind};

use super::procfs::{gnu_build_id_from_notes, lines_bounded, read_bounded};
use crate::types::ImageInfo;

/// Bound on /proc/kallsyms (a few MB on a distribution kernel).
pub(crate) const MAX_KALLSYMS: u64 = 256 << 20;
const MAX_SMALL: u64 = 16 << 20;
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// A module from /proc/modules.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ModuleLine {
    pub name: String,
    pub size: u64,
    pub base: u64,
}

/// Parse /proc/modules (`name size refs deps state address [taints]`); garbage lines and
/// modules with a zero (hidden) address are skipped.
pub fn parse_modules(text: &str) -> Vec<ModuleLine> {
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let (Ok(size), Ok(base)) =
            (f[1].parse::<u64>(), u64::from_str_radix(f[5].trim_start_matches("0x"), 16))
        else {
            continue;
        };
        if base == 0 || size == 0 || !safe_module_name(f[0]) {
            continue;
        }
        v.push(ModuleLine { name: f[0].to_string(), size, base });
    }
    v.sort_by_key(|m| m.base);
    v
}

/// Module names become path components under /sys/module: refuse anything odd.
pub(crate) fn safe_module_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Find `_text` and `_end` in /proc/kallsyms text; without `_end` (kallsyms lists no data
/// symbols unless the kernel has `CONFIG_KALLSYMS_ALL`: none on this project's 6.18 kernels),
/// the end of `.init.text` (`_einittext`) or of `.text` (`_etext`), whichever is higher. The
/// boot CPU's idle stack runs through `.init.text` (`start_kernel`, `x86_64_start_kernel`),
/// which lies above `_etext`: with `_etext` for the end its frames were `kernel-unknown`.
pub fn parse_text_range(kallsyms: &str) -> Option<(u64, u64)> {
    parse_text_range_lines(kallsyms.lines())
}

/// [`parse_text_range`] over lines as they are read: /proc/kallsyms is several MB, and the
/// daemon should not hold all of it just to find two symbols.
pub fn parse_text_range_lines<S: AsRef<str>>(lines: impl Iterator<Item = S>) -> Option<(u64, u64)> {
    let (mut text, mut end, mut etext, mut einit) = (None, None, None, None);
    for line in lines {
        let line = line.as_ref();
        let mut f = line.split_ascii_whitespace();
        let (Some(a), Some(_), Some(name)) = (f.next(), f.next(), f.next()) else { continue };
        let slot = match name {
            "_text" => &mut text,
            "_end" => &mut end,
            "_etext" => &mut etext,
            "_einittext" => &mut einit,
            _ => continue,
        };
        *slot = u64::from_str_radix(a, 16).ok();
        if text.is_some() && end.is_some() {
            break;
        }
    }
    let t = text.filter(|&t| t != 0)?;
    let e = end.or_else(|| etext.max(einit)).filter(|&e| e > t)?;
    Some((t, e))
}

#[derive(Debug)]
pub(crate) struct ModuleImage {
    pub base: u64,
    pub size: u64,
    pub image: Arc<ImageInfo>,
}

#[derive(Debug, Default)]
pub(crate) struct KernelState {
    loaded: bool,
    text: Option<(u64, u64)>,
    image: Option<Arc<ImageInfo>>,
    modules: Vec<ModuleImage>,
    pub modules_stale: bool,
    last_refresh: Option<Instant>,
    pub release: String,
}

pub(crate) fn kernel_release(proc_root: &Path) -> String {
    read_bounded(&proc_root.join("sys/kernel/osrelease"), 4096)
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn kernel_build_id(sys_root: &Path) -> Option<Vec<u8>> {
    gnu_build_id_from_notes(&read_bounded(&sys_root.join("kernel/notes"), 1 << 16).ok()?)
}

pub(crate) fn module_build_id(sys_root: &Path, name: &str) -> Option<Vec<u8>> {
    if !safe_module_name(name) {
        return None;
    }
    let p = sys_root.join("module").join(name).join("notes/.note.gnu.build-id");
    gnu_build_id_from_notes(&read_bounded(&p, 1 << 16).ok()?)
}

impl KernelState {
    fn load(&mut self, proc_root: &Path, sys_root: &Path) {
        self.loaded = true;
        self.release = kernel_release(proc_root);
        if let Ok(lines) = lines_bounded(&proc_root.join("kallsyms"), MAX_KALLSYMS) {
            self.text = parse_text_range_lines(lines.map_while(Result::ok));
        }
        if self.text.is_none() {
            tracing::warn!(
                "{}: no usable _text/_end/_etext (kptr_restrict?); kernel samples will be unknown",
                proc_root.join("kallsyms").display()
            );
        }
        let id = match kernel_build_id(sys_root) {
            Some(b) => ImageId::BuildId(b),
            None => ImageId::special("[kernel.kallsyms]", self.release.as_bytes()),
        };
        self.image = Some(Arc::new(ImageInfo {
            kind: ImageKind::Kernel,
            id,
            path: b"[kernel.kallsyms]".to_vec(),
            jit_symbols: Vec::new(),
        }));
        self.refresh_modules(proc_root, sys_root);
    }

    fn refresh_modules(&mut self, proc_root: &Path, sys_root: &Path) {
        self.last_refresh = Some(Instant::now());
        self.modules_stale = false;
        let Ok(b) = read_bounded(&proc_root.join("modules"), MAX_SMALL) else { return };
        let mut old: Vec<ModuleImage> = std::mem::take(&mut self.modules);
        for m in parse_modules(&String::from_utf8_lossy(&b)) {
            // Keep the image of a module that did not move (its build-id cannot have changed).
            if let Some(i) = old.iter().position(|o| {
                o.base == m.base && o.size == m.size && o.image.path == m.name.as_bytes()
            }) {
                self.modules.push(old.swap_remove(i));
                continue;
            }
            let id = match module_build_id(sys_root, &m.name) {
                Some(b) => ImageId::BuildId(b),
                None => ImageId::special("[module]", format!("{}\0{}", m.name, m.size).as_bytes()),
            };
            let image = Arc::new(ImageInfo {
                kind: ImageKind::KernelModule,
                id,
                path: m.name.clone().into_bytes(),
                jit_symbols: Vec::new(),
            });
            self.modules.push(ModuleImage { base: m.base, size: m.size, image });
        }
    }

    /// (image, offset) of a kernel pc, or `None` (`KernelUnknown`).
    pub(crate) fn resolve(
        &mut self,
        pc: u64,
        proc_root: &Path,
        sys_root: &Path,
    ) -> Option<(Arc<ImageInfo>, u64)> {
        if !self.loaded {
            self.load(proc_root, sys_root);
        }
        if let Some(r) = self.lookup(pc) {
            return Some(r);
        }
        let due = self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH_EVERY);
        if self.modules_stale || due {
            self.refresh_modules(proc_root, sys_root);
            return self.lookup(pc);
        }
        None
    }

    fn lookup(&self, pc: u64) -> Option<(Arc<ImageInfo>, u64)> {
        if let (Some((t, e)), Some(img)) = (self.text, &self.image) {
            if pc >= t && pc < e {
                return Some((Arc::clone(img), pc - t));
            }
        }
        let i = self.modules.partition_point(|m| m.base <= pc);
        let m = self.modules.get(i.checked_sub(1)?)?;
        (pc - m.base < m.size).then(|| (Arc::clone(&m.image), pc - m.base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_and_text() {
        let m = parse_modules(
            "virtio_net 65536 0 - Live 0xffffffffc0010000\n\
             bad line\n\
             ../evil 4096 0 - Live 0xffffffffc0020000\n\
             hidden 4096 0 - Live 0x0000000000000000\n\
             ext4 1000000 1 - Live 0xffffffffc0100000 (E)\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].name, "virtio_net");
        assert_eq!(m[1].base, 0xffffffffc0100000);
        let r = parse_text_range(
            "0000000000000000 A fixed_percpu_data\n\
             ffffffff81000000 T _text\n\
             ffffffff81000010 T startup_64\n\
             ffffffff83000000 B _end\n",
        );
        assert_eq!(r, Some((0xffffffff81000000, 0xffffffff83000000)));
        assert_eq!(parse_text_range("0000000000000000 T _text\n0000000000000000 B _end\n"), None);
    }

    /// Without `_end` (this kernel's kallsyms), `.init.text` above `_etext` is the kernel's:
    /// `start_kernel` (the boot CPU's idle stack) was `kernel-unknown` with `_etext` for the end.
    #[test]
    fn init_text_is_kernel_text() {
        let kallsyms = "ffffffff81000000 T _text\n\
                        ffffffff813c3870 t do_idle\n\
                        ffffffff82209988 T _etext\n\
                        ffffffff83783000 T _sinittext\n\
                        ffffffff83783b00 T start_kernel\n\
                        ffffffff837f8910 T _einittext\n";
        let (t, e) = parse_text_range(kallsyms).expect("range");
        assert_eq!(t, 0xffffffff81000000);
        assert!((t..e).contains(&0xffffffff83783b40), "start_kernel+0x40 in {t:x}..{e:x}");
        // _einittext before _etext (no init text above it): _etext still ends it.
        let r = parse_text_range("ffffffff81000000 T _text\nffffffff82000000 T _etext\n");
        assert_eq!(r, Some((0xffffffff81000000, 0xffffffff82000000)));
        // With _end, _end.
        let r = parse_text_range(&format!("{kallsyms}ffffffff84000000 B _end\n"));
        assert_eq!(r, Some((0xffffffff81000000, 0xffffffff84000000)));
    }
}
