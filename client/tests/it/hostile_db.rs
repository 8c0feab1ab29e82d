//! dcpiprof on a database where a `.prof` was replaced by a FIFO, a symbolic link to
//! /dev/zero or a sparse 3 GiB file: an error naming the file and exit status 2, at once
//! (before, the FIFO and /dev/zero made it hang).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use dcpi_testkit::db::{build_id, event, single_host, Image};
use dcpi_testkit::Hostile;
use profile_format::HostDir;

use crate::util::prof_command;

fn write_profile(hd: &HostDir, img: u8) -> PathBuf {
    let image = Image::elf(build_id(img, 8), format!("/bin/img{img}"));
    image.profile(&event("cpu-clock", 1000)).count(0x10, 7).period(1000).write(hd)
}

/// Run dcpiprof with a deadline of 60 s (killed and failed past it).
fn prof_bounded(db: &Path, args: &[&str]) -> Output {
    let mut child = prof_command(db, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dcpiprof");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            drop(child.kill());
            drop(child.wait());
            panic!("dcpiprof {args:?} still running after 60 s on a hostile file");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn fifo_dev_zero_link_and_3_gib_file_are_errors_naming_the_file() {
    for kind in [Hostile::Fifo, Hostile::DevZeroLink, Hostile::Sparse] {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("db");
        let hd = single_host(&root, "h1");
        write_profile(&hd, 1);
        let path = write_profile(&hd, 2);
        kind.plant(&path);
        let o = prof_bounded(&root, &["--host", "all"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{kind:?}: {err}");
        assert!(err.contains(&path.display().to_string()), "{kind:?}: file not named: {err}");
        assert!(!err.contains("panicked"), "{kind:?}: {err}");
        // --keep-going reports the rest, still naming the file.
        let o = prof_bounded(&root, &["--host", "all", "--keep-going"]);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{kind:?}: {err}");
        assert!(out.lines().any(|l| l.ends_with("  img1")), "{kind:?}: {out}");
        assert!(err.contains(&path.display().to_string()), "{kind:?}: {err}");
    }
}
