/* tier_budget.c -- tier mode's residency samples (which pool pages are in DRAM) and the round-robin resident budget. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "prmalloc/tier_internal.h"

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* ---------------------------------------------------------------- residency over time (the tier view) */
/* A sample per stats write (step marks, at most every 0.5 s, and exit), at most one a second or when the step
 * count doubled: which pool pages are in DRAM now (mincore over every live record) and the process's major
 * faults. */
static double g_tl_last;
static double g_tl_cost;     /* seconds the last sample took */
static uint64_t g_tl_steps;  /* the step count at the last sample */

/* A sample reads the residency of every pool page (mincore: a page-cache lookup each, so a pool of tens of GiB takes
 * a good part of a second), on the thread that marks the step. Samples are spaced to take at most 1/SAMPLE_DUTY of
 * the time between them. */
#define SAMPLE_DUTY 50

/* the record's pages in DRAM but its DRAM head's (its promoted chunks' included) */
static uint64_t file_resident(const live_t *r)
{
    if (!r->head)
        return rtk_tier_resident_of(r->payload, r->n);
    char *lo = rtk_tier_head_lo(r->payload), *hi = lo + r->head, *end = r->payload + r->n;
    return (lo > r->payload ? rtk_tier_resident_of(r->payload, (uint64_t)(lo - r->payload)) : 0) +
           (end > hi ? rtk_tier_resident_of(hi, (uint64_t)(end - hi)) : 0);
}

/* Write [lo, lo+len) of the pool back to its file and ask the kernel to drop it: dirty pages must reach the file
 * before the kernel can drop them. */
static void write_out(uintptr_t lo, uint64_t len)
{
    if (rtk_tier.fd >= 0)
        rtk_os_write_back(rtk_tier.fd, (uint64_t)(lo - (uintptr_t)rtk_tier.base), len);
    rtk_os_advise((void *)lo, len, RTK_ADVISE_PAGEOUT);
}

/* Over the resident budget: write out and drop records, round-robin from where the last pass stopped, until a
 * quarter of the budget is free (the pages the next steps touch come back as major faults: the hot set). Where
 * no page heat is measured. */
static uint32_t g_evict_cursor;

static void enforce_budget(uint64_t total)
{
    uint64_t goal = rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX) / 4 * 3;
    rtk_spin_lock(&rtk_tier.live_lock);
    /* one pass drops only part of what it asks for (pages still under writeback, or referenced again meanwhile):
     * a few passes while they make progress */
    for (int pass = 0; pass < 4 && total > goal; pass++) {
        uint64_t before = total;
        for (uint32_t k = 0; k < rtk_tier.nlive && total > goal; k++) {
            uint32_t i = (g_evict_cursor + k) % rtk_tier.nlive;
            live_t *r = &rtk_tier.live[i];
            if (!r->resident)
                continue;
            uintptr_t lo = rtk_tier_file_lo(r), hi = ((uintptr_t)r->payload + r->n + 4095) & ~(uintptr_t)4095;
            if (hi <= lo)
                continue;
            write_out(lo, hi - lo);
            uint64_t now = file_resident(r);
            rtk_tier_view.dropped_bytes += r->resident > now ? r->resident - now : 0;
            total -= r->resident > now ? r->resident - now : 0;
            r->resident = now;
            g_evict_cursor = i + 1;
        }
        if (total >= before)
            break;
    }
    rtk_tier_view.passes++;
    rtk_spin_unlock(&rtk_tier.live_lock);
}

static int top_records(live_t *out);

void rtk_tier_sample(int force)
{
    if (rtk_tier.state != T_ON || !rtk_tier.live)
        return;
    double now = rtk_tier_now_s();
    if (!rtk_tier_t0)
        rtk_tier_t0 = now;
    /* once a second, and whenever the step count doubled since the last sample: a short run still gets a few
     * samples while it trains (at exit the job has freed its tables), a long one about log2(steps) extra */
    uint64_t steps = rtk_tier.steps;
    if (!force && rtk_tier_view.ntimeline &&
        ((now - g_tl_last < 1.0 && !(steps >= 2 * g_tl_steps && steps > g_tl_steps)) ||
         now - g_tl_last < SAMPLE_DUTY * g_tl_cost))
        return;
    g_tl_steps = steps;
    if (!rtk_tier_mincore_vec())
        return;
    g_tl_last = now;
    uint64_t total = 0, heads = 0;
    rtk_spin_lock(&rtk_tier.live_lock);
    for (uint32_t i = 0; i < rtk_tier.nlive; i++) {
        live_t *r = &rtk_tier.live[i];
        uint64_t promoted = rtk_tier_promoted_resident(r), file = file_resident(r);
        r->resident = file > promoted ? file - promoted : 0;
        r->head_resident = (r->head ? rtk_tier_resident_of(rtk_tier_head_lo(r->payload), r->head) : 0) + promoted;
        total += r->resident;
        heads += r->head_resident;
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    if (rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX) && total > rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX) &&
        !rtk_tier_heat_on())  /* with heat, the heat passes keep the budget */
        enforce_budget(total);
    /* what the report shows is the pool's file pages in DRAM, read over the used span once: the records' sum counts
     * a page that small records share once for each of them (99 MiB shown for 26-31 MiB in smaps), and misses the
     * pages of freed records not yet given back; the heads and promoted chunks are private, not the file's */
    rtk_spin_lock(&rtk_tier.live_lock);
    uint64_t span = rtk_tier_resident_of(rtk_tier.base, LD(rtk_tier.high));
    rtk_spin_unlock(&rtk_tier.live_lock);
    total = span > heads ? span - heads : 0;
    rtk_tier_view.resident = total;
    /* the records while training runs (at exit the job has already freed most of them) */
    if (LD(rtk_tier.bytes) >= LD(rtk_tier.bytes_at_mark) / 2)
        rtk_tier_view.ntop = top_records(rtk_tier_view.top);
    rtk_tier_view.timeline[rtk_tier_view.ntimeline % TL_CAP] =
        (tl_t){rtk_tier.steps, now - rtk_tier_t0, total, LD(rtk_tier.bytes), rtk_os_major_faults()};
    rtk_tier_view.ntimeline++;
    rtk_tier_sample_rss(span);
    g_tl_cost = rtk_tier_now_s() - now;
}

/* the largest live records (at most 16), largest first, into out; returns how many */
static int top_records(live_t *out)
{
    int k = 0;
    rtk_spin_lock(&rtk_tier.live_lock);
    for (uint32_t i = 0; rtk_tier.live && i < rtk_tier.nlive; i++) {
        live_t r = rtk_tier.live[i];
        int j = k < TOP_N ? k++ : TOP_N;
        if (j == TOP_N && r.n <= out[TOP_N - 1].n)
            continue;
        if (j == TOP_N)
            j = TOP_N - 1;
        while (j > 0 && out[j - 1].n < r.n) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = r;
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    return k;
}

