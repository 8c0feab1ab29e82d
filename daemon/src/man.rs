//! The man pages of dcpid: dcpid(8) and dcpid.toml(5), the latter generated from the one
//! settings declaration (`settings!` in [`crate::config`]) so that it lists every key.

use std::io::Write;

use clap::Args;
use dcpi_manpage::{Key, Page};

use crate::config::{PartialSettings, DEFAULT_CONFIG, RELOADABLE};

const EXIT: &[(&str, &str)] = &[
    (
        "0",
        "Stopped by SIGTERM or SIGINT, or at the end of --duration, with everything flushed and \
         published.",
    ),
    (
        "1",
        "Another failure to start, a fatal error while running, or samples dropped: written \
         neither to the spool nor to the database (the closing log line `dcpid stopped \
         samples=N dropped=D` says how many).",
    ),
    (
        "2",
        "Usage or configuration error: a bad flag or key, an unknown event (with a suggestion) \
         or one this machine cannot count (with the events that can), a bad period, an \
         unusable database or spool path, sampling not permitted.",
    ),
];

const ENV: &[(&str, &str)] = &[
    ("DCPI_LOG", "Log filter; wins over log_level and -v (e.g. DCPI_LOG=dcpid::store=debug)."),
    ("JOURNAL_STREAM", "Set by systemd: with --log-format auto, logs go to the journal."),
    ("NOTIFY_SOCKET, WATCHDOG_USEC", "Set by systemd: readiness, STATUS= and watchdog."),
    ("NO_COLOR", "When set and not empty, no colour in the log even on a terminal."),
];

const FILES: &[(&str, &str)] = &[
    ("/etc/dcpi/dcpid.toml", "The configuration file, see dcpid.toml(5)."),
    ("/var/lib/dcpi", "The profile database (may be an NFS mount shared by the fleet)."),
    ("/var/lib/dcpid/spool", "The host-local spool: increments not yet published."),
    (
        "/run/dcpi/dcpid.sock",
        "The control socket used by dcpictl(8): one JSON request line within 2 s, or the \
         connection is answered with an error and closed; at most 512 connections, 128 per \
         uid (when full, the oldest idle connection of the process holding the most is closed \
         for a newcomer).",
    ),
];

/// dcpid(8) or a completion script ([`dcpi_manpage::generate`]).
pub fn generate(
    cmd: clap::Command,
    what: dcpi_manpage::Generate,
    section: &str,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let see = see_also("dcpid");
    let see: Vec<&str> = see.iter().map(String::as_str).collect();
    let page = Page {
        section,
        summary: "continuous, system-wide profiling daemon of the dcpi profiler",
        exit_status: EXIT,
        environment: ENV,
        files: FILES,
        examples: &[
            (
                "dcpid --config none --db ./dcpi-db --spool ./dcpi-spool --socket ./dcpid.sock \
                 --duration 20s",
                "Profile the whole machine for 20 seconds into a private database:",
            ),
            ("dcpid --probe", "Whether sampling is possible here, and why not:"),
            ("systemctl enable --now dcpid", "Run it as a service:"),
        ],
        see_also: &see,
    };
    dcpi_manpage::generate(cmd, what, &page, out)
}

fn see_also(name: &str) -> Vec<String> {
    dcpi_manpage::others(name)
}

/// dcpid.toml(5): every key of the settings declaration, its type, meaning and flag.
pub fn config(out: &mut dyn Write) -> std::io::Result<()> {
    let cmd = PartialSettings::augment_args(clap::Command::new("dcpid.toml"));
    let keys: Vec<Key> = cmd
        .get_arguments()
        .map(|a| {
            let name = a.get_id().to_string();
            let value = a
                .get_value_names()
                .and_then(|v| v.first())
                .map_or_else(|| "VALUE".to_owned(), std::string::ToString::to_string);
            let value = match value.as_str() {
                "DUR" => "\"DURATION\"".to_owned(),
                "DIR" | "FILE" | "PATH" | "NAME" | "LEVEL" => format!("\"{value}\""),
                "LIST" => "\"auto\" | [\"EVENT[:PERIOD]\", ...]".to_owned(),
                _ => value,
            };
            let help =
                a.get_long_help().or(a.get_help()).map(ToString::to_string).unwrap_or_default();
            let note = if RELOADABLE.contains(&name.as_str()) {
                "A reload (SIGHUP, dcpictl reload) applies a change at once."
            } else {
                "A change takes effect at the next start (a reload reports it)."
            };
            Key {
                flag: a.get_long().map(|l| format!("--{l}")),
                name,
                value,
                help,
                note: note.to_owned(),
            }
        })
        .collect();
    let see = see_also("dcpid.toml");
    let see: Vec<&str> = see.iter().map(String::as_str).collect();
    let page = Page {
        section: "5",
        summary: "configuration file of the dcpid profiling daemon",
        exit_status: &[],
        environment: &[("DCPI_LOG", "Wins over log_level.")],
        files: &[(DEFAULT_CONFIG, "Read at start and on reload; a missing file is fine.")],
        examples: &[(
            "events = [\"cycles:2000000\", \"instructions\"]\nflush_interval = \"2s\"\n\
             publish_interval = \"60s\"\nretention_days = 7\nsocket_group = \"dcpi\"",
            "Two hardware events with their periods, and the default intervals:",
        )],
        see_also: &see,
    };
    let description = format!(
        "dcpid(8) reads its settings from {DEFAULT_CONFIG} (or the file given with --config), \
         a TOML file of top-level keys. Every key is optional and has a built-in default; \
         every key is also a command-line flag, which wins over the file. Durations are \
         strings such as \"500ms\", \"2s\", \"1m30s\", \"1h\" or \"7d\"; a plain number is \
         seconds. An unknown key, a value of the wrong type or out of range is an error naming \
         the file, line and column; on reload such a file is rejected and the running settings \
         stay.\n\nThe installed file lists every key with its default and meaning."
    );
    dcpi_manpage::render_file_page(
        "dcpid.toml",
        env!("CARGO_PKG_VERSION"),
        &description,
        &keys,
        &page,
        out,
    )
}
