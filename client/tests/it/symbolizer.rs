//! Issue 34: one symbolizer names an offset the same way in every report. Before it, a JIT
//! offset no perf-map entry covers was `[anon:…]+0x9000` in a flat report but `+0x9234` in a
//! call stack, and `dcpilist --top` showed a (Rust-mangled) kernel symbol as stored while the
//! flat report and the stacks demangled it.

use std::path::Path;
use std::process::Command;

use profile_format::{
    ImageId, ImageKind, JitSymbol, KallsymsSnapshot, KernelSymbol, StackImage, StackProfile,
};
use serde_json::Value;

use crate::util::{event, json_ok, prof, row, rows, stderr, stdout, TestDb};
use dcpi_testkit::db::Image;

fn top(db: &Path, n: &str) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_dcpilist"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(db)
        .args(["--no-system-debug", "--no-symbol-cache", "--host", "alpha", "--top", n])
        .args(["--format", "json"])
        .output()
        .expect("run dcpilist");
    assert!(o.status.success(), "dcpilist --top: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(&o)))
}

#[test]
fn flat_rows_stack_frames_and_dcpilist_top_name_an_offset_alike() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    // A JIT region: one function, and samples outside every perf-map entry.
    let anon = ImageId::special("[anon]", b"1234");
    let jit = vec![JitSymbol { start: 0x1000, size: 0x100, name: "_ZN3jit4loopEv".into() }];
    let anon_counts = [(0x1010, 5), (0x9234, 3)];
    Image::new(ImageKind::Anon, anon.clone(), b"[anon:1234:node]")
        .profile(&ev)
        .counts(&anon_counts)
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);
    // The kernel, with a Rust (v0-mangled) function as Rust for Linux names them.
    let text = 0xffff_ffff_8100_0000u64;
    let snap = KallsymsSnapshot {
        kernel_release: "9.9.9-test".into(),
        kernel_build_id: None,
        text_base: text,
        modules: Vec::new(),
        symbols: vec![
            KernelSymbol { addr: text, kind: b't', name: "_text".into(), module: None },
            KernelSymbol {
                addr: text + 0x100,
                kind: b't',
                name: "_RNvCs1234_7mycrate4main".into(),
                module: None,
            },
            KernelSymbol { addr: text + 0x200, kind: b't', name: "after".into(), module: None },
        ],
    };
    snap.write(&hd.kallsyms_path()).expect("snapshot");
    let kid = ImageId::special("[kernel.kallsyms]", b"9.9.9-test");
    Image::new(ImageKind::Kernel, kid.clone(), b"[kernel.kallsyms]")
        .profile(&ev)
        .counts(&[(0x108, 7)])
        .period(1000)
        .write(&hd);
    // Stacks of the same offsets (leaf first).
    let mut st = StackProfile::new(&hd.host, hd.epoch.as_str(), "cpu-clock");
    let img =
        |kind, id: &ImageId, path: &[u8]| StackImage { kind, id: id.clone(), path: path.to_vec() };
    let a = st.image_index(&img(ImageKind::Anon, &anon, b"[anon:1234:node]"));
    let k = st.image_index(&img(ImageKind::Kernel, &kid, b"[kernel.kallsyms]"));
    st.add(&[(a, 0x9234), (a, 0x1010)], false, 3);
    st.add(&[(k, 0x108), (a, 0x1010)], false, 7);
    st.write(&hd.stacks_path("cpu-clock")).expect("write stacks");

    // Flat reports.
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "[anon:1234"]);
    assert_eq!(row(&v, "symbol", "jit::loop()")["samples"], 5, "{v:#}");
    let gap = "[anon:1234:node]+0x9000";
    assert_eq!(row(&v, "symbol", gap)["samples"], 3, "{v:#}");
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "kernel"]);
    let kname = "mycrate::main";
    assert_eq!(row(&v, "symbol", kname)["samples"], 7, "{v:#}");

    // Call stacks (folded: root first, leaf last).
    let o = prof(&t.root(), &["--host", "alpha", "--format", "folded"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let folded = stdout(&o);
    let has = |tail: &str| folded.lines().any(|l| l.ends_with(tail));
    assert!(has(&format!("jit::loop();{gap} 3")), "{folded}");
    assert!(has(&format!("jit::loop();{kname} 7")), "{folded}");

    // dcpilist --top: the same names, with the offset into the function.
    let v = top(&t.root(), "3");
    let sym_at = |off: u64| {
        rows(&v)
            .iter()
            .find(|r| r["offset"] == off)
            .map(|r| r["symbol"].clone())
            .unwrap_or_default()
    };
    assert_eq!(sym_at(0x108), format!("{kname}+0x8"), "{v:#}");
    assert_eq!(sym_at(0x1010), "jit::loop()+0x10", "{v:#}");
    assert_eq!(sym_at(0x9234), Value::Null, "no function covers it: {v:#}");
}
