/* tier_heads.c -- tier mode at the first step mark (free space punched, DRAM heads made), at fork and at exit. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "prmalloc/tier_internal.h"

/* ---------------------------------------------------------------- DRAM heads (tier_dram_head)
 * A record's head is its first whole pages, remapped as a private mapping of the same range of the pool file: the
 * same addresses, so pointers into the table stay valid. A page of it the steps write becomes the process's own
 * anonymous copy (the kernel's copy on write): never a dirty page of the file, never written back, never evicted:
 * the rows a job rewrites every step would otherwise be written back to a pool on disk again and again
 * (docs/pmem.md, "Full scale"). Pages of it no step writes stay the file's: clean page cache the kernel may
 * reclaim, so the head's DRAM follows the rows in use. */
#define HEAD_MIN ((uint64_t)1 << 20)     /* records smaller than this keep no head */

static void give_back(char *lo, uint64_t len)
{
    rtk_os_advise(lo, len, RTK_ADVISE_RANDOM);  /* as the rest of the pool */
    rtk_tier_heat_watch(lo, len);               /* a new mapping: watched as the rest of the pool */
}

/* Give a freed record's head and promoted chunks back to the pool file (under the live lock, with its entry): the
 * pool may place any record there next, and everything in the pool must be the file's shared pages (fork, the
 * budget and hole punching assume it). The private copies go with them: the record is freed. -1: some stay private,
 * and the record must not be reused. */
int rtk_tier_restore_head(live_t *r)
{
    int rc = 0;
    if (r->promoted) {
        rc = rtk_tier_restore_promoted(r, give_back);
        if (rc == 0)
            r->promoted = 0;
    }
    if (!r->head)
        return rc;
    char *lo = rtk_tier_head_lo(r->payload);
    rtk_tier_pager_forget(lo, r->head);  /* a paged record: no eviction touches it once the file is back */
    if (rtk_os_map_file_at(lo, r->head, rtk_tier.fd, (uint64_t)(lo - rtk_tier.base), 1) != 0)
        return -1;
    give_back(lo, r->head);
    rtk_tier.head_restored += r->head;
    r->head = 0;
    return rc;
}

/* tier_pager: every record of HEAD_MIN or more, its whole pages, becomes the pager's at the first step mark: its
 * "head" is all of it (fork keeps it, a free gives it back to the file as a head's). The pager's DRAM is the
 * process's anonymous memory, bounded by its own eviction, not by a head budget. */
/* The next live record from *i on that may get a head (HEAD_MIN or more, none yet, under HEAD_CAP heads), with its
 * whole pages [*lo, *end); NULL when there is none. Under the live lock. */
static live_t *next_head_candidate(uint32_t *i, char **lo, char **end)
{
    for (; *i < rtk_tier.nlive && rtk_tier.head_records < HEAD_CAP; ++*i) {
        live_t *r = &rtk_tier.live[*i];
        if (r->n < HEAD_MIN || r->head)
            continue;
        *lo = rtk_tier_head_lo(r->payload);
        *end = (char *)(((uintptr_t)r->payload + r->n) & ~(uintptr_t)(TIER_PAGE - 1));
        ++*i;
        return r;
    }
    return NULL;
}

static void page_records(void)
{
    double t0 = rtk_tier_now_s();
    rtk_spin_lock(&rtk_tier.live_lock);
    char *lo, *end;
    for (uint32_t i = 0; ;) {
        live_t *r = next_head_candidate(&i, &lo, &end);
        if (!r)
            break;
        if (end <= lo)
            continue;
        r->head = rtk_tier_pager_adopt(lo, (uint64_t)(end - lo));
        if (r->head) {
            rtk_tier.head_bytes += r->head;
            rtk_tier.head_records++;
        }
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    rtk_tier.head_s = rtk_tier_now_s() - t0;
}

/* At the first step mark, under the live lock (no record is placed or freed meanwhile): every record of HEAD_MIN
 * or more gets the same leading share of the budget over their total bytes: all of it, or, where page heat is
 * measured, what tier_dram_head_heat_pct leaves: the heat passes promote the chunks the steps write most with the
 * rest (rtk_tier_promote). With rows in first-seen order, a table's first rows are its most used ones; with other
 * layouts, or tables of unequal use, the heat finds them. */
static void make_heads(void)
{
    if (rtk_tier.state != T_ON || !rtk_tier.live || rtk_tier.fd < 0)
        return;
    if (rtk_tier_pager_wanted() && rtk_tier_pager_start() == 0) {
        page_records();
        return;
    }
    if (!rtk_setting_bytes(RTK_OPT_TIER_DRAM_HEAD))
        return;
    double t0 = rtk_tier_now_s();
    uint64_t budget = rtk_setting_bytes(RTK_OPT_TIER_DRAM_HEAD), avail = rtk_os_mem_available();
    if (avail != SIZE_MAX && budget > avail / 2)
        budget = avail / 2;  /* anonymous pages cannot be reclaimed without swap: leave the page cache room */
    rtk_tier.head_budget = budget;
    long by_heat = rtk_setting_num(RTK_OPT_TIER_DRAM_HEAD_HEAT_PCT);
    if (by_heat > 0 && rtk_tier_heat_on() && rtk_tier_promoted_arm() == 0) {
        uint64_t heat = budget * (uint64_t)by_heat / 100;  /* budget: at most half of MemAvailable, far from overflow */
        /* No more than RUNS_MAX promotions of one chunk each are sure to hold: where the hot chunks lie scattered,
         * a larger share would go unspent once the promotion limit is reached, and the leading shares it was taken
         * from would leave their hot pages to the writeback */
        if (heat > (uint64_t)RUNS_MAX << TIER_CHUNK_SHIFT)
            heat = (uint64_t)RUNS_MAX << TIER_CHUNK_SHIFT;
        budget -= heat;
    }
    rtk_spin_lock(&rtk_tier.live_lock);
    uint64_t total = 0;
    for (uint32_t i = 0, k = 0; i < rtk_tier.nlive && k < HEAD_CAP; i++)
        if (rtk_tier.live[i].n >= HEAD_MIN && !rtk_tier.live[i].head)
            total += rtk_tier.live[i].n, k++;
    double share = total <= budget ? 1.0 : (double)budget / (double)total;
    char *lo, *end;
    for (uint32_t i = 0; ;) {
        live_t *r = next_head_candidate(&i, &lo, &end);
        if (!r)
            break;
        uint64_t want = (uint64_t)((double)(end - lo) * share) & ~(uint64_t)4095;
        if (end <= lo || want < HEAD_MIN / 4 || rtk_tier.head_bytes + want > budget)
            continue;
        r->head = rtk_tier_private_map(lo, want);
        if (r->head) {
            rtk_tier_heat_watch(lo, r->head);  /* a new mapping, made after the heat watched the pool */
            rtk_tier.head_bytes += r->head;
            rtk_tier.head_records++;
        }
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    rtk_tier.head_s = rtk_tier_now_s() - t0;
}

/* The heads' pages the steps wrote (private copies in anonymous memory) now, and the most seen at any stats write
 * (a job frees its tables at exit), or -errno where the kernel cannot tell. A walk of the page tables of the heads
 * and promoted chunks (under the live lock): under 1 GiB of them (well under a millisecond) at every stats write;
 * past it (tens of ms for 10 GiB) again only once 50 times its own time has passed, so the stats writes spend at
 * most 2% of a core on it, and the figure may be that old. The file's cached copy of a written page stays until the kernel reclaims it
 * (clean once written back): dropping it from here would drop the pages not yet read through the private mapping
 * too, which the next read then faults in from the disk. */
long long rtk_tier_heads_written(long long *peak)
{
    static long long last, most;
    static double at = -1e300, took;
    double t0 = rtk_tier_now_s();
    uint64_t held = rtk_tier_private_held();
    if (held && (held < (1ull << 30) || t0 - at >= 50.0 * took)) {
        int pagemap = rtk_os_pagemap_open();
        long long sum = pagemap < 0 ? pagemap : 0;
        rtk_spin_lock(&rtk_tier.live_lock);
        for (uint32_t i = 0; pagemap >= 0 && rtk_tier.live && i < rtk_tier.nlive && sum >= 0; i++)
            if (rtk_tier.live[i].head || rtk_tier.live[i].promoted) {
                long long b = rtk_tier_private_written(&rtk_tier.live[i], pagemap);
                sum = b < 0 ? b : sum + b;
            }
        rtk_spin_unlock(&rtk_tier.live_lock);
        if (pagemap >= 0)
            rtk_os_close(pagemap);
        at = rtk_tier_now_s();
        took = at - t0;
        last = sum;
        if (sum >= 0 && sum > most)
            most = sum;
        else if (sum < 0 && !most)
            most = sum;  /* never measured: the kernel cannot tell */
    } else if (!held && last > 0) {
        last = 0;  /* every head and promoted chunk given back */
    }
    *peak = most;
    return last;
}

/* ---------------------------------------------------------------- step marks, fork, exit */
/* sort (start, end) pairs by start: a heap sort, since qsort may call malloc */
static void sort_ranges(uint64_t (*r)[2], long n)
{
    for (long k = n / 2 - 1, end = n; end > 1 || k >= 0;) {
        long i;
        if (k >= 0)
            i = k--;
        else {
            end--;
            uint64_t t0 = r[0][0], t1 = r[0][1];
            r[0][0] = r[end][0], r[0][1] = r[end][1], r[end][0] = t0, r[end][1] = t1;
            i = 0;
        }
        for (long c; (c = 2 * i + 1) < end; i = c) {
            if (c + 1 < end && r[c + 1][0] > r[c][0])
                c++;
            if (r[i][0] >= r[c][0])
                break;
            uint64_t t0 = r[i][0], t1 = r[i][1];
            r[i][0] = r[c][0], r[i][1] = r[c][1], r[c][0] = t0, r[c][1] = t1;
        }
    }
}

/* At the first step mark: punch every whole page of the pool's used span that no live record covers (the pages
 * that pre-step frees left behind), under the live lock so no record is placed meanwhile. */
static void punch_free_space(void)
{
    if (rtk_tier.state != T_ON || !rtk_tier.live || rtk_tier.no_remove || rtk_tier.live_overflow)
        return;
    rtk_spin_lock(&rtk_tier.live_lock);
    uint32_t n = rtk_tier.nlive;
    size_t len = ((size_t)n + 1) * 16;
    uint64_t (*r)[2] = rtk_os_map(len, 0);
    if (!r) {
        rtk_spin_unlock(&rtk_tier.live_lock);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        r[i][0] = (uint64_t)(rtk_tier.live[i].rec - rtk_tier.base);
        r[i][1] = r[i][0] + rtk_tier.live[i].len;
    }
    sort_ranges(r, n);
    rtkit_pmem_stats s;
    rtkit_pmem_stats_get(rtk_tier.pool, &s);
    uint64_t cur = s.data_offset;
    for (uint32_t i = 0; i <= n; i++) {
        uint64_t next = i < n ? r[i][0] : rtk_tier.high;
        uint64_t lo = (cur + 4095) & ~4095ull, hi = next & ~4095ull;
        if (hi > lo) {
            int rc = rtk_os_advise(rtk_tier.base + lo, hi - lo, RTK_ADVISE_REMOVE);
            if (rc == 0) {
                rtk_tier.gap_punches++;
                rtk_tier.gap_bytes += hi - lo;
            } else if (rc == -EOPNOTSUPP || rc == -EINVAL) {
                rtk_tier.no_remove = 1;
                break;
            }
        }
        if (i < n && r[i][1] > cur)
            cur = r[i][1];
    }
    /* What the profiler saw so far is initialisation: every pool page was written by it, and the steps will
     * touch only some. Deactivate them all once: the pages the steps touch are referenced again and stay
     * active, the ones only the initialisers wrote are the first the kernel reclaims under pressure. */
    uint64_t used = rtk_tier.high > s.data_offset ? rtk_tier.high - s.data_offset : 0;
    if (rtk_setting_on(RTK_OPT_TIER_COLD_HINT) && used && rtk_os_advise(rtk_tier.base + s.data_offset, used, RTK_ADVISE_COLD) == 0)
        rtk_tier.cold_hint_bytes = used;
    rtk_spin_unlock(&rtk_tier.live_lock);
    rtk_os_unmap(r, len);
}

void rtk_tier_step_mark(void)
{
    int first = __atomic_load_n(&rtk_tier_pre, __ATOMIC_RELAXED) && __atomic_exchange_n(&rtk_tier_pre, 0, __ATOMIC_ACQ_REL);
    if (first) {
        rtk_tier_sample_rss(UINT64_MAX);  /* the pre-step frees' pages still held: often the run's highest RSS */
        punch_free_space();
    }
    rtk_tier_pre = 0;
    rtk_tier.steps++;
    rtk_tier.bytes_at_mark = __atomic_load_n(&rtk_tier.bytes, __ATOMIC_RELAXED);
    rtk_tier_heat_mark();  /* the first arms the heat: the heads then know whether its passes promote chunks */
    if (first)
        make_heads();      /* after the cold hint: heads are hot by design */
    rtk_tier.heads_at_mark = rtk_tier_private_held();
    rtk_tier_pager_mark();
}

/* fork waits for the live lock (a mark making heads holds it): the child then sees every head recorded */
static int g_fork_locked;

void rtk_tier_fork_prepare(void)
{
    g_fork_locked = __atomic_load_n(&rtk_tier.state, __ATOMIC_ACQUIRE) == T_ON;
    if (!g_fork_locked)
        return;
    rtk_spin_fork_prepare(&rtk_tier.live_lock);
}

void rtk_tier_fork_parent(void)
{
    if (g_fork_locked)
        rtk_spin_fork_parent(&rtk_tier.live_lock);
}

void rtk_tier_fork_child(void)
{
    rtk_tier_min = SIZE_MAX;
    rtk_tier_heat_fork_child();
    if (rtk_tier.state != T_ON)
        return;
    rtk_spin_fork_child(&rtk_tier.live_lock);
    /* the pool is MAP_SHARED: turn the child's view into a private copy so its writes stay its own (through
     * the kept descriptor: the file's name is gone) */
    int fd = rtk_tier.fd >= 0 ? rtk_tier.fd : rtk_os_open_ro(rtk_tier.path);
    if (fd >= 0) {
        /* around the DRAM heads and the promoted chunks: they are private mappings already, of which fork gave
         * the child its own (mapping the file over them would show the child the file's older rows) */
        static uint64_t keep[HEAD_CAP + RUNS_MAX][2];
        long nk = 0;
        for (uint32_t i = 0; rtk_tier.head_records && rtk_tier.live && i < rtk_tier.nlive && nk < HEAD_CAP; i++)
            if (rtk_tier.live[i].head) {
                keep[nk][0] = (uint64_t)(rtk_tier_head_lo(rtk_tier.live[i].payload) - rtk_tier.base);
                keep[nk][1] = keep[nk][0] + rtk_tier.live[i].head;
                nk++;
            }
        nk += rtk_tier_promoted_ranges(keep + nk, HEAD_CAP + RUNS_MAX - nk);
        sort_ranges(keep, nk);
        uint64_t cur = 0;
        for (long i = 0; i <= nk; i++) {
            uint64_t next = i < nk ? keep[i][0] : rtk_tier.size;
            int rc = next > cur ? rtk_os_map_file_at(rtk_tier.base + cur, next - cur, fd, cur, 0) : 0;
            if (rc != 0)
                snprintf(rtk_tier.reason, sizeof rtk_tier.reason, "forked child: pool view stays shared (%s)",
                         strerror(-rc));
            if (i < nk)
                cur = keep[i][1];
        }
        if (fd != rtk_tier.fd)
            rtk_os_close(fd);
    }
    rtk_tier.state = T_CHILD;
}

void rtk_tier_exit(void)
{
    /* scratch: the file goes with the process (the mapping stays valid for frees still to come; they no longer
     * punch pages: the inode's pages are dropped at once when the process ends) */
    rtk_tier.exiting = 1;
    if (rtk_tier.state == T_ON && rtk_tier.owner == rtk_os_pid() && rtk_tier.fd < 0)
        rtk_os_unlink(rtk_tier.path);
}

