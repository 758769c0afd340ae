/* tier_private.c -- tier mode's private ranges of the pool: heads and the chunks page heat promotes, and their map. */
#define _GNU_SOURCE
#include <string.h>

#include "prmalloc/tier_internal.h"

/* A private range is a private mapping of the same range of the pool file at the same addresses: pointers into
 * the table stay valid, its pages read the file's until a step writes them, and a written page is the process's
 * own anonymous copy (the kernel's copy on write), never written back or evicted. Nothing is ever copied into it,
 * which is what makes it safe while other threads write the table (docs/pmem.md, "DRAM heads"). */

/* Chunks the heat passes made private (promoted), a byte each: 1 while promoted. Written under the live lock (the
 * passes promote under it, a free gives them back under it); the passes read it relaxed, to leave those chunks
 * alone. Mapped at the first step mark, when heads and heat are both on. */
static unsigned char *g_promoted;
static uint64_t g_promoted_n;             /* chunks the map covers */
static uint64_t g_runs;                   /* runs of promoted chunks now */
static uint64_t g_calls;                  /* promotions made: each may add two mappings, and give one back two more */

uint64_t rtk_tier_private_map(char *lo, uint64_t len)
{
    if (rtk_os_map_file_at(lo, len, rtk_tier.fd, (uint64_t)(lo - rtk_tier.base), 0) != 0)
        return 0;
    rtk_os_advise(lo, len, RTK_ADVISE_RANDOM);  /* as the rest of the pool: rows are not read in order */
    return len;
}

int rtk_tier_promoted_arm(void)
{
    g_promoted_n = (rtk_tier.size + TIER_CHUNK - 1) >> TIER_CHUNK_SHIFT;
    g_promoted = rtk_os_map(g_promoted_n, 0);
    return g_promoted ? 0 : -1;
}

/* The chunks that lie whole inside record r, [*c, *end): the only ones a promotion may take of it */
static void record_chunks(const live_t *r, uint64_t *c, uint64_t *end)
{
    uintptr_t base = (uintptr_t)rtk_tier.base;
    *c = ((uintptr_t)r->payload - base + TIER_CHUNK - 1) >> TIER_CHUNK_SHIFT;
    *end = ((uintptr_t)r->payload + r->n - base) >> TIER_CHUNK_SHIFT;
}

/* The next run of promoted chunks in [*c, end): its length (0: none) and first chunk; *c moves past it */
static uint64_t next_run(uint64_t *c, uint64_t end, uint64_t *first)
{
    if (end > g_promoted_n)
        end = g_promoted_n;
    while (g_promoted && *c < end && !g_promoted[*c])
        (*c)++;
    *first = *c;
    while (g_promoted && *c < end && g_promoted[*c])
        (*c)++;
    return *c - *first;
}

uint64_t rtk_tier_private_held(void)
{
    return (rtk_tier.head_bytes - rtk_tier.head_restored) + (rtk_tier.head_promoted - rtk_tier.head_promoted_restored);
}

uint64_t rtk_tier_promote_room(void)
{
    uint64_t held = rtk_tier_private_held();
    return g_promoted && rtk_tier.head_budget > held ? rtk_tier.head_budget - held : 0;
}

int rtk_tier_chunk_promoted(uint64_t c)
{
    return g_promoted && c < g_promoted_n && __atomic_load_n(&g_promoted[c], __ATOMIC_RELAXED);
}

/* Each promotion is a mapping of its own, which splits the pool's: up to two more mappings, and two more when a free
 * gives it back (the kernel merges a promoted neighbour's only where their anonymous pages allow, so a run count says
 * little). So the promotions of a process are at most RUNS_MAX, 4 x RUNS_MAX mappings at worst, far under the
 * process's mapping limit (vm.max_map_count, 65,530 by default) beside the job's own. */
int rtk_tier_promote(uint32_t at, uint64_t born, uint64_t c, uint64_t n)
{
    int rc = -1;
    rtk_spin_lock(&rtk_tier.live_lock);
    live_t *r = rtk_tier.live && at < rtk_tier.nlive ? &rtk_tier.live[at] : NULL;
    int left = c > 0 && g_promoted[c - 1], right = c + n < g_promoted_n && g_promoted[c + n];
    if (!r || r->born != born || c + n > g_promoted_n || (n << TIER_CHUNK_SHIFT) > rtk_tier_promote_room()) {
        rc = -1;
    } else if (g_calls >= RUNS_MAX) {
        rtk_tier.head_runs_refused++;
    } else if (rtk_tier_private_map(rtk_tier.base + (c << TIER_CHUNK_SHIFT), n << TIER_CHUNK_SHIFT)) {
        g_calls++;
        memset(g_promoted + c, 1, n);
        g_runs = g_runs + 1 - (uint64_t)left - (uint64_t)right;
        r->promoted += n << TIER_CHUNK_SHIFT;
        rtk_tier.head_promoted += n << TIER_CHUNK_SHIFT;
        rtk_tier.head_promoted_chunks += n;
        rc = 0;
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    return rc;
}

uint64_t rtk_tier_promoted_runs(void) { return g_runs; }

int rtk_tier_restore_promoted(const live_t *r, void (*remapped)(char *lo, uint64_t len))
{
    uint64_t c, end, first, n;
    int rc = 0;
    record_chunks(r, &c, &end);
    while ((n = next_run(&c, end, &first)) != 0) {
        char *at = rtk_tier.base + (first << TIER_CHUNK_SHIFT);
        uint64_t len = n << TIER_CHUNK_SHIFT;
        if (rtk_os_map_file_at(at, len, rtk_tier.fd, first << TIER_CHUNK_SHIFT, 1) != 0) {
            rc = -1;
            continue;
        }
        remapped(at, len);
        /* the mapping it was part of (the kernel merges neighbours, another record's too): cut at an end, split in
         * two, or gone */
        int left = first > 0 && g_promoted[first - 1], right = c < g_promoted_n && g_promoted[c];
        g_runs = g_runs + (uint64_t)(left && right) - (uint64_t)(!left && !right);
        memset(g_promoted + first, 0, n);
        rtk_tier.head_promoted_restored += len;
    }
    return rc;
}

uint64_t rtk_tier_promoted_resident(const live_t *r)
{
    uint64_t c, end, first, n, sum = 0;
    record_chunks(r, &c, &end);
    while (r->promoted && (n = next_run(&c, end, &first)) != 0)
        sum += rtk_tier_resident_of(rtk_tier.base + (first << TIER_CHUNK_SHIFT), n << TIER_CHUNK_SHIFT);
    return sum;
}

long long rtk_tier_private_written(const live_t *r, int pagemap)
{
    long long sum = r->head ? rtk_os_private_bytes(pagemap, rtk_tier_head_lo(r->payload), r->head) : 0;
    uint64_t c, end, first, n;
    record_chunks(r, &c, &end);
    while (sum >= 0 && r->promoted && (n = next_run(&c, end, &first)) != 0) {
        long long b = rtk_os_private_bytes(pagemap, rtk_tier.base + (first << TIER_CHUNK_SHIFT), n << TIER_CHUNK_SHIFT);
        sum = b < 0 ? b : sum + b;
    }
    return sum;
}

long rtk_tier_promoted_ranges(uint64_t (*out)[2], long cap)
{
    long k = 0;
    for (uint64_t c = 0, first, n; k < cap && (n = next_run(&c, g_promoted_n, &first)) != 0; k++) {
        out[k][0] = first << TIER_CHUNK_SHIFT;
        out[k][1] = (first + n) << TIER_CHUNK_SHIFT;
    }
    return k;
}
