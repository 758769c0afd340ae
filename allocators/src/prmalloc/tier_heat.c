/* tier_heat.c -- tier mode's page heat (which 64 KiB pool chunks the steps write) and the resident budget on it. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/say.h"
#include "prmalloc/tier_internal.h"

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* Every tier_heat_every step marks: which pool pages the steps wrote since the last sample (the pool's mapping
 * is watched by a userfaultfd in asynchronous write-protect mode; PAGEMAP_SCAN reads and re-arms it), folded
 * into a decayed heat per 64 KiB chunk: each sample shifts it right and sets its top bit where the chunk was
 * written, so a chunk written at every sample reads 255 and one last written k samples ago reads 128 >> k.
 * Rows a step uses are written by its optimizer, so write heat is use heat for trained tables. Over the budget,
 * the coldest chunks are written out and dropped first. A first write after each sample costs one fault the
 * kernel resolves itself; no other memory of the process is write-protected.
 * A pass runs beside the steps, on the budget's worker thread (tier_worker.c): it takes the live lock only to copy
 * the live records and to check one is still live before it drops its pages, so frees and placements never wait
 * for its system calls; it never reads or writes a record's memory, only asks the kernel about its pages. */
#define CHUNK_SHIFT TIER_CHUNK_SHIFT
#define CHUNK TIER_CHUNK
#define REGION_CAP 4096
#define F_DROPPED 1                       /* the budget dropped this chunk's pages since it was last written */

static rtk_os_watch_t g_watch = {-1, -1};
static int g_heat;                        /* 0: not armed yet, 1: armed, -1: unavailable or off */
static unsigned char *g_hot, *g_flags, *g_res, *g_dirty;  /* per chunk: heat, F_*, resident pages, written pages */
static unsigned char *g_wres;             /* per chunk, during a pass: its resident pages the lookahead wants */
static uint16_t *g_wmask, *g_drop;        /* and which pages it wants (tier_want.c, read once), which it drops */
static uint64_t *g_want;                  /* the lookahead's words (tier_want.c) */
static uint64_t g_nchunks;
static rtk_os_region_t *g_regions;
static unsigned char *g_vec;              /* the pass's own mincore vector (the stats writes use rtk_tier_vec) */
static live_t *g_snap;                    /* the live records as the pass found them (address space for LIVE_CAP) */
static uint32_t *g_snap_at;               /* and each one's index in the table then */
static uint32_t g_nsnap;

int rtk_tier_heat_on(void) { return g_heat == 1; }

/* the chunks up to the highest record end ever handed out: the only ones with heat or resident pages */
static uint64_t chunks_used(void)
{
    uint64_t used = (LD(rtk_tier.high) + CHUNK - 1) >> CHUNK_SHIFT;
    return used < g_nchunks ? used : g_nchunks;
}

static void heat_unavailable(const char *what, int err)
{
    g_heat = -1;
    rtk_tier_want_off();
    snprintf(rtk_tier_view.heat_note, sizeof rtk_tier_view.heat_note,
             "page heat unavailable (%s: %s): the resident budget drops whole records round-robin", what,
             strerror(-err));
    if (rtk_say_once(rtk_opt_internal(RTK_ENV_RUN_DIR), ".tier-heat-reported"))
        rtk_log_line("tier: %s", rtk_tier_view.heat_note);
}

/* write-protect the whole pool once (what initialisation wrote is not heat); strict: fail where the pool's
 * mapping cannot be watched, rather than skip it */
static int heat_rearm(char *lo, char *hi, int strict)
{
    while (lo < hi) {
        uintptr_t end = 0;
        long k = rtk_os_watch_scan(&g_watch, lo, hi, g_regions, REGION_CAP, strict, &end);
        if (k < 0)
            return (int)k;
        for (long i = 0; i < k; i++) {
            uint64_t a = g_regions[i].start - (uintptr_t)rtk_tier.base, b = g_regions[i].end - (uintptr_t)rtk_tier.base;
            for (uint64_t c = a >> CHUNK_SHIFT; c < g_nchunks && (c << CHUNK_SHIFT) < b; c++) {
                uint64_t clo = c << CHUNK_SHIFT, chi = clo + CHUNK;
                uint64_t pages = ((b < chi ? b : chi) - (a > clo ? a : clo)) / TIER_PAGE;
                rtk_tier_view.heat_pages_written += pages;
                g_dirty[c] = g_dirty[c] + pages > CHUNK / TIER_PAGE ? CHUNK / TIER_PAGE : (unsigned char)(g_dirty[c] + pages);
                if (!(g_hot[c] & 0x80)) {
                    g_hot[c] |= 0x80;
                    if (g_flags[c] & F_DROPPED) {
                        g_flags[c] &= ~F_DROPPED;
                        rtk_tier_view.heat_promoted++;
                    }
                }
            }
        }
        if (end <= (uintptr_t)lo || end >= (uintptr_t)hi)
            break;
        lo = (char *)end;
    }
    return 0;
}

/* at the first step mark (before the DRAM heads are made: they then watch their own new mappings), under the live
 * lock: watch the whole pool */
void rtk_tier_heat_arm(void)
{
    g_nchunks = (rtk_tier.size + CHUNK - 1) >> CHUNK_SHIFT;
    g_hot = rtk_os_map(g_nchunks * 5, 0);
    g_want = rtk_os_map(g_nchunks * (sizeof *g_want + 2 * sizeof *g_wmask), 0);
    g_regions = rtk_os_map(REGION_CAP * sizeof(rtk_os_region_t), 0);
    g_vec = rtk_os_map(VEC_PAGES, 0);
    g_snap = rtk_os_reserve(LIVE_CAP * (sizeof *g_snap + sizeof *g_snap_at), 0);
    if (!g_hot || !g_want || !g_regions || !g_vec || !g_snap) {
        heat_unavailable("memory for its counters", -ENOMEM);
        return;
    }
    g_flags = g_hot + g_nchunks, g_res = g_flags + g_nchunks, g_dirty = g_res + g_nchunks, g_wres = g_dirty + g_nchunks;
    g_wmask = (uint16_t *)(g_want + g_nchunks), g_drop = g_wmask + g_nchunks;
    g_snap_at = (uint32_t *)(g_snap + LIVE_CAP);
    int rc = rtk_os_watch_open(&g_watch);
    if (rc != 0) {
        heat_unavailable("userfaultfd with asynchronous write-protect", rc);
        return;
    }
    /* the mapping's whole pages: a pool's size need not be a multiple of them, userfaultfd wants them */
    uint64_t span = (rtk_tier.size + TIER_PAGE - 1) & ~(uint64_t)(TIER_PAGE - 1);
    rc = rtk_os_watch_add(&g_watch, rtk_tier.base, span);
    if (rc == 0)
        rc = heat_rearm(rtk_tier.base, rtk_tier.base + span, 1);
    if (rc != 0) {
        rtk_os_watch_close(&g_watch);
        heat_unavailable("watching the pool's mapping (PAGEMAP_SCAN)", rc);
        return;
    }
    memset(g_hot, 0, g_nchunks * 2);  /* initialisation's writes are not heat */
    memset(g_dirty, CHUNK / TIER_PAGE, g_nchunks);
    rtk_tier_view.heat_pages_written = 0;
    __atomic_store_n(&g_heat, 1, __ATOMIC_RELEASE);
    rtk_tier_want_arm(g_want, g_nchunks);
}

void rtk_tier_heat_watch(char *lo, uint64_t len)
{
    if (g_heat == 1 && rtk_os_watch_add(&g_watch, lo, len) != 0)
        rtk_tier_view.heat_watch_errors++;  /* those pages read as never written: the first to go */
}

void rtk_tier_heat_fork_child(void)
{
    /* the child's pagemap descriptor would read its parent's pages; it never samples */
    if (g_watch.uffd >= 0 || g_watch.pagemap >= 0)
        rtk_os_watch_close(&g_watch);
    g_heat = -1;
    rtk_tier_want_off();
}

/* The live records now, into the pass's own copy (under the live lock, a copy of its entries only) */
static void snapshot(void)
{
    rtk_spin_lock(&rtk_tier.live_lock);
    g_nsnap = rtk_tier.live ? rtk_tier.nlive : 0;
    for (uint32_t i = 0; i < g_nsnap; i++) {
        g_snap[i] = rtk_tier.live[i];
        g_snap_at[i] = i;
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
}

/* 1 while the copy's record k is still live (no free took it since the copy; one that moved in the table because
 * another was freed counts as gone too, for this pass): only then are its pages dropped. Its pages are the pool's
 * file pages either way, so a free racing the drop that follows loses nothing: dirty pages reach the file first. */
static int still_live(uint32_t k)
{
    rtk_spin_lock(&rtk_tier.live_lock);
    uint32_t i = g_snap_at[k];
    int live = rtk_tier.live && i < rtk_tier.nlive && rtk_tier.live[i].born == g_snap[k].born;
    rtk_spin_unlock(&rtk_tier.live_lock);
    if (!live)
        rtk_tier_view.heat_skipped++;
    return live;
}

/* each copied record's pool file pages in DRAM, per chunk into g_res and per record into its copy; -1: the process
 * exits */
static int64_t chunk_residency(void)
{
    uint64_t used = chunks_used(), total = 0;
    memset(g_res, 0, used);
    for (uint32_t i = 0; i < g_nsnap; i++) {
        if (rtk_tier_pass_point(0))
            return -1;
        live_t *r = &g_snap[i];
        uintptr_t lo = rtk_tier_file_lo(r);
        uintptr_t end = (uintptr_t)r->payload + r->n;
        uint64_t mine = 0;
        for (uintptr_t a = lo; a < end;) {
            uint64_t n = (end - a + 4095) / 4096;
            if (n > VEC_PAGES)
                n = VEC_PAGES;
            if (rtk_os_resident((void *)a, n * 4096, g_vec) != 0)
                break;
            uint64_t off = a - (uintptr_t)rtk_tier.base;
            for (uint64_t k = 0; k < n; k++)
                if (g_vec[k] & 1) {
                    uint64_t c = (off + k * 4096) >> CHUNK_SHIFT;
                    if (rtk_tier_chunk_promoted(c))
                        continue;  /* private: the process's own pages, not the budget's to drop */
                    if (c < used && g_res[c] < CHUNK / TIER_PAGE)
                        g_res[c]++;
                    mine++;
                }
            a += n * 4096;
        }
        r->resident = mine * 4096;
        total += r->resident;
    }
    return (int64_t)total;
}

/* Drop the pages of [lo, hi) (whole chunks of record r, but at its ends) marked in g_drop: all of it is written
 * back at once first (dirty pages must reach the file before the kernel can drop them; the kept pages are clean
 * or written needlessly, never lost), then each run of marked pages is paged out and its cached copies dropped. */
static void drop_span(live_t *r, uintptr_t lo, uintptr_t hi, uint64_t *total)
{
    uintptr_t base = (uintptr_t)rtk_tier.base, run = 0;
    uint64_t before = rtk_tier_resident_in((char *)lo, hi - lo, g_vec);
    if (rtk_tier.fd >= 0)
        rtk_os_write_back(rtk_tier.fd, (uint64_t)(lo - base), hi - lo);
    for (uintptr_t p = lo;; p += TIER_PAGE) {
        int d = p < hi && (g_drop[(p - base) >> CHUNK_SHIFT] >> (((p - base) >> 12) & 15) & 1);
        if (d && !run)
            run = p;
        if (!d && run) {
            rtk_os_advise((void *)run, p - run, RTK_ADVISE_PAGEOUT);
            if (rtk_tier.fd >= 0)  /* what a forked child read in, which this process does not map */
                rtk_os_drop_cached(rtk_tier.fd, (uint64_t)(run - base), p - run);
            run = 0;
        }
        if (p >= hi)
            break;
    }
    uint64_t after = rtk_tier_resident_in((char *)lo, hi - lo, g_vec), gone = before > after ? before - after : 0;
    rtk_tier_view.dropped_bytes += gone;
    rtk_tier_view.heat_demoted_bytes += gone;
    *total -= gone < *total ? gone : *total;
    r->resident -= gone < r->resident ? gone : r->resident;
    uint64_t off = lo - base;
    for (uint64_t c = off >> CHUNK_SHIFT; c < g_nchunks && (c << CHUNK_SHIFT) < hi - base; c++) {
        rtk_tier_view.heat_written_out_bytes += (uint64_t)g_dirty[c] * TIER_PAGE;
        g_dirty[c] = 0;
        if (!(g_flags[c] & F_DROPPED))
            rtk_tier_view.heat_demoted++;
        g_flags[c] |= F_DROPPED;
        g_hot[c] = 0;
    }
}

/* chunk c's resident pages among `mask` (a bit per page), at most its resident file pages */
static unsigned wanted_resident(uint64_t c, uint32_t mask)
{
    uint64_t span = (rtk_tier.size + TIER_PAGE - 1) & ~(uint64_t)(TIER_PAGE - 1), lo = c << CHUNK_SHIFT;
    uint64_t len = span - lo < CHUNK ? span - lo : CHUNK;
    if (rtk_os_resident(rtk_tier.base + lo, len, g_vec) != 0)
        return 0;
    unsigned k = 0;
    for (unsigned i = 0; i < len / TIER_PAGE; i++)
        k += (mask >> i & 1) && (g_vec[i] & 1);
    return k < g_res[c] ? k : g_res[c];
}

/* The pages of chunk c this pass drops (a bit per page): none above the cut level, all but the wanted ones at or
 * below it while the cut level's share lasts; the wanted ones only when cut is the wanted level (256: every other
 * page is gone and the goal is not reached), while its share lasts. Each chunk's wanted pages are counted once. */
static uint32_t drop_mask(uint64_t c, int cut, uint64_t *partial)
{
    uint32_t keep = g_wmask[c];
    uint64_t rest = (uint64_t)(g_res[c] - g_wres[c]) * TIER_PAGE, mine = (uint64_t)g_wres[c] * TIER_PAGE;
    int take = g_hot[c] < cut || (g_hot[c] == cut && *partial);
    if (take && g_hot[c] == cut)
        *partial -= rest < *partial ? rest : *partial;
    if (!take)
        return 0;
    if (keep && cut == 256 && *partial) {
        *partial -= mine < *partial ? mine : *partial;
        rtk_tier_view.want_dropped += g_wres[c];
        keep = g_wmask[c] = 0;
    } else {
        rtk_tier_view.want_kept += g_wres[c];
    }
    g_wres[c] = 0;
    return ~keep & 0xFFFFu;
}

/* Over the budget: the coldest chunks first, down to 3/4 of it (the tail rows the next steps meet come in as
 * major faults meanwhile), each chunk's pages written back and then dropped; the chunks of the heat level
 * where the goal is reached go in address order. The pages the lookahead read ahead for the step about to run
 * (tier_want.c) are unwritten, so cold: they go last, after every other page, and the rest of their chunks goes
 * at the chunk's heat. Over the copied records, each checked still live before its pages go, at most SPAN_MAX at
 * a time (a fork or the exit waits for one span at most). */
#define SPAN_MAX ((uintptr_t)64 << 20)

static uint64_t heat_evict(uint64_t total, uint64_t goal, uint64_t step)
{
    static uint64_t hist[257];  /* heat levels 0..255, then the wanted pages */
    memset(hist, 0, sizeof hist);
    uint64_t used = chunks_used();
    for (uint64_t c = 0; c < used; c++) {
        g_wmask[c] = g_res[c] ? (uint16_t)rtk_tier_wanted(c, step) : 0;
        g_wres[c] = g_wmask[c] ? (unsigned char)wanted_resident(c, g_wmask[c]) : 0;
        hist[g_hot[c]] += (uint64_t)(g_res[c] - g_wres[c]) * TIER_PAGE;
        hist[256] += (uint64_t)g_wres[c] * TIER_PAGE;
    }
    uint64_t need = total - goal, acc = 0;
    int cut = 0;
    while (cut < 256 && acc + hist[cut] < need)
        acc += hist[cut++];
    uint64_t partial = need - acc;  /* of the cut level's bytes */
    uintptr_t base = (uintptr_t)rtk_tier.base;
    for (uint32_t i = 0; i < g_nsnap && total > goal; i++) {
        live_t *r = &g_snap[i];
        if (!r->resident)
            continue;
        if (rtk_tier_pass_point(0))
            break;
        int live = still_live(i);
        uintptr_t lo = rtk_tier_file_lo(r), hi = ((uintptr_t)r->payload + r->n + 4095) & ~(uintptr_t)4095, span = 0;
        for (uintptr_t a = lo; live && a < hi;) {  /* spans of chunks with pages to drop */
            uint64_t c = (a - base) >> CHUNK_SHIFT;
            uintptr_t next = base + ((c + 1) << CHUNK_SHIFT);
            if (next > hi)
                next = hi;
            uint32_t drop = c < used && g_res[c] ? drop_mask(c, cut, &partial) : 0;
            if (c < used)
                g_drop[c] = (uint16_t)drop;
            if (drop && !span)
                span = a;
            if (span && (!drop || a - span >= SPAN_MAX)) {
                drop_span(r, span, a, &total);
                span = drop ? a : 0;
                /* a fork, an exit or a free may have come meanwhile */
                if (rtk_tier_pass_point(0))
                    return total;
                live = still_live(i);
            }
            a = next;
        }
        if (live && span)
            drop_span(r, span, hi, &total);
    }
    rtk_tier_view.passes++;
    return total;
}

/* Heat-driven DRAM heads: while the heads' budget has room (tier_dram_head; the first step mark's leading shares take
 * what tier_dram_head_heat_pct leaves of it), the chunks the steps wrote at the last two samples or more (heat 0xC0 and up), the hottest first,
 * become private (rtk_tier_promote): their pages are then the process's own once written, never written back or
 * dropped. Chunks of records of 1 MiB or more, whole chunks inside the record's pages past its leading head. No
 * chunk is demoted: taking a written page back into the file while a thread may write it would lose that write. */
#define PROMOTE_MIN 0xC0
#define PROMOTE_RECORD_MIN ((uint64_t)1 << 20)

/* the chunks of copied record k a promotion may take: [*c0, *c1) (empty, and 0, where none) */
static int promotable(uint32_t k, uint64_t *c0, uint64_t *c1)
{
    const live_t *r = &g_snap[k];
    *c0 = *c1 = 0;
    if (r->n < PROMOTE_RECORD_MIN)
        return 0;
    uintptr_t base = (uintptr_t)rtk_tier.base, lo = (uintptr_t)rtk_tier_head_lo(r->payload) + r->head;
    uintptr_t hi = ((uintptr_t)r->payload + r->n) & ~(uintptr_t)4095;
    *c0 = (lo - base + CHUNK - 1) >> CHUNK_SHIFT;
    *c1 = (hi - base) >> CHUNK_SHIFT;
    if (*c1 > chunks_used())
        *c1 = chunks_used();
    return *c1 > *c0;
}

static void heat_promote(void)
{
    uint64_t room = rtk_tier_promote_room() >> CHUNK_SHIFT;
    if (!room)
        return;
    static uint64_t hist[256];
    memset(hist, 0, sizeof hist);
    uint64_t c0, c1;
    for (uint32_t k = 0; k < g_nsnap; k++)
        for (uint64_t c = promotable(k, &c0, &c1) ? c0 : c1; c < c1; c++)
            if (g_hot[c] >= PROMOTE_MIN && !rtk_tier_chunk_promoted(c))
                hist[g_hot[c]]++;
    /* every chunk hotter than `cut`, and `partial` of those at `cut` (in address order) */
    int cut = 255;
    uint64_t acc = 0, partial;
    while (cut > PROMOTE_MIN && acc + hist[cut] <= room)
        acc += hist[cut--];
    partial = room - acc < hist[cut] ? room - acc : hist[cut];
    for (uint32_t k = 0; k < g_nsnap; k++) {
        if (!promotable(k, &c0, &c1))
            continue;
        if (rtk_tier_pass_point(0))
            return;
        uint64_t run = 0;
        for (uint64_t c = c0; c <= c1; c++) {
            int take = c < c1 && !rtk_tier_chunk_promoted(c) &&
                       (g_hot[c] > cut || (g_hot[c] == cut && g_hot[c] >= PROMOTE_MIN && partial && partial--));
            if (take) {
                run++;
                continue;
            }
            if (run && rtk_tier_promote(g_snap_at[k], g_snap[k].born, c - run, run) == 0)
                rtk_tier_heat_watch(rtk_tier.base + ((c - run) << CHUNK_SHIFT), run << CHUNK_SHIFT);  /* a new mapping */
            else if (run && !rtk_tier_promote_room())
                return;
            run = 0;
        }
    }
}

int rtk_tier_heat_due(void)
{
    long every = rtk_setting_num(RTK_OPT_TIER_HEAT_EVERY);
    int budget = rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX) != 0;
    int by_heat = rtk_setting_bytes(RTK_OPT_TIER_DRAM_HEAD) && rtk_setting_num(RTK_OPT_TIER_DRAM_HEAD_HEAT_PCT) > 0;
    if ((!budget && !by_heat) || every <= 0 || g_heat < 0 || rtk_tier.state != T_ON || !rtk_tier.live)
        return 0;
    if (!g_heat)
        return 1;
    /* heads alone: no pass once their budget is spent (a free of a record with heads gives it room again) */
    return rtk_tier.steps % (uint64_t)every == 0 && (budget || rtk_tier_promote_room()) ? 2 : 0;
}

/* A sample and the budget on it, for the step `step` is about to run: under the pass lock (the worker's, or the
 * step mark's where no worker runs), the live lock only for moments. Ends early when the process exits. */
void rtk_tier_heat_pass(uint64_t step)
{
    if (__atomic_load_n(&g_heat, __ATOMIC_ACQUIRE) != 1)
        return;
    double t0 = rtk_tier_now_s();
    uint64_t max = rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX), used = chunks_used();
    for (uint64_t c = 0; c < used; c++)
        g_hot[c] >>= 1;
    uint64_t end = used << CHUNK_SHIFT, span = (rtk_tier.size + TIER_PAGE - 1) & ~(uint64_t)(TIER_PAGE - 1);
    int rc = heat_rearm(rtk_tier.base, rtk_tier.base + (end < span ? end : span), 0);
    if (rc != 0) {
        rtk_spin_lock(&rtk_tier.live_lock);  /* a free may be adding a range to the watch */
        rtk_os_watch_close(&g_watch);
        heat_unavailable("PAGEMAP_SCAN", rc);
        rtk_spin_unlock(&rtk_tier.live_lock);
        return;
    }
    rtk_tier_view.heat_samples++;
    snapshot();
    int64_t total = chunk_residency();
    /* where a test holds the pass: its sample and its copy of the records taken, nothing dropped yet */
    if (total < 0 || rtk_tier_pass_point(1))
        return;
    if (max && (uint64_t)total > max)
        total = (int64_t)heat_evict((uint64_t)total, max / 4 * 3, step);
    heat_promote();
    uint64_t hot = 0;
    for (uint64_t c = 0; c < used; c++)
        hot += g_hot[c] >= 0x80;
    rtk_tier_view.heat_hot_chunks = hot;
    rtk_tier_view.heat_resident = (uint64_t)total;
    rtk_tier_view.heat_s += rtk_tier_now_s() - t0;
}
