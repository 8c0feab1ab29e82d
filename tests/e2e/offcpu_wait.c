/* dcpi e2e workload (tests/e2e/offcpu.rs): the main thread blocks 60 % of its wall time in
   read() on a pipe through wait_a (a feeder thread writes 6 ms after being asked) and 40 % in
   nanosleep through wait_b, for argv[1] rounds. wait_b sleeps what keeps its total at 2/3 of
   wait_a's (a loaded machine stretches both sleeps). It prints the nanoseconds it spent in
   wait_a and in wait_b, measured around the calls.
   Built -O0 with frame pointers. libc's read and nanosleep wrappers have no frame: a
   frame-pointer walk from them skips their caller, so each goes through a helper
   (do_read, do_sleep) and the walk finds wait_a / wait_b above it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int go[2], data[2];

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + t.tv_nsec;
}

static void *feeder(void *arg) {
    (void)arg;
    char c;
    struct timespec d = {0, 6000000};
    while (read(go[0], &c, 1) == 1) {
        nanosleep(&d, NULL);
        if (write(data[1], &c, 1) != 1) break;
    }
    return NULL;
}

__attribute__((noinline)) void do_read(void) {
    char c;
    if (read(data[0], &c, 1) != 1) exit(2);
}
__attribute__((noinline)) void do_sleep(unsigned long long ns) {
    struct timespec d = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    nanosleep(&d, NULL);
}
__attribute__((noinline)) void wait_a(void) {
    char c = 'x';
    if (write(go[1], &c, 1) != 1) exit(2);
    do_read();
}
__attribute__((noinline)) void wait_b(unsigned long long ns) { do_sleep(ns); }

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    if (pipe(go) || pipe(data)) return 2;
    pthread_t t;
    if (pthread_create(&t, NULL, feeder, NULL)) return 2;
    unsigned long long a = 0, b = 0;
    for (int i = 0; i < rounds; i++) {
        unsigned long long t0 = now_ns();
        wait_a();
        unsigned long long t1 = now_ns();
        a += t1 - t0;
        unsigned long long want = a * 2 / 3;
        if (b + 500000ULL < want) {
            wait_b(want - b);
            b += now_ns() - t1;
        }
    }
    printf("%llu %llu\n", a, b);
    return 0;
}
