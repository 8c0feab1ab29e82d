/* Off-CPU benchmark workload (bench/offcpu.py): two threads, pinned to CPUs 0 and 1, bounce a
   byte over two pipes. Each round trip blocks each thread once, so each CPU switches twice
   (thread -> idle -> thread). argv[1]: seconds; argv[2]: round trips per second to pace to
   (0: as fast as possible); argv[3]: the second thread's CPU (default 1; 0 puts both threads on
   CPU 0, where each switch goes from one thread straight to the other, with no idle between:
   the round trips are then bound by the CPU, kernel work at each switch included). Prints
   "round_trips seconds". */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ab[2], ba[2];
static int pong_cpu = 1;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *arg) {
    (void)arg;
    pin(pong_cpu);
    char c;
    while (read(ab[0], &c, 1) == 1)
        if (write(ba[1], &c, 1) != 1) break;
    return NULL;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 10;
    double rate = argc > 2 ? atof(argv[2]) : 0;
    pong_cpu = argc > 3 ? atoi(argv[3]) : 1;
    if (pipe(ab) || pipe(ba)) return 2;
    pthread_t t;
    pthread_create(&t, NULL, pong, NULL);
    pin(0);
    double t0 = now(), end = t0 + secs;
    unsigned long n = 0;
    char c = 'x';
    for (;;) {
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 2;
        n++;
        if ((n & 63) == 0) {
            double t1 = now();
            if (t1 >= end) break;
            if (rate > 0) {
                /* Batches of 64 round trips, paced to `rate` on average. */
                double due = t0 + n / rate;
                if (due > t1) {
                    struct timespec d = {(time_t)(due - t1), (long)((due - t1 - (time_t)(due - t1)) * 1e9)};
                    nanosleep(&d, NULL);
                }
            }
        }
    }
    printf("%lu %.3f\n", n, now() - t0);
    return 0;
}
