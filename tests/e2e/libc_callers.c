/* dcpi e2e workload (tests/e2e/dwarf_stacks.rs): the hot path runs in libc. copy_a copies
   3 blocks per round through memcpy, copy_b 2: libc's memcpy (a frameless leaf in an image
   without frame pointers) is called from copy_a for 60 % of its work, from copy_b for 40 %.
   Built at -O2 without frame pointers: only CFI finds memcpy's caller. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK (256 * 1024)
static char src[BLOCK], dst[BLOCK];
static volatile size_t len = BLOCK;
static volatile unsigned long sink;

/* The read of dst after the call keeps memcpy from being a tail call, and len being volatile
   keeps gcc from inlining the copy. */
__attribute__((noinline, noclone)) void copy_a(void) {
    for (int i = 0; i < 3; i++) {
        memcpy(dst, src, len);
        sink += (unsigned char)dst[i];
    }
}

__attribute__((noinline, noclone)) void copy_b(void) {
    for (int i = 0; i < 2; i++) {
        memcpy(dst, src, len);
        sink += (unsigned char)dst[i];
    }
}

/* Runs for argv[1] seconds of its own CPU time. */
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec t0, t;
    for (size_t i = 0; i < BLOCK; i++)
        src[i] = (char)i;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do {
        for (int k = 0; k < 16; k++) {
            copy_a();
            copy_b();
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return (int)(sink & 1);
}
