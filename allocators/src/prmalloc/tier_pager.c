/* tier_pager.c -- tier mode's own pager (tier_pager): pooled records as anonymous memory under userfaultfd, read
 * from the pool file on first touch, written to it only when evicted, evicted coldest first by measured write heat. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/uffd_abi.h"
#include "prmalloc/tier_internal.h"
#include "rtkit/prmalloc.h"

/* Why: through the page cache a pool page a step writes is written back on the flusher's 30 s clock while still in
 * use (and an IPI shoots down the other core's TLB for each), and reclaim chooses by recency, blind to which rows
 * recur: the full-scale bench wrote 10.4M pages for ~3.7M pages of rows past the DRAM heads and read 1.2-1.5M back
 * (docs/results.md, "Where (b)'s time goes"). Here a record's pages are the process's anonymous memory at the same
 * addresses (a registered mapping moved over it, so no access ever sees it half made):
 * - a missing page is served by a handler thread: read from the pool file where the pager wrote it or the job had
 *   (through the page cache: a page evicted a moment ago comes back from memory, and the kernel writes evicted
 *   pages out in its own time, unmapped, so with no TLB shoot-down; direct I/O made each eviction wait for the
 *   disk, 134 us a page at full scale), zeroed pages where the file holds a hole (that one and the holes after
 *   it to a 256 KiB boundary: new rows are handed out in order, one trip to the handler serves many);
 * - every tier_pager_heat_every marks, one PAGEMAP_SCAN re-arms asynchronous write-protection and says which pages
 *   were written since the last scan: a page's age is the number of scans since a step last wrote it. The scans
 *   start tier_pager_heat_lead scans before the process would reach its limit at the rate its anonymous memory
 *   grows (or at the latest once it has used tier_pager_heat_from percent of its room): each costs the steps a
 *   fault at the next write to every page they write (~0.5 us each, ~20-25k a step at full scale), which buys
 *   nothing while no eviction is near;
 * - once the process's anonymous memory nears its limit, pages are moved out (UFFDIO_MOVE: atomic, an access after
 *   it faults to a handler, which waits for that chunk's eviction to end), written to the file and freed: pages
 *   written in the fewest scans first, the least recently written first among them. Nothing is written while a
 *   page is in use.
 * The handler threads and the evictor block every signal, allocate nothing and never stop (a fault may come until
 * the process ends); the evictor pauses at fork and stops at exit. A forked child's mappings lose the handler: it
 * gets private views of the file over its absent pages (rtk_tier_pager_fork_child), never zeros for a row. */

#define HANDLERS 4                        /* faults of several compute threads read the disk at once */
#define REGIONS HEAD_CAP
#define CHUNK_PAGES 16                    /* eviction works on 64 KiB chunks: one busy word each */
#define STAGE_PAGES 512                   /* the stage: freed once full (one TLB shoot-down for many moves) */
#define SLACK_HI ((uint64_t)64 << 20)     /* evict once within this of the limit (or an eighth of the room) ... */
#define SLACK_LO ((uint64_t)256 << 20)    /* ... down to this far under it (or a quarter of the room) */
#define SCAN_VEC 4096
#define FILL_RUN 64                       /* a hole's fault fills the holes after it up to a 256 KiB boundary */
#define AGE_MAX 255
#define HITS_MAX 15
#define RANKS ((HITS_MAX + 1) * (AGE_MAX + 1))
#define WORDS 255                         /* distinct repeated words evicted pages are kept as */
#define ARM_FIRST 8                       /* a region the lookahead tells is write-protected every this many scans, */
#define ARM_MOST 32                       /* twice as far apart after each cycle with few writes it did not tell, at */
#define UNTOLD_SHARE 8                    /* most one in this many of the writes a cycle saw; at every scan after one
                                           * with more (rows it misses: ids first seen in the step just before) */
#define RUN_FILL_MIN 3                    /* a chunk with this many candidates is moved in runs (run_fill) */
#define WHOLE_OF 8                        /* a heat window is told whole with tells for all but 1 in this many marks */
#define CHILD_FILL_MAX 65536              /* pages kept as a word that a forked child gets copies of, at most */
/* The eviction order: pages written in the fewest scans first (rows that never recur: under a power law most of the
 * pages of new rows; docs/results.md's hindsight floor keeps the most-touched pages), the least recently written
 * first among them. A lower rank goes first. */
static inline unsigned rank_of(unsigned hits, unsigned age) { return hits * (AGE_MAX + 1) + (AGE_MAX - age); }
#define LD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_RELAXED)

/* told: the lookahead told this region's pages of every step of the last heat window: its scan then re-arms it every
 * `every` scans only: ARM_FIRST, doubled after each cycle in which the writes the lookahead did not tell were few
 * (a protected page faults at its first write whenever it comes, so only far-apart arms save most faults), 1 after
 * a cycle with many (a slot its optimizer writes whole: between arms its pages would age as if unwritten, and go
 * before pages the steps use less); since: scans since it was last armed; seen, untold: the first writes since
 * then to pages a scan saw written before, and those of them the lookahead had told neither in their window nor in
 * the one before */
typedef struct { char *lo; uint64_t len; int told; uint32_t every, since; uint64_t seen, untold; } region_t;

static struct {
    int on;                               /* 1: running in this process; -1: could not start */
    int uffd, pagemap;
    uint64_t npages;                      /* of the pool */
    uint64_t *on_file;                    /* a bit per pool page: its data is in the file, read it from there */
    uint64_t *paged;                      /* a bit per pool page: in a record the pager holds (adopted, not forgotten) */
    uint8_t *age;                         /* per pool page: 0 not resident (or the zero page), 1 written since the
                                           * last scan (or filled since), k: unwritten for k - 1 scans */
    uint32_t *busy;                       /* per chunk: a lock (futex word): 1 the evictor's, 2 a handler's */
    char *stage;                          /* STAGE_PAGES registered pages the evictor moves chunks' pages into */
    uint64_t staged;                      /* pages of the stage used since it was last freed */
    char *zeros;                          /* FILL_RUN pages never written: what a hole is filled from */
    char *fetch_buf;                      /* CHUNK_PAGES pages: what rtkit_tier_pager_fetch reads a run into */
    uint32_t fetching;                    /* futex word: one fetch at a time (it owns fetch_buf) */
    region_t reg[REGIONS];
    uint32_t nreg;
    rtk_spin_t lock;                      /* the regions and the evictor's batches: fork and frees wait for it */
    uint64_t limit, slack_hi, slack_lo;   /* anonymous RSS the evictor keeps the process under, and its margins */
    uint64_t heat_from;                   /* anonymous RSS from which the heat scans run */
    uint64_t grown_at, grown_step, growth; /* anonymous RSS and step where the last scan interval began; its growth
                                            * a step: the lower of the last two intervals' (`intervals` measured) */
    uint64_t grown_last;                  /* the growth a step over the last interval alone */
    uint32_t intervals;
    uint8_t *hits;                        /* per pool page: the scans that found it written (and its read-backs) */
    uint8_t *told;                        /* per pool page: the heat window in which the lookahead last told it */
    uint64_t *credited;                   /* a bit per pool page: its write since the region was last armed counted */
    uint8_t window;                       /* the heat window now open (1..255): what the lookahead's tells stamp */
    uint32_t tells;                       /* the lookahead's tells in the open window */
    uint16_t *chunk_min;                  /* per chunk: the lowest rank of its pages at the last scan (RANKS: none
                                           * resident), so an eviction's walk skips chunks holding no candidate */
    uint8_t *word;                        /* per pool page: 0, or 1 + the index in words[] of the word every 8 bytes
                                           * of it held when evicted (kept as that, not written to the file) */
    uint64_t words[WORDS];
    uint32_t nwords;
    uint64_t *gone[2];                    /* a bit per pool page: evicted in this pass (gone[gone_now]) or the one
                                           * before: a page back in DRAM meanwhile was needed again within two steps */
    uint32_t gone_now;
    int gone_any[2];                      /* the map holds a bit (an empty one is not cleared again) */
    uint64_t last_scan_step, hist[RANKS], resident_pages;
    int scanned;
    uint32_t asked, pause, stop;          /* futex words: marks ask for passes; fork pauses; exit stops */
    uint64_t step;
    unsigned long evictor, handler[HANDLERS];
    int evictor_started;
    char note[256];
} g = {.uffd = -1, .pagemap = -1, .lock = RTK_SPIN_INIT};

rtk_tier_pager_stats_t rtk_tier_pager_stats;
#define S rtk_tier_pager_stats

/* bit i of a per-page bitmap (on_file, paged), read and set atomically: handlers, the evictor and frees share them */
static inline int bit_at(uint64_t *map, uint64_t i) { return (int)((LD(map[i >> 6]) >> (i & 63)) & 1); }
static inline void set_bit(uint64_t *map, uint64_t i, int v)
{
    if (v)
        __atomic_or_fetch(&map[i >> 6], 1ull << (i & 63), __ATOMIC_RELEASE);
    else
        __atomic_and_fetch(&map[i >> 6], ~(1ull << (i & 63)), __ATOMIC_RELEASE);
}
static inline int on_file(uint64_t i) { return bit_at(g.on_file, i); }
static inline void set_on_file(uint64_t i, int v) { set_bit(g.on_file, i, v); }
static void set_paged(uint64_t i0, uint64_t n, int v)
{
    for (uint64_t i = i0; i < i0 + n; i++)
        set_bit(g.paged, i, v);
}
static inline uint64_t page_of(const char *p) { return (uint64_t)(p - rtk_tier.base) / TIER_PAGE; }
static inline char *addr_of(uint64_t i) { return rtk_tier.base + i * TIER_PAGE; }
static inline unsigned word_at(uint64_t i) { return __atomic_load_n(&g.word[i], __ATOMIC_ACQUIRE); }
/* heat windows are numbered 1..255 round (0: a page never told) */
static inline uint8_t window_after(uint8_t w) { return (uint8_t)(w % 255 + 1); }
static inline uint8_t window_before(uint8_t w) { return (uint8_t)(w == 1 ? 255 : w - 1); }

/* `pages` pages at dst filled with the word of index id (1-based) */
static void fill_word(char *dst, unsigned id, uint64_t pages)
{
    uint64_t w = g.words[id - 1], *d = (uint64_t *)(void *)dst;
    for (uint64_t k = 0; k < pages * (TIER_PAGE / 8); k++)
        d[k] = w;
}

/* wake the threads waiting on [p, p + len) */
static void wake(char *p, uint64_t len)
{
    struct uffdio_range_ r = {(uint64_t)(uintptr_t)p, len};
    rtk_os_uffd_call(g.uffd, UFFDIO_WAKE_, &r);
}

/* ---------------------------------------------------------------- chunk locks
 * A chunk's pages change hands under its lock: the evictor's while it moves them out and writes them (a fault there
 * waits, then reads what was written), a handler's while it fills them (no eviction of a page beside them may leave
 * it a hole the handler would fill with zeros before the file has it). A handler holds its fault's chunk and, by
 * try-lock only, the next ones its fill runs into: no handler waits while it holds one. */
static void chunk_lock(uint64_t c, uint32_t who)
{
    for (uint32_t seen = 0; !__atomic_compare_exchange_n(&g.busy[c], &seen, who, 0, __ATOMIC_ACQUIRE,
                                                         __ATOMIC_RELAXED);
         seen = 0) {
        ADD(S.busy_waits, 1);
        rtk_os_futex_wait(&g.busy[c], seen);
    }
}

static int chunk_trylock(uint64_t c, uint32_t who)
{
    uint32_t seen = 0;
    return __atomic_compare_exchange_n(&g.busy[c], &seen, who, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static void chunk_unlock(uint64_t c)
{
    ST(g.busy[c], 0);
    rtk_os_futex_wake(&g.busy[c]);
}

/* ---------------------------------------------------------------- missing pages */
/* Pool page i is back in DRAM: within two steps of its eviction, it counts (back_soon) */
static void count_back(uint64_t i)
{
    if (bit_at(g.gone[0], i) | bit_at(g.gone[1], i))
        ADD(S.back_soon, 1);
}

/* Put the page at `src` in place of pool page i (missing; its chunk locked by the caller): 0, or -errno (EEXIST: a
 * fault or another fill brought it in meanwhile). A page brought back is used again after its eviction: it recurs,
 * and counts as written now. `mode` UFFDIO_COPY_MODE_DONTWAKE_: a thread waiting on the page is woken by the caller
 * (after the books say the page is in), not by the copy. */
static int put_back(uint64_t i, const char *src, uint64_t mode)
{
    struct uffdio_copy_ c = {(uint64_t)(uintptr_t)addr_of(i), (uint64_t)(uintptr_t)src, TIER_PAGE, mode, 0};
    int rc;
    while ((rc = rtk_os_uffd_call(g.uffd, UFFDIO_COPY_, &c)) == -EAGAIN)
        c.copy = 0;
    if (rc == 0) {
        __atomic_store_n(&g.age[i], 1, __ATOMIC_RELAXED);
        if (g.hits[i] < HITS_MAX)
            g.hits[i]++;
        count_back(i);
    }
    return rc;
}

static void serve(char *p, char *buf)
{
    uint64_t i = page_of(p);
    if (p < rtk_tier.base || i >= g.npages) {
        wake(p, TIER_PAGE);
        return;
    }
    uint64_t c0 = i / CHUNK_PAGES, c1 = c0;  /* the chunks locked: [c0, c1] */
    chunk_lock(c0, 2);
    double t0 = rtk_tier_now_s();
    uint64_t cpu0 = rtk_os_thread_cpu_ns();
    int rc;
    uint64_t filled = TIER_PAGE;  /* bytes put in from p on */
    unsigned id = word_at(i);
    if (id) {
        /* kept as its word: rebuilt in the handler's buffer, no disk. That page only: the rows a step gathers from
         * a slot lie far apart, and pages filled beside it unasked would sit in DRAM unaged for a heat scan,
         * pushing out pages the steps use (filling its run of 64 at full scale: 2.5M pages filled and 5.9M evicted
         * against 4.0M) */
        fill_word(buf, id, 1);
        if ((rc = put_back(i, buf, UFFDIO_COPY_MODE_DONTWAKE_)) == 0)
            ADD(S.filled_same, 1);
    } else if (on_file(i)) {
        long got = -1;
        for (int tries = 0; tries < 3 && got != TIER_PAGE; tries++)
            got = rtk_os_read_at(rtk_tier.fd, buf, TIER_PAGE, i * TIER_PAGE);
        if (got != TIER_PAGE) {
            /* the disk failed this page: the page cache's fault would raise SIGBUS; a handler cannot, so the
             * page reads as zeros and the count says so (the report shows it) */
            memset(buf, 0, TIER_PAGE);
            ADD(S.read_errors, 1);
        }
        if ((rc = put_back(i, buf, UFFDIO_COPY_MODE_DONTWAKE_)) == 0)
            ADD(S.filled_from_file, 1);
    } else {
        /* a hole: zeroed pages for it and the holes after it, up to the end of its FILL_RUN window (rows are
         * handed out in order, so the next rows land there). Real pages, not the zero page: replacing the zero
         * page at the first write costs a TLB shoot-down on every other core the job runs on (8% of the CPU at
         * full scale), a page that was never mapped costs none. */
        uint64_t end = (i / FILL_RUN + 1) * FILL_RUN, e = i + 1;
        while (e < end && e < g.npages && !on_file(e) && !word_at(e)) {
            if (e % CHUNK_PAGES == 0 && !chunk_trylock(e / CHUNK_PAGES, 2))
                break;  /* being evicted or filled: the run stops short of it */
            c1 = e / CHUNK_PAGES;
            e++;
        }
        struct uffdio_copy_ c = {(uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)g.zeros, (e - i) * TIER_PAGE,
                                 UFFDIO_COPY_MODE_DONTWAKE_, 0};
        while ((rc = rtk_os_uffd_call(g.uffd, UFFDIO_COPY_, &c)) != 0 && c.copy <= 0 && rc != -EEXIST && c.len > TIER_PAGE) {
            c.len = rc == -EAGAIN ? c.len : TIER_PAGE;  /* past the record's end (not registered): this page only */
            c.copy = 0;
        }
        if (c.copy > 0) {
            /* in DRAM now (what rtkit_tier_resident reads): a new row's page, written since any scan */
            for (uint64_t k = 0; k < (uint64_t)c.copy / TIER_PAGE; k++)
                __atomic_store_n(&g.age[i + k], 1, __ATOMIC_RELAXED), count_back(i + k);
            ADD(S.filled_zero, (uint64_t)c.copy / TIER_PAGE);
            filled = (uint64_t)c.copy;
            rc = 0;  /* the faulting page is the first: it is in; a later one that was there stopped the copy */
        }
    }
    for (uint64_t c = c0; c <= c1; c++)
        chunk_unlock(c);
    /* The copies did not wake the faulting thread: it runs on once the books say its pages are in (a thread that
     * reads them right after its access, the lookahead's check, would otherwise find them out). Where the copy
     * failed, another thread filled the page or the range left the pager (a free): the access retries. */
    wake(p, rc == 0 ? filled : TIER_PAGE);
    double dt = rtk_tier_now_s() - t0;
    __atomic_fetch_add(&S.fill_ns, (uint64_t)(dt * 1e9), __ATOMIC_RELAXED);
    __atomic_fetch_add(&S.fill_cpu_ns, rtk_os_thread_cpu_ns() - cpu0, __ATOMIC_RELAXED);
}

static void *handler_main(void *arg)
{
    char *buf = arg;
    for (;;) {
        struct uffd_msg_ m;
        if (!rtk_os_uffd_wait_read(g.uffd, &m, sizeof m))
            continue;  /* another handler took it */
        if (m.event == UFFD_EVENT_PAGEFAULT_)
            serve((char *)(uintptr_t)(m.address & ~(uint64_t)(TIER_PAGE - 1)), buf);
        /* other events (the move of a registered mapping at adoption) need only to be read */
    }
    return NULL;
}

/* ---------------------------------------------------------------- heat */
/* One scan of a region: re-arm write-protection on every present page (`arm`) and age the pages by what was written.
 * A page counts as written in the window the scan closes (`win`) where the lookahead told it for a step of that
 * window, or where the kernel says it was written since the region was last armed and that write is not counted yet
 * (a page the lookahead does not tell: written densely, or rows it does not see). Pages the scan does not return are
 * not present (evicted, never touched): age 0. Returns whether any page was told in the window. */
static int scan_region(region_t *r, rtk_os_region_t *vec, int arm, uint8_t win)
{
    uint64_t start = (uint64_t)(uintptr_t)r->lo, end = start + r->len, next = start;
    int told_any = 0;
    while (start < end) {
        struct pm_scan_arg_ a = {sizeof a, (arm ? PM_SCAN_WP_MATCHING_ : 0) | PM_SCAN_CHECK_WPASYNC_, start, end, 0,
                                 (uint64_t)(uintptr_t)vec, SCAN_VEC, 0, 0, PAGE_IS_PRESENT_, 0,
                                 PAGE_IS_WRITTEN_ | PAGE_IS_PFNZERO_};
        long n = rtk_os_pagemap_scan(g.pagemap, &a);
        if (n < 0) {
            ADD(S.scan_errors, 1);
            return told_any;
        }
        for (long k = 0; k <= n; k++) {
            uint64_t lo = k < n ? vec[k].start : a.walk_end, hi = k < n ? vec[k].end : a.walk_end;
            for (uint64_t i = page_of((char *)(uintptr_t)next); i < page_of((char *)(uintptr_t)lo); i++)
                g.age[i] = 0;
            if (k == n)
                break;
            for (uint64_t i = page_of((char *)(uintptr_t)lo); i < page_of((char *)(uintptr_t)hi); i++) {
                uint8_t stamp = __atomic_load_n(&g.told[i], __ATOMIC_RELAXED);
                int told = stamp == win;
                int wp = (vec[k].flags & PAGE_IS_WRITTEN_) && !bit_at(g.credited, i);
                if (wp && g.hits[i]) {
                    /* a page no scan saw written yet (a new row's, filled since) was never protected: its write cost
                     * no fault, and the lookahead does not know new rows; the lookahead tells a step's pages during
                     * the step before: a window early at its edge */
                    r->seen++;
                    r->untold += !told && stamp != window_before(win);
                }
                if (vec[k].flags & PAGE_IS_WRITTEN_)
                    set_bit(g.credited, i, !arm);
                told_any |= told;
                uint8_t a8 = vec[k].flags & PAGE_IS_PFNZERO_ ? 0
                             : told || wp ? 1
                             : g.age[i] && g.age[i] < AGE_MAX ? (uint8_t)(g.age[i] + 1)
                             : g.age[i] ? AGE_MAX : 2;
                g.age[i] = a8;
                if (a8 == 1 && g.hits[i] < HITS_MAX)
                    g.hits[i]++;
                if (a8) {
                    unsigned rk = rank_of(g.hits[i], a8);
                    g.hist[rk]++;
                    g.resident_pages++;
                    if (rk < g.chunk_min[i / CHUNK_PAGES])
                        g.chunk_min[i / CHUNK_PAGES] = (uint16_t)rk;
                }
            }
            next = hi;
        }
        if (a.walk_end <= start)
            break;
        start = next = a.walk_end;
    }
    return told_any;
}

static void scan(uint64_t step)
{
    static rtk_os_region_t vec[SCAN_VEC];
    double t0 = rtk_tier_now_s();
    uint64_t cpu0 = rtk_os_thread_cpu_ns();
    memset(g.hist, 0, sizeof g.hist);
    for (uint64_t c = 0; c <= g.npages / CHUNK_PAGES; c++)
        g.chunk_min[c] = RANKS;
    g.resident_pages = 0;
    /* the window closes: tells from here on stamp the next one; it was told whole where nearly every step mark in
     * it had the lookahead's pages (a lookahead backing off tells every second step or fewer: those windows are
     * armed). Nearly: its worker tells the next step's pages while this one runs, so a window cut by a scan holds
     * one tell fewer or more than its marks (full scale: the last window of a run had 31 tells for 32 marks, and
     * a window short by one armed every region) */
    uint8_t win = g.window;
    ST(g.window, window_after(win));
    uint32_t tells = __atomic_exchange_n(&g.tells, 0, __ATOMIC_ACQ_REL);
    uint64_t marks = step - g.last_scan_step;
    int whole = g.scanned && (uint64_t)tells * WHOLE_OF >= marks * (WHOLE_OF - 1);
    for (uint32_t k = 0;; k++) {
        rtk_spin_lock(&g.lock);
        if (k >= g.nreg) {
            rtk_spin_unlock(&g.lock);
            break;
        }
        region_t r = g.reg[k];
        int arm = !r.told || r.since + 1 >= r.every;
        if (arm && r.told && r.seen) {  /* a cycle ends: its writes say how far apart the next arms may be */
            int few = r.untold * UNTOLD_SHARE <= r.seen;
            r.every = !few ? 1 : r.every < ARM_MOST ? r.every * 2 : ARM_MOST;
        }
        if (arm)
            r.since = 0, r.seen = r.untold = 0;
        else
            r.since++;
        r.told = scan_region(&r, vec, arm, win) && whole;
        if (!r.told && r.every > ARM_FIRST)  /* told again, it starts over; one written whole stays protected */
            r.every = ARM_FIRST;
        g.reg[k] = r;
        S.regions_armed += arm;
        S.regions_scanned++;
        rtk_spin_unlock(&g.lock);
        if (LD(g.stop))
            break;
    }
    g.scanned = 1;
    S.scans++;
    S.resident_at_scan = g.resident_pages * TIER_PAGE;
    S.scan_s += rtk_tier_now_s() - t0;
    S.scan_cpu_ns += rtk_os_thread_cpu_ns() - cpu0;
}

/* ---------------------------------------------------------------- eviction */
static int page_is_zero(const char *p)
{
    const uint64_t *w = (const uint64_t *)(const void *)p;
    uint64_t any = 0;
    for (unsigned k = 0; k < TIER_PAGE / 8; k++)
        any |= w[k];
    return any == 0;
}

/* A page whose every 8 bytes hold one word (an optimizer slot's constant on rows its steps never moved: Adagrad's
 * 0.1 plus squared gradients below a float's rounding) is kept as that word instead of written: 1 + its index in
 * words[], or 0 (not such a page, or words[] full). The evictor's alone (it adds words; handlers read them after the
 * page's index, stored with release). */
static unsigned word_of(const char *p)
{
    const uint64_t *w = (const uint64_t *)(const void *)p;
    for (unsigned k = 1; k < TIER_PAGE / 8; k++)
        if (w[k] != w[0])
            return 0;
    for (unsigned k = 0; k < g.nwords; k++)
        if (g.words[k] == w[0])
            return k + 1;
    if (g.nwords == WORDS)
        return 0;
    g.words[g.nwords] = w[0];
    return ++g.nwords;
}

/* Page i left DRAM in this pass: a fault or fetch bringing it back before the next pass but one counts (back_soon) */
static void mark_gone(uint64_t i)
{
    set_bit(g.gone[g.gone_now], i, 1);
    g.gone_any[g.gone_now] = 1;
}

/* Pages [i0, i0 + len) moved into the stage at `from`: to the file (pages still zero that never were the file's
 * go without a write: still holes; pages of one repeated word are kept as that word), or, where the write fails,
 * back where they were (nothing may be lost). The pages that left DRAM. */
static uint64_t write_out(uint64_t i0, char *from, uint64_t len)
{
    uint64_t n = len / TIER_PAGE, done = 0;
    int holes = 1;
    for (uint64_t k = 0; holes && k < n; k++)
        holes = !on_file(i0 + k) && page_is_zero(from + k * TIER_PAGE);
    if (holes) {
        for (uint64_t k = 0; k < n; k++)
            __atomic_store_n(&g.word[i0 + k], 0, __ATOMIC_RELEASE), g.age[i0 + k] = 0, set_bit(g.credited, i0 + k, 0),
                mark_gone(i0 + k);
        S.evicted_holes += n;
        return n;
    }
    for (uint64_t k = 0; k < n;) {
        unsigned id = word_of(from + k * TIER_PAGE);
        if (id) {
            set_on_file(i0 + k, 0);
            __atomic_store_n(&g.word[i0 + k], (uint8_t)id, __ATOMIC_RELEASE);
            g.age[i0 + k] = 0;
            set_bit(g.credited, i0 + k, 0);  /* back in DRAM it is a new page, unprotected: its next write counts */
            mark_gone(i0 + k);
            S.evicted_same++;
            done++, k++;
            continue;
        }
        uint64_t e = k + 1;
        while (e < n && !word_of(from + e * TIER_PAGE))
            e++;
        long w = rtk_os_write_at(rtk_tier.fd, from + k * TIER_PAGE, (e - k) * TIER_PAGE, (i0 + k) * TIER_PAGE);
        if (w != (long)((e - k) * TIER_PAGE)) {
            struct uffdio_move_ back = {(uint64_t)(uintptr_t)addr_of(i0 + k), (uint64_t)(uintptr_t)(from + k * TIER_PAGE),
                                        (e - k) * TIER_PAGE, 0, 0};
            if (rtk_os_uffd_call(g.uffd, UFFDIO_MOVE_, &back) != 0)
                ADD(S.move_errors, 1);
            ADD(S.write_errors, 1);
        } else {
            for (uint64_t j = k; j < e; j++) {
                set_on_file(i0 + j, 1);
                __atomic_store_n(&g.word[i0 + j], 0, __ATOMIC_RELEASE);
                g.age[i0 + j] = 0;
                set_bit(g.credited, i0 + j, 0);
                mark_gone(i0 + j);
            }
            S.written_bytes += (e - k) * TIER_PAGE;
            done += e - k;
        }
        k = e;
    }
    return done;
}

/* Free the stage's pages: every move into it shot the moved pages down from the TLBs already, and freeing many at
 * once costs one more shoot-down for them all (freeing after each chunk's move doubled the shoot-downs: at the
 * runs of one or two pages a heat-ranked eviction mostly moves, that was ~40% of a page's eviction cost on this
 * 2-core VM, allocators/bench figures in docs/pmem.md). */
static void stage_free(void)
{
    if (g.staged)
        rtk_os_release(g.stage, g.staged * TIER_PAGE);
    g.staged = 0;
}

/* Move the pages of chunk c in `mask` out, write them to the file, free them. Under g.lock. Returns pages evicted. */
static uint64_t evict_chunk(uint64_t c, uint32_t mask)
{
    uint64_t done = 0;
    chunk_lock(c, 1);
    for (uint32_t j = 0; j < CHUNK_PAGES;) {
        if (!(mask >> j & 1)) {
            j++;
            continue;
        }
        uint32_t e = j;
        while (e < CHUNK_PAGES && mask >> e & 1)
            e++;
        uint64_t i0 = c * CHUNK_PAGES + j, len = (uint64_t)(e - j) * TIER_PAGE;
        if (g.staged + (e - j) > STAGE_PAGES)
            stage_free();
        char *st = g.stage + g.staged * TIER_PAGE;
        struct uffdio_move_ mv = {(uint64_t)(uintptr_t)st, (uint64_t)(uintptr_t)addr_of(i0), len, 0, 0};
        int rc = rtk_os_uffd_call(g.uffd, UFFDIO_MOVE_, &mv);
        S.evict_moves++;
        if (rc == -EBUSY)
            ADD(S.move_shared, 1);  /* a page a forked child still shares: it stays */
        /* Which pages moved is what the stage holds, not what the call's count says: trusting the count, a loaded
         * machine (Linux 6.18) left pages in the stage that it had not reported (the next moves into it failed
         * with EEXIST) and the table read those rows back stale from the file (prmalloc_pager race, ~1 run in 30) */
        unsigned char in_stage[CHUNK_PAGES];
        if (rc == 0 && mv.move == (int64_t)len) {
            /* A call that says it moved every page did: with no mode set, a page absent at its place fails the
             * call (-ENOENT) and a slot taken in the stage fails it (-EEXIST). What follows is for the other answers
             * (the count short of len, an error): the stage's check there was ~1.3% of the tail's CPU, most moves
             * whole */
            memset(in_stage, 1, sizeof in_stage);
        } else if (rtk_os_resident(st, len, in_stage) != 0) {
            ADD(S.move_errors, 1);
            memset(in_stage, mv.move > 0 ? 1 : 0, sizeof in_stage);
        }
        /* Nor its return code: the same kernel says EEXIST for a page it did move (~1 run of the race mode in 40:
         * the page in the stage's slot, none left at its place; presumably an internal retry that found its own move
         * done: not traced in the kernel).
         * A failed call's pages count as moved where the stage holds a page and the source holds none; a page
         * still at its place stays, whatever the stage's slot holds (that would be ours to explain: an error) */
        int stray = 0;
        if (rc != 0 && rc != -EAGAIN && rc != -EBUSY) {
            unsigned char at_src[CHUNK_PAGES];
            int known = rtk_os_resident(addr_of(i0), len, at_src) == 0, moved = 0;
            for (uint32_t k = 0; known && k < e - j; k++) {
                if (at_src[k] & 1)
                    stray |= in_stage[k] & 1, in_stage[k] = 0;
                moved |= in_stage[k] & 1;
            }
            if (rc == -EEXIST && known && !stray && moved) {
                ADD(S.move_done_eexist, 1);
            } else {
                ADD(S.move_errors, 1);
                S.move_errno = (uint64_t)-rc;
            }
        }
        int any = 0;
        for (uint32_t k = 0; k < e - j;) {
            if (!(in_stage[k] & 1)) {
                k++;
                continue;
            }
            uint32_t k2 = k;
            while (k2 < e - j && in_stage[k2] & 1)
                k2++;
            any = 1;
            done += write_out(i0 + k, st + (uint64_t)k * TIER_PAGE, (uint64_t)(k2 - k) * TIER_PAGE);
            k = k2;
        }
        if (any || stray)
            g.staged += e - j;  /* its copies stay until the stage is freed (the data is the file's now); slots
                                 * holding what no move of ours put there are not moved into before then */
        j = e;
    }
    chunk_unlock(c);
    return done;
}

/* Evict `need` pages: every page older than the threshold age, then pages at it, walking the regions in order from
 * where the last eviction stopped. The lock is taken a chunk at a time (fork and frees wait at most one). Short of
 * the limit (floor_age 2) only the pages the last scan counted can go: no more are looked for than it counted (with
 * every page written since that scan, a pass walked the whole pool twice for none). Past it a last walk looks at
 * every chunk, pages filled since the scan included. Returns the pages evicted. */
static inline int old_enough(unsigned rank, int floor_age) { return AGE_MAX - rank % (AGE_MAX + 1) >= (unsigned)floor_age; }

/* The pages of chunk c a move takes beside its candidates `mask`: where RUN_FILL_MIN of its pages are candidates,
 * its other pages old enough to go (unwritten for a whole scan) of at most one hit more than the cut's. A page moved
 * alone costs ~3x a page of a 16-page move (docs/pmem.md), and heat-ranked candidates lie in runs of ~1.8 pages;
 * whether a page of 1-3 hits came back within 100 steps of its eviction hardly depended on its hits or how long it
 * had lived (17-23% at full scale, 30-36% for pages not yet scanned: docs/results.md), so the order spared here
 * bought little. */
static uint32_t run_fill(uint64_t c, uint64_t lo, uint64_t hi, uint32_t mask, unsigned cut, int floor_age)
{
    if (__builtin_popcount(mask) < RUN_FILL_MIN)
        return 0;
    unsigned most = cut / (AGE_MAX + 1) + 1, oldest = floor_age > 2 ? (unsigned)floor_age : 2;
    uint32_t more = 0;
    for (uint32_t j = 0; j < CHUNK_PAGES; j++) {
        uint64_t i = c * CHUNK_PAGES + j;
        if (!(mask >> j & 1) && i >= lo && i < hi && g.age[i] >= oldest && g.hits[i] <= most)
            more |= 1u << j;
    }
    return more;
}

static uint64_t evict(uint64_t need, int floor_age)
{
    double t0 = rtk_tier_now_s();
    uint64_t cpu0 = rtk_os_thread_cpu_ns();
    uint64_t counted = 0;
    for (unsigned r = 0; r < RANKS; r++)
        counted += old_enough(r, floor_age) ? g.hist[r] : 0;
    if (floor_age > 1 && counted < need)
        need = counted;
    if (!need)
        return 0;
    /* the cut: every page of a lower rank goes, and pages of rank `cut` while `at_cut` lasts */
    uint64_t below = 0;
    unsigned cut = 0;
    for (; cut < RANKS - 1; cut++) {
        if (!old_enough(cut, floor_age))
            continue;  /* written too recently to go */
        if (below + g.hist[cut] >= need)
            break;
        below += g.hist[cut];
    }
    uint64_t at_cut = need > below ? need - below : 0, got = 0;
    static uint32_t cursor_reg;
    static uint64_t cursor_page;
    for (uint32_t pass = 0; pass < (floor_age > 1 ? 2u : 3u) && got < need && !LD(g.stop) && !LD(g.pause); pass++) {
        for (uint32_t k = 0; got < need && !LD(g.stop) && !LD(g.pause); k++) {
            rtk_spin_lock(&g.lock);
            if (k >= g.nreg) {
                rtk_spin_unlock(&g.lock);
                break;
            }
            uint32_t rk = (cursor_reg + k) % g.nreg;
            uint64_t lo = page_of(g.reg[rk].lo), hi = lo + g.reg[rk].len / TIER_PAGE;
            rtk_spin_unlock(&g.lock);
            uint64_t from = rk == cursor_reg && cursor_page > lo && cursor_page < hi && pass == 0 ? cursor_page : lo;
            for (uint64_t c = from / CHUNK_PAGES; c * CHUNK_PAGES < hi && got < need; c++) {
                /* Ranks change between scans only where a page leaves (no longer a candidate) or comes in (aged 1:
                 * a candidate past the limit alone, where the last pass looks at every chunk): walking every page
                 * was ~75% of the evictor's own CPU at full scale, most chunks holding none below the cut */
                if (pass < 2 && (g.chunk_min[c] > cut || (g.chunk_min[c] == cut && !at_cut)))
                    continue;
                S.evict_walked += CHUNK_PAGES;
                uint32_t mask = 0;
                for (uint32_t j = 0; j < CHUNK_PAGES; j++) {
                    uint64_t i = c * CHUNK_PAGES + j;
                    if (i < lo || i >= hi)
                        continue;
                    uint8_t a8 = g.age[i];
                    if (a8 < floor_age)
                        continue;
                    unsigned r = rank_of(g.hits[i], a8);
                    if (r < cut || (r == cut && at_cut)) {
                        mask |= 1u << j;
                        if (r == cut)
                            at_cut--;
                    }
                }
                if (!mask)
                    continue;
                mask |= run_fill(c, lo, hi, mask, cut, floor_age);
                rtk_spin_lock(&g.lock);
                /* the region may have left (a free) while the lock was free */
                int still = rk < g.nreg && page_of(g.reg[rk].lo) == lo;
                if (still)
                    got += evict_chunk(c, mask);
                rtk_spin_unlock(&g.lock);
                if (!still || LD(g.stop) || LD(g.pause))
                    break;
                cursor_reg = rk;
                cursor_page = (c + 1) * CHUNK_PAGES;
            }
        }
    }
    stage_free();
    S.evicted_pages += got;
    S.evictions++;
    S.evict_s += rtk_tier_now_s() - t0;
    S.evict_cpu_ns += rtk_os_thread_cpu_ns() - cpu0;
    return got;
}

/* The process's anonymous resident bytes (statm: resident less file-backed and shared) */
static uint64_t anon_rss(void)
{
    char buf[128];
    long n = rtk_os_read_file("/proc/self/statm", buf, sizeof buf - 1);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long size = 0, res = 0, shared = 0;
    if (sscanf(buf, "%llu %llu %llu", &size, &res, &shared) != 3 || shared > res)
        return 0;
    return (uint64_t)(res - shared) * TIER_PAGE;
}

/* Whether the limit is near enough for the scans to start: within tier_pager_heat_lead scans at the rate the
 * process's anonymous memory grew, measured over whole scan intervals, the lower of the last two: a job's first
 * steps allocate in bursts (the full-scale bench's first pass measured 156 MB a step, which started the scans at its
 * second step), and a late start costs no more than tier_pager_heat_from allows (past the limit a scan comes first) */
static int limit_near(uint64_t anon, uint64_t step, uint64_t every)
{
    if (!g.grown_at) {
        g.grown_at = anon, g.grown_step = step;
        return 0;
    }
    if (step < g.grown_step + every)
        return 0;
    uint64_t per = anon > g.grown_at ? (anon - g.grown_at) / (step - g.grown_step) : 0;
    g.growth = g.intervals++ && g.grown_last < per ? g.grown_last : per;
    g.grown_last = per;
    S.growth = g.growth;
    g.grown_at = anon, g.grown_step = step;
    uint64_t lead = (uint64_t)rtk_setting_num(RTK_OPT_TIER_PAGER_HEAT_LEAD);
    if (!lead || g.intervals < 2 || !g.growth || anon + g.slack_hi >= g.limit)
        return 0;
    return (g.limit - g.slack_hi - anon) / (lead * every) < g.growth;  /* the bytes left within the lead: no overflow */
}

/* A new pass: the map of the pass before last is cleared and takes this pass's evictions (handlers read both
 * meanwhile: a page read in the clearing counts or not, a count, not the data) */
static void gone_turn(void)
{
    uint32_t next = g.gone_now ^ 1;
    if (g.gone_any[next])
        for (uint64_t w = 0; w < (g.npages + 63) / 64; w++)
            ST(g.gone[next][w], 0);
    g.gone_any[next] = 0;
    ST(g.gone_now, next);
}

static void pass(uint64_t step)
{
    gone_turn();
    long every_n = rtk_setting_num(RTK_OPT_TIER_PAGER_HEAT_EVERY);
    uint64_t every = (uint64_t)(every_n > 0 ? every_n : 1), anon = anon_rss();
    int over = anon + g.slack_hi > g.limit, near = !g.scanned && limit_near(anon, step, every);
    /* once started the scans run every `every` marks; an eviction never runs on ages no scan made: past the limit a
     * scan comes first whatever heat_from and the lead say */
    if (g.scanned ? step >= g.last_scan_step + every : anon >= g.heat_from || over || near) {
        if (!g.scanned)
            S.first_scan_step = step, S.first_scan_near = near && anon < g.heat_from && !over;
        scan(step);
        g.last_scan_step = step;
    }
    if (over && !LD(g.stop)) {
        uint64_t need = (anon + g.slack_lo - g.limit) / TIER_PAGE;
        /* pages a step wrote since the last scan go only past the limit itself: hot, but memory is not optional */
        int floor_age = anon > g.limit ? 1 : 2;
        need = evict(need, floor_age);
        /* the histogram now counts pages gone: take them off the lowest ranks old enough to go, as they went */
        for (unsigned r = 0; r < RANKS && need; r++) {
            if (!old_enough(r, floor_age))
                continue;
            uint64_t t = g.hist[r] < need ? g.hist[r] : need;
            g.hist[r] -= t;
            need -= t;
        }
    }
    S.passes++;
    if (anon > S.anon_peak)
        S.anon_peak = anon;
}

static void *evictor_main(void *arg)
{
    (void)arg;
    uint32_t served = 0;
    while (!LD(g.stop)) {
        uint32_t asked = LD(g.asked);
        if (LD(g.pause) || asked == served) {
            rtk_os_futex_wait(LD(g.pause) ? &g.pause : &g.asked, LD(g.pause) ? 1 : asked);
            continue;
        }
        served = asked;
        pass(LD(g.step));
    }
    return NULL;
}

/* ---------------------------------------------------------------- start, adopt, forget */
int rtk_tier_pager_wanted(void) { return rtk_setting_on(RTK_OPT_TIER_PAGER) && rtk_tier.fd >= 0; }
int rtk_tier_pager_on(void) { return g.on == 1; }

/* Whether the 4 KiB page at vpage * 4096 is in DRAM, by the pager's own books (it alone brings a page of its records
 * in, by a fault, a fill or a fetch, and takes one out, by an eviction): 1 or 0, or -1 where the page is not the
 * pager's (mincore answers). No system call: the lookahead checks ~70k scattered pages a step at full scale, and a
 * mincore for nearly each of them took ~6 ms a check. Advisory while a chunk changes hands. */
int rtk_tier_pager_page_resident(uint64_t vpage)
{
    uintptr_t a = (uintptr_t)(vpage * TIER_PAGE), base = (uintptr_t)rtk_tier.base;
    uint64_t i = (a - base) / TIER_PAGE;
    if (LD(g.on) != 1 || a < base || i >= g.npages || !bit_at(g.paged, i))
        return -1;
    return __atomic_load_n(&g.age[i], __ATOMIC_RELAXED) != 0;
}
const char *rtk_tier_pager_note(void) { return g.note; }

static int fail(const char *what, int rc)
{
    if (rc == -EXDEV)  /* not the kernel's refusal: the why is all in `what` */
        snprintf(g.note, sizeof g.note, "tier_pager off: %s; the DRAM heads run instead", what);
    else
        snprintf(g.note, sizeof g.note, "tier_pager off: %s (%s); the DRAM heads run instead", what, strerror(-rc));
    g.on = -1;
    return rc;
}

/* At the first step mark, before any record is adopted: the userfaultfd, the file for direct I/O, the maps, the
 * threads. 0, or -errno with the note set. */
int rtk_tier_pager_start(void)
{
    if (g.on)
        return g.on == 1 ? 0 : -EINVAL;
    if (rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX))  /* two budgets over the same pages would fight */
        return fail("tier_resident_max is set (the page cache's budget): unset it, or bound the pager with "
                    "tier_pager_max", -EXDEV);
    if (rtk_os_fd_on_ram_fs(rtk_tier.fd) == 1)
        return fail("the pool file is in DRAM already (a RAM file system): nothing to page", -EXDEV);
    g.uffd = rtk_os_uffd_open(UFFD_FEATURE_EVENT_REMAP_ | UFFD_FEATURE_WP_ASYNC_ | UFFD_FEATURE_MOVE_, 1);
    int rc = g.uffd < 0 ? g.uffd : 0;
    if (rc != 0)
        return fail("userfaultfd with move and asynchronous write-protect (Linux >= 6.8)", rc);
    g.pagemap = rtk_os_pagemap_open();
    if (g.pagemap < 0)
        return fail("/proc/self/pagemap", g.pagemap);
    g.npages = (rtk_tier.size + TIER_PAGE - 1) / TIER_PAGE;
    g.on_file = rtk_os_reserve((g.npages + 63) / 64 * 8, 0);
    g.paged = rtk_os_reserve((g.npages + 63) / 64 * 8, 0);
    g.age = rtk_os_reserve(g.npages, 0);
    g.hits = rtk_os_reserve(g.npages, 0);
    g.chunk_min = rtk_os_reserve((g.npages / CHUNK_PAGES + 1) * sizeof *g.chunk_min, 0);
    g.told = rtk_os_reserve(g.npages, 0);
    g.credited = rtk_os_reserve((g.npages + 63) / 64 * 8, 0);
    g.window = 1;
    g.word = rtk_os_reserve(g.npages, 0);
    g.gone[0] = rtk_os_reserve((g.npages + 63) / 64 * 8, 0);
    g.gone[1] = rtk_os_reserve((g.npages + 63) / 64 * 8, 0);
    g.busy = rtk_os_reserve((g.npages / CHUNK_PAGES + 1) * 4, 0);
    g.stage = rtk_os_reserve(STAGE_PAGES * TIER_PAGE, 0);
    g.zeros = rtk_os_reserve(FILL_RUN * TIER_PAGE, 0);
    char *bufs = rtk_os_map(HANDLERS * TIER_PAGE, 0);
    g.fetch_buf = rtk_os_map(CHUNK_PAGES * TIER_PAGE, 0);
    if (!g.on_file || !g.paged || !g.age || !g.hits || !g.chunk_min || !g.told || !g.credited || !g.word || !g.gone[0] || !g.gone[1] || !g.busy || !g.stage || !g.zeros || !bufs || !g.fetch_buf)
        return fail("the pager's maps", -ENOMEM);
    rtk_os_advise(g.stage, STAGE_PAGES * TIER_PAGE, RTK_ADVISE_NOHUGEPAGE);
    struct uffdio_register_ reg = {(uint64_t)(uintptr_t)g.stage, STAGE_PAGES * TIER_PAGE, UFFDIO_REGISTER_MODE_MISSING_,
                                   0};
    if ((rc = rtk_os_uffd_call(g.uffd, UFFDIO_REGISTER_, &reg)) != 0)
        return fail("userfaultfd registration", rc);
    int handlers = 0;
    for (int h = 0; h < HANDLERS; h++)
        if ((rc = rtk_os_thread_start(handler_main, bufs + h * TIER_PAGE, 64 << 10, &g.handler[h])) == 0)
            handlers++;
    if (!handlers)
        return fail("the fault handler thread", rc);  /* one is enough to serve faults, none is not */
    if ((rc = rtk_os_thread_start(evictor_main, NULL, 256 << 10, &g.evictor)) != 0) {
        /* handlers run: records may still be adopted, nothing is evicted; say so */
        snprintf(g.note, sizeof g.note, "tier_pager: the evictor thread did not start (%s): nothing is evicted",
                 strerror(-rc));
    } else {
        g.evictor_started = 1;
    }
    uint64_t avail = rtk_os_mem_available(), reserve = rtk_setting_bytes(RTK_OPT_TIER_PAGER_RESERVE);
    uint64_t room = avail != SIZE_MAX && avail > reserve ? avail - reserve : 0, max = rtk_setting_bytes(RTK_OPT_TIER_PAGER_MAX);
    if (max && max < room)
        room = max, S.room_by_max = 1;
    S.room = room;
    uint64_t anon = anon_rss();
    g.limit = anon + room;
    g.heat_from = anon + room * (uint64_t)rtk_setting_num(RTK_OPT_TIER_PAGER_HEAT_FROM) / 100;  /* room < 2^57 */
    S.heat_from = g.heat_from;
    g.slack_hi = room / 8 < SLACK_HI ? room / 8 : SLACK_HI;
    g.slack_lo = room / 4 < SLACK_LO ? room / 4 : SLACK_LO;
    S.limit = g.limit;
    g.on = 1;
    return 0;
}

/* Make [lo, lo + len) (whole pages of the pool, a live record's) the pager's: its length, or 0 where it stays the
 * file's shared pages. Under the live lock at the first step mark. */
uint64_t rtk_tier_pager_adopt(char *lo, uint64_t len)
{
    if (g.on != 1 || g.nreg >= REGIONS || !len)
        return 0;
    double t0 = rtk_tier_now_s();
    uint64_t off = (uint64_t)(lo - rtk_tier.base), end = off + len, i0 = off / TIER_PAGE;
    /* which pages hold data: before the move, so no fault after it finds a page not yet marked */
    uint64_t data_pages = 0;
    for (uint64_t x = off; x < end;) {
        long long d = rtk_os_seek_data(rtk_tier.fd, x, 0);
        if (d < 0 || (uint64_t)d >= end)
            break;
        long long h = rtk_os_seek_data(rtk_tier.fd, (uint64_t)d, 1);
        uint64_t he = h < 0 || (uint64_t)h > end ? end : (uint64_t)h;
        for (uint64_t i = (uint64_t)d / TIER_PAGE; i < (he + TIER_PAGE - 1) / TIER_PAGE; i++)
            set_on_file(i, 1), data_pages++;
        x = (he + TIER_PAGE - 1) & ~(uint64_t)(TIER_PAGE - 1);
    }
    /* eviction and heat work on 4 KiB pages: the mapping takes no huge page */
    int rc = rtk_os_map_registered_over(lo, len, g.uffd, UFFDIO_REGISTER_MODE_MISSING_ | UFFDIO_REGISTER_MODE_WP_);
    if (rc != 0) {
        for (uint64_t i = i0; i < i0 + len / TIER_PAGE; i++)
            set_on_file(i, 0);
        ADD(S.adopt_errors, 1);
        snprintf(g.note, sizeof g.note, "tier_pager: a record stays in the page cache (%s)", strerror(-rc));
        return 0;
    }
    rtk_spin_lock(&g.lock);
    g.reg[g.nreg++] = (region_t){lo, len, 0, ARM_FIRST, 0, 0, 0};
    rtk_spin_unlock(&g.lock);
    set_paged(i0, len / TIER_PAGE, 1);
    S.regions++;
    S.adopted_bytes += len;
    S.data_at_adopt += data_pages * TIER_PAGE;
    S.adopt_s += rtk_tier_now_s() - t0;
    return len;
}

/* A freed record's range leaves the pager (under the live lock, before the file is mapped back over it): no
 * eviction touches it after this returns. */
void rtk_tier_pager_forget(char *lo, uint64_t len)
{
    if (g.on != 1)
        return;
    set_paged(page_of(lo), len / TIER_PAGE, 0);  /* residency is mincore's again before the file is mapped back */
    rtk_spin_lock(&g.lock);
    for (uint32_t k = 0; k < g.nreg; k++)
        if (g.reg[k].lo == lo) {
            g.reg[k] = g.reg[--g.nreg];
            break;
        }
    rtk_spin_unlock(&g.lock);
    for (uint64_t i = page_of(lo); i < page_of(lo + len); i++) {
        set_on_file(i, 0);
        g.age[i] = g.hits[i] = 0;
        __atomic_store_n(&g.word[i], 0, __ATOMIC_RELEASE);
    }
    S.forgotten_bytes += len;
}

/* ---------------------------------------------------------------- marks, fork, exit */
void rtk_tier_pager_mark(void)
{
    if (g.on != 1 || !g.evictor_started)
        return;
    ST(g.step, rtk_tier.steps);
    __atomic_add_fetch(&g.asked, 1, __ATOMIC_ACQ_REL);
    rtk_os_futex_wake(&g.asked);
}

void rtk_tier_pager_fork_prepare(void)
{
    if (g.on != 1)
        return;
    ST(g.pause, 1);
    rtk_spin_fork_prepare(&g.lock);
}

void rtk_tier_pager_fork_parent(void)
{
    if (g.on != 1)
        return;
    rtk_spin_fork_parent(&g.lock);
    ST(g.pause, 0);
    rtk_os_futex_wake(&g.pause);
    __atomic_add_fetch(&g.asked, 1, __ATOMIC_ACQ_REL);  /* a pass the pause cut short runs again */
    rtk_os_futex_wake(&g.asked);
}

/* A child sees what the parent had in DRAM at the fork (its own copy), but its mappings lose the handler: a page not
 * present would read as zeros, though the parent's row may be in the file. Each run of absent pages that holds any
 * of the file's data gets a private view of the file (a hole of the file reads as zeros, as it should), up to
 * CHILD_MAPS of them (each is a mapping: the kernel's limit is 65,530 a process), with the pages kept as a word
 * written into it (the child's own copies, CHILD_FILL_MAX pages at most); past either, the rest of the regions
 * raise SIGBUS for an absent page (a userfaultfd of the child's own, UFFD_FEATURE_SIGBUS): a child that reads such a
 * row fails loudly, never silently wrong. Neither view is a snapshot (as for the rest of the pool): a page the parent
 * evicts later is read as the parent wrote it. */
#define CHILD_MAPS 8192

/* The runs of r's absent pages that hold file data or pages kept as a word: counted into *maps (and those pages into
 * *words), and mapped when `map` (0, or -1 where the scan or a mapping failed) */
static int child_view_region(const region_t *r, int pagemap, long *maps, long *words, int map)
{
    static rtk_os_region_t vec[SCAN_VEC];
    uint64_t start = (uint64_t)(uintptr_t)r->lo, end = start + r->len, gap = start;
    while (gap < end) {
        struct pm_scan_arg_ a = {sizeof a, 0, start, end, 0, (uint64_t)(uintptr_t)vec, SCAN_VEC, 0, 0,
                                 PAGE_IS_PRESENT_, 0, 0};
        long n = pagemap >= 0 && start < end ? rtk_os_pagemap_scan(pagemap, &a) : 0;
        if (n < 0)
            return -1;
        for (long k = 0; k <= n; k++) {
            uint64_t lo = k < n ? vec[k].start : (n < SCAN_VEC ? end : a.walk_end);
            if (lo > gap) {
                uint64_t i0 = page_of((char *)(uintptr_t)gap), i1 = page_of((char *)(uintptr_t)lo), i = i0, kept = 0;
                for (uint64_t j = i0; j < i1; j++)
                    kept += word_at(j) != 0;
                while (i < i1 && !on_file(i))
                    i++;
                if (i < i1 || kept) {
                    uint64_t off = gap - (uint64_t)(uintptr_t)rtk_tier.base;
                    if (map && rtk_os_map_file_at((char *)(uintptr_t)gap, lo - gap, rtk_tier.fd, off, 0) != 0)
                        return -1;
                    /* pages kept as a word: written into the child's private view (its own copies) */
                    for (uint64_t j = i0; map && kept && j < i1; j++)
                        if (word_at(j))
                            fill_word(addr_of(j), word_at(j), 1);
                    ++*maps;
                    *words += (long)kept;
                }
            }
            if (k < n)
                gap = vec[k].end;
            else
                gap = lo > gap ? lo : gap;
        }
        if (n < SCAN_VEC || a.walk_end <= start)
            break;
        start = a.walk_end;
    }
    return 0;
}

void rtk_tier_pager_fork_child(void)
{
    if (g.on != 1)
        return;
    rtk_spin_fork_child(&g.lock);
    g.on = 0;
    g.evictor_started = 0;
    g.pause = g.stop = g.asked = 0;
    int pagemap = rtk_os_pagemap_open();  /* the parent's descriptor reads the parent's pages */
    long maps = 0, words = 0, unused = 0;
    int ok = pagemap >= 0;
    for (uint32_t k = 0; ok && k < g.nreg; k++)
        ok = child_view_region(&g.reg[k], pagemap, &maps, &words, 0) == 0 && maps <= CHILD_MAPS &&
             words <= CHILD_FILL_MAX;
    for (uint32_t k = 0; ok && k < g.nreg; k++)
        ok = child_view_region(&g.reg[k], pagemap, &maps, &unused, 1) == 0;
    if (pagemap >= 0)
        rtk_os_close(pagemap);
    if (ok)
        return;
    int fd = rtk_os_uffd_open(UFFD_FEATURE_SIGBUS_, 0);
    if (fd >= 0)
        for (uint32_t k = 0; k < g.nreg; k++) {
            /* a region a failed mapping left part-mapped refuses (file views take no missing mode): the others hold */
            struct uffdio_register_ reg = {(uint64_t)(uintptr_t)g.reg[k].lo, g.reg[k].len,
                                           UFFDIO_REGISTER_MODE_MISSING_, 0};
            rtk_os_uffd_call(fd, UFFDIO_REGISTER_, &reg);
        }
    /* the descriptor stays open: closing it would drop the registrations */
}

void rtk_tier_pager_stop(void)
{
    if (g.on != 1 || !g.evictor_started)
        return;
    ST(g.stop, 1);
    __atomic_add_fetch(&g.asked, 1, __ATOMIC_ACQ_REL);
    rtk_os_futex_wake(&g.asked);
    rtk_os_futex_wake(&g.pause);
    rtk_os_thread_join(g.evictor);
    g.evictor_started = 0;
}

/* rtkit/prmalloc.h */
__attribute__((visibility("default"))) long rtkit_tier_pager_wait(void)
{
    if (g.on != 1 || !g.evictor_started)
        return -1;
    uint64_t before = LD(S.passes);
    __atomic_add_fetch(&g.asked, 1, __ATOMIC_ACQ_REL);
    rtk_os_futex_wake(&g.asked);
    while (LD(S.passes) == before && !LD(g.stop))
        rtk_os_yield();
    return (long)LD(S.passes);
}

/* ---------------------------------------------------------------- fetch ahead (the lookahead's) */
/* A page worth bringing in ahead: in the pool, its data in the file or kept as a word, not in DRAM (evicted, or
 * never touched since the record was adopted). A page filled since is aged 1 (by its fill) or by the scans: it is
 * skipped. */
static inline int fetch_wanted(uint64_t i)
{
    return i < g.npages && (on_file(i) || word_at(i)) && __atomic_load_n(&g.age[i], __ATOMIC_RELAXED) == 0;
}

/* Pages [i, i + n) of one chunk: read from the file in one call (where any is the file's), pages kept as a word
 * rebuilt over their bytes, then put in place one by one under the chunk's lock (the evictor cannot write a newer
 * copy meanwhile; a page a fault or another fill brought in refuses the copy, EEXIST). A chunk the evictor or a
 * handler holds is skipped: the step's own fault brings in what is still missing. Returns the pages filled. */
static uint64_t fetch_run(uint64_t i, uint64_t n)
{
    uint64_t c = i / CHUNK_PAGES, got = 0, same = 0;
    if (!chunk_trylock(c, 2)) {
        ADD(S.fetch_busy, n);
        return 0;
    }
    int from_file = 0;
    for (uint64_t k = 0; k < n && !from_file; k++)
        from_file = !word_at(i + k);
    if (!from_file || rtk_os_read_at(rtk_tier.fd, g.fetch_buf, n * TIER_PAGE, i * TIER_PAGE) == (long)(n * TIER_PAGE)) {
        for (uint64_t k = 0; k < n; k++) {
            unsigned id = word_at(i + k);
            if (!fetch_wanted(i + k))
                continue;
            if (id)
                fill_word(g.fetch_buf + k * TIER_PAGE, id, 1);
            if (put_back(i + k, g.fetch_buf + k * TIER_PAGE, 0) == 0)
                got++, same += id != 0;
        }
    }  /* a failed read fills nothing here: the step's fault reads it again and counts an error if it fails */
    chunk_unlock(c);
    ADD(S.fetch_same, same);
    return got;
}

/* Pass 0 starts the reads of every wanted run of file pages at once (the kernel reads them together) and returns the
 * pages wanted (those kept as a word too); pass 1 fills them, a chunk at a time, counts those it tried into *asked
 * and returns those it filled. */
static uint64_t fetch_pass(int fill, const uint64_t *pages, size_t n, uint64_t per, uint64_t *asked)
{
    uint64_t lo = (uint64_t)(uintptr_t)rtk_tier.base, hi = lo + g.npages * TIER_PAGE, run = 0, len = 0, got = 0;
    for (size_t k = 0; k <= n; k++) {
        uint64_t a = k < n ? pages[k] * per * TIER_PAGE : 0;
        int in = k < n && a >= lo && a < hi;
        for (uint64_t j = 0; j < (in ? per : 1); j++) {
            uint64_t i = in ? (a - lo) / TIER_PAGE + j : UINT64_MAX;
            int want = in && fetch_wanted(i);
            if (want && !fill && word_at(i))
                got++, want = 0;  /* rebuilt from its word in the second pass: nothing to read */
            if (want && len && i == run + len && (!fill || i % CHUNK_PAGES) && len < (fill ? CHUNK_PAGES : 256)) {
                len++;
                continue;
            }
            if (len) {
                if (fill)
                    got += fetch_run(run, len), *asked += len;
                else
                    rtk_os_read_soon(rtk_tier.fd, run * TIER_PAGE, len * TIER_PAGE), got += len;
            }
            run = i, len = want ? 1 : 0;
        }
    }
    return got;
}

/* rtkit/prmalloc.h */
__attribute__((visibility("default"))) long rtkit_tier_pager_likeness(const void *table, const void *const *cands,
                                                                      size_t n, size_t bytes, double *scores)
{
    if (LD(g.on) != 1 || !table || (!cands && n) || (!scores && n) || !bytes)
        return -1;
    const char *lo = rtk_tier.base, *hi = rtk_tier.base + g.npages * TIER_PAGE, *t = table;
    if (t < lo || t + bytes > hi)
        return -1;
    uint64_t t0 = page_of(t), pages = ((uint64_t)(t - addr_of(t0)) + bytes + TIER_PAGE - 1) / TIER_PAGE, most = 0;
    for (size_t k = 0; k < n; k++) {
        const char *c = cands[k];
        scores[k] = -1;
        if (!c || c < lo || c + bytes > hi || (uint64_t)(c - lo) % TIER_PAGE != (uint64_t)(t - lo) % TIER_PAGE)
            continue;
        uint64_t c0 = page_of(c), both = 0, same = 0;
        for (uint64_t j = 0; j < pages; j++) {
            uint8_t a = __atomic_load_n(&g.age[t0 + j], __ATOMIC_RELAXED),
                    b = __atomic_load_n(&g.age[c0 + j], __ATOMIC_RELAXED);
            if (a && b && (a > 1 || b > 1))
                both++, same += a == b;
        }
        scores[k] = both ? (double)same / (double)both : -1;
        if (both > most)
            most = both;
    }
    return (long)most;
}

/* rtkit/prmalloc.h */
__attribute__((visibility("default"))) long rtkit_tier_pager_scans(void)
{
    return LD(g.on) == 1 ? (long)LD(S.scans) : -1;
}

/* rtkit/prmalloc.h */
__attribute__((visibility("default"))) long rtkit_tier_pager_heat(const uint64_t *pages, size_t n, size_t page_bytes)
{
    if (LD(g.on) != 1 || !pages || page_bytes < TIER_PAGE || page_bytes % TIER_PAGE)
        return -1;
    uint64_t lo = (uint64_t)(uintptr_t)rtk_tier.base, per = page_bytes / TIER_PAGE, told = 0;
    uint8_t win = LD(g.window);
    for (size_t k = 0; k < n; k++) {
        uint64_t a = pages[k] * page_bytes;
        if (a < lo || (a - lo) / TIER_PAGE + per > g.npages)
            continue;
        for (uint64_t i = (a - lo) / TIER_PAGE, j = 0; j < per; j++, told++)
            __atomic_store_n(&g.told[i + j], win, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&g.tells, 1, __ATOMIC_ACQ_REL);
    ADD(S.told_pages, told);
    return (long)told;
}

__attribute__((visibility("default"))) long rtkit_tier_pager_fetch(const uint64_t *pages, size_t n, size_t page_bytes)
{
    if (LD(g.on) != 1 || !g.evictor_started || LD(g.stop) || !pages || page_bytes < TIER_PAGE ||
        page_bytes % TIER_PAGE)
        return -1;
    for (uint32_t seen = 0; !__atomic_compare_exchange_n(&g.fetching, &seen, 1, 0, __ATOMIC_ACQUIRE,
                                                         __ATOMIC_RELAXED); seen = 0)
        rtk_os_futex_wait(&g.fetching, seen);
    double t0 = rtk_tier_now_s();
    /* pages wanted in the first pass may be gone by the second (a fault brought them in) or new (evicted between) */
    uint64_t per = page_bytes / TIER_PAGE, asked = 0, got = fetch_pass(0, pages, n, per, &asked) ?
        fetch_pass(1, pages, n, per, &asked) : 0;
    ADD(S.fetch_calls, 1);
    ADD(S.fetch_asked, asked);
    ADD(S.fetch_filled, got);
    ADD(S.fetch_ns, (uint64_t)((rtk_tier_now_s() - t0) * 1e9));
    ST(g.fetching, 0);
    rtk_os_futex_wake(&g.fetching);
    return (long)got;
}
