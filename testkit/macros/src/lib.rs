//! `#[dcpi_testkit::test(...)]`: see the `dcpi-testkit` crate's documentation. Written on
//! `proc_macro` alone (no syn/quote) so that it builds in a second.

use proc_macro::{Delimiter, Group, TokenStream, TokenTree};

// Shared with the test kit, which re-exports these items: `pub` there, unreachable here.
#[allow(unreachable_pub)]
#[path = "../../src/probe.rs"]
#[allow(dead_code)]
mod probe;

use probe::Req;

/// A test that needs something of the machine: `#[dcpi_testkit::test(perf, root, tool("setpriv"))]`
/// in place of `#[test]`. Where a requirement is missing when the test crate compiles (and
/// `DCPI_REQUIRE_ALL` is not 1), the test is emitted with `#[ignore = "needs ...: why"]`; in
/// every case its body starts with a run-time check of the same requirements that panics with
/// the reason.
#[proc_macro_attribute]
pub fn test(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr, item) {
        Ok(ts) => ts,
        Err(msg) => format!("::core::compile_error!({msg:?});").parse().unwrap(),
    }
}

fn parse_reqs(attr: TokenStream) -> Result<Vec<Req<'static>>, String> {
    let mut reqs = Vec::new();
    let mut it = attr.into_iter().peekable();
    while let Some(tt) = it.next() {
        match tt {
            TokenTree::Punct(p) if p.as_char() == ',' => {}
            TokenTree::Ident(id) => match id.to_string().as_str() {
                "perf" => reqs.push(Req::Perf),
                "root" => reqs.push(Req::Root),
                "pmu" => reqs.push(Req::Pmu),
                "no_pmu" => reqs.push(Req::NoPmu),
                "tool" => {
                    let Some(TokenTree::Group(g)) = it.next() else {
                        return Err("dcpi_testkit::test: write tool(\"name\")".into());
                    };
                    let lit = g.stream().to_string();
                    let name = lit
                        .strip_prefix('"')
                        .and_then(|s| s.strip_suffix('"'))
                        .filter(|s| !s.is_empty() && !s.contains(['"', '\\', '/']))
                        .ok_or_else(|| {
                            format!("dcpi_testkit::test: tool({lit}): not a tool name")
                        })?;
                    // Lives for the compilation: a handful of short names per test crate.
                    reqs.push(Req::Tool(Box::leak(name.to_string().into_boxed_str())));
                }
                other => {
                    return Err(format!(
                        "dcpi_testkit::test: unknown requirement `{other}` \
                         (perf, root, tool(\"name\"), pmu, no_pmu)"
                    ))
                }
            },
            other => return Err(format!("dcpi_testkit::test: unexpected `{other}`")),
        }
    }
    Ok(reqs)
}

fn expand(attr: TokenStream, item: TokenStream) -> Result<TokenStream, String> {
    let reqs = parse_reqs(attr)?;
    // Under the switch only the kind-of-machine requirements (PMU or not) may still ignore.
    let strict = probe::strict();
    let mut missing = Vec::new();
    for r in reqs.iter().filter(|r| !strict || r.is_variant()) {
        if let Err(why) = r.check() {
            missing.push(format!("needs {}: {why}", r.what()));
        }
    }
    let mut out: TokenStream = "#[test]".parse().unwrap();
    if !missing.is_empty() {
        let reason = missing.join("; ");
        out.extend(format!("#[ignore = {reason:?}]").parse::<TokenStream>().unwrap());
    }
    let mut tokens: Vec<TokenTree> = item.into_iter().collect();
    let body_at = tokens
        .iter()
        .rposition(|t| matches!(t, TokenTree::Group(g) if g.delimiter() == Delimiter::Brace))
        .ok_or("dcpi_testkit::test goes on a function")?;
    let TokenTree::Group(body) = &tokens[body_at] else { unreachable!() };
    let list: Vec<String> = reqs
        .iter()
        .map(|r| match r {
            Req::Perf => "::dcpi_testkit::Req::Perf".to_string(),
            Req::Root => "::dcpi_testkit::Req::Root".to_string(),
            Req::Tool(t) => format!("::dcpi_testkit::Req::Tool({t:?})"),
            Req::Pmu => "::dcpi_testkit::Req::Pmu".to_string(),
            Req::NoPmu => "::dcpi_testkit::Req::NoPmu".to_string(),
        })
        .collect();
    // The option_env! calls make rustc record both variables in the test crate's dep-info, so
    // cargo recompiles it (and this macro checks again) when either changes.
    let mut new_body: TokenStream = format!(
        "::dcpi_testkit::guard(&[{}]);
         let _ = (::core::option_env!({:?}), ::core::option_env!({:?}));",
        list.join(", "),
        probe::SWITCH,
        probe::PRETEND
    )
    .parse()
    .unwrap();
    new_body.extend(body.stream());
    let mut g = Group::new(Delimiter::Brace, new_body);
    g.set_span(body.span());
    tokens[body_at] = TokenTree::Group(g);
    out.extend(tokens);
    Ok(out)
}
