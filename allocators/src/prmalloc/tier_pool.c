/* tier_pool.c -- PMEM tier mode: with RTKIT_TIER_POOL_PATH set, long-lived large allocations (made before the first step
 * mark, or of sizes the profiler saw outliving steps) live in a volatile rtkit PMEM pool instead of DRAM: the
 * settings, the pool, placing and freeing a record. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/options.h"
#include "common/say.h"
#include "prmalloc/tier_internal.h"

#define TIER_MAGIC 0x7469657252544b31ull  /* mixed into the tag so a stray pointer into the pool is told apart */
#define LL_CAP 4096                       /* long-lived sizes remembered (open addressing, never removed) */

static uint64_t g_ll[LL_CAP];
static __thread int t_in_tier __attribute__((tls_model("initial-exec")));

static inline uint64_t ll_hash(uint64_t s) { return (s * 0x9E3779B97F4A7C15ull) >> 52; }  /* 12 bits */

static int ll_has(uint64_t s)
{
    for (unsigned i = (unsigned)ll_hash(s), k = 0; k < LL_CAP; k++, i = (i + 1) & (LL_CAP - 1)) {
        uint64_t v = __atomic_load_n(&g_ll[i], __ATOMIC_RELAXED);
        if (v == s)
            return 1;
        if (!v)
            return 0;
    }
    return 0;
}

static void note_longlived(size_t size)
{
    if (size < rtk_tier_min || rtk_tier.ll_sizes >= LL_CAP / 4 * 3)
        return;
    for (unsigned i = (unsigned)ll_hash(size);; i = (i + 1) & (LL_CAP - 1)) {
        if (g_ll[i] == size)
            return;
        if (!g_ll[i]) {
            __atomic_store_n(&g_ll[i], (uint64_t)size, __ATOMIC_RELAXED);
            rtk_tier.ll_sizes++;
            return;
        }
    }
}

/* pointers carried at the previous and at this boundary (only while profiling with tier mode on) */
#define CARRY_CAP 8192
static uintptr_t g_carry[2][CARRY_CAP];
static int g_carry_cur;

static int carry_find_or_add(uintptr_t *tab, uintptr_t p, int add)
{
    for (unsigned i = (unsigned)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 51), k = 0; k < CARRY_CAP / 4 * 3;
         k++, i = (i + 1) & (CARRY_CAP - 1)) {
        if (tab[i] == p)
            return 1;
        if (!tab[i]) {
            if (add)
                tab[i] = p;
            return 0;
        }
    }
    return 0;
}

void rtk_tier_note_carried(uintptr_t p, size_t size)
{
    if (size < rtk_tier_min)
        return;
    if (carry_find_or_add(g_carry[!g_carry_cur], p, 0))
        note_longlived(size);
    carry_find_or_add(g_carry[g_carry_cur], p, 1);
}

void rtk_tier_carry_done(void)
{
    g_carry_cur = !g_carry_cur;
    memset(g_carry[g_carry_cur], 0, sizeof g_carry[0]);
}

void rtk_tier_plan_ready(void) { __atomic_store_n(&rtk_tier.plan_ready, 1, __ATOMIC_RELEASE); }

/* ---------------------------------------------------------------- settings and the pool */
void rtk_tier_read_settings(void)
{
    const char *path = rtk_setting_text(RTK_OPT_TIER_POOL_PATH);
    rtk_tier.fd = -1;
    rtk_tier.size = rtk_setting_bytes(RTK_OPT_TIER_POOL_SIZE);  /* the pool's own size once it is made */
    if (!path || strlen(path) >= sizeof rtk_tier.path) {
        rtk_tier.state = path ? T_FAILED : T_OFF;
        if (path) {  /* no file can have this name (ENAMETOOLONG): said now, since no pool is ever opened */
            snprintf(rtk_tier.reason, sizeof rtk_tier.reason, "%s is longer than %zu bytes (the system's PATH_MAX)",
                     rtk_settings[RTK_OPT_TIER_POOL_PATH].env, sizeof rtk_tier.path - 1);
            if (rtk_say_once(rtk_opt_internal(RTK_ENV_RUN_DIR), ".pmem-path-reported"))
                rtk_log_line("%s; tier mode off, allocations stay in DRAM", rtk_tier.reason);
        }
        return;
    }
    snprintf(rtk_tier.path, sizeof rtk_tier.path, "%s", path);
    rtk_tier.state = T_IDLE;
    rtk_tier_min = rtk_setting_bytes(RTK_OPT_TIER_MIN_SIZE);
}

/* Safety rule (docs/safety.md): rtkit never deletes or truncates a file it did not create in this run. The tier
 * pool is scratch that this process creates (O_EXCL) and removes at exit; any file already at the path (a durable
 * pool made with the Python API, a stale pool, /proc/self/mem) is left alone and tier mode stays off with one
 * line. 0: go ahead; 1: busy (a live process holds a pool there); -1: refuse (reason set). */
static int clear_old(void)
{
    int at = rtk_os_path_probe(rtk_tier.path);
    if (at == RTK_PATH_ABSENT)
        return 0;  /* absent (or unreachable: create says why) */
    if (at == RTK_PATH_LOCKED)
        return 1;
    snprintf(rtk_tier.reason, sizeof rtk_tier.reason,
             "%s exists; tier mode never reuses or deletes a file it did not create: remove it or choose a new "
             "path", rtk_tier.path);
    return -1;
}

static void tier_open(void)
{
    int expect = T_IDLE;
    if (!__atomic_compare_exchange_n(&rtk_tier.state, &expect, T_CREATING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;  /* another thread is creating it (its requests meanwhile stay in DRAM) or it is settled */
    t_in_tier = 1;
    /* said by the first process of the run that opens the pool (its settings' messages were said at init) */
    int speak = rtk_say_once(rtk_opt_internal(RTK_ENV_RUN_DIR), ".pmem-path-reported");
    int st = clear_old();
    int next = T_FAILED;
    if (st == 1) {
        snprintf(rtk_tier.reason, sizeof rtk_tier.reason,
                 "%s is held by another process; this process keeps its memory in DRAM", rtk_tier.path);
        next = T_BUSY;
    } else if (st == 0) {
        rtkit_pmem_options o;
        rtkit_pmem_options_init(&o);
        o.durable = 0;  /* scratch: DeepRec's volatile mode, no per-record flush */
        rtkit_pmem_pool *pool = NULL;
        int rc = rtkit_pmem_create(rtk_tier.path, rtk_tier.size, &o, &pool);
        if (rc == 0) {
            rtkit_pmem_stats s;
            rtkit_pmem_stats_get(pool, &s);
            rtk_tier.pool = pool;
            rtk_tier.base = rtkit_pmem_base(pool);
            rtk_tier.size = s.pool_size;
            rtk_tier.owner = rtk_os_pid();
            int ram = rtk_os_on_ram_fs(rtk_tier.path);
            snprintf(rtk_tier.medium, sizeof rtk_tier.medium, "%s", s.is_pmem ? "pmem" : ram ? "tmpfs" : "file");
            /* tensors are not read sequentially through the file: no read-ahead into untouched extents */
            rtk_os_advise(rtk_tier.base, s.pool_size, RTK_ADVISE_RANDOM);
            rtk_tier.live = rtk_os_reserve(LIVE_CAP * sizeof(live_t), 0);
            /* scratch: the name goes now, so neither a crash nor kill -9 leaves a pool file behind, and the
             * pages still dirty at exit are dropped with the inode instead of written (fork remaps by fd) */
            rtk_tier.fd = rtk_os_open_rw(rtk_tier.path);
            if (rtk_tier.fd >= 0)
                rtk_os_unlink(rtk_tier.path);
            /* publish the range before anything can be placed: a free must always recognise pool memory */
            __atomic_store_n(&rtk_fastpath.tier_lo, (uintptr_t)rtk_tier.base, __ATOMIC_RELEASE);
            __atomic_store_n(&rtk_fastpath.tier_span, (uintptr_t)s.pool_size, __ATOMIC_RELEASE);
            rtk_publish_any();
            next = T_ON;
        } else {
            snprintf(rtk_tier.reason, sizeof rtk_tier.reason, "%s", rtkit_pmem_last_error());
        }
    }
    if (next == T_FAILED) {
        char line[sizeof rtk_tier.reason + 128];
        snprintf(line, sizeof line, "%s: %s; tier mode off, allocations stay in DRAM",
                 rtk_settings[RTK_OPT_TIER_POOL_PATH].env, rtk_tier.reason);
        if (speak)
            rtk_log_line("%s", line);
        rtk_tier_min = SIZE_MAX;
    }
    __atomic_store_n(&rtk_tier.state, next, __ATOMIC_RELEASE);
    t_in_tier = 0;
}

/* ---------------------------------------------------------------- allocation */
static inline void add_bytes(uint64_t n)
{
    uint64_t now = __atomic_add_fetch(&rtk_tier.bytes, n, __ATOMIC_RELAXED);
    uint64_t peak = __atomic_load_n(&rtk_tier.peak, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&rtk_tier.peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static inline uint64_t tag_of(uint64_t h, const void *q)
{
    return h ^ TIER_MAGIC ^ ((uintptr_t)q * 0x9E3779B97F4A7C15ull);
}

/* what a free leaves in the tag: a second free of the payload is told from a pointer that never was one */
#define TIER_FREED 0x5a5a5a5a00000001ull

/* The largest request the pool had no room for, with the bytes it held then and whether the first step had come:
 * what the report sizes the pool by (a table that fell back to DRAM is the case that matters; the figures are not a
 * promise when frees race them) */
static void note_largest_fallback(uint64_t n)
{
    uint64_t seen = __atomic_load_n(&rtk_tier.fallback_largest, __ATOMIC_RELAXED);
    while (n > seen)
        if (__atomic_compare_exchange_n(&rtk_tier.fallback_largest, &seen, n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            __atomic_store_n(&rtk_tier.fallback_largest_held, __atomic_load_n(&rtk_tier.bytes, __ATOMIC_RELAXED),
                             __ATOMIC_RELAXED);
            __atomic_store_n(&rtk_tier.fallback_largest_pre, (uint64_t)(rtk_tier_pre != 0), __ATOMIC_RELAXED);
            break;
        }
}

void *rtk_tier_alloc(size_t n, size_t align, int zero, int longlived)
{
    if (t_in_tier)
        return NULL;  /* the pool's own set-up (libpmem, thread creation) allocates: DRAM */
    if (longlived ? !__atomic_load_n(&rtk_tier.plan_ready, __ATOMIC_ACQUIRE) || !ll_has(n)
                  : !rtk_tier_pre || (n < TIER_TABLE_BYTES && __atomic_load_n(&rtk_tier.pre_stopped, __ATOMIC_RELAXED)))
        return NULL;
    int st = __atomic_load_n(&rtk_tier.state, __ATOMIC_ACQUIRE);
    if (st != T_ON) {
        if (st != T_IDLE)
            return NULL;
        tier_open();
        if (__atomic_load_n(&rtk_tier.state, __ATOMIC_ACQUIRE) != T_ON)
            return NULL;
    }
    size_t a = align > 16 ? align : 16, need;
    if (__builtin_add_overflow(n, TIER_HDR + a, &need))
        return NULL;
    uint64_t h;
    t_in_tier = 1;
    /* under the live lock: the first step mark punches what is not a live record */
    rtk_spin_lock(&rtk_tier.live_lock);
    int rc = rtkit_pmem_alloc(rtk_tier.pool, need, &h);
    if (rc != 0)
        rtk_spin_unlock(&rtk_tier.live_lock);
    t_in_tier = 0;
    if (rc != 0) {
        if (rc == RTKIT_PMEM_ENOSPC || rc == RTKIT_PMEM_ETOOBIG) {
            __atomic_add_fetch(&rtk_tier.fallbacks, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&rtk_tier.fallback_bytes, n, __ATOMIC_RELAXED);
            note_largest_fallback(n);
        } else {
            __atomic_add_fetch(&rtk_tier.errors_other, 1, __ATOMIC_RELAXED);
        }
        return NULL;
    }
    char *p = rtkit_pmem_ptr(rtk_tier.pool, h);
    char *q = (char *)(((uintptr_t)p + TIER_HDR + a - 1) & ~(uintptr_t)(a - 1));
    uint64_t *hd = (uint64_t *)(q - TIER_HDR);
    hd[0] = n;
    hd[1] = h;
    hd[2] = UINT64_MAX;
    hd[3] = tag_of(h, q);
    uint64_t req, usable;
    if (rtkit_pmem_record_size(rtk_tier.pool, h, &req, &usable) != 0)
        usable = need;
    if ((uint64_t)(p - rtk_tier.base) + usable > rtk_tier.high)
        rtk_tier.high = (uint64_t)(p - rtk_tier.base) + usable;
    if (rtk_tier.live && rtk_tier.nlive < LIVE_CAP) {
        rtk_tier.live[rtk_tier.nlive] = (live_t){p, usable, q, n, 0, 0, 0, ++rtk_tier.born, 0};
        hd[2] = rtk_tier.nlive++;
    } else {
        rtk_tier.live_overflow = 1;  /* an untracked record: the first step mark must not punch around the table */
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    if (zero)
        memset(q, 0, n);  /* a reused extent holds old data */
    __atomic_add_fetch(&rtk_tier.allocs, 1, __ATOMIC_RELAXED);
    if (longlived) {
        __atomic_add_fetch(&rtk_tier.ll_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&rtk_tier.ll_bytes, n, __ATOMIC_RELAXED);
    } else {
        __atomic_add_fetch(&rtk_tier.pre_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&rtk_tier.pre_bytes, n, __ATOMIC_RELAXED);
    }
    add_bytes(n);
    return q;
}

/* the tier header of p (and its record handle in *h), or NULL when p is not a payload this file handed out */
/* *freed: 1 when p is a payload's address whose tag a free cleared (a second free of it) */
static uint64_t *header_of(const void *p, uint64_t *h, int *freed)
{
    *freed = 0;
    if (!rtk_tier.base || ((uintptr_t)p & 15) || (const char *)p < rtk_tier.base + 4096 + TIER_HDR)
        return NULL;
    uint64_t *hd = (uint64_t *)((const char *)p - TIER_HDR);
    *h = hd[1];
    uint64_t tag = __atomic_load_n(&hd[3], __ATOMIC_ACQUIRE);
    if (tag != tag_of(*h, p)) {
        *freed = tag == (tag_of(*h, p) ^ TIER_FREED);
        return NULL;
    }
    return hd;
}

/* Give the whole pages of a freed payload back to the file system (a hole: tmpfs memory or page cache freed),
 * as glibc unmaps a large chunk on free; otherwise every page the pool ever touched stays resident. Done before
 * the record is freed, so no other thread can own it yet. The headers lie below the first whole page. */
static void release_pages(void *p, uint64_t n, uint64_t h)
{
    if (rtk_tier.no_remove || rtk_tier.exiting)
        return;  /* at exit the whole file goes at once */
    /* to the end of the record, not of the payload: file read-ahead may have brought in pages past it */
    uint64_t req, usable;
    uintptr_t end = (uintptr_t)p + n;
    if (rtkit_pmem_record_size(rtk_tier.pool, h, &req, &usable) == 0)
        end = (uintptr_t)rtkit_pmem_ptr(rtk_tier.pool, h) + usable;
    if (rtk_tier_pre) {
        /* graph construction churns the pool: the next record reuses these pages (no new fault, no new dirty
         * page), up to a bound; what is still free at the first step mark is punched then */
        uint64_t span = end - (uintptr_t)p;
        if (__atomic_add_fetch(&rtk_tier.deferred_bytes, span, __ATOMIC_RELAXED) <= TIER_DEFER_MAX) {
            __atomic_add_fetch(&rtk_tier.deferred_frees, 1, __ATOMIC_RELAXED);
            return;
        }
        __atomic_sub_fetch(&rtk_tier.deferred_bytes, span, __ATOMIC_RELAXED);
    }
    uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = end & ~(uintptr_t)4095;
    int rc = hi > lo ? rtk_os_advise((void *)lo, hi - lo, RTK_ADVISE_REMOVE) : 0;
    if (rc != 0) {
        if (rc == -EOPNOTSUPP || rc == -EINVAL)
            rtk_tier.no_remove = 1;  /* the file system cannot punch holes: keep the pages */
        else
            __atomic_add_fetch(&rtk_tier.remove_errors, 1, __ATOMIC_RELAXED);
    }
}

int rtk_tier_free(void *p, size_t n, uint64_t h)
{
    if (__builtin_expect(rtk_tier.state == T_CHILD, 0)) {
        /* a forked child sees a private copy of the pool: giving records back would free the parent's */
        __atomic_add_fetch(&rtk_tier.child_frees, 1, __ATOMIC_RELAXED);
        return 0;
    }
    /* The tag the lookup matched is taken in one step: of two frees of p racing past the lock-free lookup only one
     * claims the record, the other is the program's double free and touches nothing */
    uint64_t *hd = (uint64_t *)((char *)p - TIER_HDR), tag = tag_of(h, p);
    if (!__atomic_compare_exchange_n(&hd[3], &tag, tag ^ TIER_FREED, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&rtk_tier.bad_frees, 1, __ATOMIC_RELAXED);
        return -2;
    }
    if (rtk_tier_pre) {  /* placed before the first step and freed before it: churn, not a table */
        uint64_t freed = __atomic_add_fetch(&rtk_tier.pre_freed_bytes, n, __ATOMIC_RELAXED);
        if (freed >= TIER_CHURN_STOP && freed > __atomic_load_n(&rtk_tier.pre_bytes, __ATOMIC_RELAXED) / 4 * 3)
            __atomic_store_n(&rtk_tier.pre_stopped, 1, __ATOMIC_RELAXED);
    }
    /* Out of the live set, and its head given back, in one hold of the lock: the first mark's heads are made
     * under it, so a record is either seen there whole or not at all. */
    t_in_tier = 1;
    rtk_spin_lock(&rtk_tier.live_lock);
    uint64_t i = hd[2];
    int kept = 0;
    if (rtk_tier.live && i < rtk_tier.nlive && rtk_tier.live[i].payload == (char *)p) {
        kept = rtk_tier_restore_head(&rtk_tier.live[i]) != 0;
        rtk_tier.live[i] = rtk_tier.live[--rtk_tier.nlive];
        if (i < rtk_tier.nlive)
            ((uint64_t *)(rtk_tier.live[i].payload - TIER_HDR))[2] = i;
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
    if (kept) {  /* an anonymous range inside the pool: leaked rather than handed out as pool memory */
        t_in_tier = 0;
        __atomic_add_fetch(&rtk_tier.head_kept_errors, 1, __ATOMIC_RELAXED);
        return 0;
    }
    release_pages(p, n, h);
    rtk_spin_lock(&rtk_tier.live_lock);
    int rc = rtkit_pmem_free(rtk_tier.pool, h);
    rtk_spin_unlock(&rtk_tier.live_lock);
    t_in_tier = 0;
    if (rc != 0) {  /* the pool's own inconsistency, not the program's: counted */
        __atomic_add_fetch(&rtk_tier.bad_frees, 1, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_add_fetch(&rtk_tier.frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&rtk_tier.bytes, n, __ATOMIC_RELAXED);
    return 0;
}

size_t rtk_tier_usable(const void *p, uint64_t *handle, int *freed)
{
    uint64_t *hd = header_of(p, handle, freed);
    return hd ? (size_t)hd[0] : 0;
}

int rtk_tier_keeps(size_t old, size_t n)
{
    /* a mild shrink keeps the record (malloc_usable_size still reports the old size) */
    return n <= old && n >= old / 2 && rtk_tier.state != T_CHILD;
}

