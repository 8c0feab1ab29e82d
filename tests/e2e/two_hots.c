/* dcpi e2e workload (tests/e2e/stacks.rs): built twice, as two programs that each have a
   function `hot`. -DPROG_A: hot is called by alpha_one and alpha_two; otherwise by beta_only.
   Runs for argv[1] seconds of its own CPU time. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long hot(unsigned long units) {
    /* A stack slot gives this leaf a frame (see callers.c), so its caller is found. */
    volatile unsigned long slot = units;
    unsigned long x = sink + slot;
    for (unsigned long i = 0; i < units * 200000UL; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
    return x;
}

#ifdef PROG_A
__attribute__((noinline)) unsigned long alpha_one(void) { return hot(3) + 1; }
__attribute__((noinline)) unsigned long alpha_two(void) { return hot(2) + 1; }
static unsigned long round_(void) { return alpha_one() + alpha_two(); }
#else
__attribute__((noinline)) unsigned long beta_only(void) { return hot(4) + 1; }
static unsigned long round_(void) { return beta_only(); }
#endif

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    unsigned long acc = 0;
    do {
        acc += round_();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return (int)(acc & 1);
}
