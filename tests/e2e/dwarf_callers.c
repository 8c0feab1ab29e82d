/* dcpi e2e workload (tests/e2e/dwarf_stacks.rs): built at -O2, with or without frame
   pointers. hot() does all the work and is a leaf without a frame (no stack slot: at -O2 gcc
   12 gives it no frame even with -fno-omit-frame-pointer); via_a calls it with 3 units per
   round, via_b with 2: 60/40. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline, noclone)) unsigned long hot(unsigned long units) {
    unsigned long x = sink;
    for (unsigned long i = 0; i < units * 200000UL; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
    return x;
}

/* The +1 keeps the call from being a tail call: the caller's frame stays on the stack. */
__attribute__((noinline, noclone)) unsigned long via_a(void) { return hot(3) + 1; }
__attribute__((noinline, noclone)) unsigned long via_b(void) { return hot(2) + 1; }

/* Runs for argv[1] seconds of its own CPU time, so that a loaded machine still gets the
   same number of samples, only later. */
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    unsigned long acc = 0;
    do {
        acc += via_a();
        acc += via_b();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return (int)(acc & 1);
}
