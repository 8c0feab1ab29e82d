//! Call-stack counts (`callchains = "fp"`): per CPU, samples per (pid, asid, stack, event),
//! where the stack is an id in that CPU's stack table ([`crate::perf::callchain`]). At a flush
//! each counted stack's pcs are resolved to (image, offset) frames with the resolver, exactly
//! as flat samples are (the process's address-space version at the sample's time), and added
//! with the command of that process version (FORMAT.md §13, version 3) into one
//! [`StackProfile`] per event; then the stack tables drop what neither a pending sample nor a
//! count made since names. The pid is already in the key the drain thread counts (a hot stack
//! costs one increment); the command is looked up once per key per flush, not per sample.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use hashbrown::{HashMap, HashSet};
use profile_format::{ImageId, ImageKind, StackImage, StackProfile};

use crate::perf::callchain::{StackId, StackTables};
use crate::resolve::{Resolution, Resolver, KERNEL_START};
use crate::types::{EventIdx, ImageInfo, Sample};
use crate::who;

/// Distinct (pid, asid, stack, event) counted per CPU per flush interval at most; past it a
/// sample's stack is dropped (its flat count stays) and counted in `dropped`.
pub(super) const DEFAULT_KEYS_PER_CPU: usize = 32 * 1024;

/// The stack counts of one CPU since the last flush.
#[derive(Debug, Default)]
pub(crate) struct CpuStacks {
    /// hashbrown's foldhash, not std's `SipHash`: this is one lookup per stack sample on the
    /// drain thread, where `SipHash` was a tenth of its CPU with call stacks on (issue 19).
    counts: HashMap<(u32, u64, StackId, EventIdx), u64>,
    pub(crate) dropped: u64,
}

impl CpuStacks {
    /// Count one sample of a stack of process `pid` (address-space version `asid`), of weight
    /// `weight` (1; a time-weighted event's nanoseconds, see `Aggregator::set_time_event`).
    pub(crate) fn add(
        &mut self,
        pid: u32,
        asid: u64,
        stack: StackId,
        event: EventIdx,
        weight: u64,
    ) {
        let len = self.counts.len();
        match self.counts.get_mut(&(pid, asid, stack, event)) {
            Some(n) => *n = n.saturating_add(weight),
            None if len >= DEFAULT_KEYS_PER_CPU => self.dropped += 1,
            None => {
                self.counts.insert((pid, asid, stack, event), weight);
            }
        }
    }

    /// The counts so far; the map left in their place has room for as many keys, so that the
    /// drain thread does not grow it again (rehashing on its hot path) every interval.
    pub(crate) fn take(&mut self) -> Self {
        let room = HashMap::with_capacity(self.counts.len());
        Self { counts: std::mem::replace(&mut self.counts, room), dropped: 0 }
    }

    /// The counts of the processes for which `f` says yes; the others stay.
    pub(crate) fn take_if(&mut self, mut f: impl FnMut(u32) -> bool) -> Self {
        let counts = self.counts.extract_if(|k, _| f(k.0)).collect();
        Self { counts, dropped: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Half of [`DEFAULT_KEYS_PER_CPU`] used: time for a take (the rest drops stacks).
    pub(crate) fn past_high_water(&self) -> bool {
        self.counts.len() >= DEFAULT_KEYS_PER_CPU / 2
    }
}

/// The image of a stack frame in a stack profile.
fn stack_image(i: &ImageInfo) -> StackImage {
    StackImage { kind: i.kind, id: i.id.clone(), path: i.path.clone() }
}

fn unknown_image() -> StackImage {
    StackImage {
        kind: ImageKind::Unknown,
        id: ImageId::special("[unknown]", b""),
        path: b"[unknown]".to_vec(),
    }
}

/// Commands of (pid, asid) looked up during one flush (kernel threads have none in the
/// resolver: their `/proc/PID/comm` is read once per flush).
pub(crate) type Comms = HashMap<(u32, u64), Vec<u8>>;

/// The command of process `pid` in address-space version `asid`, as the who table names it:
/// the resolver's comm for that version (after an exec the resolver keeps the newest name, so
/// stacks of a flush interval in which a process exec'ed carry its new name), `swapper` for the
/// idle task, `[exiting]` for a task whose pid the kernel had released, else `/proc/PID/comm`
/// (kernel threads); empty (stored as `[unknown command]`) when the process is gone.
fn command<'a>(r: &Resolver, comms: &'a mut Comms, pid: u32, asid: u64) -> &'a [u8] {
    comms.entry((pid, asid)).or_insert_with(|| {
        let named = r.comm(pid, asid).or_else(|| who::reserved_command(pid));
        named.map_or_else(
            || {
                std::fs::read(r.proc_root().join(pid.to_string()).join("comm"))
                    .map(|s| s.strip_suffix(b"\n").unwrap_or(&s).to_vec())
                    .unwrap_or_default()
            },
            <[u8]>::to_vec,
        )
    })
}

/// Resolve the counts of CPU slot `slot` into `out` (one profile per event index; event names
/// are filled in by the store). Needs the resolver in the state it had for the flat entries
/// of the same flush (before its `gc`).
pub(crate) fn resolve_cpu(
    r: &mut Resolver,
    idle: &OnceLock<Arc<ImageInfo>>,
    tables: &StackTables,
    slot: u32,
    counts: CpuStacks,
    comms: &mut Comms,
    out: &mut BTreeMap<EventIdx, StackProfile>,
) {
    if counts.is_empty() {
        return;
    }
    let table = tables.cpu(slot);
    // With `stack_one_in = N` a sample's stack is taken with probability 1/N: each counts N,
    // so that a stack's count stays an estimate of its samples (FORMAT.md §13). Per table:
    // the off-CPU source's slot takes every stack.
    let weight = u64::from(table.one_in());
    // Interned images per (event, image pointer): a hot image is hashed once per flush.
    // The Arc is kept so that its address cannot be reused for another image meanwhile.
    let mut images: HashMap<(EventIdx, *const ImageInfo), (u32, Arc<ImageInfo>)> = HashMap::new();
    let mut frames = Vec::new();
    for ((pid, asid, stack, event), n) in counts.counts {
        let Some(entry) = table.get(stack) else { continue };
        let p = out.entry(event).or_default();
        frames.clear();
        for &pc in entry.pcs.iter() {
            let kernel = pc >= KERNEL_START;
            // Kernel frames are the same image in every process (flat kernel entries use
            // pid 1 likewise); user frames resolve in the process's version at sample time.
            let res =
                if kernel { r.resolve(1, 0, pc, true) } else { r.resolve(pid, asid, pc, false) };
            let frame = match res {
                Resolution::Image { image, offset } => {
                    // The idle task's kernel frames are `[idle]`, as its flat samples are.
                    let image = if kernel && pid == 0 && image.kind == ImageKind::Kernel {
                        Arc::clone(idle.get_or_init(|| who::idle_image(&image)))
                    } else {
                        image
                    };
                    let key = (event, Arc::as_ptr(&image));
                    let ix = match images.get(&key) {
                        Some(&(i, _)) => i,
                        None => {
                            let i = p.image_index(&stack_image(&image));
                            // A JIT region may be sampled only as a caller: its names then
                            // travel with the stacks (FORMAT.md §13, version 2).
                            if image.kind == ImageKind::Anon && !image.jit_symbols.is_empty() {
                                p.add_jit_symbols(i, &image.jit_symbols);
                            }
                            images.insert(key, (i, image));
                            i
                        }
                    };
                    (ix, offset)
                }
                Resolution::Unknown(reason) => (p.image_index(&unknown_image()), reason as u64),
            };
            frames.push(frame);
        }
        let command = p.command_index(command(r, comms, pid, asid));
        p.add_command(Some(command), &frames, entry.truncated, n.saturating_mul(weight));
    }
}

/// After a flush resolved what it took: let CPU slot `slot`'s stack table free every stack
/// that neither a sample still `pending` nor a count made since the take (`counted`) names.
/// Called under that CPU's lock, so neither can change meanwhile.
pub(crate) fn prune<'a>(
    tables: &StackTables,
    slot: u32,
    pending: impl Iterator<Item = &'a Sample>,
    counted: &CpuStacks,
) -> usize {
    let mut live: HashSet<StackId> = pending.map(|s| s.stack).filter(|&s| s != 0).collect();
    live.extend(counted.counts.keys().map(|k| k.2));
    tables.cpu(slot).prune(|id| live.contains(&id))
}
