//! `--format pprof`: a gzipped `profile.proto` (pprof's format; the types are generated from
//! the upstream .proto into `pprof_proto.rs`, which a test regenerates and compares) that `go tool pprof`, Parca and Pyroscope read.
//!
//! * Sample types: per event, its raw samples (`samples/count`, or `EVENT_samples/count` when
//!   there are several events) and the weighted estimate (`cpu/nanoseconds` for cpu-clock,
//!   `task-clock/nanoseconds`, else `EVENT/events`); the first event's estimate is the default.
//! * One Mapping per image: path, build-id, and a synthetic address range of its own
//!   (`memory_start` = (n+1) << 40, `file_offset` 0), so that every Location's `address` is
//!   `memory_start` plus the sampled file offset (kernel: offset from the text or module base):
//!   `address - memory_start + file_offset` is what pprof hands its symbolizer.
//! * Functions and Lines from dcpi's symbolizer: demangled name, symbol-table name, and with
//!   `--lines` source file and line.
//! * String labels `host` and `epoch` on every sample; samples of call stacks (FORMAT.md §13)
//!   also carry `comm`, the command that ran them, and end in a synthetic Location (no mapping)
//!   whose function is that command, so that the stack's root is the command as in folded
//!   stacks. Stacks read from files written before commands were kept have the command
//!   `[unknown command]`.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use prost::Message;

use super::model::Export;

// Generated code: prost writes absolute paths (`::prost::alloc::vec::Vec`), and clippy::all
// does not cover that restriction lint.
#[allow(clippy::all, clippy::absolute_paths, missing_debug_implementations, missing_docs)]
pub mod proto {
    // Committed rather than generated at build time: compiling the .proto needed protox and
    // prost-build (with petgraph, miette, prost-reflect, two versions of logos) in every build.
    // tests/it/pprof_proto.rs fails when this file is not what client/proto/profile.proto
    // generates.
    include!("pprof_proto.rs");
}

/// The mapping of image `n` starts here; 2^40 bytes apart leaves room for any file.
fn mapping_start(n: usize) -> u64 {
    (n as u64 + 1) << 40
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self::default();
        s.get("");
        s
    }
    fn get(&mut self, v: &str) -> i64 {
        if let Some(&i) = self.index.get(v) {
            return i;
        }
        // A string table never nears 2^63 entries: saturate rather than wrap.
        let i = i64::try_from(self.table.len()).unwrap_or(i64::MAX);
        self.table.push(v.to_owned());
        self.index.insert(v.to_owned(), i);
        i
    }
}

/// (type, unit) of the weighted value of an event.
fn weighted_type(event: &str) -> (String, &'static str) {
    match event {
        "cpu-clock" => ("cpu".to_owned(), "nanoseconds"),
        "task-clock" => ("task-clock".to_owned(), "nanoseconds"),
        // dcpid's off-CPU time: its counts are nanoseconds (period 1).
        "off-cpu" => ("off-cpu".to_owned(), "nanoseconds"),
        e => (e.to_owned(), "events"),
    }
}

/// The id of the item at `index` of a pprof table: ids start at 1 (0 means none).
fn pprof_id(index: usize) -> u64 {
    index as u64 + 1
}

/// A pprof table (mappings, functions, locations): `make` builds each item from its index.
fn table<T, U>(items: &[T], make: impl FnMut(usize, &T) -> U) -> Vec<U> {
    let mut make = make;
    items.iter().enumerate().map(|(i, t)| make(i, t)).collect()
}

/// Build the pprof profile.
pub fn profile(x: &Export) -> proto::Profile {
    let mut st = Strings::new();
    let n_events = x.events.len();
    let mut sample_type = Vec::with_capacity(2 * n_events);
    for e in &x.events {
        let samples =
            if n_events == 1 { "samples".to_owned() } else { format!("{}_samples", e.name) };
        sample_type.push(proto::ValueType { r#type: st.get(&samples), unit: st.get("count") });
        let (t, u) = weighted_type(&e.name);
        sample_type.push(proto::ValueType { r#type: st.get(&t), unit: st.get(u) });
    }
    let mut mapping = table(&x.images, |i, img| {
        let start = mapping_start(i);
        let lines = x.locations.iter().any(|l| l.image == i && l.line.is_some());
        proto::Mapping {
            id: pprof_id(i),
            memory_start: start,
            memory_limit: start + ((img.max_offset | 0xfff) + 1),
            file_offset: 0,
            filename: st.get(&img.name),
            build_id: img.build_id.as_deref().map_or(0, |b| st.get(b)),
            has_functions: img.symbolized,
            has_filenames: lines,
            has_line_numbers: lines,
            has_inline_frames: false,
        }
    });
    // pprof takes the first mapping for the profile's main binary (`File:` in its reports):
    // the user image with the most samples, or, when no user image was sampled, a mapping
    // without a file (not the kernel, which would otherwise be named as the program).
    match main_image(x) {
        Some(i) => {
            let m = mapping.remove(i);
            mapping.insert(0, m);
        }
        None if !mapping.is_empty() => {
            let start = mapping_start(x.images.len());
            mapping.insert(
                0,
                proto::Mapping {
                    id: pprof_id(x.images.len()),
                    memory_start: start,
                    memory_limit: start + 0x1000,
                    ..Default::default()
                },
            );
        }
        None => {}
    }
    let function = table(&x.functions, |i, f| proto::Function {
        id: pprof_id(i),
        name: st.get(&f.name),
        system_name: st.get(f.system_name.as_deref().unwrap_or(&f.name)),
        filename: f.file.as_deref().map_or(0, |p| st.get(p)),
        start_line: 0,
    });
    let mut function = function;
    // Call stacks start at their command (FORMAT.md §13): one synthetic function and location
    // (no mapping) per command, the outermost frame of its stacks, as in folded stacks.
    let (fn0, loc0) = (x.functions.len(), x.locations.len());
    for (i, c) in x.commands.iter().enumerate() {
        let name = st.get(c);
        function.push(proto::Function {
            id: pprof_id(fn0 + i),
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
    }
    let mut location = table(&x.locations, |i, l| proto::Location {
        id: pprof_id(i),
        mapping_id: pprof_id(l.image),
        address: mapping_start(l.image) + l.offset,
        line: vec![proto::Line {
            function_id: pprof_id(l.function),
            line: l.line.map_or(0, i64::from),
            column: 0,
        }],
        is_folded: false,
    });
    location.extend((0..x.commands.len()).map(|i| proto::Location {
        id: pprof_id(loc0 + i),
        mapping_id: 0,
        address: 0,
        line: vec![proto::Line { function_id: pprof_id(fn0 + i), line: 0, column: 0 }],
        is_folded: false,
    }));
    let (host_key, epoch_key) = (st.get("host"), st.get("epoch"));
    let comm_key = if x.commands.is_empty() { 0 } else { st.get("comm") };
    let comm_str: Vec<i64> = x.commands.iter().map(|c| st.get(c)).collect();
    let host_str: Vec<i64> = x.hosts.iter().map(|h| st.get(h)).collect();
    let epoch_str: Vec<i64> = x.epochs.iter().map(|e| st.get(e)).collect();
    let sample = x
        .samples
        .iter()
        .filter(|s| s.samples > 0)
        .map(|s| {
            let mut value = vec![0i64; 2 * n_events];
            value[2 * s.event as usize] = i64::try_from(s.samples).unwrap_or(i64::MAX);
            value[2 * s.event as usize + 1] = s.events.round() as i64;
            let label = |key: i64, str: i64| proto::Label { key, str, num: 0, num_unit: 0 };
            let mut location_id: Vec<u64> = x.stack(s).iter().copied().map(pprof_id).collect();
            let mut label = vec![
                label(host_key, host_str[s.host as usize]),
                label(epoch_key, epoch_str[s.epoch as usize]),
            ];
            if let Some(&c) = x.stack_commands.get(&s.stack) {
                location_id.push(pprof_id(loc0 + c as usize));
                label.push(proto::Label {
                    key: comm_key,
                    str: comm_str[c as usize],
                    num: 0,
                    num_unit: 0,
                });
            }
            proto::Sample { location_id, value, label }
        })
        .collect();
    let (period_type, period, default_sample_type) = match x.events.first() {
        Some(e) => {
            let (t, u) = weighted_type(&e.name);
            let ty = st.get(&t);
            (
                Some(proto::ValueType { r#type: ty, unit: st.get(u) }),
                i64::try_from(e.nominal_period).unwrap_or(i64::MAX),
                ty,
            )
        }
        None => (None, 0, 0),
    };
    let comment = vec![
        st.get(&format!("dcpi database {}", x.scope.database)),
        st.get(&format!("epochs {}", x.scope.epochs.join(","))),
        st.get(&format!("hosts {}", x.scope.hosts.join(","))),
    ];
    proto::Profile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: std::mem::take(&mut st.table),
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: x.time_nanos,
        duration_nanos: x.duration_nanos,
        period_type,
        period,
        comment,
        default_sample_type,
        doc_url: 0,
    }
}

/// The user image (an ELF file mapped by a process) with the most samples, if any.
fn main_image(x: &Export) -> Option<usize> {
    let mut samples = vec![0u64; x.images.len()];
    for s in &x.samples {
        if let Some(&leaf) = x.stack(s).first() {
            samples[x.locations[leaf].image] += s.samples;
        }
    }
    (0..x.images.len())
        .filter(|&i| x.images[i].kind == "elf" && samples[i] > 0)
        .max_by_key(|&i| (samples[i], std::cmp::Reverse(i)))
}

/// The gzipped encoding pprof reads.
pub fn encode(x: &Export) -> std::io::Result<Vec<u8>> {
    let bytes = profile(x).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()
}
