/* dcpi e2e workload (tests/e2e/threads.rs): two threads that name themselves with
   pthread_setname_np, "hot70" and "hot30", spin until each has used argv[1] * 0.7 and
   argv[1] * 0.3 seconds of its own CPU time; the main thread only waits for them. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct job { const char *name; double secs; };

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void *spin(void *arg) {
    struct job *j = arg;
    pthread_setname_np(pthread_self(), j->name);
    volatile unsigned long x = 0;
    double end = thread_cpu() + j->secs;
    while (thread_cpu() < end)
        for (int i = 0; i < 10000; i++) x += i;
    return NULL;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    struct job a = { "hot70", secs * 0.7 }, b = { "hot30", secs * 0.3 };
    pthread_t ta, tb;
    if (pthread_create(&ta, NULL, spin, &a) || pthread_create(&tb, NULL, spin, &b)) return 2;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    return 0;
}
