/* tier_want.c -- the scheduler's lookahead's side of tier mode: pages wanted by the next step (the heat budget drops them last), and which of them are in DRAM. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

#include "prmalloc/tier_internal.h"
#include "rtkit/prmalloc.h"

#define EXPORT __attribute__((visibility("default")))
#define WANT_BITS 16                      /* pages of a 64 KiB chunk: one bit each */
#define WANT_MASK ((uint64_t)0xFFFF)

/* Per 64 KiB chunk of the pool, one word: (mark << 16) | the chunk's wanted pages. A page read ahead is written by
 * no step yet, so its heat is cold; the lookahead says which pages its next step will use, and the budget's mark
 * right after it keeps them over every other page. `mark` is the step count the want is meant for: a word whose
 * mark has passed wants nothing, so nothing is ever cleared and a stale word costs nothing. Words are updated with
 * compare-and-swap: any thread may call, the mark reads them without a lock. 8 bytes per 64 KiB of pool. */
static uint64_t *g_want;
static uint64_t g_nchunks;
static char *g_lo;
static int g_armed;                       /* 1 once g_want is mapped and the heat budget runs; -1 in a forked child */

void rtk_tier_want_arm(uint64_t *words, uint64_t nchunks)
{
    g_want = words;
    g_nchunks = nchunks;
    g_lo = rtk_tier.base;
    __atomic_store_n(&g_armed, 1, __ATOMIC_RELEASE);
}

void rtk_tier_want_off(void) { __atomic_store_n(&g_armed, -1, __ATOMIC_RELEASE); }

/* a want for the step the pass is for or a later one: the worker's pass may run while the next step's want comes */
uint32_t rtk_tier_wanted(uint64_t chunk, uint64_t step)
{
    if (__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE) != 1 || chunk >= g_nchunks)
        return 0;
    uint64_t w = __atomic_load_n(&g_want[chunk], __ATOMIC_RELAXED);
    return (w >> WANT_BITS) >= step ? (uint32_t)(w & WANT_MASK) : 0;
}

static void want_bits(uint64_t chunk, uint64_t bits, uint64_t mark)
{
    uint64_t old = __atomic_load_n(&g_want[chunk], __ATOMIC_RELAXED), nw;
    do {
        /* a want for an earlier mark is over: start the chunk's bits afresh */
        nw = (mark << WANT_BITS) | bits | ((old >> WANT_BITS) == mark ? old & WANT_MASK : 0);
        if ((old >> WANT_BITS) > mark)  /* a later mark's want (another caller): keep it, add ours */
            nw = old | bits;
    } while (nw != old &&
             !__atomic_compare_exchange_n(&g_want[chunk], &old, nw, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

/* The page numbers (address / page_bytes) of this process the next step will use; the budget's next mark keeps
 * the pool's ones among them in DRAM over every other page. Sorted input is cheapest (one swap per chunk).
 * Returns the 4 KiB pages recorded, or -1 where nothing is recorded: not preloaded with tier mode on, the heat
 * budget not running (tier_resident_max or tier_heat_every off, no page heat, before the first step mark), or a
 * forked child. Never blocks, allocates nothing, writes no memory but its own words. */
EXPORT long rtkit_tier_want(const uint64_t *pages, size_t n, size_t page_bytes)
{
    if (__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE) != 1 || !pages || page_bytes < TIER_PAGE ||
        page_bytes % TIER_PAGE)
        return -1;
    uint64_t mark = __atomic_load_n(&rtk_tier.steps, __ATOMIC_RELAXED) + 1, cur = UINT64_MAX, bits = 0;
    uintptr_t lo = (uintptr_t)g_lo, hi = lo + (g_nchunks << 16);
    long recorded = 0;
    for (size_t i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)(pages[i] * page_bytes);
        if (a < lo || a >= hi || a + page_bytes > hi)
            continue;
        for (uintptr_t p = a; p < a + page_bytes; p += TIER_PAGE) {
            uint64_t off = p - lo, c = off >> 16;
            if (c != cur) {
                if (bits)
                    want_bits(cur, bits, mark);
                cur = c, bits = 0;
            }
            bits |= (uint64_t)1 << ((off >> 12) & (WANT_BITS - 1));
            recorded++;
        }
    }
    if (bits)
        want_bits(cur, bits, mark);
    __atomic_add_fetch(&rtk_tier_view.want_calls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&rtk_tier_view.want_pages, (uint64_t)recorded, __ATOMIC_RELAXED);
    return recorded;
}

/* What the budget did with the wanted pages: out[0] pages recorded, out[1] pages the budget kept (resident wanted
 * pages of chunks it dropped the rest of), out[2] wanted pages it dropped all the same (it needed them to reach
 * its goal). Returns how many of the n entries were filled, or -1 while nothing is recorded (as rtkit_tier_want). */
EXPORT int rtkit_tier_want_counts(uint64_t *out, int n)
{
    if (__atomic_load_n(&g_armed, __ATOMIC_ACQUIRE) != 1 || !out)
        return -1;
    uint64_t v[3] = {__atomic_load_n(&rtk_tier_view.want_pages, __ATOMIC_RELAXED),
                     __atomic_load_n(&rtk_tier_view.want_kept, __ATOMIC_RELAXED),
                     __atomic_load_n(&rtk_tier_view.want_dropped, __ATOMIC_RELAXED)};
    int k = n < 3 ? n : 3;
    for (int i = 0; i < k; i++)
        out[i] = v[i];
    return k;
}

#define GAP_PAGES 64                      /* pages this far apart are looked at by separate calls */
#define RESIDENT_VEC 4096

/* The 4 KiB pages [p, p + per) by the pager's books: 1 all in DRAM, 0 one out, -1 one not the pager's */
static int paged_resident(uint64_t p, uint64_t per)
{
    int all = 1;
    for (uint64_t j = 0; j < per; j++) {
        int r = rtk_tier_pager_page_resident(p + j);
        if (r < 0)
            return -1;
        all &= r;
    }
    return all;
}

/* Which of `pages` (page numbers: address / page_bytes; sorted ascending is cheapest) are in DRAM: out[k] 1 or 0 (a page of
 * several 4 KiB pages counts when all are). Pages the pager holds are answered from its own books, no system call;
 * the others by one mincore per cluster of pages less than GAP_PAGES apart: a step's rows scattered over a large
 * table cost their own pages, not the table's span, and no call per page. Returns how many are in DRAM, or -1 on bad
 * arguments. A page whose call fails (not mapped) counts as out. */
EXPORT long rtkit_tier_resident(const uint64_t *pages, size_t n, size_t page_bytes, uint8_t *out)
{
    if (!pages || !out || page_bytes < TIER_PAGE || page_bytes % TIER_PAGE || page_bytes / TIER_PAGE > RESIDENT_VEC)
        return -1;
    uint64_t per = page_bytes / TIER_PAGE;
    unsigned char vec[RESIDENT_VEC];
    long in = 0;
    int pager = rtk_tier_pager_on();
    for (size_t a = 0; a < n;) {
        int known = pager ? paged_resident(pages[a] * per, per) : -1;
        if (known >= 0) {
            out[a++] = (uint8_t)known;
            in += known;
            continue;
        }
        /* [a, b): a cluster of pages the pager does not hold whose 4 KiB pages all fit one vector */
        uint64_t lo = pages[a] * per;
        size_t b = a + 1;
        while (b < n && pages[b] >= pages[b - 1] && (pages[b] - pages[b - 1]) * per < GAP_PAGES &&
               (pages[b] + 1) * per - lo <= RESIDENT_VEC && (!pager || paged_resident(pages[b] * per, per) < 0))
            b++;
        uint64_t span = (pages[b - 1] + 1) * per - lo;
        int ok = rtk_os_resident((void *)(uintptr_t)(lo * TIER_PAGE), span * TIER_PAGE, vec) == 0;
        for (size_t k = a; k < b; k++) {
            uint8_t all = ok;
            for (uint64_t j = 0; all && j < per; j++)
                all = vec[pages[k] * per - lo + j] & 1;
            out[k] = all;
            in += all;
        }
        a = b;
    }
    return in;
}
