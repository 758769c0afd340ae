/* malloc_large.c -- micro-benchmark of recurring large allocations (mimalloc-bench's malloc-large shape: 5 to
 * 25 MiB, 20 live), the same sequence every "step", each block touched once per page as a tensor would be.
 * Marks steps through rtkit_step_mark when the preloaded allocator has it. Prints one key=value line.
 * Usage: malloc_large [steps] [warm-up steps] [touch: 1 = write one byte per page (default), 0 = never]
 *                     [random: 1 = new sizes and slots every step (mimalloc-bench's random blocks), 0 = recurring]
 *                     [shape: 0 = 40 blocks of 5-25 MiB a step, 20 live; 1 = 20 sizes of 64 KiB-32 MiB, all live]
 * Reports the median step after warm-up (step_us, faults_per_step) and the whole run (total_ms, cpu_ms: user +
 * system time, steadier than wall time on a shared machine; faults_total). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_clock.h"

#define LIVE 20
#define PER_STEP 40

static uint64_t g_seed = 42;

static uint64_t next(void)
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return g_seed;
}

/* shape 0: 5-25 MiB, a random slot of 20; shape 1: 64 KiB * 2^(0..9) spread, slot i (all live together) */
static int draw(int shape, size_t *sizes, int *slots)
{
    int n = shape ? LIVE : PER_STEP;
    for (int i = 0; i < n; i++) {
        uint64_t s = next();
        if (shape) {
            size_t lo = (size_t)64 << 10 << (i % 10);
            sizes[i] = lo + (size_t)((s >> 33) % lo);  /* 64 KiB .. 32 MiB */
            slots[i] = i;
        } else {
            sizes[i] = (5u << 20) + (size_t)((s >> 33) % (20u << 20));
            slots[i] = (int)((s >> 20) % LIVE);
        }
    }
    return n;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
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
    int random = argc > 4 ? atoi(argv[4]) : 0;
    int shape = argc > 5 ? atoi(argv[5]) : 0;
    void (*mark)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "rtkit_step_mark");
    size_t sizes[PER_STEP];
    int slots[PER_STEP];
    int per_step = draw(shape, sizes, slots);
    void *live[LIVE] = {0};
    double *t = calloc((size_t)steps, sizeof *t);
    long f_warm = 0, f_start = bench_minor_faults();
    double run0 = bench_now_s(), cpu0 = cpu_s();
    for (int st = 0; st < steps; st++) {
        if (st == warm)
            f_warm = bench_minor_faults();
        if (random && st)
            draw(shape, sizes, slots);
        double t0 = bench_now_s();
        for (int i = 0; i < per_step; i++) {
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
        t[st] = bench_now_s() - t0;
        if (mark)
            mark();
    }
    double total = bench_now_s() - run0, cpu = cpu_s() - cpu0;
    long f_end = bench_minor_faults();
    int n = steps - warm;
    qsort(t + warm, (size_t)n, sizeof *t, cmp);
    printf("bench=malloc_large touch=%d random=%d shape=%d step_us=%.2f faults_per_step=%.1f total_ms=%.2f "
           "cpu_ms=%.2f faults_total=%ld steps=%d marked=%d\n", touch, random, shape, t[warm + n / 2] * 1e6,
           (double)(f_end - f_warm) / n, total * 1e3, cpu * 1e3, f_end - f_start, n, mark != NULL);
    return 0;
}
