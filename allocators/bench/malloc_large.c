/* malloc_large.c -- micro-benchmark of recurring large allocations (mimalloc-bench's malloc-large shape: 5 to
 * 25 MiB, 20 live), the same sequence every "step", each block touched once per page as a tensor would be.
 * Marks steps through rtkit_step_mark when the preloaded allocator has it. Prints one key=value line.
 * Usage: malloc_large [steps] [warm-up steps] [touch: 1 = write one byte per page (default), 0 = never] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define LIVE 20
#define PER_STEP 40

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 40;
    int warm = argc > 2 ? atoi(argv[2]) : 10;
    int touch = argc > 3 ? atoi(argv[3]) : 1;
    void (*mark)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "rtkit_step_mark");
    size_t sizes[PER_STEP];
    int slots[PER_STEP];
    uint64_t s = 42;
    for (int i = 0; i < PER_STEP; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        sizes[i] = (5u << 20) + (size_t)((s >> 33) % (20u << 20));
        slots[i] = (int)((s >> 20) % LIVE);
    }
    void *live[LIVE] = {0};
    double *t = calloc((size_t)steps, sizeof *t);
    long f_warm = 0;
    for (int st = 0; st < steps; st++) {
        if (st == warm)
            f_warm = faults();
        double t0 = now();
        for (int i = 0; i < PER_STEP; i++) {
            free(live[slots[i]]);
            char *p = malloc(sizes[i]);
            if (touch)
                for (size_t off = 0; off < sizes[i]; off += 4096)
                    p[off] = (char)off;
            else
                *(volatile char *)p = 1;
            live[slots[i]] = p;
        }
        for (int k = 0; k < LIVE; k++) {  /* the step ends: everything is released */
            free(live[k]);
            live[k] = NULL;
        }
        t[st] = now() - t0;
        if (mark)
            mark();
    }
    long f_end = faults();
    int n = steps - warm;
    qsort(t + warm, (size_t)n, sizeof *t, cmp);
    printf("bench=malloc_large touch=%d step_us=%.2f faults_per_step=%.1f steps=%d marked=%d\n", touch, t[warm + n / 2] * 1e6,
           (double)(f_end - f_warm) / n, n, mark != NULL);
    return 0;
}
