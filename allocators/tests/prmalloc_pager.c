/* prmalloc_pager.c -- tier mode's own pager (tier_pager) under LD_PRELOAD: data kept through adoption, eviction and
 * refill, writes racing evictions and fetches ahead, a forked child, frees, fetches ahead. Usage: prmalloc_pager
 * basic|race|fork|fetch|same|likeness|heat_from|heat_lead|fetch_free|fork_words|order|told|untold|told_dense|told_gaps|
 * whole
 * (RTKIT_TIER_POOL_PATH, RTKIT_RUN_DIR, RTKIT_TIER_PAGER=1 and a small RTKIT_TIER_PAGER_MAX set by the caller). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prmalloc_test.h"

#define PG 4096u

typedef int (*in_pmem_fn)(const void *);
typedef int (*write_fn)(void);
static in_pmem_fn t_in_pmem;
static write_fn t_write;
static long (*t_pager_wait)(void);
static long (*t_fetch)(const uint64_t *, size_t, size_t);
static long (*t_resident)(const uint64_t *, size_t, size_t, uint8_t *);
static long (*t_likeness)(const void *, const void *const *, size_t, size_t, double *);
static long (*t_heat)(const uint64_t *, size_t, size_t);

/* 1 when p lies in a mapping of the pool file (its path in /proc/self/maps), 0 when anonymous */
static int in_file_mapping(const void *p)
{
    const char *path = getenv("RTKIT_TIER_POOL_PATH");
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && path && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi && strstr(line, path))
            found = 1;
    }
    if (f)
        fclose(f);
    return found;
}

/* the figure as the stats say it now */
static long long stats_figure(const char *key)
{
    t_write();
    return t_pmem_figure(key);
}

/* a mark and the evictor's pass for it done */
static void mark(void)
{
    t_mark();
    t_pager_wait();
}

static uint32_t value(size_t page, uint32_t round) { return (uint32_t)(page * 2654435761u) ^ round; }

static void write_pages(unsigned char *p, size_t n, uint32_t round)
{
    for (size_t i = 0; i < n / PG; i++)
        memcpy(p + i * PG + 8, &(uint32_t){value(i, round)}, 4);
}

static size_t bad_pages_from(const unsigned char *p, size_t first, size_t n, uint32_t round)
{
    size_t bad = 0;
    for (size_t i = first; i < first + n / PG; i++) {
        uint32_t v;
        memcpy(&v, p + i * PG + 8, 4);
        if (v != value(i, round) && bad++ < 3) {
            uint32_t r = 0;
            while (r < round && value(i, r) != v)
                r++;
            fprintf(stderr, "page %zu: round %u's value expected, read %s %u\n", i, round,
                    r < round ? "round" : "a value of no round:", r < round ? r : v);
        }
    }
    return bad;
}

static size_t bad_pages(const unsigned char *p, size_t n, uint32_t round) { return bad_pages_from(p, 0, n, round); }

/* a page-aligned record of n bytes in the pool (a payload follows its header: the record's first page is shared) */
static unsigned char *pooled(size_t n)
{
    unsigned char *p = aligned_alloc(PG, n);
    CHECK(p && t_in_pmem(p));
    return p;
}

static size_t resident_pages(void *p, size_t n)
{
    unsigned char vec[(64u << 20) / PG];
    if (n > sizeof vec * PG || mincore(p, n, vec) != 0)
        return (size_t)-1;
    size_t k = 0;
    for (size_t i = 0; i < n / PG; i++)
        k += vec[i] & 1;
    return k;
}

/* A 32 MiB record with a few rows written before the first step and an 8 MiB one written whole; an 8 MiB limit */
static int basic(void)
{
    size_t n = 32u << 20, m = 8u << 20;
    unsigned char *a = pooled(n), *b = pooled(m);
    CHECK(in_file_mapping(a + PG));
    memset(a + (3u << 20), 5, 64u << 10);
    memset(b, 7, m);
    mark();  /* adopted: anonymous now, the data as it was */
    CHECK(!in_file_mapping(a + PG) && !in_file_mapping(b + (m / 2)));
    CHECK(stats_figure("\"regions\": ") == 2 && stats_figure("\"adopt_errors\": ") == 0);
    CHECK(a[(3u << 20) + 100] == 5 && a[(3u << 20) + (64u << 10) - 1] == 5 && a[(3u << 20) + (64u << 10)] == 0);
    CHECK(a[100] == 0 && b[0] == 7 && b[m - 1] == 7);
    write_pages(a, n, 1);
    mark();  /* written since the last scan: age 1, nothing old enough to go */
    mark();  /* unwritten for a scan: evicted down to the limit */
    mark();
    long long evicted = stats_figure("\"evicted_pages\": "), written = stats_figure("\"evicted_bytes\": ");
    /* every page evicted is written, but those of one repeated word (b's, which a loaded machine's timing can rank
     * among the oldest: 2 of them in one run) */
    long long kept_as_word = stats_figure("\"evicted_same\": ");
    CHECK(evicted > 0 && kept_as_word >= 0 && written >= (evicted - kept_as_word) * (long long)PG);
    size_t res = resident_pages(a, n);
    CHECK(res != (size_t)-1 && res < n / PG);
    CHECK(bad_pages(a, n, 1) == 0);  /* every evicted page read back from the file */
    CHECK(stats_figure("\"filled_from_file\": ") >= evicted);
    for (size_t i = 0; i < m; i += PG)
        CHECK(b[i] == 7 && b[i + PG - 1] == 7);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"write_errors\": ") == 0 &&
          stats_figure("\"move_errors\": ") == 0);
    uintptr_t a_page = (uintptr_t)a + PG;
    free(a);
    CHECK(in_file_mapping((void *)a_page));  /* the pool file's again, for the next record placed there */
    free(b);
    CHECK(stats_figure("\"forgotten_bytes\": ") >= (long long)(n + m - 4 * PG));
    return test_done("prmalloc_pager basic");
}

/* Threads rewrite their own pages round after round, in a scattered order, each checking the last round's value
 * first (zero at the first: the record starts as holes), while the main thread marks steps and the evictor moves
 * pages out under them: a write lost to an eviction, a page read back stale, or a hole's fill run zeroing a page
 * the evictor has just taken out (before the file has it), is a wrong value. */
typedef struct { unsigned char *p; size_t first, count; uint32_t rounds; size_t bad; } stripe_t;
static volatile int g_go;
static int g_done, g_evicted;

/* At least s->rounds rounds, and on until the main thread has seen an eviction (a fast machine wrote 40 rounds in
 * the first few marks, before any pass found the process past its limit: nothing raced); s->rounds is the last */
static void *writer(void *arg)
{
    stripe_t *s = arg;
    while (!g_go)
        ;
    uint32_t r = 1;
    for (; r <= s->rounds || !__atomic_load_n(&g_evicted, __ATOMIC_ACQUIRE); r++)
        for (size_t k = 0; k < s->count; k++) {
            size_t i = s->first + (k * 7919) % s->count;  /* 7919 is prime: a permutation of the stripe */
            uint32_t v;
            memcpy(&v, s->p + i * PG + 8, 4);
            s->bad += v != (r == 1 ? 0 : value(i, r - 1));
            memcpy(s->p + i * PG + 8, &(uint32_t){value(i, r)}, 4);
        }
    s->rounds = r - 1;
    __atomic_add_fetch(&g_done, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

/* While the writers run: read every page of the record ahead, over and over, in a scattered order (what a lookahead
 * does for the next step's rows), so that fetches race the writers' faults and the evictor's moves */
typedef struct { unsigned char *p; size_t pages; long filled; } fetcher_t;

static void *fetcher(void *arg)
{
    fetcher_t *f = arg;
    static uint64_t list[(24u << 20) / PG];
    size_t n = f->pages < sizeof list / sizeof list[0] ? f->pages : sizeof list / sizeof list[0];
    while (!g_go)
        ;
    for (uint32_t round = 0; __atomic_load_n(&g_done, __ATOMIC_ACQUIRE) < 3; round++) {
        for (size_t k = 0; k < n; k++)
            list[k] = (uintptr_t)f->p / PG + (k * 4099 + round) % n;
        long got = t_fetch(list, n, PG);
        f->filled += got > 0 ? got : 0;
    }
    return NULL;
}

static int race(void)
{
    size_t n = 24u << 20, pages = n / PG;
    unsigned char *a = pooled(n);
    mark();
    enum { T = 3 };
    pthread_t th[T], fth;
    stripe_t st[T];
    fetcher_t fe = {a, pages, 0};
    for (int t = 0; t < T; t++) {
        st[t] = (stripe_t){a, pages * (size_t)t / T, pages / T, 40, 0};
        CHECK(pthread_create(&th[t], NULL, writer, &st[t]) == 0);
    }
    CHECK(pthread_create(&fth, NULL, fetcher, &fe) == 0);
    g_go = 1;
    for (int k = 0; k < 20000 && __atomic_load_n(&g_done, __ATOMIC_ACQUIRE) < T; k++) {
        mark();
        if (!__atomic_load_n(&g_evicted, __ATOMIC_RELAXED) && stats_figure("\"evicted_pages\": ") > 0)
            __atomic_store_n(&g_evicted, 1, __ATOMIC_RELEASE);  /* the stats written once a mark until then */
        usleep(1000);
    }
    __atomic_store_n(&g_evicted, 1, __ATOMIC_RELEASE);  /* none in 20 s: the check below says so */
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        CHECK(st[t].bad == 0);
    }
    pthread_join(fth, NULL);
    for (int t = 0; t < T; t++)
        CHECK(bad_pages_from(a, st[t].first, st[t].count * PG, st[t].rounds) == 0);
    CHECK(stats_figure("\"fetch_filled\": ") == fe.filled);
    CHECK(stats_figure("\"evicted_pages\": ") > 0 && stats_figure("\"filled_zero\": ") > 0);
    CHECK(stats_figure("\"write_errors\": ") == 0 && stats_figure("\"move_errors\": ") == 0);
    free(a);
    return test_done("prmalloc_pager race");
}

/* The first page of [p, p + n) out of DRAM and the first in it (mincore; n up to 320 MiB): 0, or -1 where either is
 * missing or the call fails */
static int first_out_and_in(void *p, size_t n, size_t *gone, size_t *kept)
{
    static unsigned char vec[(320u << 20) / PG];
    size_t pages = n / PG;
    if (pages > sizeof vec || mincore(p, n, vec) != 0)
        return -1;
    *gone = *kept = pages;
    for (size_t i = 0; i < pages; i++) {
        if (!(vec[i] & 1) && *gone == pages)
            *gone = i;
        if ((vec[i] & 1) && *kept == pages)
            *kept = i;
    }
    return *gone < pages && *kept < pages ? 0 : -1;
}

/* After evictions: a forked child reads the parent's rows, those in DRAM at the fork (its own copy) and those
 * evicted to the file (a private view of it), and zeros where no row was ever written; its writes stay its own; the
 * parent's pager goes on. */
static int forked(void)
{
    size_t n = 32u << 20, m = 4u << 20;
    unsigned char *a = pooled(n), *c = pooled(m);
    mark();
    write_pages(a, n, 3);
    mark();
    mark();
    mark();
    size_t gone, kept;
    CHECK(first_out_and_in(a, n, &gone, &kept) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        int ok = bad_pages(a, n, 3) == 0 && c[0] == 0 && c[m - 1] == 0;
        write_pages(a, n, 9);  /* its own copy */
        _exit(ok && bad_pages(a, n, 9) == 0 ? 0 : 1);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(bad_pages(a, n, 3) == 0);
    write_pages(a, n, 4);
    mark();
    mark();
    mark();
    CHECK(bad_pages(a, n, 4) == 0 && c[5] == 0);
    free(a);
    free(c);
    return test_done("prmalloc_pager fork");
}

/* Pages of [p, p + n) where rtkit_tier_resident (the pager's books for its records) and mincore disagree, with a page
 * outside the pool (mincore's answer) in the same call; (size_t)-1 where a call fails */
static size_t books_match_mincore(unsigned char *p, size_t n)
{
    static uint64_t list[(32u << 20) / PG + 1];
    static uint8_t said[(32u << 20) / PG + 1];
    unsigned char vec[(32u << 20) / PG];
    size_t pages = n / PG, wrong = 0;
    int here = 1;
    for (size_t k = 0; k < pages; k++)
        list[k] = (uintptr_t)p / PG + k;
    list[pages] = (uintptr_t)&here / PG;  /* this thread's stack: resident, not the pager's */
    if (n > sizeof vec * PG || t_resident(list, pages + 1, PG, said) < 0 || mincore(p, n, vec) != 0)
        return (size_t)-1;
    for (size_t k = 0; k < pages; k++)
        wrong += said[k] != (vec[k] & 1);
    return wrong + (said[pages] != 1);
}

/* After evictions: a fetch of the record's pages brings every evicted one back before any access, so reading them
 * faults none in; pages in DRAM, pages of another size and pages outside the pool are left alone. */
static int fetch(void)
{
    size_t n = 32u << 20, pages = n / PG;
    unsigned char *a = pooled(n);
    mark();
    write_pages(a, n, 5);
    CHECK(books_match_mincore(a, n) == 0);  /* pages filled since the last scan included */
    mark();
    mark();
    mark();
    size_t before = resident_pages(a, n);
    CHECK(before != (size_t)-1 && before < pages);
    CHECK(books_match_mincore(a, n) == 0);  /* the pager's books say what mincore says, page for page */
    static uint64_t list[(32u << 20) / PG];
    for (size_t k = 0; k < pages; k++)
        list[k] = (uintptr_t)a / PG + (k * 4099) % pages;  /* any order */
    uint64_t outside = (uintptr_t)&before / PG;
    CHECK(t_fetch(&outside, 1, PG) == 0);
    CHECK(t_fetch(list, 1, 1000) == -1);  /* not a multiple of 4 KiB */
    long long from_file = stats_figure("\"filled_from_file\": ");
    long got = t_fetch(list, pages, PG);
    /* the evictor runs only at marks: nothing left between the two looks, so every absent page came back */
    CHECK(got == (long)(pages - before) && resident_pages(a, n) == pages);
    CHECK(books_match_mincore(a, n) == 0);
    CHECK(t_fetch(list, pages, PG) == 0);  /* all in DRAM now */
    CHECK(bad_pages(a, n, 5) == 0);
    CHECK(stats_figure("\"filled_from_file\": ") == from_file);  /* no fault read any of them */
    CHECK(stats_figure("\"fetch_filled\": ") == got && stats_figure("\"fetch_asked\": ") == got);
    /* pages of 8 KiB: both 4 KiB halves of each */
    write_pages(a, n, 6);
    mark();
    mark();
    mark();
    before = resident_pages(a, n);
    CHECK(before < pages);
    size_t first = (uintptr_t)a / (2 * PG), count = ((uintptr_t)a + n - 1) / (2 * PG) + 1 - first;
    for (size_t k = 0; k < count; k++)
        list[k] = first + k;  /* the first may begin a page before the record: that page is no record's to fetch */
    CHECK(t_fetch(list, count, 2 * PG) == (long)(pages - before) && resident_pages(a, n) == pages);
    CHECK(bad_pages(a, n, 6) == 0);
    free(a);
    CHECK(t_fetch(list, count, 2 * PG) == 0);  /* freed: the pool file's again, nothing to fetch */
    return test_done("prmalloc_pager fetch");
}

/* Pages of one repeated word (an Adagrad slot's 0.1 on rows no step moved) are kept as the word when evicted, not
 * written; they read back as they were, beside pages that differ in one float and pages of data, in the parent and
 * in a forked child (its own copies). */
static int same_filled(void)
{
    size_t n = 32u << 20, pages = n / PG;
    float *a = (float *)(void *)pooled(n);
    size_t per = PG / sizeof(float);
    mark();
    for (size_t i = 0; i < pages; i++)
        for (size_t k = 0; k < per; k++)
            a[i * per + k] = i % 3 == 0 ? 0.1f : i % 3 == 1 ? (k == 7 ? 0.2f : 0.1f) : (float)(i * per + k);
    mark();
    mark();
    mark();
    long long same = stats_figure("\"evicted_same\": "), evicted = stats_figure("\"evicted_pages\": ");
    long long written = stats_figure("\"evicted_bytes\": ");
    CHECK(same > 0 && evicted > same && written == (evicted - same) * (long long)PG);
    pid_t pid = fork();
    if (pid == 0) {
        size_t bad = 0;
        for (size_t i = 0; i < pages; i++)
            for (size_t k = 0; k < per; k += 97)
                bad += a[i * per + k] != (i % 3 == 0 ? 0.1f : i % 3 == 1 ? (k == 7 ? 0.2f : 0.1f) : (float)(i * per + k));
        _exit(bad == 0 ? 0 : 1);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < pages; i++)
        for (size_t k = 0; k < per; k++)
            bad += a[i * per + k] != (i % 3 == 0 ? 0.1f : i % 3 == 1 ? (k == 7 ? 0.2f : 0.1f) : (float)(i * per + k));
    CHECK(bad == 0);
    CHECK(stats_figure("\"filled_same\": ") > 0);
    /* evicted again, then fetched ahead: the word pages are rebuilt by the fetch, none by a fault */
    mark();
    mark();
    mark();
    static uint64_t list[(32u << 20) / PG];
    for (size_t i = 0; i < pages; i++)
        list[i] = (uintptr_t)a / PG + i;
    long long filled_same = stats_figure("\"filled_same\": "), from_file = stats_figure("\"filled_from_file\": ");
    CHECK(t_fetch(list, pages, PG) > 0 && stats_figure("\"fetch_same\": ") > 0);
    CHECK(resident_pages(a, n) == pages);
    bad = 0;
    for (size_t i = 0; i < pages; i++)
        for (size_t k = 0; k < per; k++)
            bad += a[i * per + k] != (i % 3 == 0 ? 0.1f : i % 3 == 1 ? (k == 7 ? 0.2f : 0.1f) : (float)(i * per + k));
    CHECK(bad == 0);
    CHECK(stats_figure("\"filled_same\": ") == filled_same && stats_figure("\"filled_from_file\": ") == from_file);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"write_errors\": ") == 0);
    free(a);
    return test_done("prmalloc_pager same");
}

/* A table and its twin (an optimizer slot: written at the same pages in the same steps) score 1 by their write
 * history; a record written at other pages in other steps scores far less; a candidate at another offset in its page,
 * or memory outside the pool, scores nothing. */
static int likeness(void)
{
    size_t n = 2u << 20, pages = n / PG;
    unsigned char *t = pooled(n), *twin = pooled(n), *other = pooled(n);
    mark();
    for (uint32_t round = 0; round < 6; round++) {
        for (size_t i = 0; i < pages; i++) {
            if ((i * 2654435761u >> 7) % 6 == round)
                t[i * PG + 8] = twin[i * PG + 8] = (unsigned char)round;
            if ((i * 40503u >> 3) % 6 == round)
                other[i * PG + 8] = (unsigned char)round;
        }
        mark();
    }
    const void *cands[4] = {other, twin, twin + 64, &n};
    double score[4];
    long most = t_likeness(t, cands, 4, n, score);
    fprintf(stderr, "likeness: %ld pages, twin %.3f, other %.3f, off %.1f, outside %.1f\n", most, score[1], score[0],
            score[2], score[3]);
    CHECK(most >= 64);  /* pages written in the last step in both, and pages evicted, are not compared */
    CHECK(score[1] > 0.99 && score[0] >= 0 && score[0] < 0.5 && score[2] == -1 && score[3] == -1);
    CHECK(t_likeness(&n, cands, 2, n, score) == -1);  /* a table outside the pool */
    free(t);
    free(twin);
    free(other);
    return test_done("prmalloc_pager likeness");
}

/* More pages kept as a word than a forked child gets copies of (CHILD_FILL_MAX, 65,536): the child cannot be given
 * the parent's rows, so an absent page raises SIGBUS in it (never zeros for a row), while the pages in DRAM at the fork
 * read as the parent's; the parent's pages all read back rebuilt from their word. */
static int fork_words(void)
{
    size_t n = 320u << 20;
    uint64_t word = 0x3e8000003e800000ull;  /* two floats of 0.25: an optimizer slot's constant */
    uint64_t *a = (uint64_t *)(void *)pooled(n);
    mark();
    for (size_t k = 0; k < n / 8; k++)
        a[k] = word;
    mark();
    mark();
    mark();
    CHECK(stats_figure("\"evicted_same\": ") > 65536);
    size_t gone, kept;
    CHECK(first_out_and_in(a, n, &gone, &kept) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        setrlimit(RLIMIT_CORE, &(struct rlimit){0, 0});  /* no 320 MiB core for the expected signal */
        volatile uint64_t *v = a;
        if (v[kept * (PG / 8)] != word || v[kept * (PG / 8) + PG / 8 - 1] != word)
            _exit(1);
        (void)v[gone * (PG / 8)];  /* SIGBUS here */
        _exit(2);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS);
    size_t bad = 0;
    for (size_t k = 0; k < n / 8; k += 509)
        bad += a[k] != word;
    CHECK(bad == 0 && a[n / 8 - 1] == word);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"move_errors\": ") == 0);
    free(a);
    return test_done("prmalloc_pager fork_words");
}

/* A fetch racing frees: a thread fetches the pages of six records without pause while the main thread writes those
 * still live, has their pages evicted and read back, checks them and frees one, round after round (records are placed
 * before the first step only: the frees are what races here). Every live record reads back what was written last;
 * a fetch of a freed record's pages finds none the pager holds (nothing filled, no error). */
static int fetch_free(void)
{
    enum { R = 6 };
    size_t m = 4u << 20;
    unsigned char *rec[R], *lo = NULL, *hi = NULL;
    for (int k = 0; k < R; k++) {
        rec[k] = pooled(m);
        lo = !lo || rec[k] < lo ? rec[k] : lo;
        hi = !hi || rec[k] + m > hi ? rec[k] + m : hi;
    }
    mark();  /* adopted */
    fetcher_t fe = {lo, (size_t)(hi - lo) / PG, 0};
    pthread_t fth;
    g_done = 0;
    CHECK(pthread_create(&fth, NULL, fetcher, &fe) == 0);
    g_go = 1;
    for (int round = 0; round < R; round++) {
        for (int k = round; k < R; k++)
            write_pages(rec[k], m, (uint32_t)round + 1);
        mark();
        mark();
        mark();  /* evicted down to the limit while the fetches bring pages back */
        for (int k = round; k < R; k++)
            CHECK(bad_pages(rec[k], m, (uint32_t)round + 1) == 0);
        free(rec[round]);
    }
    __atomic_store_n(&g_done, 3, __ATOMIC_RELEASE);
    pthread_join(fth, NULL);
    CHECK(stats_figure("\"evicted_pages\": ") > 0 && stats_figure("\"regions\": ") == R);
    CHECK(stats_figure("\"forgotten_bytes\": ") >= (long long)(R * (m - PG)));
    CHECK(stats_figure("\"fetch_filled\": ") == fe.filled && fe.filled > 0);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"write_errors\": ") == 0 &&
          stats_figure("\"move_errors\": ") == 0);
    return test_done("prmalloc_pager fetch_free");
}

/* The heat scans wait until the process has used tier_pager_heat_from percent of its room (64 MiB here, set by the
 * caller): with 50, none while 8 MiB of rows are written over three steps, the first at the step after 40 MiB are;
 * with 100, the first at the step that passes the limit, before anything is evicted; the data kept through both. */
static int heat_from(void)
{
    size_t n = 96u << 20, mib = 1u << 20;
    const char *from = getenv("RTKIT_TIER_PAGER_HEAT_FROM");
    int late = from && !strcmp(from, "100");
    unsigned char *a = pooled(n);
    mark();  /* adopted */
    for (int k = 0; k < 3; k++) {
        write_pages(a, 8 * mib, 1);
        mark();
    }
    CHECK(stats_figure("\"scans\": ") == 0 && stats_figure("\"evicted_pages\": ") == 0);
    size_t written = late ? 80 * mib : 40 * mib;
    write_pages(a, written, 1);
    long long step = stats_figure("\"step_marks\": ");
    mark();
    CHECK(stats_figure("\"scans\": ") == 1 && stats_figure("\"first_scan_step\": ") == step + 1);
    mark();  /* past the limit (late) every page may go once a scan has aged them; short of it (50) nothing */
    CHECK(late ? stats_figure("\"evicted_pages\": ") > 0 : stats_figure("\"evicted_pages\": ") == 0);
    CHECK(bad_pages(a, written, 1) == 0);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"write_errors\": ") == 0);
    free(a);
    return test_done("prmalloc_pager heat_from");
}

/* The heat scans start tier_pager_heat_lead scans (4, of one step each here, set by the caller with a room of 64 MiB
 * and tier_pager_heat_from 100) before the process would reach its limit at its growth: a first step of 20 MiB (a
 * job's start, which alone would put the limit 2 steps away), then 4 MiB of rows a step: no scan while 32 MiB are
 * written (~22 MiB short of the limit less its 8 MiB slack: 5 steps), the first by 44 MiB; the data kept. */
static int heat_lead(void)
{
    size_t n = 96u << 20, mib = 1u << 20, written = 0;
    unsigned char *a = pooled(n);
    mark();  /* adopted */
    for (int k = 0; k < 7; k++) {
        size_t now = k ? 4 * mib : 20 * mib;
        write_pages(a + written, now, 1);
        written += now;
        mark();
        if (k == 3)
            CHECK(stats_figure("\"scans\": ") == 0);
    }
    CHECK(stats_figure("\"scans\": ") >= 1 && stats_figure("\"first_scan_step\": ") > 5);
    CHECK(stats_figure("\"first_scan_by_lead\": ") == 1 && stats_figure("\"evicted_pages\": ") == 0);
    long long growth = stats_figure("\"growth_bytes_per_step\": ");
    CHECK(growth >= (long long)(3 * mib) && growth <= (long long)(5 * mib));
    CHECK(bad_pages(a, 20 * mib, 1) == 0);
    for (size_t at = 20 * mib; at < written; at += 4 * mib)
        CHECK(bad_pages(a + at, 4 * mib, 1) == 0);
    free(a);
    return test_done("prmalloc_pager heat_lead");
}

/* Each step writes its whole 32 MiB record (a slot that a dense optimizer update writes whole) against 8 MiB of room
 * (set by the caller): each pass evicts what the next step writes again, so nearly every page evicted comes back
 * within two steps (back_within_two_steps: the caller reads the report's words on it); the data kept. */
static int whole_steps(void)
{
    size_t n = 32u << 20;
    uint32_t steps = 6;
    unsigned char *a = pooled(n);
    mark();  /* adopted */
    for (uint32_t step = 1; step <= steps; step++) {
        write_pages(a, n, step);
        mark();
    }
    CHECK(bad_pages(a, n, steps) == 0);
    long long evicted = stats_figure("\"evicted_pages\": "), back = stats_figure("\"back_within_two_steps\": ");
    CHECK(evicted > 0 && back * 2 > evicted);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"write_errors\": ") == 0 &&
          stats_figure("\"move_errors\": ") == 0);
    free(a);
    return test_done("prmalloc_pager whole");
}

/* 4 MiB written at every step (told before each step with `tell`: rtkit_tier_pager_heat), 4 MiB written once at step
 * 2, 8 MiB of room: evicted down under the limit, every hot page stays in DRAM, the cold pages go first and read back
 * as written. `faults`: the minor faults of the hot writes from step 9 on go to stderr ("faults N"), for the caller
 * to compare told and untold (a told region is write-protected at every eighth scan at most); `tell` 2: told at 7
 * steps in 8 only. `dense`: the last 1 MiB of the hot 4 MiB is written at every step but never told (an optimizer
 * slot updated densely): it stays hot. */
static int hot_and_cold(const char *name, uint32_t steps, int tell, int faults, int dense)
{
    size_t n = 16u << 20, part = 4u << 20;
    unsigned char *a = pooled(n), *cold = a + n - part;
    uint64_t hot[(4u << 20) / PG];
    size_t told_pages = dense ? part / PG - 256 : part / PG;
    for (size_t i = 0; i < part / PG; i++)
        hot[i] = (uintptr_t)(a + i * PG) / PG;
    mark();  /* adopted */
    long count = 0;
    for (uint32_t step = 1; step <= steps; step++) {
        if (tell && !(tell == 2 && step % 8 == 0))  /* 2: a step in 8 untold (a lookahead a tell short) */
            CHECK(t_heat(hot, told_pages, PG) == (long)told_pages);
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        write_pages(a, part, step);
        getrusage(RUSAGE_SELF, &r1);
        if (step == 2)
            write_pages(cold, part, 100);
        else if (step > 8)
            count += r1.ru_minflt - r0.ru_minflt;
        mark();
    }
    if (faults)
        fprintf(stderr, "faults %ld\n", count);
    CHECK(stats_figure("\"evicted_pages\": ") > 0);
    CHECK(resident_pages(a, part) == part / PG);  /* read without touching: mincore */
    CHECK(resident_pages(cold, part) < part / PG);
    CHECK(bad_pages(a, part, steps) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < part / PG; i++) {
        uint32_t v;
        memcpy(&v, cold + i * PG + 8, 4);
        bad += v != value(i, 100);
    }
    CHECK(bad == 0);
    CHECK(stats_figure("\"read_errors\": ") == 0 && stats_figure("\"write_errors\": ") == 0 &&
          stats_figure("\"move_errors\": ") == 0);
    free(a);
    return test_done(name);
}

int main(int argc, char **argv)
{
    test_bind();
    t_in_pmem = (in_pmem_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_in_pmem");
    t_write = (write_fn)dlsym(RTLD_DEFAULT, "rtkit_malloc_write_stats");
    t_pager_wait = (long (*)(void))dlsym(RTLD_DEFAULT, "rtkit_tier_pager_wait");
    t_fetch = (long (*)(const uint64_t *, size_t, size_t))dlsym(RTLD_DEFAULT, "rtkit_tier_pager_fetch");
    t_resident = (long (*)(const uint64_t *, size_t, size_t, uint8_t *))dlsym(RTLD_DEFAULT, "rtkit_tier_resident");
    t_likeness = (long (*)(const void *, const void *const *, size_t, size_t, double *))dlsym(
        RTLD_DEFAULT, "rtkit_tier_pager_likeness");
    t_heat = (long (*)(const uint64_t *, size_t, size_t))dlsym(RTLD_DEFAULT, "rtkit_tier_pager_heat");
    if (!t_in_pmem || !t_write || !t_pager_wait || !t_fetch || !t_likeness || !t_resident || !t_heat) {
        fprintf(stderr, "FAIL: librtkit_malloc.so without the tier pager\n");
        return 2;
    }
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "race"))
        return race();
    if (!strcmp(mode, "fork"))
        return forked();
    if (!strcmp(mode, "fetch"))
        return fetch();
    if (!strcmp(mode, "same"))
        return same_filled();
    if (!strcmp(mode, "likeness"))
        return likeness();
    if (!strcmp(mode, "heat_from"))
        return heat_from();
    if (!strcmp(mode, "heat_lead"))
        return heat_lead();
    if (!strcmp(mode, "fetch_free"))
        return fetch_free();
    if (!strcmp(mode, "fork_words"))
        return fork_words();
    if (!strcmp(mode, "whole"))
        return whole_steps();
    if (!strcmp(mode, "order"))  /* the walk for the cold pages: the caller reads what it looked at */
        return hot_and_cold("prmalloc_pager order", 8, 0, 0, 0);
    if (!strcmp(mode, "told") || !strcmp(mode, "untold") || !strcmp(mode, "told_dense") || !strcmp(mode, "told_gaps")) {
        char name[64];
        snprintf(name, sizeof name, "prmalloc_pager %s", mode);
        int tell = !strcmp(mode, "untold") ? 0 : !strcmp(mode, "told_gaps") ? 2 : 1;
        return hot_and_cold(name, 72, tell, 1, !strcmp(mode, "told_dense"));
    }
    return basic();
}
