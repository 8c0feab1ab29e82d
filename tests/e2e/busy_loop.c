/* dcpi e2e workload (tests/e2e/offcpu.rs): spins for argv[1] seconds of wall time, never
   blocking (clock_gettime runs in the vDSO), and prints the wall nanoseconds it ran. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + t.tv_nsec;
}

__attribute__((noinline)) unsigned long long spin(unsigned long long until) {
    volatile unsigned long long x = 0, t;
    while ((t = now_ns()) < until) x++;
    return x;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    unsigned long long t0 = now_ns();
    spin(t0 + (unsigned long long)(secs * 1e9));
    printf("%llu\n", now_ns() - t0);
    return 0;
}
