//! End-to-end tests: what a new user meets in the first hour (issue #21) — plain-text logs off a
//! terminal, "did you mean" for event names, events this machine cannot count, quiet exit on
//! a closed pipe for the daemon-facing tools.

use std::process::{Command, Output, Stdio};

use dcpi_e2e::{bin, require_perf, Sandbox};

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

#[test]
fn daemon_log_in_a_file_has_no_colour_codes() {
    if !require_perf() {
        return;
    }
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
        _ => eprintln!("SKIPPED (terminal part): `script` cannot run a pseudo-terminal here"),
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

#[test]
fn event_the_pmu_cannot_count_lists_what_opens_here() {
    if !require_perf() {
        return;
    }
    let probe = dcpi_e2e::run("dcpid", &["--probe"]);
    if text(&probe.stdout).contains("hardware PMU available") {
        eprintln!("SKIPPED: this machine has a hardware PMU, so `cycles` opens");
        return;
    }
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
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
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

#[test]
fn dcpictl_into_a_closed_pipe_exits_0() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let d = sb.start_daemon("fh", &[]);
    let sock = d.socket.display().to_string();
    for cmd in [&["status"][..], &["status", "--json"], &["epoch", "show"], &["flush"]] {
        let mut args = vec!["--socket", sock.as_str()];
        args.extend_from_slice(cmd);
        assert_quiet_success(&format!("dcpictl {cmd:?}"), &into_closed_pipe("dcpictl", &args));
    }
}
