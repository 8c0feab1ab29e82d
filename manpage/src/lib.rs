//! Man pages of the dcpi binaries. `clap_mangen` renders a command's synopsis and options; a
//! page a user can rely on also needs a NAME line that reads as one ("dcpiprof \- report ..."),
//! the commands of a tool with subcommands inline (`clap_mangen` points at `dcpictl-status(8)`
//! pages that do not exist), and EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES and SEE ALSO. Each
//! binary describes those in a [`Page`]; [`render`] writes the whole page.
//!
//! Every binary's hidden `--generate WHAT` flag takes a [`Generate`] and calls [`generate`]:
//! the one place that writes a man page or a shell completion script.
#![forbid(unsafe_code)]

use std::io::Write;

use clap_mangen::roff::{bold, italic, roman, Inline, Roff};

/// What a page says besides the command line.
#[derive(Clone, Debug, Default)]
pub struct Page<'a> {
    /// Man section: `1` for the report tools, `8` for dcpid and dcpictl, `5` for a file format.
    pub section: &'a str,
    /// The NAME line's description (after `NAME \-`): lower case, no final period.
    pub summary: &'a str,
    /// (status, meaning), in order.
    pub exit_status: &'a [(&'a str, &'a str)],
    /// (variable, meaning).
    pub environment: &'a [(&'a str, &'a str)],
    /// (path, meaning).
    pub files: &'a [(&'a str, &'a str)],
    /// (command line, what it does).
    pub examples: &'a [(&'a str, &'a str)],
    /// Other pages, `name(section)`.
    pub see_also: &'a [&'a str],
}

/// The dcpi man pages, `(name, section)`: what a SEE ALSO may point at.
pub const PAGES: &[(&str, &str)] = &[
    ("dcpid", "8"),
    ("dcpictl", "8"),
    ("dcpiprof", "1"),
    ("dcpilist", "1"),
    ("dcpidiff", "1"),
    ("dcpistats", "1"),
    ("dcpiexport", "1"),
    ("dcpid.toml", "5"),
];

/// SEE ALSO of a dcpi page: every other dcpi page.
pub fn others(name: &str) -> Vec<String> {
    PAGES.iter().filter(|(n, _)| *n != name).map(|(n, s)| format!("{n}({s})")).collect()
}

/// `--generate WHAT`: a man page or a completion script, written to stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generate {
    /// The man page (roff).
    Man,
    /// Completions for bash.
    CompleteBash,
    /// Completions for zsh.
    CompleteZsh,
    /// Completions for fish.
    CompleteFish,
}

/// Write what `what` asks for about `cmd`: its man page with `page`'s sections, or a
/// completion script for the command's name.
pub fn generate(
    mut cmd: clap::Command,
    what: Generate,
    page: &Page<'_>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let shell = match what {
        Generate::Man => return render(cmd, page, out),
        Generate::CompleteBash => clap_complete::Shell::Bash,
        Generate::CompleteZsh => clap_complete::Shell::Zsh,
        Generate::CompleteFish => clap_complete::Shell::Fish,
    };
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, &mut cmd, name, out);
    Ok(())
}

/// Write the man page of `cmd` with `page`'s sections.
pub fn render(cmd: clap::Command, page: &Page<'_>, out: &mut dyn Write) -> std::io::Result<()> {
    let mut cmd = cmd;
    cmd.build();
    let name = cmd.get_name().to_owned();
    // clap's after_long_help is rendered below as DETAILS, not as clap_mangen's "EXTRA".
    let details = cmd.get_after_long_help().or(cmd.get_after_help()).map(ToString::to_string);
    let man_cmd = cmd.clone().after_help(None::<&str>).after_long_help(None::<&str>);
    let man = clap_mangen::Man::new(man_cmd.clone()).section(page.section);
    man.render_title(out)?;
    let mut r = Roff::new();
    r.control("SH", ["NAME"]);
    r.text([roman(format!("{name} - {}", page.summary))]);
    r.to_writer(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    if man_cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(out)?;
    }
    let mut r = Roff::new();
    let subs: Vec<&clap::Command> = visible_subcommands(&man_cmd);
    if !subs.is_empty() {
        r.control("SH", ["COMMANDS"]);
        for s in subs {
            commands(&mut r, &name, s);
        }
    }
    if let Some(d) = details {
        r.control("SH", ["DETAILS"]);
        preformatted(&mut r, &d);
    }
    tail_sections(&mut r, page);
    if let Some(v) = man_cmd.get_version() {
        r.control("SH", ["VERSION"]);
        r.text([roman(format!("{name} {v}"))]);
    }
    r.to_writer(out)
}

/// A subcommand as `.TP` paragraphs: `dcpictl epoch new`, its arguments and help.
fn commands(r: &mut Roff, parent: &str, c: &clap::Command) {
    let full = format!("{parent} {}", c.get_name());
    let subs: Vec<&clap::Command> = visible_subcommands(c);
    if subs.is_empty() {
        let mut head = vec![bold(full.clone())];
        for a in own_args(c) {
            let flag = match (a.get_long(), a.get_short()) {
                (Some(l), _) => format!("--{l}"),
                (None, Some(s)) => format!("-{s}"),
                (None, None) => a.get_id().to_string().to_uppercase(),
            };
            head.push(roman(" ["));
            head.push(bold(flag));
            head.push(roman("]"));
        }
        r.control("TP", []);
        r.text(head);
        let help =
            c.get_long_about().or(c.get_about()).map(ToString::to_string).unwrap_or_default();
        paragraphs(r, &help, "IP");
        for a in own_args(c) {
            if let (Some(l), Some(h)) = (a.get_long(), a.get_long_help().or(a.get_help())) {
                r.control("RS", []);
                r.text([bold(format!("--{l}")), roman(format!(": {h}"))]);
                r.control("RE", []);
            }
        }
    } else {
        for s in subs {
            commands(r, &full, s);
        }
    }
}

/// Subcommands a user types (not clap's generated `help`).
fn visible_subcommands(c: &clap::Command) -> Vec<&clap::Command> {
    c.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help").collect()
}

/// A subcommand's own arguments (not the global ones, not --help/--version).
fn own_args(c: &clap::Command) -> impl Iterator<Item = &clap::Arg> {
    c.get_arguments().filter(|a| {
        !a.is_hide_set() && !a.is_global_set() && !matches!(a.get_id().as_str(), "help" | "version")
    })
}

/// Text with blank-line separated paragraphs, each after the first begun by macro `sep`
/// (`PP` at the left margin, `IP` indented under a `.TP` item).
fn paragraphs(r: &mut Roff, text: &str, sep: &str) {
    for (i, p) in text.split("\n\n").enumerate() {
        if i > 0 {
            r.control(sep, []);
        }
        r.text([roman(p.split_whitespace().collect::<Vec<_>>().join(" "))]);
    }
}

/// Text laid out by hand (tables, schemas): kept line for line.
fn preformatted(r: &mut Roff, text: &str) {
    r.control("nf", []);
    for line in text.lines() {
        r.text([roman(line)]);
    }
    r.control("fi", []);
}

/// EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES and SEE ALSO, in the order man-pages(7) gives.
fn tail_sections(r: &mut Roff, page: &Page<'_>) {
    list(r, "EXIT STATUS", page.exit_status);
    list(r, "ENVIRONMENT", page.environment);
    list(r, "FILES", page.files);
    if !page.examples.is_empty() {
        r.control("SH", ["EXAMPLES"]);
        for (text, what) in page.examples {
            r.control("PP", []);
            r.text([roman(*what)]);
            r.control("RS", ["4"]);
            r.control("nf", []);
            for line in text.lines() {
                r.text([bold(line)]);
            }
            r.control("fi", []);
            r.control("RE", []);
        }
    }
    if !page.see_also.is_empty() {
        r.control("SH", ["SEE ALSO"]);
        let mut inl: Vec<Inline> = Vec::new();
        for (i, p) in page.see_also.iter().enumerate() {
            let (n, rest) = p.split_once('(').unwrap_or((p, ""));
            let sep = if i + 1 < page.see_also.len() { ", " } else { "" };
            inl.push(bold(n));
            inl.push(roman(format!("({rest}{sep}")));
        }
        r.text(inl);
    }
}

fn list(r: &mut Roff, title: &str, items: &[(&str, &str)]) {
    if items.is_empty() {
        return;
    }
    r.control("SH", [title]);
    for (k, v) in items {
        r.control("TP", []);
        r.text([bold(*k)]);
        r.text([roman(*v)]);
    }
}

/// One key of a configuration file page: name, value placeholder, help, the flag that sets it.
#[derive(Clone, Debug)]
pub struct Key {
    pub name: String,
    pub value: String,
    pub help: String,
    pub flag: Option<String>,
    pub note: String,
}

/// A file-format page (section 5): description, then one entry per key, then `page`'s sections.
pub fn render_file_page(
    name: &str,
    version: &str,
    description: &str,
    keys: &[Key],
    page: &Page<'_>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut r = Roff::new();
    r.control("TH", [name, page.section, "", &format!("{name} {version}"), ""]);
    r.control("SH", ["NAME"]);
    r.text([roman(format!("{name} - {}", page.summary))]);
    r.control("SH", ["DESCRIPTION"]);
    paragraphs(&mut r, description, "PP");
    r.control("SH", ["KEYS"]);
    for k in keys {
        r.control("TP", []);
        r.text([bold(k.name.clone()), roman(" = "), italic(k.value.clone())]);
        r.text([roman(k.help.clone())]);
        let mut tail = k.note.clone();
        if let Some(f) = &k.flag {
            tail.push_str(&format!(" Command line: {f}."));
        }
        if !tail.trim().is_empty() {
            r.control("br", []);
            r.text([roman(tail.trim().to_owned())]);
        }
    }
    r.to_writer(out)?;
    let mut r = Roff::new();
    tail_sections(&mut r, page);
    r.to_writer(out)
}
