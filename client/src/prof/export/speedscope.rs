//! `--format speedscope`: speedscope's JSON file format
//! (<https://github.com/jlfwong/speedscope/wiki/Importing-from-custom-sources>), one "sampled"
//! profile per event weighted by its event estimate (nanoseconds for cpu-clock and task-clock),
//! frames `image` (call stacks: the command) then `function` root first as in folded stacks.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::model::Export;

pub fn document(x: &Export) -> Value {
    let mut frames: Vec<Value> = Vec::new();
    // Keyed by (0 image, 1 function, 2 command; index).
    let mut index: HashMap<(u8, usize), usize> = HashMap::new();
    let mut frame = |what: u8, i: usize| -> usize {
        *index.entry((what, i)).or_insert_with(|| {
            let v = if what == 0 {
                json!({ "name": x.images[i].name })
            } else if what == 2 {
                json!({ "name": x.commands[i] })
            } else {
                let f = &x.functions[i];
                match &f.file {
                    Some(file) => json!({ "name": f.name, "file": file }),
                    None => json!({ "name": f.name }),
                }
            };
            frames.push(v);
            frames.len() - 1
        })
    };
    let mut profiles = Vec::new();
    for (ei, e) in x.events.iter().enumerate() {
        let mut merged: HashMap<Vec<usize>, f64> = HashMap::new();
        for s in x.samples.iter().filter(|s| s.event as usize == ei && s.samples > 0) {
            let st = x.stack(s);
            let Some(&outer) = st.last() else { continue };
            let root = match x.stack_commands.get(&s.stack) {
                Some(&c) => frame(2, c as usize),
                None => frame(0, x.locations[outer].image),
            };
            let mut stack = vec![root];
            stack.extend(st.iter().rev().map(|&l| frame(1, x.locations[l].function)));
            *merged.entry(stack).or_default() += s.events;
        }
        let mut merged: Vec<(Vec<usize>, f64)> = merged.into_iter().collect();
        merged.sort_by(|a, b| a.0.cmp(&b.0));
        let total: f64 = merged.iter().map(|m| m.1.round()).sum();
        let unit = if matches!(e.name.as_str(), "cpu-clock" | "task-clock" | "off-cpu") {
            "nanoseconds"
        } else {
            "none"
        };
        profiles.push(json!({
            "type": "sampled",
            "name": format!("{} ({})", e.name, x.scope.hosts.join(", ")),
            "unit": unit,
            "startValue": 0,
            "endValue": total,
            "samples": merged.iter().map(|m| &m.0).collect::<Vec<_>>(),
            "weights": merged.iter().map(|m| m.1.round()).collect::<Vec<_>>(),
        }));
    }
    json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames },
        "profiles": profiles,
        "name": format!("dcpi {}", super::flame::title(x)),
        "activeProfileIndex": 0,
        "exporter": format!("dcpiprof {}", env!("CARGO_PKG_VERSION")),
    })
}
