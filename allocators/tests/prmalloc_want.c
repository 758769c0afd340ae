/* prmalloc_want.c -- the heat budget keeps the pages the lookahead says its next step uses, for one mark, data kept.
 * Usage: prmalloc_want (RTKIT_TIER_POOL_PATH, RTKIT_RUN_DIR, RTKIT_TIER_RESIDENT_MAX=8M, RTKIT_TIER_HEAT_EVERY=1
 * set by the caller; with RTKIT_TIER_HEAT_EVERY=0 it only checks that nothing is recorded). A 64 MiB table in the
 * pool; each step rewrites a 1 MiB hot range, reads a 4 MiB window of the never-written rest (its own faults: the
 * budget is over at every mark) and, like the lookahead, reads ahead one page in each 64 KiB of that rest after
 * saying so (rtkit_tier_want): those unwritten pages are as cold as the window's, yet the mark keeps them. One step
 * wants more than the budget: the budget still reaches its goal, dropping wanted pages last. A want holds for one
 * mark: pages wanted and then not again go at the next mark like any cold page. A thread wants and frees pool
 * records while the steps mark; a child forked mid-run records nothing and sees its parent's data. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prmalloc_test.h"

#define PAGE 4096u
#define TABLE_PAGES 16384u          /* 64 MiB */
#define HOT_PAGES 256u              /* 1 MiB, rewritten every step */
#define COLD_LO 4096u               /* never written after initialisation: [COLD_LO, TABLE_PAGES - 1) */
#define STRIDE 16u                  /* one wanted page per 64 KiB: 768 pages (3 MiB), chunks of 48 MiB */
#define WINDOW 1024u                /* 4 MiB read by each step itself, moving over the cold rest */
#define STEPS 24
#define BIG_STEP 16                 /* this step wants 3072 pages (12 MiB, over the 8 MiB budget) */
#define RACERS 16

typedef long (*want_fn)(const uint64_t *, size_t, size_t);
typedef int (*counts_fn)(uint64_t *, int);
typedef int (*in_pmem_fn)(const void *);

static unsigned char *g_table;
static uint32_t g_version[TABLE_PAGES];
static uint64_t g_list[TABLE_PAGES];
static want_fn want;

static void write_page(uint32_t i) { t_write_page(g_table, g_version, i); }
static int page_ok(const unsigned char *table, uint32_t i) { return t_page_ok(table, g_version, i); }

static int page_resident(uint32_t i)
{
    unsigned char v = 0;
    return mincore(g_table + (size_t)i * PAGE, PAGE, &v) == 0 && (v & 1);
}

/* step s's read-ahead: page (COLD_LO + s % STRIDE) of every STRIDE, or every page of [COLD_LO, +3072) */
static uint32_t wanted_pages(int s, uint32_t *out)
{
    uint32_t n = 0;
    if (s == BIG_STEP) {
        for (uint32_t i = COLD_LO; i < COLD_LO + 3072u; i++)
            out[n++] = i;
        return n;
    }
    for (uint32_t i = COLD_LO + (uint32_t)s % STRIDE; i < TABLE_PAGES - 1; i += STRIDE)
        out[n++] = i;
    return n;
}

/* say the pages are wanted (as page numbers), then read them in (the lookahead's MADV_WILLNEED) */
static long read_ahead(const uint32_t *idx, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        g_list[k] = ((uintptr_t)g_table >> 12) + idx[k];
    long got = want(g_list, n, PAGE);
    volatile unsigned char sink = 0;
    for (uint32_t k = 0; k < n; k++)
        sink += g_table[(size_t)idx[k] * PAGE];
    (void)sink;
    return got;
}

/* pool records wanted and freed one by one while the main thread steps (a want of freed pages, frees racing the
 * marks); the thread's wants are of its own records only */
static unsigned char *g_racer[RACERS];
static volatile int g_racers_ok = 1;

static void *racers(void *arg)
{
    for (int i = 0; i < RACERS; i++) {
        uint64_t pages[256];
        uintptr_t lo = ((uintptr_t)g_racer[i] + PAGE - 1) >> 12;
        for (int k = 0; k < 255; k++)
            pages[k] = lo + (uint64_t)k;
        want(pages, 255, PAGE);
        if (!t_racer_ok(g_racer[i], i))
            g_racers_ok = 0;
        free(g_racer[i]);
        want(pages, 255, PAGE);  /* freed: harmless */
        usleep(2000);
    }
    return NULL;
}

int main(void)
{
    test_bind();
    in_pmem_fn in_pmem = (in_pmem_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_in_pmem");
    want = (want_fn)dlsym(RTLD_DEFAULT, "rtkit_tier_want");
    counts_fn counts = (counts_fn)dlsym(RTLD_DEFAULT, "rtkit_tier_want_counts");
    CHECK(in_pmem && want && counts);
    if (!in_pmem || !want || !counts)
        return 1;
    g_table = t_pool_table(in_pmem, TABLE_PAGES, g_version, g_racer, RACERS);
    if (!g_table)
        return 1;
    static uint32_t now[TABLE_PAGES];
    uint32_t n = wanted_pages(0, now);
    CHECK(read_ahead(now, n) == -1);  /* before the first mark: the budget does not run yet, nothing recorded */
    uint64_t c[3] = {0};
    CHECK(counts(c, 3) == -1);
    t_mark_pass();
    const char *every = getenv("RTKIT_TIER_HEAT_EVERY");
    if (every && !strcmp(every, "0")) {  /* no heat budget: nothing is recorded, the job goes on */
        CHECK(read_ahead(now, n) == -1 && counts(c, 3) == -1);
        t_mark_pass();
        return test_done("prmalloc_want");
    }
    pthread_t th;
    CHECK(pthread_create(&th, NULL, racers, NULL) == 0);
    uint32_t kept_min = UINT32_MAX;
    for (int s = 1; s <= STEPS; s++) {
        for (uint32_t i = 0; i < HOT_PAGES; i++)
            write_page(i);
        volatile unsigned char sink = 0;
        for (uint32_t i = 0, w = COLD_LO + ((uint32_t)s * WINDOW) % (TABLE_PAGES - 1 - COLD_LO - WINDOW); i < WINDOW; i++)
            sink += g_table[(size_t)(w + i) * PAGE];
        (void)sink;
        n = wanted_pages(s, now);
        long got = read_ahead(now, n);
        CHECK(got == (long)n);
        if (s == STEPS / 2) {
            pid_t pid = fork();
            if (pid == 0) {
                int ok = read_ahead(now, n) == -1;
                for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
                    ok &= page_ok(g_table, i);
                memset(g_table, 0xAB, (size_t)HOT_PAGES * PAGE);
                _exit(ok ? 0 : 3);
            }
            int st = 0;
            CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
        t_mark_pass();
        /* the step that runs now uses the pages read ahead for it: they are in DRAM */
        uint32_t kept = 0, total = 0;
        for (uint32_t k = 0; k < n; k++)
            kept += page_resident(now[k]);
        for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
            total += page_resident(i);
        if (s == BIG_STEP) {
            /* more wanted than the budget holds: the budget still holds (3/4 of 8 MiB after its pass) */
            fprintf(stderr, "step %d: %u of %u wanted pages kept, %u table pages resident\n", s, kept, n, total);
            CHECK(total <= 2048u && kept < n);
        } else {
            kept_min = kept < kept_min ? kept : kept_min;
            CHECK(kept * 4 >= n * 3);
        }
    }
    pthread_join(th, NULL);
    CHECK(g_racers_ok);
    /* one mark only: pages wanted (1 MiB at the cold rest's start), then a step that wants nothing and reads 8 MiB
     * at its end: at that step's mark the first pages are cold like the rest, and the budget drops from the start */
    n = 0;
    for (uint32_t i = COLD_LO; i < COLD_LO + 4096u; i += STRIDE)
        now[n++] = i;
    CHECK(read_ahead(now, n) == (long)n);
    t_mark_pass();
    uint32_t kept = 0, gone = 0;
    for (uint32_t k = 0; k < n; k++)
        kept += page_resident(now[k]);
    volatile unsigned char sink = 0;
    for (uint32_t i = TABLE_PAGES - 1 - 2048u; i < TABLE_PAGES - 1; i++)
        sink += g_table[(size_t)i * PAGE];
    (void)sink;
    t_mark_pass();
    for (uint32_t k = 0; k < n; k++)
        gone += !page_resident(now[k]);
    fprintf(stderr, "wanted once: %u of %u kept at its mark, %u gone at the next\n", kept, n, gone);
    CHECK(kept * 4 >= n * 3 && gone * 4 >= n * 3);
    fprintf(stderr, "wanted pages kept at each mark: at least %u of %u\n", kept_min, wanted_pages(1, now));
    CHECK(counts(c, 3) == 3);
    fprintf(stderr, "recorded %llu, kept %llu, dropped %llu\n", (unsigned long long)c[0], (unsigned long long)c[1],
            (unsigned long long)c[2]);
    CHECK(c[1] > 0 && c[2] > 0 && c[0] >= c[1]);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
        bad += !page_ok(g_table, i);
    CHECK(bad == 0);
    return test_done("prmalloc_want");
}
