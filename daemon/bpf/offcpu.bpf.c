// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * dcpid's in-kernel off-CPU source (`off_cpu_source = "bpf"`; daemon/src/offcpu/bpf.rs loads
 * it): on `sched_switch`, a thread that blocks leaves its start time and two stack ids
 * (kernel, user) under its tid; when it runs again, the wait's nanoseconds and a count are
 * added under (tgid, tid, user stack id, kernel stack id) in the waits map of the current
 * generation. No record, wake-up or user-space work per switch: dcpid reads the aggregate
 * about once a second.
 *
 * The object is COMMITTED (offcpu.bpf.o) so that neither the build nor CI needs clang; the
 * test `bpf_object` in daemon/src/offcpu/bpf.rs recompiles it with the command below when
 * clang is present and fails if the bytes differ. After a change, from daemon/bpf/:
 *
 *   clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -fdebug-prefix-map=$PWD=. \
 *       -c offcpu.bpf.c -o offcpu.bpf.o && llvm-strip -g offcpu.bpf.o
 *
 * (Debian 12's clang 14; `-g` makes the BTF that CO-RE and the maps' definitions need, and
 * llvm-strip then drops the DWARF, which only a debugger reads, keeping .BTF and .BTF.ext.)
 * The headers are bpf_helpers.h and bpf_tracing.h from libbpf-dev, and offcpu.h.
 *
 * Kernel: `tp_btf/sched_switch` with its `prev_state` argument (5.18 and later); on an older
 * kernel the verifier refuses the program and `auto` falls back to the tracepoint.
 */
#include "offcpu.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load (read-only, so the verifier sees a constant): waits shorter
 * than this are counted under stack ids -1 (`off_cpu_threshold`). */
const volatile __u64 threshold_ns = 0;
/* Whether dcpid keeps stacks (`callchains` is not "none"): without, no stack is walked, only
 * the pc where the thread entered the kernel is read. */
const volatile bool with_stacks = true;

/* Kernel frames left out of the stack: the program's own and bpf_trace_run4, which called
 * it from the tracepoint; the stack then starts at __schedule, as the tracepoint source's. */
#define KSTACK_SKIP 2

/* A blocked thread: when it blocked, and where. */
struct start {
	__u64 ts;
	__u64 pc;
	__s32 ustack;
	__s32 kstack;
	__u32 tgid;
	__u32 pad;
};

/* "key" would clash with a kernel type name. A negative stack id is none: -1 below the
 * threshold or without stacks, else the error of bpf_get_stackid (-EFAULT: a kernel thread's
 * user stack). `pc`: the user pc where the thread entered the kernel (a kernel thread's: its
 * kernel pc), 0 if unknown; kept below the threshold, so that flat profiles place every wait. */
struct wkey {
	__u32 tgid;
	__u32 tid;
	__s32 ustack;
	__s32 kstack;
	__u64 pc;
};

/* `last`: when the latest of these waits ended (dcpid times the key's sample there, while the
 * thread still existed; a plain store: of two CPUs racing, either time will do). */
struct wval {
	__u64 ns;
	__u64 n;
	__u64 last;
};

/* Per-CPU counters (indices shared with bpf.rs). */
enum {
	C_SWITCHES,     /* switch-ins of a thread other than the idle task */
	C_WAITS,        /* waits timed (switch-ins of a thread that had blocked) */
	C_STACK_FAILED, /* bpf_get_stackid failed (bucket taken by another stack: -EEXIST) */
	C_WAITS_FULL,   /* a wait dropped: the waits map was full */
	C_COUNTERS,
};

/* Blocked threads: an LRU, so that threads that exit while blocked (or whose switch-in was
 * never seen) are evicted instead of filling it. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct start);
} starts SEC(".maps");

/* 127 frames: PERF_MAX_STACK_DEPTH, the kernel's default sysctl kernel.perf_event_max_stack. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 127 * sizeof(__u64));
} stacks SEC(".maps");

/* Two generations of waits: the program adds to waits[gen], dcpid flips gen and then drains
 * the other one (bpf.rs, `Drain`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct wkey);
	__type(value, struct wval);
} waits0 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct wkey);
	__type(value, struct wval);
} waits1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &i);
	if (c)
		*c += 1; /* per CPU, and the program runs with preemption off: no atomic needed */
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 ptid = prev->pid;

	/* A wait starts: prev blocks (not a preemption, not the idle task, not an exit). */
	if (ptid != 0 && !preempt && (prev_state & TASK_STATE_WAIT_MASK) &&
	    !(prev_state & TASK_DEAD)) {
		struct start s = { .ts = now, .tgid = prev->tgid, .ustack = -1, .kstack = -1 };
		/* One frame: the user pc is the saved user ip (no memory read); a kernel thread
		 * has none, and gets its first kernel frame. */
		__u64 pc = 0;
		if (bpf_get_stack(ctx, &pc, sizeof(pc), BPF_F_USER_STACK) <= 0 &&
		    bpf_get_stack(ctx, &pc, sizeof(pc), KSTACK_SKIP) <= 0)
			pc = 0;
		s.pc = pc;
		/* Taken here, in prev's context: at the switch-in the stack is gone, so even a
		 * wait that will be below the threshold pays for its stack ids (a hash of the
		 * walked frames; an existing stack is not stored again). */
		if (with_stacks) {
			s.kstack = bpf_get_stackid(ctx, &stacks, KSTACK_SKIP);
			s.ustack = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
			if (s.kstack < 0 ||
			    (s.ustack < 0 && s.ustack != -14 /* EFAULT: no user stack */))
				count(C_STACK_FAILED);
		}
		bpf_map_update_elem(&starts, &ptid, &s, BPF_ANY);
	}

	/* A wait ends: next had blocked. */
	__u32 ntid = next->pid;
	if (ntid == 0)
		return 0;
	count(C_SWITCHES);
	struct start *s = bpf_map_lookup_elem(&starts, &ntid);
	if (!s)
		return 0;
	__u64 d = now - s->ts;
	struct wkey k = { .tgid = s->tgid, .tid = ntid, .ustack = -1, .kstack = -1, .pc = s->pc };
	if (d >= threshold_ns) {
		k.ustack = s->ustack;
		k.kstack = s->kstack;
	}
	bpf_map_delete_elem(&starts, &ntid);
	count(C_WAITS);

	__u32 zero = 0;
	__u32 *g = bpf_map_lookup_elem(&gen, &zero);
	void *waits = (g && (*g & 1)) ? (void *)&waits1 : (void *)&waits0;
	struct wval *v = bpf_map_lookup_elem(waits, &k);
	if (v) {
		__sync_fetch_and_add(&v->ns, d);
		__sync_fetch_and_add(&v->n, 1);
		v->last = now;
		return 0;
	}
	struct wval nv = { .ns = d, .n = 1, .last = now };
	/* NOEXIST: another CPU may have added the key meanwhile; then add to its value. */
	if (bpf_map_update_elem(waits, &k, &nv, BPF_NOEXIST) != 0) {
		v = bpf_map_lookup_elem(waits, &k);
		if (v) {
			__sync_fetch_and_add(&v->ns, d);
			__sync_fetch_and_add(&v->n, 1);
			v->last = now;
		} else {
			count(C_WAITS_FULL);
		}
	}
	return 0;
}
