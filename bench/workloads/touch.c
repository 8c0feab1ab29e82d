// What this machine charges for the same memory work, minute by minute (BENCHMARKS.md,
// "Flushes at slice boundaries"): touch every cache line of a resident buffer once per period
// (as dcpid's drain and flush threads touch their tables between sleeps), in random order or
// (`s`) sequentially, and print each pass's thread CPU time in microseconds. The work is
// identical in every pass, so any spread between passes is the machine's.
//
//   cc -O2 -o touch bench/workloads/touch.c && ./touch MIB SECONDS PERIOD_S [r|s]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double thread_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 8;
    int secs = argc > 2 ? atoi(argv[2]) : 120;
    double period = argc > 3 ? atof(argv[3]) : 1.0;
    int sequential = argc > 4 && argv[4][0] == 's';
    if (mib == 0 || secs <= 0 || period <= 0) {
        fprintf(stderr, "usage: touch MIB SECONDS PERIOD_S [r|s]\n");
        return 2;
    }
    size_t n = mib << 20, lines = n / 64;
    volatile unsigned char *b = malloc(n);
    unsigned *order = malloc(lines * sizeof(unsigned));
    if (!b || !order) {
        perror("malloc");
        return 1;
    }
    memset((void *)b, 1, n);
    for (size_t i = 0; i < lines; i++)
        order[i] = (unsigned)i;
    if (!sequential) {
        srand(1);
        for (size_t i = lines - 1; i > 0; i--) {
            size_t j = (size_t)rand() % (i + 1);
            unsigned t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    int passes = (int)(secs / period);
    for (int p = 0; p < passes; p++) {
        usleep((useconds_t)(period * 1e6));
        double c0 = thread_ns();
        unsigned s = 0;
        for (size_t i = 0; i < lines; i++)
            s += b[(size_t)order[i] * 64];
        double c1 = thread_ns();
        printf("%d %.0f %u\n", p, (c1 - c0) / 1e3, s & 1);
        fflush(stdout);
    }
    return 0;
}
