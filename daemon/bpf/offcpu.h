/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The few kernel types and constants offcpu.bpf.c needs, written by hand instead of a
 * vmlinux.h (3 MB, and tied to the kernel it was dumped from). The structs are CO-RE
 * (`preserve_access_index`): the loader (aya) relocates each field access against the running
 * kernel's BTF (/sys/kernel/btf/vmlinux), so the object is not tied to this layout.
 */
#ifndef DCPI_OFFCPU_H
#define DCPI_OFFCPU_H

typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

/* include/uapi/linux/bpf.h */
enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_STACK_TRACE = 7,
	BPF_MAP_TYPE_LRU_HASH = 9,
};
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_F_USER_STACK (1ULL << 8)
#define BPF_F_NO_PREALLOC (1U << 0)

/* include/linux/sched.h: the low byte of a task's state is a sleep or stop (a wait);
 * TASK_RUNNING (0) at a switch-out is a preemption, TASK_DEAD an exit. */
#define TASK_STATE_WAIT_MASK 0x7f
#define TASK_DEAD 0x80

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

#endif
