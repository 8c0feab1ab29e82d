/* dcpi e2e workload (tests/e2e/dwarf_stacks.rs): the hot path runs in the vDSO
   (clock_gettime with the tsc clocksource never enters the kernel). via_a reads the clock 3
   times a round, via_b 2 times. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline, noclone)) void via_a(void) {
    struct timespec t;
    for (int i = 0; i < 3 * 64; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        sink += (unsigned long)t.tv_nsec;
    }
}

__attribute__((noinline, noclone)) void via_b(void) {
    struct timespec t;
    for (int i = 0; i < 2 * 64; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        sink += (unsigned long)t.tv_nsec;
    }
}

/* Runs for argv[1] seconds of its own CPU time. */
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do {
        via_a();
        via_b();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return (int)(sink & 1);
}
