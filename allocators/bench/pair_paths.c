/* pair_paths.c -- malloc/free pairs on one allocator path at a time, for callgrind's instructions per pair
 * (run_micro.py --paths runs it at two lengths and differences them, so start-up and warm-up cancel).
 * Usage: pair_paths MODE [pairs]. MODE:
 *   planned    1 MiB pairs served by a planned 1 MiB class (steps marked until the plan is in service)
 *   profiling  1 MiB pairs while the profiler records (one step marked past the warm-up)
 *   large      1 MiB pairs from the large heap (no step marked: no plan, no profile)
 *   stash      16..512 B pairs of glibc's while a plan is in service and the fallback stash holds a block
 *              (run with RTKIT_MALLOC_LARGE=0: the stash is on only without the large heap)
 * Marks steps through rtkit_step_mark (found with dlsym: run it under LD_PRELOAD). Prints one key=value line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { STATE_PROFILING = 2, STATE_PLANNED = 3 };  /* rtkit_malloc_state's values (include/rtkit/prmalloc.h) */
#define MIB ((size_t)1 << 20)

static void (*g_mark)(void);
static int (*g_state)(void);

/* steps of one 1 MiB block each, until the allocator reaches state (at most 64 steps) */
static int steps_until(int state)
{
    for (int i = 0; i < 64 && g_state() != state; i++) {
        void *p = malloc(MIB);
        *(volatile char *)p = 1;
        free(p);
        g_mark();
    }
    return g_state() == state;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    long pairs = argc > 2 ? atol(argv[2]) : 100000;
    g_mark = (void (*)(void))dlsym(RTLD_DEFAULT, "rtkit_step_mark");
    g_state = (int (*)(void))dlsym(RTLD_DEFAULT, "rtkit_malloc_state");
    if (!g_mark || !g_state) {
        fprintf(stderr, "pair_paths: run with LD_PRELOAD=librtkit_malloc.so\n");
        return 2;
    }
    int ok = 1;
    if (!strcmp(mode, "planned") || !strcmp(mode, "stash"))
        ok = steps_until(STATE_PLANNED);
    else if (!strcmp(mode, "profiling"))
        ok = steps_until(STATE_PROFILING);
    else if (strcmp(mode, "large")) {
        fprintf(stderr, "pair_paths: MODE is planned, profiling, large or stash\n");
        return 2;
    }
    if (!ok) {
        fprintf(stderr, "pair_paths: state %d, not the mode's\n", g_state());
        return 1;
    }
    if (!strcmp(mode, "stash")) {
        /* the class's one block taken, a second 1 MiB block falls back to glibc; freed, the stash keeps it */
        void *a = malloc(MIB), *b = malloc(MIB);
        free(b);
        void *live[1024] = {0};
        uint64_t s = 7;
        for (long i = 0; i < pairs; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            unsigned k = (unsigned)(s >> 40) % 1024;
            free(live[k]);
            live[k] = malloc(16 + (size_t)((s >> 20) % 497));
            *(volatile char *)live[k] = 1;
        }
        for (int k = 0; k < 1024; k++)
            free(live[k]);
        free(a);
    } else {
        for (long i = 0; i < pairs; i++) {
            void *p = malloc(MIB);
            *(volatile char *)p = 1;
            free(p);
        }
    }
    printf("bench=pair_paths mode=%s pairs=%ld state=%d\n", mode, pairs, g_state());
    return 0;
}
