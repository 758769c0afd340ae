/* prmalloc_heat.c -- tier mode's heat-driven resident budget under LD_PRELOAD: hot pages stay, cold ones go, data kept.
 * Usage: prmalloc_heat (RTKIT_TIER_POOL_PATH, RTKIT_RUN_DIR, RTKIT_TIER_RESIDENT_MAX, RTKIT_TIER_HEAT_EVERY set by
 * the caller). A 64 MiB table in the pool; each step rewrites two 1 MiB hot ranges (at the table's start, where a
 * round-robin budget drops first, and in its middle) and one passing 256 KiB window of the cold rest; a thread frees
 * other pool records while the steps mark; a child forked mid-run reads and scribbles over its own copy. */
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
#define HOT_PAGES 256u              /* 1 MiB each */
#define HOT1 0u                     /* the table's first pages */
#define HOT2 8192u                  /* its middle */
#define SWEEP_LO 1024u              /* the passing window goes over [SWEEP_LO, HOT2) */
#define SWEEP_PAGES 64u
#define COLD_LO 12288u              /* never written after initialisation */
#define STEPS 64                    /* ends on a power of two: a step mark that also writes the stats files */
#define RACERS 16

typedef int (*in_pmem_fn)(const void *);
typedef int (*write_fn)(void);

static unsigned char *g_table;
static uint32_t g_version[TABLE_PAGES];  /* how often each page was rewritten (in DRAM: below tier_min_size) */

static void write_page(uint32_t i) { t_write_page(g_table, g_version, i); }
static int page_ok(const unsigned char *table, uint32_t i) { return t_page_ok(table, g_version, i); }

static uint32_t resident(uint32_t lo, uint32_t n)
{
    static unsigned char vec[TABLE_PAGES];
    if (mincore(g_table + (size_t)lo * PAGE, (size_t)n * PAGE, vec) != 0)
        return 0;
    uint32_t r = 0;
    for (uint32_t i = 0; i < n; i++)
        r += vec[i] & 1;
    return r;
}

/* pool records of 1 MiB freed one by one while the main thread steps (frees racing the marks' samples) */
static unsigned char *g_racer[RACERS];
static volatile int g_racers_ok = 1;

static void *free_racers(void *arg)
{
    for (int i = 0; i < RACERS; i++) {
        if (!t_racer_ok(g_racer[i], i))
            g_racers_ok = 0;
        free(g_racer[i]);
        usleep(2000);
    }
    return NULL;
}

int main(void)
{
    test_bind();
    in_pmem_fn in_pmem = (in_pmem_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_in_pmem");
    write_fn write_stats = (write_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_write_stats");
    CHECK(in_pmem && write_stats);
    if (!in_pmem || !write_stats)
        return 1;
    /* before the first step mark: placed in the pool, every page written by "initialisation" */
    g_table = t_pool_table(in_pmem, TABLE_PAGES, g_version, g_racer, RACERS);
    if (!g_table)
        return 1;
    t_mark_pass();
    pthread_t th;
    CHECK(pthread_create(&th, NULL, free_racers, NULL) == 0);
    for (int s = 1; s <= STEPS; s++) {
        uint32_t sweep = SWEEP_LO + ((uint32_t)s * 3 * SWEEP_PAGES) % (HOT2 - SWEEP_LO - SWEEP_PAGES);
        for (uint32_t i = 0; i < HOT_PAGES; i++) {
            write_page(HOT1 + i);
            write_page(HOT2 + i);
        }
        for (uint32_t i = 0; i < SWEEP_PAGES; i++)
            write_page(sweep + i);
        if (s == STEPS / 2) {
            /* a child sees the pool as it was at fork, whatever the budget dropped, and its writes stay its own */
            pid_t pid = fork();
            if (pid == 0) {
                int ok = 1;
                for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
                    ok &= page_ok(g_table, i);
                memset(g_table + (size_t)HOT1 * PAGE, 0xAB, (size_t)HOT_PAGES * PAGE);
                _exit(ok ? 0 : 3);
            }
            int st = 0;
            CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
        t_mark_pass();
    }
    pthread_join(th, NULL);
    CHECK(g_racers_ok);
    /* after the last mark's budget pass: the hot ranges are in DRAM, the cold rest mostly is not */
    uint32_t hot1 = resident(HOT1, HOT_PAGES), hot2 = resident(HOT2, HOT_PAGES);
    uint32_t cold = resident(COLD_LO, TABLE_PAGES - 1 - COLD_LO);
    fprintf(stderr, "resident pages: hot %u/%u and %u/%u, cold %u/%u\n", hot1, HOT_PAGES, hot2, HOT_PAGES, cold,
            TABLE_PAGES - 1 - COLD_LO);
    CHECK(hot1 >= HOT_PAGES * 3 / 4 && hot2 >= HOT_PAGES * 3 / 4);
    CHECK(cold <= (TABLE_PAGES - 1 - COLD_LO) / 4);
    /* every page as last written: what was dropped came back from the file */
    uint32_t bad = 0;
    for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
        bad += !page_ok(g_table, i);
    CHECK(bad == 0);
    CHECK(write_stats() == 0);
    return test_done("prmalloc_heat");
}
