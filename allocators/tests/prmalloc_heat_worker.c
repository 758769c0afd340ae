/* prmalloc_heat_worker.c -- the heat budget's worker thread: a pass held half way while records are freed, a fork, exit.
 * Usage: prmalloc_heat_worker free|fork|exit (RTKIT_TIER_POOL_PATH, RTKIT_RUN_DIR, RTKIT_TIER_RESIDENT_MAX=8M,
 * RTKIT_TIER_HEAT_EVERY=1 set by the caller). A 64 MiB table and 16 records of 1 MiB in the pool; the steps rewrite
 * 1 MiB of the table. Then a pass is asked for while everything is read into DRAM (cold: read, not written), and
 * held (rtkit_tier_heat_hold) where it has sampled heat and copied the live records, before it drops anything:
 *   free: 8 of the records are freed and as many made again in their place and written: once let go, the pass
 *         drops the cold pages it sampled but leaves the new records alone (their pages were written after its
 *         sample: the hottest of the pool), and every byte reads back as last written;
 *   fork: a child forked now finds no worker (waiting for one returns at once), marks steps (none starts), frees
 *         records and exits; the parent's pass goes on once let go, and the next steps' passes run;
 *   exit: main returns: the exit ends the held pass and joins the worker (no hang), the stats are written. */
#define _GNU_SOURCE
#include <dirent.h>
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
#define RACERS 16
#define FREED 8                     /* records freed and made again while the pass is held */
#define REC (1u << 20)

typedef int (*in_pmem_fn)(const void *);
typedef long (*wait_fn)(void);
typedef int (*hold_fn)(int);

static unsigned char *g_table;
static uint32_t g_version[TABLE_PAGES];
static unsigned char *g_racer[RACERS];
static in_pmem_fn in_pmem;
static wait_fn heat_wait;
static hold_fn hold;

static int g_threads;  /* the process's threads before the first mark */

static int threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static uint32_t resident(const unsigned char *p, size_t bytes)
{
    static unsigned char vec[TABLE_PAGES];
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(PAGE - 1), hi = ((uintptr_t)p + bytes) & ~(uintptr_t)(PAGE - 1);
    if (hi <= lo || mincore((void *)lo, hi - lo, vec) != 0)
        return 0;
    uint32_t r = 0;
    for (uintptr_t i = 0; i < (hi - lo) / PAGE; i++)
        r += vec[i] & 1;
    return r;
}

static void steps(int n)
{
    for (int s = 0; s < n; s++) {
        for (uint32_t i = 0; i < HOT_PAGES; i++)
            t_write_page(g_table, g_version, i);
        t_mark_pass();
    }
}

/* every pool page read into DRAM (cold: nothing written), a pass asked for and held before it drops anything */
static void held_pass(void)
{
    volatile unsigned char sink = 0;
    for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
        sink += g_table[(size_t)i * PAGE];
    for (int i = 0; i < RACERS; i++)
        for (size_t k = 0; g_racer[i] && k < REC; k += PAGE)
            sink += g_racer[i][k];
    (void)sink;
    CHECK(hold(1) == 0);
    t_mark();
    while (hold(1) != 1)  /* the worker reaches the hold point once it has sampled */
        usleep(1000);
}

static int table_ok(void)
{
    uint32_t bad = 0;
    for (uint32_t i = 0; i < TABLE_PAGES - 1; i++)
        bad += !t_page_ok(g_table, g_version, i);
    return bad == 0;
}

static void fill(unsigned char *p, unsigned char seed)
{
    for (size_t k = 0; k < REC; k += 64)
        p[k] = (unsigned char)(seed + k / 64);
}

static int filled(const unsigned char *p, unsigned char seed)
{
    for (size_t k = 0; k < REC; k += 64)
        if (p[k] != (unsigned char)(seed + k / 64))
            return 0;
    return 1;
}

/* a record of REC bytes in the pool (the planned arena's blocks of that size are handed out first: kept aside) */
static unsigned char *pool_record(void)
{
    static void *dram[64];
    static int ndram;
    for (;;) {
        unsigned char *p = malloc(REC);
        CHECK(p != NULL);
        if (!p || in_pmem(p))
            return p;
        CHECK(ndram < 64);
        if (ndram < 64)
            dram[ndram++] = p;
    }
}

static void case_free(void)
{
    held_pass();
    unsigned char *made[FREED];
    int same = 0;
    for (int i = 0; i < FREED; i++) {
        unsigned char *old = g_racer[i];
        free(old);
        made[i] = pool_record();
        same += made[i] == old;
        fill(made[i], (unsigned char)(0x40 + i));
        g_racer[i] = NULL;
    }
    fprintf(stderr, "free: %d of %d records made again at the address of one the held pass copied\n", same, FREED);
    CHECK(same > 0);  /* the case this tests: a pass's copy of a record whose place another one took */
    CHECK(hold(0) == 0);
    CHECK(heat_wait() > 0);
    uint32_t kept = 0, pages = 0;
    for (int i = 0; i < FREED; i++) {
        kept += resident(made[i] + PAGE, REC - 2 * PAGE);
        pages += (REC - 2 * PAGE) / PAGE;
        CHECK(filled(made[i], (unsigned char)(0x40 + i)));
    }
    fprintf(stderr, "free: %u of %u pages of the records made while the pass was held still in DRAM after it\n", kept,
            pages);
    CHECK(kept == pages);
    for (int i = FREED; i < RACERS; i++)
        CHECK(t_racer_ok(g_racer[i], i));
    CHECK(resident(g_table, (size_t)TABLE_PAGES * PAGE) <= 2048u);  /* the pass dropped the cold rest all the same */
    steps(4);
    for (int i = 0; i < FREED; i++) {
        CHECK(filled(made[i], (unsigned char)(0x40 + i)));
        free(made[i]);
    }
}

static void case_fork(void)
{
    held_pass();
    pid_t pid = fork();
    if (pid == 0) {
        /* no worker here, and none starts: nothing to wait for, no pass to hold */
        int ok = heat_wait() == -1 && hold(0) == -1;
        ok &= table_ok();
        for (int s = 0; s < 3; s++) {
            memset(g_table, 0xAB, (size_t)HOT_PAGES * PAGE);  /* its own copy */
            t_mark();
        }
        ok &= heat_wait() == -1 && threads() == 1;  /* only the forking thread */
        unsigned char *p = malloc(REC);
        ok &= p != NULL;
        free(p);
        free(g_racer[0]);
        exit(ok ? 0 : 3);  /* through the destructors: no worker to stop */
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(hold(0) == 0);
    long passes = heat_wait();
    CHECK(passes > 0);
    steps(3);
    CHECK(heat_wait() >= passes + 3);  /* the worker runs on in the parent */
    CHECK(threads() == g_threads + 1);
    for (int i = 0; i < RACERS; i++)
        CHECK(t_racer_ok(g_racer[i], i));
}

int main(int argc, char **argv)
{
    test_bind();
    in_pmem = (in_pmem_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_in_pmem");
    heat_wait = (wait_fn)dlsym(RTLD_DEFAULT, "rtkit_tier_heat_wait");
    hold = (hold_fn)dlsym(RTLD_DEFAULT, "rtkit_tier_heat_hold");
    const char *mode = argc > 1 ? argv[1] : "";
    CHECK(in_pmem && heat_wait && hold);
    if (!in_pmem || !heat_wait || !hold)
        return 1;
    g_table = t_pool_table(in_pmem, TABLE_PAGES, g_version, g_racer, RACERS);
    if (!g_table)
        return 1;
    /* the worker starts at the first step mark, not before */
    int before = g_threads = threads();
    CHECK(heat_wait() == -1 && hold(0) == -1);
    t_mark();
    fprintf(stderr, "threads: %d before the first mark, %d after\n", before, threads());
    CHECK(threads() == before + 1);
    /* steps until the plan is made, a record of REC bytes made while profiling and kept: that size is then placed
     * in the pool after the first mark too (what case_free makes again) */
    void *keep = NULL;
    for (int s = 0; s < 40 && t_state() != 3; s++) {
        if (t_state() == 2 && !keep)
            keep = malloc(REC);
        steps(1);
    }
    CHECK(t_state() == 3);
    if (!strcmp(mode, "free"))
        case_free();
    else if (!strcmp(mode, "fork"))
        case_fork();
    else if (!strcmp(mode, "exit"))
        held_pass();  /* and return with the pass held: the exit must end it */
    else
        CHECK(!"mode: free, fork or exit");
    if (strcmp(mode, "exit"))
        CHECK(table_ok());
    return test_done("prmalloc_heat_worker");
}
