//! Images as reports name and select them: kinds, printable paths, the `--image` spec.
//!
//! Shared by [`super::select`] (which profile files to read) and [`super::report`] (rows and
//! headers); it depends on neither, so the two do not depend on each other.

use profile_format::{ImageId, ImageKind, ProfileHeader};

use super::names::text_from_bytes;
use crate::escape::controls as escape_controls;

pub fn kind_name(k: ImageKind) -> &'static str {
    match k {
        ImageKind::Elf => "elf",
        ImageKind::Kernel => "kernel",
        ImageKind::KernelModule => "module",
        ImageKind::Vdso => "vdso",
        ImageKind::Anon => "anon",
        ImageKind::Unknown => "unknown",
    }
}

/// Printable form of a recorded path (arbitrary bytes): bytes that are not UTF-8 as `\\xNN`,
/// control characters escaped (as symbol names are, see [`super::names`]).
pub fn display_path(raw: &[u8]) -> String {
    escape_controls(&text_from_bytes(raw)).into_owned()
}

/// Path the daemon gives the idle task's pseudo-image (FORMAT.md §5.1.1).
pub const IDLE: &str = "[idle]";

/// Whether a profile is the `[idle]` pseudo-image: samples of the idle task (pid 0), stored as
/// a kernel image with its own identity.
pub fn is_idle(h: &ProfileHeader) -> bool {
    h.kind == ImageKind::Kernel && h.image_path == IDLE.as_bytes()
}

pub fn image_display(h: &ProfileHeader) -> String {
    match h.kind {
        ImageKind::Kernel if is_idle(h) => IDLE.to_owned(),
        ImageKind::Kernel => "[kernel.kallsyms]".to_owned(),
        ImageKind::Unknown => "[unknown]".to_owned(),
        ImageKind::Vdso if h.image_path.is_empty() => "[vdso]".to_owned(),
        ImageKind::KernelModule => {
            let n = display_path(&h.image_path);
            if n.starts_with('[') {
                n
            } else {
                format!("[{n}]")
            }
        }
        _ => display_path(&h.image_path),
    }
}

/// Short name of an image for `NAME+0xOFFSET` rows: the file's basename, or the bracketed
/// pseudo-name (`[kernel.kallsyms]`, `[vdso]`, `[ext4]`, `[anon:PID:comm]`).
pub fn image_label(h: &ProfileHeader) -> String {
    match h.kind {
        ImageKind::Elf => {
            let base = h.image_path.rsplit(|&b| b == b'/').next().unwrap_or(&h.image_path);
            if base.is_empty() {
                image_display(h)
            } else {
                display_path(base)
            }
        }
        _ => image_display(h),
    }
}

pub fn build_id_hex(id: &ImageId) -> Option<String> {
    match id {
        ImageId::BuildId(b) => Some(hex::encode(b)),
        ImageId::Fallback(_) => None,
    }
}

/// What `--image` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Spec {
    Kernel,
    Idle,
    Vdso,
    Unknown,
    Anon(String),
    /// Build-id prefix or image-id text; falls back to a name when nothing matches.
    Hex(String),
    Path(Vec<u8>),
    Name(String),
}

pub(super) fn parse_spec(s: &str) -> Spec {
    match s {
        "[kernel.kallsyms]" | "vmlinux" | "kernel" => return Spec::Kernel,
        "[vdso]" | "vdso" => return Spec::Vdso,
        "[idle]" | "idle" => return Spec::Idle,
        "[unknown]" | "unknown" => return Spec::Unknown,
        _ => {}
    }
    if s.starts_with("[anon") {
        return Spec::Anon(s.trim_end_matches(']').to_owned());
    }
    // `anon` names every JIT region `[anon:PID:comm]` (as `kernel` names `[kernel.kallsyms]`),
    // `anon:PID` those of one process.
    if s == "anon" || s.starts_with("anon:") {
        return Spec::Anon(format!("[{}", s.trim_end_matches(']')));
    }
    let hexpart = s.strip_prefix('b').filter(|r| r.len() >= 8).unwrap_or(s);
    let hexpart = if s.starts_with('f') && s.len() == 33 { s } else { hexpart };
    if hexpart.len() >= 8 && hexpart.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Spec::Hex(s.to_ascii_lowercase());
    }
    if s.contains('/') {
        return Spec::Path(s.as_bytes().to_vec());
    }
    Spec::Name(s.trim_start_matches('[').trim_end_matches(']').to_owned())
}

pub(super) fn spec_matches(spec: &Spec, h: &ProfileHeader) -> bool {
    spec_rank(spec, h).is_some()
}

/// How well `spec` names the image of `h`: `Some(0)` exactly, and for a bare name also
/// `Some(1)` as a prefix and `Some(2)` as a substring of the basename (or module name), so that
/// `--image nginx` finds `/usr/sbin/nginx-debug` when nothing is called `nginx`. The caller
/// keeps only the best rank present: an exact match always wins.
pub(super) fn spec_rank(spec: &Spec, h: &ProfileHeader) -> Option<u8> {
    let exact = |yes: bool| yes.then_some(0);
    match spec {
        Spec::Kernel => exact(h.kind == ImageKind::Kernel && !is_idle(h)),
        Spec::Idle => exact(is_idle(h)),
        Spec::Vdso => exact(h.kind == ImageKind::Vdso),
        Spec::Unknown => exact(h.kind == ImageKind::Unknown),
        Spec::Anon(prefix) => exact(
            h.kind == ImageKind::Anon && display_path(&h.image_path).starts_with(prefix.as_str()),
        ),
        Spec::Hex(hx) => {
            let t = h.image_id.to_text();
            exact(
                h.kind != ImageKind::Unknown
                    && (t == *hx
                        || build_id_hex(&h.image_id).is_some_and(|b| b.starts_with(hx.as_str()))),
            )
        }
        Spec::Path(path) => exact(h.kind == ImageKind::Elf && h.image_path == *path),
        Spec::Name(name) => {
            let base: Vec<u8> = match h.kind {
                ImageKind::Elf => h.image_path.rsplit(|&b| b == b'/').next()?.to_vec(),
                ImageKind::KernelModule => display_path(&h.image_path)
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .as_bytes()
                    .to_vec(),
                _ => return None,
            };
            let name = name.as_bytes();
            if base == name {
                Some(0)
            } else if name.is_empty() {
                None
            } else if base.starts_with(name) {
                Some(1)
            } else if base.windows(name.len()).any(|w| w == name) {
                Some(2)
            } else {
                None
            }
        }
    }
}

/// Which profile files a per-symbol report needs, decided from the file name when the spec
/// allows (a build-id or image-id prefix, `unknown`) and otherwise from one profile header per
/// image identity (see [`super::select::load`]).
#[derive(Clone, Debug)]
pub struct ImageFilter {
    spec: Spec,
}

impl ImageFilter {
    pub fn new(spec_text: &str) -> Self {
        Self { spec: parse_spec(spec_text) }
    }

    /// `Some(answer)` when the file name decides; `None` when the header must be read.
    pub fn by_name(&self, image_id: Option<&ImageId>) -> Option<bool> {
        match (&self.spec, image_id) {
            (Spec::Unknown, id) => Some(id.is_none()),
            (_, None) => Some(false),
            (Spec::Hex(hx), Some(id)) => Some(
                id.to_text() == *hx || build_id_hex(id).is_some_and(|b| b.starts_with(hx.as_str())),
            ),
            _ => None,
        }
    }

    pub fn by_header(&self, h: &ProfileHeader) -> bool {
        spec_matches(&self.spec, h)
    }

    /// As [`ImageFilter::by_header`], with how well it matches ([`spec_rank`]: lower is better).
    pub fn rank(&self, h: &ProfileHeader) -> Option<u8> {
        spec_rank(&self.spec, h)
    }

    /// A hex spec that names no file is tried as a basename (as [`resolve_image`] does).
    pub fn as_name(&self) -> Option<Self> {
        match &self.spec {
            Spec::Hex(h) => Some(Self { spec: Spec::Name(h.clone()) }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_control_characters_are_escaped() {
        assert_eq!(display_path(b"/tmp/a\nb"), "/tmp/a\\nb");
        assert_eq!(display_path(b"/tmp/\xffx"), "/tmp/\\xffx");
        assert_eq!(display_path(b"/usr/bin/ls"), "/usr/bin/ls");
    }

    #[test]
    fn image_specs() {
        assert_eq!(parse_spec("vmlinux"), Spec::Kernel);
        assert_eq!(parse_spec("[vdso]"), Spec::Vdso);
        assert_eq!(parse_spec("[idle]"), Spec::Idle);
        assert_eq!(parse_spec("idle"), Spec::Idle);
        assert_eq!(parse_spec("deadbeef"), Spec::Hex("deadbeef".into()));
        assert_eq!(parse_spec("bDEADBEEF00"), Spec::Hex("bdeadbeef00".into()));
        assert_eq!(parse_spec("dead"), Spec::Name("dead".into()));
        assert_eq!(parse_spec("/usr/bin/x"), Spec::Path(b"/usr/bin/x".to_vec()));
        assert_eq!(parse_spec("[ext4]"), Spec::Name("ext4".into()));
        assert_eq!(parse_spec("[anon:12:node]"), Spec::Anon("[anon:12:node".into()));
        assert_eq!(parse_spec("[anon]"), Spec::Anon("[anon".into()));
        assert_eq!(parse_spec("anon"), Spec::Anon("[anon".into()));
        assert_eq!(parse_spec("anon:12"), Spec::Anon("[anon:12".into()));
    }
}

/// How text tables name images (issue 39): each by its basename, unless two images of the table
/// differ only in directory (then each of those by as many trailing path components as tell
/// them apart: `v1/app`, `v2/app`), and with a short build-id (`app (3b3b3b3b)`, the shortest
/// prefix, at least 8 digits, that tells the builds apart) when two builds of the same path are
/// in the table. `images` are (printable path, build-id hex); the labels are in their order.
/// Pseudo-names (`[kernel.kallsyms]`, `[vdso]`, `[ext4]`) have no directory and stay as they
/// are; CSV and JSON keep whole paths.
pub fn short_labels(images: &[(&str, Option<&str>)]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    // The last `k` components of `p` (the whole path, leading `/` included, once `k` reaches
    // its number of components).
    fn tail(p: &str, k: usize) -> &str {
        let mut cut = p.len();
        for _ in 0..k {
            match p[..cut].rfind('/') {
                Some(i) => cut = i,
                None => return p,
            }
        }
        if cut == 0 {
            p
        } else {
            &p[cut + 1..]
        }
    }
    let paths: BTreeSet<&str> = images.iter().map(|(p, _)| *p).collect();
    let mut by_path: BTreeMap<&str, &str> = BTreeMap::new();
    for &p in &paths {
        let mut k = 1;
        // Lengthen while another path ends the same; a path's whole self always differs.
        // (`/lib/x` and `/usr/lib/x` are told apart by their whole paths, not `lib/x`.)
        let same =
            |q: &str, k| tail(q, k).trim_start_matches('/') == tail(p, k).trim_start_matches('/');
        while tail(p, k) != p && paths.iter().any(|&q| q != p && same(q, k)) {
            k += 1;
        }
        // The basename may be empty (a path ending in `/`): show the whole path then.
        let label = if tail(p, k).is_empty() { p } else { tail(p, k) };
        by_path.insert(p, label);
    }
    let mut builds: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (p, b) in images {
        if let Some(b) = b {
            builds.entry(p).or_default().insert(b);
        }
    }
    images
        .iter()
        .map(|(p, b)| {
            let label = by_path[p];
            let others = builds.get(p).filter(|s| s.len() > 1);
            match (b, others) {
                (Some(b), Some(all)) => {
                    let mut n = 8.min(b.len());
                    while n < b.len() && all.iter().any(|o| o != b && o.get(..n) == b.get(..n)) {
                        n += 1;
                    }
                    format!("{label} ({})", &b[..n])
                }
                _ => label.to_owned(),
            }
        })
        .collect()
}

#[cfg(test)]
mod label_tests {
    use super::short_labels;

    fn labels(v: &[(&str, Option<&str>)]) -> Vec<String> {
        short_labels(v)
    }

    #[test]
    fn images_are_named_by_basename_unless_two_differ_only_in_directory() {
        assert_eq!(
            labels(&[
                ("/usr/lib/x86_64-linux-gnu/libc.so.6", None),
                ("/usr/bin/bash", Some("aa")),
                ("[kernel.kallsyms]", None),
                ("[vdso]", None),
            ]),
            ["libc.so.6", "bash", "[kernel.kallsyms]", "[vdso]"]
        );
        assert_eq!(
            labels(&[
                ("/srv/v1/bin/app", None),
                ("/srv/v2/bin/app", None),
                ("/usr/bin/tool", None),
                ("/bin/app", None),
                ("/lib/libc.so.6", None),
                ("/usr/lib/libc.so.6", None),
            ]),
            [
                "v1/bin/app",
                "v2/bin/app",
                "tool",
                "/bin/app",
                "/lib/libc.so.6",
                "/usr/lib/libc.so.6"
            ]
        );
    }

    #[test]
    fn two_builds_of_one_path_get_a_short_build_id() {
        let old = "3b3b3b3b3b3b3b3b3b3b";
        let new = "3b3b3b3b3c3c3c3c3c3c";
        assert_eq!(
            labels(&[
                ("/opt/app", Some(old)),
                ("/opt/app", Some(new)),
                ("/opt/app", Some(old)),
                ("/usr/lib/libm.so.6", Some("ffffffffffff")),
            ]),
            ["app (3b3b3b3b3b)", "app (3b3b3b3b3c)", "app (3b3b3b3b3b)", "libm.so.6"]
        );
        assert_eq!(
            labels(&[("/a/app", Some("0123456789ab")), ("/a/app", Some("9999999999ab"))]),
            ["app (01234567)", "app (99999999)"]
        );
    }
}
