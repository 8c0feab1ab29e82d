// The floor of a collector that follows #13's design: cpu-clock sampling on every CPU, each
// CPU's ring drained and its period re-armed once per second at a random instant, and nothing
// else (no parsing, no aggregation, no side-band). Its CPU is what any implementation of that
// design pays on this machine; bench/collector.py compares it with perf record and dcpid.
//
//   floor MODE PERIOD_NS SECONDS
//   MODE: percpu  one thread per CPU, pinned, poll(ring, timeout to the redraw instant),
//                 re-arm locally (what dcpid's drain threads do)
//         single  one thread for every CPU: one poll over all rings, re-arms the other CPUs
//                 through the kernel's cross-CPU call
//         norearm one thread, wakes only when a ring is half full (what perf record does)
// Prints the CPU (ns) its threads used after set-up (CLOCK_THREAD_CPUTIME_ID of each thread).
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAXCPU 256
#define PAGES 128

static int ncpu, mode;
static uint64_t period;
static double seconds;
static int fds[MAXCPU];
static struct perf_event_mmap_page *rings[MAXCPU];
static long page;
static uint64_t cpu_ns[MAXCPU];
static uint64_t wakes[MAXCPU];

static uint64_t now_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void open_cpu(int cpu) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.sample_period = period;
    a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_PERIOD;
    a.watermark = 1;
    a.wakeup_watermark = PAGES * page / 2;
    int fd = syscall(SYS_perf_event_open, &a, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        perror("perf_event_open");
        exit(2);
    }
    void *m = mmap(NULL, (PAGES + 1) * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    fds[cpu] = fd;
    rings[cpu] = m;
}

// Consume everything written: a collector at least reads the head and moves the tail.
static void drain(int cpu) {
    struct perf_event_mmap_page *r = rings[cpu];
    uint64_t head = __atomic_load_n(&r->data_head, __ATOMIC_ACQUIRE);
    __atomic_store_n(&r->data_tail, head, __ATOMIC_RELEASE);
}

static int no_ioctl;

static void rearm(int cpu) {
    if (no_ioctl)
        return;
    uint64_t p = period - (uint64_t)(random() % (long)(period / 16 + 1));
    ioctl(fds[cpu], PERF_EVENT_IOC_PERIOD, &p);
}

static int ms_until(uint64_t t) {
    uint64_t n = now_ns(CLOCK_MONOTONIC);
    return t > n ? (int)((t - n + 999999) / 1000000) : 0;
}

static uint64_t next_instant(uint64_t window_start) {
    return window_start + (uint64_t)(random() % 1000) * 1000000ull;
}

static void *percpu(void *arg) {
    int cpu = (int)(intptr_t)arg;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    uint64_t win = now_ns(CLOCK_MONOTONIC), at = next_instant(win);
    struct pollfd p = {.fd = fds[cpu], .events = POLLIN};
    uint64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    while (now_ns(CLOCK_MONOTONIC) < end) {
        poll(&p, 1, ms_until(at));
        wakes[cpu]++;
        drain(cpu);
        if (now_ns(CLOCK_MONOTONIC) >= at) {
            rearm(cpu);
            win += 1000000000ull;
            at = next_instant(win);
        }
    }
    cpu_ns[cpu] = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    return NULL;
}

static void single(int rearming) {
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    uint64_t win = now_ns(CLOCK_MONOTONIC), at = next_instant(win);
    struct pollfd p[MAXCPU];
    for (int c = 0; c < ncpu; c++)
        p[c] = (struct pollfd){.fd = fds[c], .events = POLLIN};
    uint64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    while (now_ns(CLOCK_MONOTONIC) < end) {
        int timeout = rearming ? ms_until(at) : ms_until(end);
        poll(p, ncpu, timeout);
        wakes[0]++;
        for (int c = 0; c < ncpu; c++)
            drain(c);
        if (rearming && now_ns(CLOCK_MONOTONIC) >= at) {
            for (int c = 0; c < ncpu; c++)
                rearm(c);
            win += 1000000000ull;
            at = next_instant(win);
        }
    }
    cpu_ns[0] = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: floor percpu|single|norearm PERIOD_NS SECONDS\n");
        return 2;
    }
    mode = !strcmp(argv[1], "percpu") ? 0 : !strcmp(argv[1], "single") ? 1
         : !strcmp(argv[1], "norearm") ? 2 : -1;
    if (mode < 0) {
        fprintf(stderr, "floor: unknown mode %s\n", argv[1]);
        return 2;
    }
    period = strtoull(argv[2], NULL, 10);
    seconds = atof(argv[3]);
    page = sysconf(_SC_PAGESIZE);
    ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > MAXCPU || period < 16) {
        fprintf(stderr, "floor: bad cpu count or period\n");
        return 2;
    }
    srandom((unsigned)now_ns(CLOCK_MONOTONIC));
    // Decompose the floor: FLOOR_NO_IOCTL=1 wakes at the instants but does not re-arm;
    // FLOOR_SCHED_OTHER=1 leaves the threads SCHED_OTHER (as under the systemd unit).
    no_ioctl = getenv("FLOOR_NO_IOCTL") != NULL;
    int other = getenv("FLOOR_SCHED_OTHER") != NULL;
    for (int c = 0; c < ncpu; c++)
        open_cpu(c);
    if (mode == 0) {
        pthread_t t[MAXCPU];
        struct sched_param sp = {.sched_priority = 1};
        for (int c = 0; c < ncpu; c++) {
            pthread_attr_t a;
            pthread_attr_init(&a);
            // As dcpid's drain threads: SCHED_FIFO when allowed.
            pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED);
            pthread_attr_setschedpolicy(&a, SCHED_FIFO);
            pthread_attr_setschedparam(&a, &sp);
            if (other || pthread_create(&t[c], &a, percpu, (void *)(intptr_t)c) != 0)
                pthread_create(&t[c], NULL, percpu, (void *)(intptr_t)c);
        }
        for (int c = 0; c < ncpu; c++)
            pthread_join(t[c], NULL);
    } else {
        struct sched_param sp = {.sched_priority = 1};
        if (!other)
            sched_setscheduler(0, SCHED_FIFO, &sp);
        single(mode == 1);
    }
    uint64_t total = 0, w = 0;
    for (int c = 0; c < ncpu; c++) {
        total += cpu_ns[c];
        w += wakes[c];
    }
    printf("{\"mode\": \"%s\", \"cpu_ns\": %llu, \"wakeups\": %llu, \"seconds\": %.1f}\n", argv[1],
           (unsigned long long)total, (unsigned long long)w, seconds);
    return 0;
}
