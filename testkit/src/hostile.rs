//! Hostile files planted where a database file should be: a FIFO (a plain `open` blocks for
//! ever), a symbolic link, the `/dev/zero` device (a plain `read` never ends), a sparse 3 GiB
//! file. Every reader of the database must refuse each at once, naming the file.

use std::path::Path;
use std::process::{Command, Stdio};

/// What replaces a database file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// A FIFO.
    Fifo,
    /// A symbolic link to a valid copy of the file (`<name>.target`): still refused, since a
    /// link can point anywhere.
    Symlink,
    /// The `/dev/zero` device itself where `mknod` is permitted (root), else a link to it.
    DevZero,
    /// A symbolic link to `/dev/zero`.
    DevZeroLink,
    /// The original's bytes (its header, announcing the real length), grown to 3 GiB, sparse.
    Sparse,
}

impl Hostile {
    /// The four kinds every reader is checked against.
    pub const ALL: [Self; 4] = [Self::Fifo, Self::Symlink, Self::DevZero, Self::Sparse];

    /// Replace the file at `path` (if any) by this.
    pub fn plant(self, path: &Path) {
        let original = match std::fs::read(path) {
            Ok(b) => {
                std::fs::remove_file(path).expect("remove the original");
                b
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("read {}: {e}", path.display()),
        };
        match self {
            Self::Fifo => {
                let ok = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
                assert!(ok.success(), "mkfifo {}", path.display());
            }
            Self::Symlink => {
                let target = path.with_extension("target");
                std::fs::write(&target, &original).expect("write link target");
                std::os::unix::fs::symlink(&target, path).expect("symlink");
            }
            Self::DevZero => {
                let made = Command::new("mknod")
                    .arg(path)
                    .args(["c", "1", "5"])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !made {
                    std::os::unix::fs::symlink("/dev/zero", path).expect("symlink");
                }
            }
            Self::DevZeroLink => std::os::unix::fs::symlink("/dev/zero", path).expect("symlink"),
            Self::Sparse => {
                std::fs::write(path, &original).expect("write");
                let f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
                f.set_len(3 << 30).expect("set_len");
            }
        }
    }
}

/// Replace the file at `path` by `hostile` (see [`Hostile::plant`]).
pub fn plant(path: &Path, hostile: Hostile) {
    hostile.plant(path);
}
