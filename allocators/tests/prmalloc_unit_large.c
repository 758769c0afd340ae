/* prmalloc_unit_large.c -- the large-object heap on its own (linked against the sources): extents never overlap
 * under threads, frees coalesce back to one extent, double and interior frees are refused, resize in place,
 * step decay (idle N steps beyond the high-water mark: released; used within N, or within the mark: kept) and trim
 * give idle pages back, aligned blocks (by address, wherever the range lies), resident-only blocks and owner
 * words, a smaller range when the kernel refuses the one asked for, growth past other mappings made later, and
 * one kept message when it cannot grow. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/say.h"
#include "prmalloc/large.h"

static int g_failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
                                   __atomic_add_fetch(&g_failures, 1, __ATOMIC_RELAXED); } } while (0)

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define THREADS 4
#define SLOTS 64

/* bytes of [p, p + n) resident in memory */
static size_t resident(void *p, size_t n)
{
    static unsigned char vec[(64 << 20) >> 12];
    if (n > sizeof vec << 12 || mincore(p, n, vec) != 0)
        return (size_t)-1;
    size_t r = 0;
    for (size_t i = 0; i < n >> 12; i++)
        r += vec[i] & 1;
    return r << 12;
}

static uint64_t rnd(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

/* each thread keeps its own blocks, filled with its id; a block seen with another byte was handed out twice */
static void *worker(void *arg)
{
    uint64_t seed = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
    unsigned char id = (unsigned char)(uintptr_t)arg + 1;
    void *blk[SLOTS] = {0};
    size_t len[SLOTS] = {0};
    for (int it = 0; it < 20000; it++) {
        uint64_t r = rnd(&seed);
        int i = (int)(r % SLOTS);
        if (blk[i]) {
            unsigned char *c = blk[i];
            CHECK(c[0] == id && c[len[i] - 1] == id && c[len[i] / 2] == id);
            size_t b = 0;
            CHECK(rtk_large_free(blk[i], &b) == 0 && b >= len[i]);
            blk[i] = NULL;
        } else {
            size_t n = 4 * KiB + (size_t)(r >> 8) % (3 * MiB);
            size_t align = (r & 0xf0) == 0 ? (size_t)64 * KiB : 64, u = 0;
            void *p = rtk_large_alloc(n, align, &u);
            CHECK(p && u >= n && ((uintptr_t)p & (align - 1)) == 0);
            if (!p)
                continue;
            memset(p, id, 1);
            memset((char *)p + n / 2, id, 1);
            memset((char *)p + n - 1, id, 1);
            blk[i] = p;
            len[i] = n;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (blk[i]) {
            size_t b;
            CHECK(rtk_large_free(blk[i], &b) == 0);
        }
    return NULL;
}

/* In a child (the heap is set up once a process): an address-space limit whose quarter is more than is left
 * under it, so the first reservation fails; the heap must settle for a smaller range rather than none. */
static int smaller_range_when_refused(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (rtk_large_span)
            _exit(5);  /* set up before main: run with RTKIT_MALLOC_LARGE=0 */
        if (mmap(NULL, (size_t)1 << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
            _exit(2);
        unsigned long vsz_pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%lu", &vsz_pages) != 1)
            _exit(2);
        fclose(f);
        size_t left = 256 * MiB, as = (size_t)vsz_pages * (size_t)sysconf(_SC_PAGESIZE) + left;
        struct rlimit rl = {as, as};
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(2);
        if (rtk_large_init((size_t)64 << 30, 0) != 0)
            _exit(3);
        size_t u = 0, b = 0;
        void *p = rtk_large_alloc(8 * MiB, 64, &u);
        /* the range settled for (its first piece is mapped now, the rest as the heap grows) fits what was left */
        int ok = rtk_large_span > 0 && rtk_large_reach >= 64 * MiB && rtk_large_reach < left && p && rtk_large_free(p, &b) == 0;
        _exit(ok ? 0 : 4);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* In a child: the range asked for at an address aligned to 2 MiB and no more (as where the kernel refuses the
 * usual one and places it itself). Alignments past 2 MiB must hold by address, from fresh pages and from freed
 * extents alike: a page index that is a multiple of the alignment is no aligned address on such a range. */
static int alignment_by_address(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (rtk_large_span)
            _exit(5);
        rtk_large_hint = 0;
        /* an address that is free here (mappings lie where ASLR put them): probed, given back, then asked for */
        static const uintptr_t tries[] = {0x100000000000ull, 0x200000000000ull, 0x300000000000ull, 0x400000000000ull};
        for (size_t t = 0; t < sizeof tries / sizeof tries[0] && !rtk_large_hint; t++) {
            void *want = (void *)(tries[t] + 2 * MiB), *got;
            got = mmap(want, (size_t)1 << 30 | 2 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (got != MAP_FAILED)
                munmap(got, (size_t)1 << 30 | 2 * MiB);
            if (got == want)
                rtk_large_hint = (uintptr_t)want;
        }
        if (!rtk_large_hint)
            _exit(7);
        if (rtk_large_init((size_t)1 << 30, 0) != 0)
            _exit(3);
        if ((rtk_large_lo & (4 * MiB - 1)) == 0)
            _exit(6);  /* the kernel placed it elsewhere, aligned more: this child proves nothing */
        int bad = 0;
        for (int round = 0; round < 2; round++) {  /* round 1: the extents round 0 freed */
            void *blk[15];
            for (int k = 12; k <= 26; k++) {
                size_t al = (size_t)1 << k, u = 0;
                blk[k - 12] = rtk_large_alloc(40 * KiB, al, &u);
                bad += !blk[k - 12] || ((uintptr_t)blk[k - 12] & (al - 1)) != 0;
            }
            for (int i = 0; i < 15; i++) {
                size_t b = 0;
                bad += blk[i] && rtk_large_free(blk[i], &b) != 0;
            }
        }
        _exit(bad ? 4 : 0);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* In a child: the range placed by the kernel (no hint: directly below the mappings already there, as when ASLR put
 * them over the usual address), then the program maps what its libraries take, a piece at a time. The heap must
 * still grow past its first piece: mappings made later fill the highest free gap first, and a page map whose
 * unmapped rest lay there was walled in, leaving the heap its first 32 MiB for the rest of the run. */
static int grows_after_other_mappings(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        rtk_large_hint = 0;
        if (rtk_large_init((size_t)64 << 30, 0) != 0)
            _exit(3);
        for (int i = 0; i < 384; i++)  /* 384 MiB, a library's segment at a time */
            if (mmap(NULL, 1 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
                _exit(5);
        size_t u = 0, b = 0;
        void *p = rtk_large_alloc((size_t)1 << 30, 4096, &u);
        if (!p || rtk_large_free(p, &b) != 0 || rtk_kept_count() != 0)
            _exit(4);
        /* a page taken right past what is mapped now: the heap cannot grow, and says so once */
        char *past = (char *)rtk_large_lo + rtk_large_span;
        if (mmap(past, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != past)
            _exit(6);
        p = rtk_large_alloc(rtk_large_span + 4096, 4096, &u);
        void *q = rtk_large_alloc(rtk_large_span + 8192, 4096, &u);
        _exit(!p && !q && rtk_kept_count() == 1 && strstr(rtk_kept_message(0, NULL), "could not grow") ? 0 : 7);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    CHECK(smaller_range_when_refused() == 0);
    CHECK(alignment_by_address() == 0);
    CHECK(grows_after_other_mappings() == 0);
    CHECK(rtk_large_init((size_t)8 << 30, 0) == 0);
    rtk_large_info_t info;

    /* resident-only blocks (a plan's classes take these first) and owner words; on a fresh heap blocks come from
     * the top in order, so g1 and g2 keep e from merging with anything */
    size_t u0 = 0, b0 = 0;
    CHECK(rtk_large_alloc_resident(4096, 4096, &u0) == NULL);  /* nothing freed yet */
    char *g1 = rtk_large_alloc(4096, 4096, &u0), *e = rtk_large_alloc(4 * MiB, 4096, &u0);
    char *g2 = rtk_large_alloc(4096, 4096, &u0);
    CHECK(e == g1 + 4096 && g2 == e + 4 * MiB);
    memset(e, 5, 4 * MiB);
    uint32_t w0 = 1;
    CHECK(rtk_large_block(e, &u0, &w0) == RTK_BLOCK_LIVE && u0 == 4 * MiB && w0 == 0);
    rtk_large_set_owner(e, RTK_LARGE_OWNED | 7);
    CHECK(rtk_large_block(e, &u0, &w0) == RTK_BLOCK_LIVE && w0 == (RTK_LARGE_OWNED | 7));
    CHECK(rtk_large_block(e + 4096, &u0, &w0) == RTK_BLOCK_NONE && w0 == 0 && u0 == 0);
    CHECK(rtk_large_block(g1, &u0, &w0) == RTK_BLOCK_LIVE && w0 == 0 && u0 == 4096);
    /* a block a class holds goes back only through its class, which clears the word first: a free of it as the
     * heap's own (one racing the class's adoption of it) is a double free */
    CHECK(rtk_large_free(e, &b0) == -2 && rtk_large_block(e, &u0, &w0) == RTK_BLOCK_LIVE);
    CHECK(rtk_large_adopt(e, RTK_LARGE_OWNED | 8) == -2 && rtk_large_adopt(e + 4096, RTK_LARGE_OWNED | 8) == -1);
    rtk_large_set_owner(e, 0);
    CHECK(rtk_large_adopt(g1, RTK_LARGE_OWNED | 9) == 0 && rtk_large_block(g1, &u0, &w0) == RTK_BLOCK_LIVE &&
          w0 == (RTK_LARGE_OWNED | 9));
    rtk_large_set_owner(g1, 0);
    CHECK(rtk_large_free(e, &b0) == 0 && rtk_large_block(e, &u0, &w0) == RTK_BLOCK_FREE && w0 == 0);
    CHECK(rtk_large_alloc_resident(8 * MiB, 4096, &u0) == NULL);  /* no resident extent that long */
    CHECK(rtk_large_alloc_resident(2 * MiB, 4096, &u0) == e);
    CHECK(rtk_large_free(e, &b0) == 0);
    CHECK(rtk_large_free_release(g2, &b0) == 0);  /* merges with e's resident pages: a mixed extent */
    CHECK(rtk_large_alloc_resident(4 * MiB + 4096, 4096, &u0) == NULL);  /* mixed: not taken as resident */
    CHECK(resident(e, 4 * MiB) == 4 * MiB);
    rtk_large_trim();
    CHECK(resident(e, 4 * MiB) == 0 && rtk_large_alloc_resident(4096, 4096, &u0) == NULL);
    CHECK(rtk_large_free(g1, &b0) == 0);

    /* double free, interior and foreign pointers are refused; the block stays usable */
    size_t u = 0, b = 0;
    char *p = rtk_large_alloc(100 * KiB, 64, &u);
    uint32_t ow;
    CHECK(p && u == 100 * KiB && rtk_large_block(p, &b, &ow) == RTK_BLOCK_LIVE && b == u);
    CHECK(rtk_large_free(p + 4096, &b) == -1 && rtk_large_free(p + 8, &b) == -1);
    CHECK(rtk_large_block(p + 4096, &b, &ow) == RTK_BLOCK_NONE && rtk_large_block(p + 8, &b, &ow) == RTK_BLOCK_NONE);
    CHECK(rtk_large_free(p, &b) == 0 && b == u);
    CHECK(rtk_large_free(p, &b) == -2);
    char *q = rtk_large_alloc(100 * KiB, 64, &u);
    CHECK(q == p);  /* newest free extent first: its pages are warm */

    /* in-place resize: grow into the free neighbour, then shrink */
    char *r = rtk_large_alloc(40 * KiB, 64, &u);
    CHECK(rtk_large_free(r, &b) == 0);
    CHECK(rtk_large_resize(q, 130 * KiB, &u) == 1 && u == 132 * KiB);
    CHECK(rtk_large_resize(q, 64 * KiB, &u) == 1 && u == 64 * KiB);
    CHECK(rtk_large_free(q, &b) == 0 && b == 64 * KiB);

    /* threads: no block handed out twice */
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);

    /* everything freed: one extent covers the used range again (full coalescing) */
    rtk_large_info(&info);
    CHECK(info.in_use == 0 && info.idle + info.released == info.used);
    size_t big = info.used;
    void *all = rtk_large_alloc(big, 4096, &u);
    CHECK(all && (uintptr_t)all == rtk_large_lo);
    CHECK(rtk_large_free(all, &b) == 0 && b == big);

    /* decay (N = 3), judged by what is resident (mincore), not by the heap's own books */
    rtk_large_trim();
    rtk_large_epoch();
    rtk_large_step(1, 3);
    char *d = rtk_large_alloc(8 * MiB, 4096, &u);
    void *guard = rtk_large_alloc(4096, 4096, &u);  /* no free neighbour to merge with */
    memset(d, 1, 8 * MiB);
    rtk_large_free(d, &b);  /* freed in step 1 */
    /* within the heap's high-water mark since the epoch (8 MiB): kept however long it stays idle */
    for (uint32_t s = 2; s <= 10; s++)
        rtk_large_step(s, 3);
    CHECK(resident(d, 8 * MiB) == 8 * MiB);
    /* beyond it (a new epoch: a plan took the recurring sizes): kept for N - 1 steps, given back at N */
    CHECK(rtk_large_alloc(8 * MiB, 4096, &u) == d);
    memset(d, 2, 8 * MiB);
    rtk_large_step(20, 3);
    rtk_large_free(d, &b);  /* freed in step 20 */
    rtk_large_epoch();
    rtk_large_step(21, 3);
    rtk_large_step(22, 3);
    CHECK(resident(d, 8 * MiB) == 8 * MiB);
    rtk_large_step(23, 3);
    CHECK(resident(d, 8 * MiB) == 0);
    rtk_large_info(&info);
    CHECK(info.decayed_bytes >= 8 * MiB);
    /* used in every step: kept past N steps */
    rtk_large_epoch();
    for (uint32_t s = 30; s <= 40; s++) {
        char *k = rtk_large_alloc(2 * MiB, 4096, &u);
        CHECK(k == d);
        memset(k, 3, 2 * MiB);
        rtk_large_free(k, &b);
        rtk_large_step(s, 3);
    }
    CHECK(resident(d, 2 * MiB) == 2 * MiB);
    CHECK(d[4096] == 3 && d[6 * MiB] == 0);  /* kept pages hold their data; given-back pages read as zero */
    /* RTKIT_MALLOC_DECAY_STEPS=0: never */
    CHECK(rtk_large_alloc(8 * MiB, 4096, &u) == d);
    memset(d, 4, 8 * MiB);
    rtk_large_free(d, &b);
    rtk_large_epoch();
    for (uint32_t s = 50; s <= 80; s++)
        rtk_large_step(s, 0);
    CHECK(resident(d, 8 * MiB) == 8 * MiB);
    CHECK(rtk_large_trim() >= 8 * MiB);
    CHECK(resident(d, 8 * MiB) == 0);
    CHECK(rtk_large_free(guard, &b) == 0);

    /* a resident extent that fits is taken however many given-back ones come first: 70 given-back extents of
     * 8 pages (each kept apart by a live page), then one resident extent of 32 pages, in a higher bin; a 4-page
     * request gets resident pages (a scan bounded at 64 extents settled for given-back ones) */
    rtk_large_trim();
    char *sep[71], *gb[70];
    for (int i = 0; i < 70; i++) {
        gb[i] = rtk_large_alloc(8 * 4096, 4096, &u);
        sep[i] = rtk_large_alloc(4096, 4096, &u);
    }
    char *res = rtk_large_alloc(32 * 4096, 4096, &u);
    sep[70] = rtk_large_alloc(4096, 4096, &u);
    memset(res, 1, 32 * 4096);
    CHECK(rtk_large_free(res, &b) == 0);
    for (int i = 0; i < 70; i++)
        CHECK(rtk_large_free_release(gb[i], &b) == 0);
    char *got = rtk_large_alloc(4 * 4096, 4096, &u);
    CHECK(got && resident(got, 4 * 4096) == 4 * 4096);
    CHECK(rtk_large_free(got, &b) == 0);
    for (int i = 0; i < 71; i++)
        CHECK(rtk_large_free(sep[i], &b) == 0);

    /* headroom: rtk_large_reserve faults in what the resident idle pages lack, once, and hands it out warm */
    rtk_large_trim();
    rtk_large_info(&info);
    CHECK(info.idle == 0);
    size_t before = info.prefaulted;
    CHECK(rtk_large_reserve(6 * MiB) == 6 * MiB);
    CHECK(rtk_large_reserve(6 * MiB) == 0);  /* already held */
    rtk_large_info(&info);
    CHECK(info.idle >= 6 * MiB && info.prefaulted == before + 6 * MiB && info.in_use == 0);
    char *warm = rtk_large_alloc(6 * MiB, 4096, &u);
    CHECK(warm && resident(warm, 6 * MiB) == 6 * MiB);
    CHECK(rtk_large_free(warm, &b) == 0);

    /* beyond the range: NULL, never a wrap */
    CHECK(rtk_large_alloc((size_t)1 << 42, 4096, &u) == NULL);
    if (g_failures) {
        fprintf(stderr, "prmalloc_unit_large: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("prmalloc_unit_large: ok\n");
    return 0;
}
