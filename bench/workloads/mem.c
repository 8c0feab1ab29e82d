/* Memory-bound workload with a fixed amount of work: a random pointer chase over an
 * array much larger than the last-level cache (every step is a dependent cache/TLB miss).
 * Usage: mem MIB STEPS   Prints the wall time of the chase in seconds (setup excluded). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

__attribute__((noinline)) static size_t chase(const size_t *a, uint64_t steps) {
    size_t p = 0;
    for (uint64_t i = 0; i < steps; i++)
        p = a[p];
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MIB STEPS\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)strtoull(argv[1], NULL, 10) * 1024 * 1024 / sizeof(size_t);
    uint64_t steps = strtoull(argv[2], NULL, 10);
    size_t *a = malloc(n * sizeof(size_t));
    if (a == NULL || n < 2) {
        fprintf(stderr, "mem: cannot allocate\n");
        return 1;
    }
    /* Sattolo's algorithm: one cycle through every slot, so the chase never short-cuts. */
    for (size_t i = 0; i < n; i++)
        a[i] = i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = next() % i;
        size_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    double t0 = now();
    size_t r = chase(a, steps);
    double t1 = now();
    printf("%.6f %zu\n", t1 - t0, r & 0xff);
    free(a);
    return 0;
}
