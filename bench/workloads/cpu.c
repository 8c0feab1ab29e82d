/* CPU-bound workload with a fixed amount of work: a dependent chain of integer
 * multiply/xor/shift steps that fits in registers (no memory traffic).
 * Usage: cpu ITERATIONS   Prints the wall time in seconds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static uint64_t spin(uint64_t n, uint64_t x) {
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x *= 0x9E3779B97F4A7C15ull;
    }
    return x;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s ITERATIONS\n", argv[0]);
        return 2;
    }
    uint64_t n = strtoull(argv[1], NULL, 10);
    double t0 = now();
    uint64_t r = spin(n, 88172645463325252ull);
    double t1 = now();
    printf("%.6f %llu\n", t1 - t0, (unsigned long long)(r & 0xff));
    return 0;
}
