//! `dcpilist`: where inside one function the samples fall, instruction by instruction and
//! source line by source line (DCPI's `dcpilist`), and the hottest instructions of the whole
//! machine (`--top`, DCPI's `dcpitopcounts`).
//!
//! * [`listing`] finds the function, its code bytes and the samples in it, and builds rows;
//! * [`disasm`] decodes x86-64 with iced-x86 and finds basic blocks and branch targets;
//! * [`load`] reads the profiles a listing or `--top` counts (`--command`/`--cgroup` or published);
//! * [`top`] ranks instructions across every image;
//! * [`render`] writes a table, JSON or CSV.

pub mod cli;
pub mod disasm;
pub mod kernel;
pub mod listing;
pub mod load;
pub mod render;
pub mod top;

use std::io::Write;

use clap::CommandFactory;

use crate::manpages;
use crate::notes;
use crate::prof;

pub use cli::{Args, ListError, Mode, HELP, SKID_NOTE};
use dcpi_report::escape;

/// Print an error the way `dcpilist` does (with the candidate lists).
pub fn print_error(err: &mut dyn Write, e: &ListError) {
    match e {
        ListError::Prof(p) => {
            let mut buf = Vec::new();
            prof::print_error(&mut buf, p);
            let text = String::from_utf8_lossy(&buf).replacen("dcpiprof:", "dcpilist:", 1);
            drop(err.write_all(text.as_bytes()));
        }
        ListError::Ambiguous { candidates, .. } => {
            drop(writeln!(err, "dcpilist: error: {}", escape::terminal(&e.to_string())));
            drop(writeln!(err, "matches (pass the mangled name to choose):"));
            for c in candidates {
                drop(writeln!(err, "  {}", escape::terminal(c)));
            }
        }
        _ => {
            drop(writeln!(err, "dcpilist: error: {}", escape::terminal(&e.to_string())));
        }
    }
}

/// Run `dcpilist` with parsed arguments; errors are returned, not printed.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), ListError> {
    notes::set_verbose(args.names.verbose);
    if let Some(g) = args.names.generate {
        return Ok(manpages::generate(Args::command(), g, out)?);
    }
    let mut warnings: Vec<String> = Vec::new();
    let result = if let Some(n) = args.top {
        top::run(args, n, &mut warnings).and_then(|r| {
            flush_warnings(err, &mut warnings)?;
            render::write_top(out, &r, args.format).map_err(ListError::from)
        })
    } else {
        listing::run(args, &mut warnings).and_then(|l| {
            flush_warnings(err, &mut warnings)?;
            render::write_listing(out, &l, args.format, args.bytes).map_err(ListError::from)
        })
    };
    flush_warnings(err, &mut warnings)?;
    result?;
    out.flush()?;
    Ok(())
}

fn flush_warnings(err: &mut dyn Write, w: &mut Vec<String>) -> std::io::Result<()> {
    notes::write_warnings("dcpilist", err, w)
}
