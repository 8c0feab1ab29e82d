/* One binary, two hot functions (e2e per_command::, who::): `BIN a SECS` spins in hot_a,
   `BIN b SECS` in hot_b, each until the process has used SECS of CPU time. */
#include <stdlib.h>
#include <time.h>
static double cpu(void) {
    struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline, noipa)) void hot_a(double want) {
    volatile unsigned long s = 0;
    do { for (int i = 0; i < 100000; i++) s += i ^ (s >> 3); } while (cpu() < want);
}
__attribute__((noinline, noipa)) void hot_b(double want) {
    volatile unsigned long s = 1;
    do { for (int i = 0; i < 100000; i++) s += i ^ (s >> 5); } while (cpu() < want);
}
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    if (argv[1][0] == 'a') hot_a(atof(argv[2])); else hot_b(atof(argv[2]));
    return 0;
}
