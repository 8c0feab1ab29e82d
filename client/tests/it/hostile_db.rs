//! dcpiprof on a database where a `.prof` was replaced by a FIFO, a symbolic link to
//! /dev/zero or a sparse 3 GiB file: an error naming the file and exit status 2, at once
//! (before, the FIFO and /dev/zero made it hang).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use profile_format::{Database, HostDir, ImageId, ImageKind};

use crate::util::{self, event, prof_command};

fn host_dir(root: &Path) -> HostDir {
    let db = Database::create(root).expect("create db");
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
    let e = db.new_epoch(t, "h1").expect("epoch");
    let hd = db.host_dir(&e, "h1").expect("host dir");
    hd.create().expect("create");
    hd
}

fn write_profile(hd: &HostDir, img: u8) -> PathBuf {
    let id = ImageId::BuildId(vec![img; 8]);
    let path = format!("/bin/img{img}");
    let ev = event("cpu-clock", 1000);
    util::write_profile(hd, ImageKind::Elf, &id, path.as_bytes(), &ev, &[(0x10, 7)], 1000);
    hd.profile_path(&id, "cpu-clock")
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
            let _ = child.kill();
            let _ = child.wait();
            panic!("dcpiprof {args:?} still running after 60 s on a hostile file");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn fifo_dev_zero_link_and_3_gib_file_are_errors_naming_the_file() {
    for kind in ["fifo", "dev-zero", "sparse"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("db");
        let hd = host_dir(&root);
        write_profile(&hd, 1);
        let path = write_profile(&hd, 2);
        let header = std::fs::read(&path).expect("read");
        std::fs::remove_file(&path).expect("rm");
        match kind {
            "fifo" => {
                let ok = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
                assert!(ok.success());
            }
            "dev-zero" => std::os::unix::fs::symlink("/dev/zero", &path).expect("symlink"),
            _ => {
                std::fs::write(&path, &header).expect("write");
                let f = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
                f.set_len(3 << 30).expect("set_len");
            }
        }
        let o = prof_bounded(&root, &["--host", "all"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{kind}: {err}");
        assert!(err.contains(&path.display().to_string()), "{kind}: file not named: {err}");
        assert!(!err.contains("panicked"), "{kind}: {err}");
        // --keep-going reports the rest, still naming the file.
        let o = prof_bounded(&root, &["--host", "all", "--keep-going"]);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{kind}: {err}");
        assert!(out.contains("/bin/img1"), "{kind}: {out}");
        assert!(err.contains(&path.display().to_string()), "{kind}: {err}");
    }
}
