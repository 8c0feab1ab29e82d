//! The committed pprof module (`src/prof/export/pprof_proto.rs`) is what `client/proto/profile.proto`
//! generates: regenerated here, compared byte for byte.
//!
//! The build no longer compiles the .proto: protox and prost-build brought protox, petgraph,
//! miette, prost-reflect and two versions of logos into every build for 233 lines of proto. This
//! small generator needs none of them (prost's derive, already a dependency, does the encoding).
//! It accepts only the proto3 subset profile.proto uses (messages of scalar, string and message
//! fields, `repeated`), and refuses anything else by name and line, so a future upstream change
//! that uses more (enums, oneofs, maps, field options such as `packed`) fails here instead of
//! being encoded wrong. Its output matches prost-build 0.14's for profile.proto, field
//! documentation left out (it is in the .proto).
//!
//! After changing the .proto: `DCPI_UPDATE_GOLDEN=1 cargo test -p dcpi-client --test it
//! pprof_proto`, and review the diff.

use std::fmt::Write as _;
use std::path::Path;

const PROTO: &str = "proto/profile.proto";
const MODULE: &str = "src/prof/export/pprof_proto.rs";

#[derive(Debug, PartialEq)]
enum Ty {
    Scalar { proto: &'static str, rust: &'static str },
    String,
    Message(String),
}

#[derive(Debug)]
struct Field {
    repeated: bool,
    ty: Ty,
    name: String,
    tag: u32,
}

#[derive(Debug)]
struct Message {
    name: String,
    fields: Vec<Field>,
}

/// Tokens with their line numbers; comments dropped.
fn tokens(src: &str) -> Result<Vec<(usize, String)>, String> {
    let mut out = Vec::new();
    let b = src.as_bytes();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = src[i + 2..].find("*/").ok_or(format!("{PROTO}:{line}: unclosed comment"))?;
            line += src[i..i + 2 + end].matches('\n').count();
            i += end + 4;
        } else if c == b'"' || c == b'\'' {
            let end = src[i + 1..]
                .find(c as char)
                .ok_or(format!("{PROTO}:{line}: unterminated string"))?;
            out.push((line, src[i..i + end + 2].to_owned()));
            i += end + 2;
        } else if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            out.push((line, src[start..i].to_owned()));
        } else {
            out.push((line, (c as char).to_string()));
            i += 1;
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(usize, String)>,
    pos: usize,
}

impl Parser {
    fn line(&self) -> usize {
        self.toks.get(self.pos).or(self.toks.last()).map_or(0, |t| t.0)
    }
    fn next(&mut self) -> Result<String, String> {
        let t = self.toks.get(self.pos).ok_or(format!("{PROTO}: unexpected end of file"))?;
        self.pos += 1;
        Ok(t.1.clone())
    }
    fn expect(&mut self, want: &str) -> Result<(), String> {
        let line = self.line();
        let got = self.next()?;
        if got == want {
            Ok(())
        } else {
            Err(format!("{PROTO}:{line}: expected `{want}`, found `{got}`"))
        }
    }
    fn until_semicolon(&mut self) -> Result<(), String> {
        while self.next()? != ";" {}
        Ok(())
    }
}

fn scalar(name: &str) -> Option<Ty> {
    let rust = match name {
        "int64" => "i64",
        "uint64" => "u64",
        "int32" => "i32",
        "uint32" => "u32",
        "bool" => "bool",
        _ => return None,
    };
    let proto = ["int64", "uint64", "int32", "uint32", "bool"].into_iter().find(|p| *p == name)?;
    Some(Ty::Scalar { proto, rust })
}

/// Parse the accepted subset; anything else is an error naming the line.
fn parse(src: &str) -> Result<(String, Vec<Message>), String> {
    let mut p = Parser { toks: tokens(src)?, pos: 0 };
    let (mut package, mut syntax, mut messages) = (None, None, Vec::new());
    while p.pos < p.toks.len() {
        let line = p.line();
        match p.next()?.as_str() {
            "syntax" => {
                p.expect("=")?;
                syntax = Some(p.next()?);
                p.expect(";")?;
            }
            "package" => {
                package = Some(p.next()?);
                p.expect(";")?;
            }
            // Options for other languages' generators (java_package, ...).
            "option" => p.until_semicolon()?,
            "message" => {
                let name = p.next()?;
                if !name.starts_with(|c: char| c.is_ascii_uppercase())
                    || !name.chars().all(|c| c.is_ascii_alphanumeric())
                {
                    return Err(format!(
                        "{PROTO}:{line}: message name `{name}` is not UpperCamelCase"
                    ));
                }
                p.expect("{")?;
                let mut fields = Vec::new();
                loop {
                    let line = p.line();
                    let mut word = p.next()?;
                    if word == "}" {
                        break;
                    }
                    let repeated = word == "repeated";
                    if repeated {
                        word = p.next()?;
                    }
                    let ty = if let Some(t) = scalar(&word) {
                        t
                    } else if word == "string" {
                        Ty::String
                    } else if word.starts_with(|c: char| c.is_ascii_uppercase())
                        && word.chars().all(|c| c.is_ascii_alphanumeric())
                    {
                        Ty::Message(word)
                    } else {
                        return Err(format!(
                            "{PROTO}:{line}: `{word}` is not supported by this generator \
                             (scalars int32/int64/uint32/uint64/bool, string, messages of this file, \
                             `repeated`)"
                        ));
                    };
                    let name = p.next()?;
                    if !name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    {
                        return Err(format!(
                            "{PROTO}:{line}: field name `{name}` is not snake_case"
                        ));
                    }
                    p.expect("=")?;
                    let n = p.next()?;
                    let tag = n
                        .parse::<u32>()
                        .ok()
                        .filter(|t| (1..(1 << 29)).contains(t))
                        .ok_or(format!("{PROTO}:{line}: field number `{n}` out of range"))?;
                    // `[packed = false]` and the like would change the encoding: refused.
                    p.expect(";").map_err(|e| format!("{e} (field options are not supported)"))?;
                    fields.push(Field { repeated, ty, name, tag });
                }
                messages.push(Message { name, fields });
            }
            other => {
                return Err(format!("{PROTO}:{line}: `{other}` is not supported by this generator"))
            }
        }
    }
    if syntax.as_deref() != Some("\"proto3\"") {
        return Err(format!("{PROTO}: expected `syntax = \"proto3\";`, found {syntax:?}"));
    }
    for m in &messages {
        for f in &m.fields {
            if let Ty::Message(t) = &f.ty {
                if !messages.iter().any(|m| &m.name == t) {
                    return Err(format!(
                        "{PROTO}: {}.{}: unknown message type `{t}`",
                        m.name, f.name
                    ));
                }
            }
        }
    }
    Ok((package.ok_or(format!("{PROTO}: no package"))?, messages))
}

fn rust_field_name(name: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "as", "break", "const", "continue", "else", "enum", "false", "fn", "for", "if", "impl",
        "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static",
        "struct", "trait", "true", "type", "unsafe", "use", "where", "while", "abstract", "become",
        "box", "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield",
        "try", "async", "await", "dyn", "gen",
    ];
    if KEYWORDS.contains(&name) {
        format!("r#{name}")
    } else {
        name.to_owned()
    }
}

/// Rust source in prost-build's shape: the same derives (Copy, Eq and Hash for messages of
/// singular integer and bool fields only), attributes and types.
fn generate(package: &str, messages: &[Message]) -> String {
    let mut s = String::new();
    writeln!(s, "// @generated from client/proto/profile.proto (package {package}) by").unwrap();
    writeln!(s, "// client/tests/it/pprof_proto.rs, which fails when this file differs from what the .proto").unwrap();
    writeln!(s, "// generates. Do not edit: change the .proto and run").unwrap();
    writeln!(s, "// `DCPI_UPDATE_GOLDEN=1 cargo test -p dcpi-client --test it pprof_proto`.")
        .unwrap();
    writeln!(s, "// The fields' documentation is in the .proto.").unwrap();
    for m in messages {
        let copy = m.fields.iter().all(|f| !f.repeated && matches!(f.ty, Ty::Scalar { .. }));
        if copy {
            s.push_str("#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]\n");
        } else {
            s.push_str("#[derive(Clone, PartialEq, ::prost::Message)]\n");
        }
        writeln!(s, "pub struct {} {{", m.name).unwrap();
        for f in &m.fields {
            let (kind, base) = match &f.ty {
                Ty::Scalar { proto, rust } => (*proto, (*rust).to_owned()),
                Ty::String => ("string", "::prost::alloc::string::String".to_owned()),
                Ty::Message(t) => ("message", t.clone()),
            };
            let (label, ty) = match (&f.ty, f.repeated) {
                (_, true) => (", repeated", format!("::prost::alloc::vec::Vec<{base}>")),
                (Ty::Message(_), false) => {
                    (", optional", format!("::core::option::Option<{base}>"))
                }
                (_, false) => ("", base),
            };
            writeln!(s, "    #[prost({kind}{label}, tag = \"{}\")]", f.tag).unwrap();
            writeln!(s, "    pub {}: {ty},", rust_field_name(&f.name)).unwrap();
        }
        s.push_str("}\n");
    }
    s
}

#[test]
fn committed_pprof_module_is_what_the_proto_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(dir.join(PROTO)).expect(PROTO);
    let (package, messages) = parse(&src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(package, "perftools.profiles");
    let want = generate(&package, &messages);
    let path = dir.join(MODULE);
    if std::env::var_os("DCPI_UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        profile_format::write_atomic(&path, want.as_bytes()).expect("write the pprof module");
        return;
    }
    let got = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if got != want {
        let first = got.lines().zip(want.lines()).position(|(a, b)| a != b);
        panic!(
            "{MODULE} differs from what {PROTO} generates (first differing line: {}); \
             regenerate with DCPI_UPDATE_GOLDEN=1 cargo test -p dcpi-client --test it pprof_proto\n\
             --- generated ---\n{want}",
            first.map_or("at the end".to_owned(), |i| (i + 1).to_string())
        );
    }
}

#[test]
fn generator_refuses_what_it_cannot_encode() {
    for (src, what) in [
        ("syntax = \"proto3\"; package p; enum E { A = 0; }", "`enum`"),
        ("syntax = \"proto3\"; package p; message M { double d = 1; }", "`double`"),
        (
            "syntax = \"proto3\"; package p; message M { repeated int64 v = 1 [packed = false]; }",
            "field options",
        ),
        ("syntax = \"proto3\"; package p; message M { oneof o { int64 a = 1; } }", "`oneof`"),
        ("syntax = \"proto3\"; package p; message M { N n = 1; }", "unknown message type `N`"),
        ("syntax = \"proto2\"; package p; message M { }", "proto3"),
    ] {
        let e = parse(src).expect_err(src);
        assert!(e.contains(what) && e.starts_with(PROTO), "{src}: {e}");
    }
}
