/* prmalloc_drift.c -- a job whose sizes change under its plan: phase A's sizes for STEPS steps, then phase B's, the
 * pair ROUNDS times (1: one change of model; more: a job alternating phases). Each step allocates its phase's sizes
 * (live together, touched), frees them and marks the step. One block of each phase's first size is kept live across
 * the next phase, its pattern checked when it is freed: a re-plan retires the arena that served it, and must neither
 * lose it nor serve it twice.
 * Usage: prmalloc_drift ROUNDS STEPS SIZES_A SIZES_B   (sizes as "1M,2M"; K/M suffixes)
 * Which blocks the arenas served is in the stats file's per-step records (the pytest reads them, tests/
 * test_prmalloc_plan.py); exits 1 on a corrupted kept block. */
#define _GNU_SOURCE
#include <string.h>

#include "prmalloc_test.h"

static int parse_sizes(const char *s, size_t *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        size_t v = strtoull(s, &end, 10);
        if (*end == 'K' || *end == 'k') { v <<= 10; end++; }
        else if (*end == 'M' || *end == 'm') { v <<= 20; end++; }
        out[n++] = v;
        if (*end != ',')
            break;
        s = end + 1;
    }
    return n;
}

static int kept_ok(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != v)
            return 0;
    return p[n - 1] == v;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: prmalloc_drift ROUNDS STEPS SIZES_A SIZES_B\n");
        return 2;
    }
    test_bind();
    int rounds = atoi(argv[1]), steps = atoi(argv[2]);
    size_t sizes[2][16];
    int n[2] = {parse_sizes(argv[3], sizes[0], 16), parse_sizes(argv[4], sizes[1], 16)};
    unsigned char *kept = NULL;
    size_t kept_n = 0;
    unsigned char kept_v = 0;
    for (int r = 0; r < rounds; r++)
        for (int ph = 0; ph < 2; ph++) {
            for (int st = 0; st < steps; st++) {
                void *live[16];
                for (int i = 0; i < n[ph]; i++) {
                    live[i] = malloc(sizes[ph][i]);
                    memset(live[i], 0x40 + i, sizes[ph][i]);
                }
                for (int i = n[ph] - 1; i >= 0; i--)
                    free(live[i]);
                if (st == steps - 1) {
                    /* the previous phase's kept block has lived through this phase and its re-plan */
                    if (kept) {
                        CHECK(kept_ok(kept, kept_n, kept_v));
                        free(kept);
                    }
                    kept_n = sizes[ph][0];
                    kept_v = (unsigned char)(0x10 + 2 * r + ph);
                    kept = malloc(kept_n);
                    memset(kept, kept_v, kept_n);  /* after the frees: a planned block, when the plan has one */
                }
                t_mark();
            }
        }
    CHECK(kept_ok(kept, kept_n, kept_v));
    free(kept);
    printf("prmalloc_drift: state %d\n", t_state());
    return g_failures ? 1 : 0;
}
