/* tier_heads.c -- tier mode at the first step mark (free space punched, DRAM heads made), at fork and at exit. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "prmalloc/tier_internal.h"

/* ---------------------------------------------------------------- DRAM heads (tier_dram_head)
 * A record's head is its first whole pages, remapped as private anonymous memory over the pool's shared file
 * mapping: the same addresses, so pointers into the table stay valid, but its pages are never dirty in the page
 * cache, never written back and never evicted: the rows a job rewrites every step would otherwise be written back
 * to a pool on disk again and again (docs/pmem.md, "Full scale"). */
#define HEAD_MIN ((uint64_t)1 << 20)     /* records smaller than this keep no head */
#define HEAD_CHUNK ((uint64_t)64 << 20)  /* copied and remapped this much at a time: bounded transient memory */

/* Give a freed record's head back to the pool file (under the live lock, with its entry): the pool may place any
 * record there next, and everything in the pool must be the file's pages (fork, the budget and hole punching
 * assume it). -1: it stays anonymous, and the record must not be reused. */
int rtk_tier_restore_head(live_t *r)
{
    if (!r->head)
        return 0;
    char *lo = rtk_tier_head_lo(r->payload);
    if (rtk_os_map_file_at(lo, r->head, rtk_tier.fd, (uint64_t)(lo - rtk_tier.base), 1) != 0)
        return -1;
    rtk_os_advise(lo, r->head, RTK_ADVISE_RANDOM);  /* as the rest of the pool */
    rtk_tier_heat_watch(lo, r->head);                /* a new mapping: watched as the rest of the pool */
    rtk_tier.head_restored += r->head;
    r->head = 0;
    return 0;
}

static int all_zero(const char *p, uint64_t n)
{
    const uint64_t *w = (const uint64_t *)p;
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n / 8; i++)
        acc |= w[i];
    for (uint64_t i = n & ~(uint64_t)7; i < n; i++)
        acc |= (unsigned char)p[i];
    return acc == 0;
}

/* The file's data in [off, off + len) into dst, whose pages start untouched (zero, not resident): only pages with
 * a non-zero byte are written, so the head's anonymous pages grow with the rows in use, as the file's did. Data
 * extents only, where the file system tells them apart (a sparse file; a preallocated one reports its unwritten
 * extents as data, and reading those costs a zero page each). */
static uint64_t copy_data(char *dst, uint64_t off, uint64_t len)
{
    uint64_t copied = 0, end = off + len;
    for (uint64_t pos = off; pos < end;) {
        uint64_t d, h;
        int rc = rtk_os_next_data(rtk_tier.fd, pos, &d, &h);
        if (rc == -ENXIO)
            break;  /* no data past pos */
        if (rc != 0)
            d = pos, h = end;  /* the file system cannot tell: look at it all */
        if (d >= end)
            break;
        uint64_t stop = h < end ? h : end;
        for (uint64_t a = d; a < stop;) {
            uint64_t next = ((a & ~(uint64_t)4095) + 4096) < stop ? (a & ~(uint64_t)4095) + 4096 : stop;
            if (!all_zero(rtk_tier.base + a, next - a)) {
                memcpy(dst + (a - off), rtk_tier.base + a, next - a);
                copied += next - a;
            }
            a = next;
        }
        pos = stop;
    }
    return copied;
}

/* Move [lo, lo + len) of the pool to anonymous memory, a chunk at a time; returns the bytes moved (a prefix). */
static uint64_t move_to_dram(char *lo, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        uint64_t c = len - done < HEAD_CHUNK ? len - done : HEAD_CHUNK, off = (uint64_t)(lo - rtk_tier.base) + done;
        char *tmp = rtk_os_map(c, 0);
        if (!tmp)
            break;
        rtk_tier.head_copied += copy_data(tmp, off, c);
        if (rtk_os_move_at(tmp, c, lo + done) != 0) {
            rtk_os_unmap(tmp, c);
            break;
        }
        /* the file's copy goes: no page cache, no disk blocks, nothing to write back; not while a child forked
         * before this mark may still read these pages through its private view of the file */
        if (rtk_tier.forked_before_heads || rtk_os_punch_hole(rtk_tier.fd, off, c) != 0)
            rtk_tier.head_punch_errors++;
        done += c;
    }
    return done;
}

/* At the first step mark, under the live lock (no record is placed or freed meanwhile; the job is between
 * steps, so no kernel writes a table): every record of HEAD_MIN or more gets the same leading share, the budget
 * over their total bytes. With rows in first-seen order, a table's first rows are its most used ones. */
static void make_heads(void)
{
    if (!rtk_setting_bytes(RTK_OPT_TIER_DRAM_HEAD) || rtk_tier.state != T_ON || !rtk_tier.live || rtk_tier.fd < 0)
        return;
    double t0 = rtk_tier_now_s();
    uint64_t budget = rtk_setting_bytes(RTK_OPT_TIER_DRAM_HEAD), avail = rtk_os_mem_available();
    if (avail != SIZE_MAX && budget > avail / 2)
        budget = avail / 2;  /* anonymous pages cannot be reclaimed without swap: leave the page cache room */
    rtk_tier.head_budget = budget;
    rtk_spin_lock(&rtk_tier.live_lock);
    uint64_t total = 0;
    for (uint32_t i = 0, k = 0; i < rtk_tier.nlive && k < HEAD_CAP; i++)
        if (rtk_tier.live[i].n >= HEAD_MIN && !rtk_tier.live[i].head)
            total += rtk_tier.live[i].n, k++;
    double share = total <= budget ? 1.0 : (double)budget / (double)total;
    for (uint32_t i = 0; i < rtk_tier.nlive && rtk_tier.head_records < HEAD_CAP; i++) {
        live_t *r = &rtk_tier.live[i];
        if (r->n < HEAD_MIN || r->head)
            continue;
        char *lo = rtk_tier_head_lo(r->payload);
        char *end = (char *)(((uintptr_t)r->payload + r->n) & ~(uintptr_t)(TIER_PAGE - 1));
        uint64_t want = (uint64_t)((double)(end - lo) * share) & ~(uint64_t)4095;
        if (end <= lo || want < HEAD_MIN / 4 || rtk_tier.head_bytes + want > budget)
            continue;
        r->head = move_to_dram(lo, want);
        if (r->head) {
            rtk_tier.head_bytes += r->head;
            rtk_tier.head_records++;
        }
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    rtk_tier.head_s = rtk_tier_now_s() - t0;
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
    if (__atomic_load_n(&rtk_tier_pre, __ATOMIC_RELAXED) && __atomic_exchange_n(&rtk_tier_pre, 0, __ATOMIC_ACQ_REL)) {
        rtk_tier_sample_rss();  /* the pre-step frees' pages still held: often the run's highest RSS */
        punch_free_space();
        make_heads();  /* after the cold hint: heads are hot by design */
    }
    rtk_tier_pre = 0;
    rtk_tier.steps++;
    rtk_tier.bytes_at_mark = __atomic_load_n(&rtk_tier.bytes, __ATOMIC_RELAXED);
    rtk_tier.heads_at_mark = rtk_tier.head_bytes - rtk_tier.head_restored;
    rtk_tier_heat_mark();  /* after the heads: they are watched with the rest of the pool */
}

/* fork waits for the live lock (a mark making heads holds it): the child then sees every moved range recorded */
static int g_fork_locked;

void rtk_tier_fork_prepare(void)
{
    g_fork_locked = __atomic_load_n(&rtk_tier.state, __ATOMIC_ACQUIRE) == T_ON;
    if (!g_fork_locked)
        return;
    rtk_spin_fork_prepare(&rtk_tier.live_lock);
    if (__atomic_load_n(&rtk_tier_pre, __ATOMIC_RELAXED))
        rtk_tier.forked_before_heads = 1;  /* the child's private view reads the file: heads must not punch it */
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
        /* around the DRAM heads: fork already gave the child its own copy of those */
        static uint64_t heads[HEAD_CAP][2];
        long nh = 0;
        for (uint32_t i = 0; rtk_tier.head_records && rtk_tier.live && i < rtk_tier.nlive && nh < HEAD_CAP; i++)
            if (rtk_tier.live[i].head) {
                heads[nh][0] = (uint64_t)(rtk_tier_head_lo(rtk_tier.live[i].payload) - rtk_tier.base);
                heads[nh][1] = heads[nh][0] + rtk_tier.live[i].head;
                nh++;
            }
        sort_ranges(heads, nh);
        uint64_t cur = 0;
        for (long i = 0; i <= nh; i++) {
            uint64_t next = i < nh ? heads[i][0] : rtk_tier.size;
            int rc = next > cur ? rtk_os_map_file_at(rtk_tier.base + cur, next - cur, fd, cur, 0) : 0;
            if (rc != 0)
                snprintf(rtk_tier.reason, sizeof rtk_tier.reason, "forked child: pool view stays shared (%s)",
                         strerror(-rc));
            if (i < nh)
                cur = heads[i][1];
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

