//! End-to-end tests: what a new user meets in the first hour (issue #21) — plain-text logs off a
//! terminal, "did you mean" for event names, events this machine cannot count, quiet exit on
//! a closed pipe for the daemon-facing tools.

use std::process::{Command, Output, Stdio};

use dcpi_e2e::{bin, Sandbox};

use crate::{install_root, repo_root};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run `dcpid` for a second on the sandbox with `extra` arguments; stderr goes to `log`.
fn short_daemon(sb: &Sandbox, extra: &[&str], log: std::fs::File) -> std::process::ExitStatus {
    Command::new(bin("dcpid"))
        .args(sb.daemon_args("fh"))
        .args(["--duration", "1s"])
        .args(extra)
        .env_remove("NO_COLOR")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null())
        .stderr(log)
        .status()
        .expect("run dcpid")
}

#[dcpi_testkit::test(perf)]
fn daemon_log_in_a_file_has_no_colour_codes() {
    let sb = Sandbox::new();
    let path = sb.dir.path().join("dcpid.log");
    let status = short_daemon(&sb, &[], std::fs::File::create(&path).expect("log file"));
    let log = std::fs::read_to_string(&path).expect("read log");
    assert!(status.success(), "{log}");
    assert!(log.contains("sampling started"), "the log was written: {log}");
    assert!(!log.contains('\x1b'), "ANSI codes in a log file: {log:?}");

    // On a terminal the same log is coloured, unless NO_COLOR says otherwise.
    let sb2 = Sandbox::new();
    let cmd = |no_color: bool| -> Option<String> {
        let mut args = sb2.daemon_args("fh");
        args.extend(["--duration".into(), "1s".into()]);
        let line = format!("{} {} >/dev/null", bin("dcpid").display(), args.join(" "));
        let mut c = Command::new("script");
        c.args(["-qec", &line, "/dev/null"]).env_remove("JOURNAL_STREAM").stdin(Stdio::null());
        if no_color {
            c.env("NO_COLOR", "1");
        } else {
            c.env_remove("NO_COLOR");
        }
        let o = c.output().ok()?;
        o.status.success().then(|| text(&o.stdout))
    };
    match (cmd(false), cmd(true)) {
        (Some(coloured), Some(plain)) => {
            assert!(coloured.contains("sampling started"), "{coloured}");
            assert!(coloured.contains('\x1b'), "a terminal gets colour: {coloured:?}");
            assert!(plain.contains("sampling started"), "{plain}");
            assert!(!plain.contains('\x1b'), "NO_COLOR is respected: {plain:?}");
        }
        _ => dcpi_testkit::skipped(format_args!(
            "(terminal part) `script` cannot run a pseudo-terminal here"
        )),
    }
}

#[test]
fn mistyped_event_gets_a_suggestion() {
    // Parsed before anything is opened: needs no perf permission.
    let sb = Sandbox::new();
    let o = Command::new(bin("dcpid"))
        .args(sb.daemon_args("fh"))
        .args(["--events", "cpu-clok", "--duration", "1s"])
        .output()
        .expect("run dcpid");
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("unknown event `cpu-clok` (did you mean `cpu-clock`?)"), "{e}");
    let o = Command::new(bin("dcpid"))
        .args(sb.daemon_args("fh"))
        .args(["--events", "instrutcions", "--duration", "1s"])
        .output()
        .expect("run dcpid");
    assert!(text(&o.stderr).contains("did you mean `instructions`?"), "{}", text(&o.stderr));
    // Nothing close: no guess.
    let o = Command::new(bin("dcpid"))
        .args(sb.daemon_args("fh"))
        .args(["--events", "bogomips", "--duration", "1s"])
        .output()
        .expect("run dcpid");
    assert!(!text(&o.stderr).contains("did you mean"), "{}", text(&o.stderr));
}

#[dcpi_testkit::test(perf, no_pmu)]
fn event_the_pmu_cannot_count_lists_what_opens_here() {
    let sb = Sandbox::new();
    let o = Command::new(bin("dcpid"))
        .args(sb.daemon_args("fh"))
        .args(["--events", "cycles", "--duration", "1s"])
        .output()
        .expect("run dcpid");
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "a configuration error: {e}");
    assert!(e.contains("event `cycles` cannot be counted on this machine"), "{e}");
    assert!(e.contains("events that open here: cpu-clock"), "{e}");
    assert!(!e.contains("events that open here: cycles"), "{e}");
}

/// Run a binary with its stdout a pipe whose reader is already gone.
fn into_closed_pipe(name: &str, args: &[&str]) -> Output {
    // The write end of a pipe whose only reader (`true`) has exited: every write fails EPIPE.
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().expect("run true");
    let writer = reader.stdin.take().expect("pipe");
    reader.wait().expect("wait for true");
    Command::new(bin(name)).args(args).stdout(writer).stderr(Stdio::piped()).output().expect("run")
}

fn assert_quiet_success(what: &str, o: &Output) {
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{what}: {e}");
    for noise in ["error", "roken pipe", "panicked"] {
        assert!(!e.contains(noise), "{what} quiet: {e}");
    }
}

#[test]
fn dcpiexport_and_dcpid_generate_into_a_closed_pipe() {
    for name in ["dcpiexport", "dcpid", "dcpictl"] {
        let o = into_closed_pipe(name, &["--generate", "man"]);
        assert_quiet_success(name, &o);
    }
}

#[dcpi_testkit::test(perf)]
fn dcpictl_into_a_closed_pipe_exits_0() {
    let sb = Sandbox::new();
    let d = sb.start_daemon("fh", &[]);
    let sock = d.socket.display().to_string();
    for cmd in [&["status"][..], &["status", "--json"], &["epoch", "show"], &["flush"]] {
        let mut args = vec!["--socket", sock.as_str()];
        args.extend_from_slice(cmd);
        assert_quiet_success(&format!("dcpictl {cmd:?}"), &into_closed_pipe("dcpictl", &args));
    }
}

/// `make man` generates every page (dcpid.toml(5) too) and says where; each renders with groff
/// without a warning, has the sections of a real page, and every `dcpi…(N)` it mentions is one
/// of the generated pages; `make install` installs them all.
#[dcpi_testkit::test(tool("groff"), tool("make"))]
fn man_pages_render_cleanly_and_reference_only_existing_pages() {
    let gendir = tempfile::tempdir().expect("tempdir");
    let dest = install_root();
    let bindir_src = bin("dcpid").parent().expect("bin dir").to_path_buf();
    let make = |target: &str| -> String {
        let out = Command::new("make")
            .arg("-C")
            .arg(repo_root())
            .arg(target)
            .arg(format!("DESTDIR={}", dest.path().display()))
            .arg("PREFIX=/usr")
            .arg(format!("BINDIR_SRC={}", bindir_src.display()))
            .arg(format!("GENDIR={}", gendir.path().display()))
            .output()
            .expect("run make");
        assert!(out.status.success(), "make {target}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let said = make("man");
    let mandir = gendir.path().join("man");
    assert!(said.contains(&format!("man pages in {}", mandir.display())), "{said}");

    let mut pages: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(&mandir).expect("man dir") {
        let p = entry.expect("entry").path();
        let file = p.file_name().and_then(|f| f.to_str()).expect("name").to_owned();
        let (name, section) = file.rsplit_once('.').expect("name.section");
        pages.push((name.to_owned(), section.to_owned()));
    }
    pages.sort();
    let want = [
        "dcpictl.8",
        "dcpid.8",
        "dcpid.toml.5",
        "dcpidiff.1",
        "dcpiexport.1",
        "dcpilist.1",
        "dcpiprof.1",
        "dcpistats.1",
    ];
    let have: Vec<String> = pages.iter().map(|(n, s)| format!("{n}.{s}")).collect();
    assert_eq!(have, want, "generated pages");

    for (name, section) in &pages {
        let path = mandir.join(format!("{name}.{section}"));
        let o = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(&path)
            .output()
            .expect("groff");
        assert!(o.status.success() && o.stderr.is_empty(), "{name}: groff: {}", text(&o.stderr));
        let o = Command::new("groff")
            // No hyphenation and long lines, so that no reference is split.
            .args(["-man", "-Tutf8", "-P-cbou", "-rHY=0", "-rLL=1000n"])
            .arg(&path)
            .output()
            .expect("groff");
        let page = text(&o.stdout);
        // NAME: "name - summary", not the name twice or clap's about sentence.
        let name_line = page
            .lines()
            .skip_while(|l| l.trim() != "NAME")
            .nth(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("{name}: no NAME\n{page}"));
        assert!(name_line.starts_with(&format!("{name} - ")), "{name}: NAME line {name_line:?}");
        assert!(!name_line[name.len() + 3..].contains(&format!("{name}:")), "{name_line}");
        let mut sections = vec!["FILES", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"];
        if section != "5" {
            sections.extend(["SYNOPSIS", "EXIT STATUS"]);
        }
        for s in sections {
            assert!(page.lines().any(|l| l == s), "{name}: no {s} section\n{page}");
        }
        // Every dcpi page it points at exists (`dcpictl-status(8)` did not).
        let mut refs = 0;
        for (i, _) in page.match_indices("dcpi") {
            let rest = &page[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_'))
                .unwrap_or(rest.len());
            let (word, after) = rest.split_at(end);
            let Some(sec) = after.strip_prefix('(').and_then(|a| a.get(..2)) else { continue };
            let Some(sec) = sec.strip_suffix(')') else { continue };
            if !sec.chars().all(|c| c.is_ascii_digit()) {
                continue;
            }
            refs += 1;
            assert!(
                pages.iter().any(|(n, s)| n == word && s == sec),
                "{name}: refers to {word}({sec}), which is not a generated page"
            );
        }
        assert!(refs >= 2, "{name}: SEE ALSO names the other pages\n{page}");
    }

    make("install");
    for (name, section) in &pages {
        let f = dest.path().join(format!("usr/share/man/man{section}/{name}.{section}"));
        assert!(f.is_file(), "{} not installed", f.display());
    }
    make("uninstall");
    assert!(!dest.path().join("usr/share/man/man5/dcpid.toml.5").exists());
}
