//! The sections of the client tools' man pages that clap does not know: NAME, EXIT STATUS,
//! ENVIRONMENT, FILES, EXAMPLES, SEE ALSO (rendered by [`dcpi_manpage::render`]).

use std::io::Write;

use dcpi_manpage::Page;

const REPORT_EXIT: &[(&str, &str)] = &[
    ("0", "Success, also when the reader of a pipe closed it early (`| head`)."),
    ("1", "The output could not be written."),
    (
        "2",
        "Usage or data error: bad arguments, no database, nothing matching the selection, a \
         corrupt profile without --keep-going, an ambiguous --image (the matches are listed).",
    ),
];

const REPORT_ENV: &[(&str, &str)] = &[
    ("DCPI_DB", "The database directory when --db is not given (default /var/lib/dcpi)."),
    ("DCPI_SYMBOL_CACHE", "The symbol cache file when --symbol-cache is not given."),
    ("XDG_CACHE_HOME", "The symbol cache is $XDG_CACHE_HOME/dcpi/symbols.sqlite when set."),
    ("DCPI_LOG", "Log filter for diagnostics on stderr (default warn), e.g. DCPI_LOG=debug."),
    (
        "DCPI_IO_THREADS",
        "How many database files a report reads at once (default 32; 1 reads one at a time). \
         More hides more latency of a network file system.",
    ),
    ("NO_COLOR", "When set and not empty, no colour even on a terminal."),
];

const REPORT_FILES: &[(&str, &str)] = &[
    ("/var/lib/dcpi", "The profile database: epochs/ID/HOST/*.prof and summary.json."),
    (
        "/var/lib/dcpi/binaries",
        "Build-id cache of binaries (dcpiprof --cache-binary), and the function-symbol tables \
         dcpid stored (XX/REST.sym): an image whose binary was rebuilt or deleted is named from \
         its table (no source lines or inlines).",
    ),
    ("~/.cache/dcpi/symbols.sqlite", "Cached symbol tables and DWARF answers."),
    ("/usr/lib/debug", "Separate debug files (.build-id/xx/rest.debug, .gnu_debuglink)."),
];

/// The page of client tool `name`; `None` for a name that is not one.
pub fn page(name: &str) -> Option<Page<'static>> {
    let p = match name {
        "dcpiprof" => Page {
            section: "1",
            summary: "report dcpi profiles per image, per symbol or per source line",
            examples: &[
                ("dcpiprof", "Where the time went on this host in the current epoch, per image:"),
                ("dcpiprof --image nginx --limit 20", "The 20 hottest functions of one image:"),
                ("dcpiprof --image postgres --lines", "Per source line, under each function:"),
                ("dcpiprof --host all --since 2h", "Every host over the last two hours:"),
                ("dcpiprof --format pprof -o cpu.pb.gz", "A pprof file for go tool pprof:"),
            ],
            ..report_page()
        },
        "dcpilist" => Page {
            section: "1",
            summary: "list one function's samples per instruction and per source line",
            examples: &[
                ("dcpilist --image postgres --symbol ExecScan", "Per instruction:"),
                ("dcpilist --image postgres --symbol ExecScan --both", "Source and assembly:"),
                ("dcpilist --top 20", "The 20 hottest instructions of the machine:"),
            ],
            ..report_page()
        },
        "dcpidiff" => Page {
            section: "1",
            summary: "compare two selections of dcpi profiles with a significance test",
            examples: &[
                ("dcpidiff --before 20261123 --after 20261124 --image postgres", "Day vs day:"),
                ("dcpidiff --epoch all --before-host web-1 --after-host web-2", "Host vs host:"),
            ],
            ..report_page()
        },
        "dcpistats" => Page {
            section: "1",
            summary: "spread of one image's per-function shares over epochs or hosts",
            examples: &[(
                "dcpistats --image postgres --by epoch",
                "How much each function's share varies from epoch to epoch:",
            )],
            ..report_page()
        },
        "dcpiexport" => Page {
            section: "1",
            summary: "export dcpi profiles as Parquet or CSV for SQL engines",
            exit_status: &[
                ("0", "Success."),
                ("1", "The output could not be written."),
                (
                    "2",
                    "Usage or data error: no database, nothing selected, a corrupt profile \
                     without --keep-going, an output directory holding something else.",
                ),
            ],
            examples: &[(
                "dcpiexport --epoch all --host all --output /srv/dcpi-parquet",
                "Every epoch of every host, incrementally, as Hive-partitioned Parquet:",
            )],
            ..report_page()
        },
        "dcpictl" => Page {
            section: "8",
            summary: "control a running dcpid profiling daemon",
            exit_status: &[
                ("0", "Success."),
                ("1", "The daemon reported an error (e.g. a flush could not be completed)."),
                ("2", "Usage error."),
                (
                    "3",
                    "dcpid is not running, or the socket cannot be reached: the message names \
                     the socket and, without permission, its owner and group (root or the \
                     socket's group, dcpid's --socket-group, dcpi by default, is needed).",
                ),
                ("4", "Communication error: a bad or missing response."),
            ],
            environment: &[(
                "(none)",
                "dcpictl reads no environment variable; choose the socket with --socket.",
            )],
            files: &[(
                "/run/dcpi/dcpid.sock",
                "dcpid's control socket, mode 0660, group dcpi (or dcpid's --socket-group): \
                 root and members of that group may use it.",
            )],
            examples: &[
                ("dcpictl status", "Events, samples per CPU, losses, the epoch, overhead:"),
                ("dcpictl flush && dcpiprof", "A report that includes the last seconds:"),
                ("dcpictl epoch new", "Close the current epoch and start the next:"),
            ],
            ..Page::default()
        },
        _ => return None,
    };
    Some(p)
}

fn report_page() -> Page<'static> {
    Page {
        exit_status: REPORT_EXIT,
        environment: REPORT_ENV,
        files: REPORT_FILES,
        ..Page::default()
    }
}

pub use dcpi_manpage::Generate;

/// `--generate WHAT` of client tool `cmd` (its name picks the man page), through
/// [`dcpi_manpage::generate`].
pub fn generate(cmd: clap::Command, what: Generate, out: &mut dyn Write) -> std::io::Result<()> {
    let name = cmd.get_name().to_owned();
    let mut p = page(&name).ok_or_else(|| std::io::Error::other(format!("no page for {name}")))?;
    let others = dcpi_manpage::others(&name);
    let see: Vec<&str> = others.iter().map(String::as_str).collect();
    p.see_also = &see;
    dcpi_manpage::generate(cmd, what, &p, out)
}

/// Write the man page of client tool `cmd` (its name picks the page).
pub fn write(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    generate(cmd, Generate::Man, out)
}
