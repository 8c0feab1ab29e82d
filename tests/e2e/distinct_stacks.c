/* dcpi e2e workload (tests/e2e/stacks.rs): nearly every sample a distinct call stack, as on a
   machine of compilers. walk() recurses DEPTH levels, each through one of two call sites
   chosen by the bits of a random path, so that a path is one of 2^DEPTH stacks. */
#include <stdlib.h>
#include <time.h>

#define DEPTH 20

static volatile unsigned long sink;

__attribute__((noinline)) void leaf(unsigned long r) {
    volatile unsigned long slot = r;
    unsigned long x = sink + slot;
    for (int i = 0; i < 2000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}

__attribute__((noinline)) void walk(int depth, unsigned long path) {
    volatile int slot = depth;
    if (slot == 0) {
        leaf(path);
        return;
    }
    if (path & 1)
        walk(depth - 1, path >> 1);
    else
        walk(depth - 1, path >> 1);
    sink += 1;
}

/* Runs for argv[1] seconds of its own CPU time. */
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    unsigned long r = 88172645463325252UL;
    do {
        for (int i = 0; i < 64; i++) {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            walk(DEPTH, r);
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return (int)(sink & 1);
}
