/* dcpi e2e workload (tests/e2e/stacks.rs). */
/* hot() does all the work; via_a calls it with 3 units per round, via_b with 2: 60/40. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long hot(unsigned long units) {
    /* A stack slot makes gcc set up the frame pointer even in this leaf function (gcc 12
       ignores -mno-omit-leaf-frame-pointer for functions without a frame), so that the
       kernel's frame-pointer walk finds hot's caller. */
    volatile unsigned long slot = units;
    unsigned long x = sink + slot;
    for (unsigned long i = 0; i < units * 200000UL; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
    return x;
}

__attribute__((noinline)) unsigned long via_a(void) { return hot(3) + 1; }
__attribute__((noinline)) unsigned long via_b(void) { return hot(2) + 1; }

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
