/* Process churn: fork + exec PROGRAM as fast as possible for SECONDS, then print the number
 * of execs and the rate. Usage: churn SECONDS [PROGRAM] (default /bin/true). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SECONDS [PROGRAM]\n", argv[0]);
        return 2;
    }
    double secs = atof(argv[1]);
    const char *prog = argc > 2 ? argv[2] : "/bin/true";
    double t0 = now(), t = t0;
    unsigned long n = 0, failed = 0;
    while (t - t0 < secs) {
        pid_t pid = fork();
        if (pid < 0) {
            failed++;
        } else if (pid == 0) {
            execl(prog, prog, (char *)NULL);
            _exit(127);
        } else {
            int st;
            if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                failed++;
            else
                n++;
        }
        t = now();
    }
    printf("%lu %.3f %.1f %lu\n", n, t - t0, n / (t - t0), failed);
    return failed ? 1 : 0;
}
