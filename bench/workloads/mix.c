/* Workload with known proportions: f1, f2 and f3 run the same loop body (same instruction
 * sequence, different constants so the compiler cannot fold them into one function) for
 * 50%, 30% and 20% of the iterations. Ground truth is the iteration share.
 * Usage: mix TOTAL_ITERATIONS   Prints wall time. Build with -fno-ipa-icf -fno-inline. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define BODY(K1, K2)                      \
    for (uint64_t i = 0; i < n; i++) {    \
        x ^= x << 13;                     \
        x ^= x >> 7;                      \
        x ^= x << 17;                     \
        x *= K1;                          \
        x += K2;                          \
    }                                     \
    return x;

__attribute__((noinline)) uint64_t f1(uint64_t n, uint64_t x) { BODY(0x9E3779B97F4A7C15ull, 1) }
__attribute__((noinline)) uint64_t f2(uint64_t n, uint64_t x) { BODY(0xBF58476D1CE4E5B9ull, 3) }
__attribute__((noinline)) uint64_t f3(uint64_t n, uint64_t x) { BODY(0x94D049BB133111EBull, 5) }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s TOTAL_ITERATIONS\n", argv[0]);
        return 2;
    }
    uint64_t total = strtoull(argv[1], NULL, 10);
    /* Interleave in small slices so all three are sampled across the whole run. */
    uint64_t slice = 1000000, done = 0, x = 88172645463325252ull;
    double t0 = now();
    while (done < total) {
        x = f1(slice * 5 / 10, x);
        x = f2(slice * 3 / 10, x);
        x = f3(slice * 2 / 10, x);
        done += slice;
    }
    double t1 = now();
    printf("%.6f %llu\n", t1 - t0, (unsigned long long)(x & 0xff));
    return 0;
}
