//! A small tmpfs mounted for a test (to fill a file system), unmounted when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a directory while it lives.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mount a tmpfs of `size` (`mount`'s syntax: `64k`, `4m`) with mode 0755 on `dir`
    /// (created); `None` after [`crate::skipped`] where that is not possible (not root, mount
    /// refused), which panics under `DCPI_REQUIRE_ALL=1`.
    pub fn mount(dir: &Path, size: &str) -> Option<Self> {
        Self::mount_mode(dir, size, 0o755)
    }

    /// [`Tmpfs::mount`] with the root directory's `mode`.
    pub fn mount_mode(dir: &Path, size: &str, mode: u32) -> Option<Self> {
        if let Err(why) = crate::Req::Root.check() {
            crate::skipped(format_args!("mounting a tmpfs needs root: {why}"));
            return None;
        }
        std::fs::create_dir_all(dir).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode={mode:o}"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self(dir.to_path_buf())),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                crate::skipped(format_args!("mount -t tmpfs failed: {}", why.trim()));
                None
            }
            Err(e) => {
                crate::skipped(format_args!("cannot run mount: {e}"));
                None
            }
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Fill it to the last byte with a file `ballast`; the ballast's path.
    pub fn fill(&self) -> PathBuf {
        let p = self.0.join("ballast");
        fill(&p);
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            // Still busy (a child that has not exited yet): detach it now, freed when unused.
            drop(Command::new("umount").arg("-l").arg(&self.0).status());
        }
    }
}

/// Create `path` and write to it until its file system is full (ENOSPC), the last bytes one
/// at a time. Panics on any other error.
pub fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("create ballast");
    let chunk = vec![0x5au8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // Partial pages: fill the last bytes one at a time.
    while matches!(f.write(&[0]), Ok(1)) {}
    drop(f.flush());
}
