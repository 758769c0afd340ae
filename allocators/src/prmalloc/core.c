/* core.c -- PRMalloc's engine: settings, lazy init, the step-mark state machine (warm-up -> profiling -> planned),
 * the large-allocation profiler, arena serving and fallback, plan load/validation, fork handling, exit stats. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/os.h"
#include "prmalloc/core.h"
#include "prmalloc/stats.h"
#include "prmalloc/tier.h"
#include "rtkit/prmalloc.h"

#define EXPORT __attribute__((visibility("default")))

rtk_hot_t rtk_hot __attribute__((aligned(64))) = {
    .fast_max = 0, .arena_lo = UINTPTR_MAX, .arena_span = 0, .track_min = SIZE_MAX, .min_size = SIZE_MAX,
    .any_lo = UINTPTR_MAX, .any_span = 0,
};

rtk_state_t rtk_g;  /* everything the stats writer reports (stats.h) */

static __thread int t_in_init __attribute__((tls_model("initial-exec")));
static rtk_spin_t g_step_lock = RTK_SPIN_INIT;
static rtk_spin_t g_prof_lock = RTK_SPIN_INIT;
static rtk_arena_t *volatile g_cur_arena;    /* serving arena, NULL when none */
static rtk_arena_t *g_arenas[2];             /* current and (at most one) retired arena */

/* ---------------------------------------------------------------- profiler (large allocations only) */
#define PTAB_BITS 16
#define PTAB_CAP (1u << PTAB_BITS)
#define PLOG_CAP (1u << 18)

typedef struct { uintptr_t ptr; uint64_t size; uint32_t align; uint32_t step; } rtk_pent_t;
static rtk_pent_t *g_ptab, *g_ptab_spare;
static unsigned g_pcount;
static rtk_event_t *g_plog;
static unsigned g_nlog;
static uint64_t g_plog_dropped;
static uint32_t g_pstep;                     /* step index the profiler is recording */
static rtk_planner_t g_planner;
static rtk_plan_t g_cand, g_prev;
static int g_streak;
static int g_profiling;                      /* under g_prof_lock: the profiler records */

static inline unsigned ph(uintptr_t p) { return (unsigned)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - PTAB_BITS)); }

static void ptab_insert(rtk_pent_t *tab, unsigned *count, uintptr_t p, uint64_t size, uint32_t align, uint32_t step)
{
    if (*count >= PTAB_CAP / 4 * 3)
        return;  /* table full: this allocation is not profiled (counted as dropped) */
    unsigned i = ph(p);
    while (tab[i].ptr && tab[i].ptr != p)
        i = (i + 1) & (PTAB_CAP - 1);
    if (!tab[i].ptr)
        (*count)++;
    tab[i] = (rtk_pent_t){p, size, align, step};
}

/* linear probing with backward-shift deletion: no tombstones to clean up */
static int ptab_remove(uintptr_t p, rtk_pent_t *out)
{
    unsigned i = ph(p);
    while (g_ptab[i].ptr != p) {
        if (!g_ptab[i].ptr)
            return 0;
        i = (i + 1) & (PTAB_CAP - 1);
    }
    *out = g_ptab[i];
    unsigned j = i;
    for (;;) {
        j = (j + 1) & (PTAB_CAP - 1);
        if (!g_ptab[j].ptr)
            break;
        unsigned k = ph(g_ptab[j].ptr);
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            g_ptab[i] = g_ptab[j];
            i = j;
        }
    }
    g_ptab[i].ptr = 0;
    g_pcount--;
    return 1;
}

static void plog_add(uint64_t size, uint32_t align, uint32_t kind)
{
    if (g_nlog < PLOG_CAP)
        g_plog[g_nlog++] = (rtk_event_t){size, align, kind};
    else
        g_plog_dropped++;
}

static void profile_alloc(void *p, size_t size, size_t align)
{
    rtk_spin_lock(&g_prof_lock);
    if (g_profiling) {
        plog_add(size, (uint32_t)align, 1);
        ptab_insert(g_ptab, &g_pcount, (uintptr_t)p, size, (uint32_t)align, g_pstep);
    }
    rtk_spin_unlock(&g_prof_lock);
}

void rtk_profile_free(void *p)
{
    rtk_pent_t e;
    if (!__atomic_load_n(&g_profiling, __ATOMIC_ACQUIRE))
        return;
    rtk_spin_lock(&g_prof_lock);
    if (g_profiling && ptab_remove((uintptr_t)p, &e))
        plog_add(e.size, e.align, 2);
    rtk_spin_unlock(&g_prof_lock);
}

static int profiler_buffers(void)
{
    if (g_ptab)
        return 0;
    g_ptab = rtk_os_map(sizeof(rtk_pent_t) * PTAB_CAP, 0);
    g_ptab_spare = rtk_os_map(sizeof(rtk_pent_t) * PTAB_CAP, 0);
    g_plog = rtk_os_map(sizeof(rtk_event_t) * PLOG_CAP, 0);
    return (g_ptab && g_ptab_spare && g_plog) ? 0 : -1;
}

/* ---------------------------------------------------------------- arenas */
static void publish_range(void)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < 2; i++)
        if (g_arenas[i]) {
            uintptr_t b = (uintptr_t)g_arenas[i]->base;
            if (b < lo)
                lo = b;
            if (b + g_arenas[i]->span > hi)
                hi = b + g_arenas[i]->span;
        }
    /* widen first (span from the new low), so a reader never sees a range missing a live arena */
    if (hi) {
        __atomic_store_n(&rtk_hot.arena_span, (uintptr_t)-1 / 2, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.arena_lo, lo, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.arena_span, hi - lo, __ATOMIC_RELEASE);
    }
    rtk_publish_any();
}

void rtk_publish_any(void)
{
    static rtk_spin_t lock = RTK_SPIN_INIT;
    rtk_spin_lock(&lock);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    uintptr_t al = __atomic_load_n(&rtk_hot.arena_lo, __ATOMIC_ACQUIRE), as = __atomic_load_n(&rtk_hot.arena_span, __ATOMIC_ACQUIRE);
    uintptr_t tl = __atomic_load_n(&rtk_hot.tier_lo, __ATOMIC_ACQUIRE), ts = __atomic_load_n(&rtk_hot.tier_span, __ATOMIC_ACQUIRE);
    if (as) {
        lo = al;
        hi = al + as;
    }
    if (ts) {
        if (tl < lo)
            lo = tl;
        if (tl + ts > hi)
            hi = tl + ts;
    }
    if (hi) {
        __atomic_store_n(&rtk_hot.any_span, (uintptr_t)-1 / 2, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.any_lo, lo, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.any_span, hi - lo, __ATOMIC_RELEASE);
    }
    rtk_spin_unlock(&lock);
}

rtk_arena_t *rtk_arena_of(const void *p)
{
    for (int i = 0; i < 2; i++) {
        rtk_arena_t *a = g_arenas[i];
        if (a && (const char *)p >= a->base && (const char *)p < a->base + a->span)
            return a;
    }
    return NULL;
}

static int install_arena(const rtk_plan_t *plan)
{
    rtk_arena_t *a = rtk_arena_create(plan, rtk_g.cfg.thp, rtk_g.cfg.debug);
    if (!a)
        return -1;
    int slot = g_arenas[0] ? 1 : 0;
    if (g_arenas[slot]) {
        /* already one retired arena: retire no further; drop the new one rather than leak more */
        rtk_os_unmap(a->base, a->span);
        rtk_os_unmap(a, a->meta_size);
        return -1;
    }
    g_arenas[slot] = a;
    publish_range();
    __atomic_store_n(&g_cur_arena, a, __ATOMIC_RELEASE);
    return 0;
}

static void retire_arena(void)
{
    rtk_arena_t *a = g_cur_arena;
    if (a) {
        a->retired = 1;
        __atomic_store_n(&g_cur_arena, NULL, __ATOMIC_RELEASE);
    }
}

/* ---------------------------------------------------------------- fallback stash
 * A class that runs out after the plan (a step keeps one block more live than the profile saw: TF ordering ops
 * differently under load) falls back to glibc every step. glibc serves such a block by mmap, or from a heap
 * top it trims again at free once several are freed together, so each recurrence faults the block in anew
 * (measured: 3 extra 2 MiB blocks a step = 2016 faults a step). Once planned, frees of glibc chunks at or
 * above min_size and no larger than twice the largest class are kept here (at most RTK_STASH) and handed to
 * the next fallback they fit: recurring fallbacks fault once, not every step. Memory held: at most RTK_STASH
 * blocks and max(plan's reserved bytes, 64 MiB), blocks that were live at the same time anyway (peak unchanged). */
#define RTK_STASH 16
static rtk_spin_t g_stash_lock = RTK_SPIN_INIT;
static void *g_stash[RTK_STASH];
static size_t g_stash_size[RTK_STASH];  /* usable bytes */
static int g_nstash;
static int g_stash_on;
static size_t g_stash_max;
static size_t g_stash_bytes, g_stash_cap;  /* usable bytes held, and their bound */

static void stash_enable(const rtk_plan_t *p)
{
    size_t top = 0;
    for (int i = 0; i < p->nclasses; i++)
        if (p->cls[i].size > top)
            top = p->cls[i].size;
    g_stash_max = 2 * top;
    g_stash_cap = p->reserved > ((size_t)64 << 20) ? p->reserved : (size_t)64 << 20;
    __atomic_store_n(&g_stash_on, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_hot.track_min, rtk_g.cfg.min_size, __ATOMIC_RELEASE);  /* large frees: ask the stash */
}

/* empty the stash into glibc (profiling again: the blocks must not hide from the new profile) */
static void stash_disable(void)
{
    __atomic_store_n(&g_stash_on, 0, __ATOMIC_RELEASE);
    for (;;) {
        void *p = NULL;
        rtk_spin_lock(&g_stash_lock);
        if (g_nstash) {
            p = g_stash[--g_nstash];
            g_stash_bytes -= g_stash_size[g_nstash];
        }
        rtk_spin_unlock(&g_stash_lock);
        if (!p)
            break;
        __libc_free(p);
    }
}

int rtk_stash_push(void *p, size_t cs)
{
    if (!__atomic_load_n(&g_stash_on, __ATOMIC_ACQUIRE) || cs > g_stash_max + 4096)
        return 0;
    int kept = 0;
    rtk_spin_lock(&g_stash_lock);
    size_t usable = rtk_libc_usable(p);
    if (g_nstash < RTK_STASH && g_stash_bytes + usable <= g_stash_cap) {
        g_stash[g_nstash] = p;
        g_stash_size[g_nstash++] = usable;
        g_stash_bytes += usable;
        kept = 1;
    }
    rtk_spin_unlock(&g_stash_lock);
    return kept;
}

/* the most recently kept block that fits n at align without wasting more than n */
static void *stash_pop(size_t n, size_t align)
{
    if (!__atomic_load_n(&g_nstash, __ATOMIC_ACQUIRE))
        return NULL;
    void *p = NULL;
    size_t mask = align > 16 ? align - 1 : 15;
    rtk_spin_lock(&g_stash_lock);
    for (int i = g_nstash - 1; i >= 0; i--) {
        if (g_stash_size[i] >= n && g_stash_size[i] - n <= n && !((uintptr_t)g_stash[i] & mask)) {
            p = g_stash[i];
            g_stash_bytes -= g_stash_size[i];
            g_stash[i] = g_stash[g_nstash - 1];
            g_stash_size[i] = g_stash_size[g_nstash - 1];
            g_nstash--;
            break;
        }
    }
    rtk_spin_unlock(&g_stash_lock);
    if (p)
        __atomic_add_fetch(&rtk_g.fallback_reused, 1, __ATOMIC_RELAXED);
    return p;
}

/* ---------------------------------------------------------------- allocation paths */
static void *libc_alloc(size_t n, size_t align, int zero)
{
    if (align <= 16)
        return zero ? __libc_calloc(1, n) : __libc_malloc(n);
    void *p = __libc_memalign(align, n);
    if (p && zero)
        memset(p, 0, n);
    return p;
}

void *rtk_alloc(size_t n, size_t align, int zero)
{
    if (__builtin_expect(rtk_hot.mode != RTK_MODE_READY, 0)) {
        rtk_init();
        if (rtk_hot.mode != RTK_MODE_READY)  /* re-entered from inside init: straight to glibc */
            return libc_alloc(n, align, zero);
    }
    if (__builtin_expect(n >= rtk_tier_min, 0) && rtk_tier_pre) {
        void *p = rtk_tier_alloc(n, align, zero, 0);  /* tier mode: made before the first step mark */
        if (p)
            return p;
    }
    if (!rtk_hot.inspect || (n < rtk_hot.min_size && !rtk_g.cfg.census))
        return libc_alloc(n, align, zero);  /* RTKIT_MALLOC_CENSUS=0: small requests are not counted */
    rtk_tslot_t *s = rtk_slot();
    unsigned b = rtk_bucket(n);
    s->count[b]++;
    s->bytes[b] += n;
    if (n < rtk_hot.min_size) {
        void *p = libc_alloc(n, align, zero);
        if (p)
            s->live += (int64_t)rtk_chunk_bytes(p);
        return p;
    }
    rtk_arena_t *a = __atomic_load_n(&g_cur_arena, __ATOMIC_ACQUIRE);
    if (a) {
        int why;
        void *p = rtk_arena_alloc(a, n, align, &why);
        if (p) {
            s->arena_hits++;
            s->live += (int64_t)rtk_arena_block_size(a, p);
            if (zero)
                memset(p, 0, n);
            return p;
        }
        if (why == RTK_ARENA_EXHAUSTED)
            s->arena_exhausted++;
        else
            s->arena_misses++;
    }
    if (__builtin_expect(n >= rtk_tier_min, 0)) {
        /* tier mode: a size the profiler saw outlive steps. After the arena: its blocks are DRAM that is
         * reserved anyway, so the pool only takes what would otherwise grow glibc's heap */
        void *p = rtk_tier_alloc(n, align, zero, 1);
        if (p)
            return p;
    }
    s->fallbacks++;
    void *p = a ? stash_pop(n, align) : NULL;
    if (p) {
        s->live += (int64_t)rtk_chunk_bytes(p);
        if (zero)
            memset(p, 0, n);
        return p;
    }
    p = libc_alloc(n, align, zero);
    if (p) {
        s->live += (int64_t)rtk_chunk_bytes(p);
        if (g_profiling)
            profile_alloc(p, n, align);
    }
    return p;
}

void rtk_free_range(void *p)
{
    rtk_arena_t *a = rtk_arena_of(p);
    if (!a) {
        /* a glibc pointer that happens to lie between two arenas */
        if (rtk_hot.inspect) {
            size_t cs = rtk_chunk_bytes(p);
            rtk_tslot_t *s = rtk_slot();
            s->frees++;
            s->live -= (int64_t)cs;
            if (cs >= rtk_hot.track_min) {
                rtk_profile_free(p);
                if (rtk_stash_push(p, cs))
                    return;
            }
        }
        __libc_free(p);
        return;
    }
    size_t bs = rtk_arena_block_size(a, p);
    int r = rtk_arena_free(a, p);
    if (r == 0) {
        rtk_tslot_t *s = rtk_slot();
        s->frees++;
        s->live -= (int64_t)bs;
    } else if (rtk_g.cfg.debug) {
        rtk_log_line("RTKIT_MALLOC_DEBUG: %s of %p inside the arena ignored",
                     r == -2 ? "double free" : "free of a pointer that is not a block start", p);
        __atomic_add_fetch(&rtk_g.debug_errors, 1, __ATOMIC_RELAXED);
    } else {
        __atomic_add_fetch(&rtk_g.debug_errors, 1, __ATOMIC_RELAXED);
    }
}

size_t rtk_usable_size(const void *p)
{
    if (!p)
        return 0;
    if (rtk_in_tier(p))
        return rtk_tier_usable(p);
    if (rtk_in_range(p)) {
        rtk_arena_t *a = rtk_arena_of(p);
        if (a)
            return rtk_arena_block_size(a, p);
    }
    return rtk_libc_usable(p);
}

void *rtk_realloc(void *p, size_t n)
{
    if (rtk_hot.mode != RTK_MODE_READY)
        rtk_init();
    if (rtk_in_tier(p))
        return rtk_tier_realloc(p, n);
    rtk_arena_t *a = rtk_in_range(p) ? rtk_arena_of(p) : NULL;
    if (rtk_hot.inspect)
        rtk_slot()->realloc_calls++;
    if (a || (rtk_hot.inspect && n >= rtk_hot.min_size && g_cur_arena)) {
        /* into, out of or within an arena: keep the block when the new size still fits it and is large */
        size_t old = a ? rtk_arena_block_size(a, p) : rtk_libc_usable(p);
        if (a && n <= old && n >= rtk_hot.min_size && !a->retired)
            return p;
        void *q = rtk_alloc(n, 0, 0);
        if (!q) {
            errno = ENOMEM;
            return NULL;
        }
        memcpy(q, p, old < n ? old : n);
        if (a)
            rtk_free_range(p);
        else {
            rtk_tslot_t *s = rtk_slot();
            size_t cs = rtk_chunk_bytes(p);
            s->frees++;
            s->live -= (int64_t)cs;
            if (cs >= rtk_hot.track_min) {
                rtk_profile_free(p);
                if (rtk_stash_push(p, cs))
                    return q;
            }
            __libc_free(p);
        }
        return q;
    }
    if (!rtk_hot.inspect || rtk_hot.mode != RTK_MODE_READY)
        return __libc_realloc(p, n);
    size_t old_cs = rtk_chunk_bytes(p);
    if (old_cs >= rtk_hot.track_min)
        rtk_profile_free(p);
    void *q = __libc_realloc(p, n);
    rtk_tslot_t *s = rtk_slot();
    unsigned b = rtk_bucket(n);
    s->count[b]++;
    s->bytes[b] += n;
    if (q) {
        s->live += (int64_t)rtk_chunk_bytes(q) - (int64_t)old_cs;
        if (n >= rtk_hot.min_size) {
            s->fallbacks++;
            if (g_profiling)
                profile_alloc(q, n, 0);
        }
    }
    return q;
}

/* ---------------------------------------------------------------- settings and init */
static void read_settings(void)
{
    rtk_config_t *c = &rtk_g.cfg;
    int on = 1, b;
    long v;
    size_t sz;
    rtk_env_set_fallback_note("the allocator runs as a plain pass-through");
#define SINK() rtk_env_set_error_sink(rtk_g.errors[rtk_g.nerrors < RTK_MAX_ERRORS ? rtk_g.nerrors : RTK_MAX_ERRORS - 1], \
                                      sizeof rtk_g.errors[0])
#define BAD(call) do { SINK(); if ((call) != 0 && rtk_g.nerrors < RTK_MAX_ERRORS) rtk_g.nerrors++; } while (0)
    BAD(rtk_env_bool("RTKIT_MALLOC", 1, &on));
    c->enabled = on;
    BAD(rtk_env_int("RTKIT_MALLOC_PROFILE_START", 2, 0, INT_MAX, &v)); c->profile_start = v;
    BAD(rtk_env_int("RTKIT_MALLOC_PROFILE_STABLE", 3, 1, INT_MAX, &v)); c->profile_stable = v;
    BAD(rtk_env_int("RTKIT_MALLOC_PROFILE_MAX", 20, 1, INT_MAX, &v)); c->profile_max = v;
    BAD(rtk_env_size("RTKIT_MALLOC_MIN_SIZE", 32 << 10, 16, SIZE_MAX, &sz)); c->min_size = sz;
    BAD(rtk_env_size("RTKIT_MALLOC_ARENA_LIMIT", (size_t)4 << 30, 0, SIZE_MAX, &sz)); c->arena_limit = sz;
    BAD(rtk_env_bool("RTKIT_MALLOC_THP", 1, &b)); c->thp = b;
    BAD(rtk_env_bool("RTKIT_MALLOC_CENSUS", 1, &b)); c->census = b;
    BAD(rtk_env_bool("RTKIT_MALLOC_DEBUG", 0, &b)); c->debug = b;
    rtk_env_set_error_sink(NULL, 0);
    const char *plan = rtk_env_str("RTKIT_MALLOC_PLAN");
    if (plan)
        snprintf(c->plan_path, sizeof c->plan_path, "%s", plan);
    const char *dir = rtk_env_str("RTKIT_RUN_DIR");
    if (dir)
        snprintf(c->run_dir, sizeof c->run_dir, "%s", dir);
}

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);
static void start_profiling(uint32_t step);
static void load_plan(void);

static void do_init(void)
{
    /* The first preloaded process of a tree marks itself in the environment its children inherit: only it
     * reports a bad setting on stderr and writes a stats file without step marks (helpers such as `uname`
     * spawned by the job stay silent). setenv may allocate: re-entry goes to glibc while t_in_init is set. */
    rtk_g.pid = getpid();
    const char *root = getenv("_RTKIT_MALLOC_ROOT");
    rtk_g.is_root = !root || atol(root) == (long)rtk_g.pid;
    if (!root) {
        char b[32];
        snprintf(b, sizeof b, "%ld", (long)rtk_g.pid);
        setenv("_RTKIT_MALLOC_ROOT", b, 1);
    }
    rtk_env_set_quiet(1);
    read_settings();
    rtk_tier_read_settings();
    rtk_env_set_quiet(0);
    if (rtk_g.nerrors && rtk_g.is_root) {
        /* shells (pyenv shims) do not pass our marker on: with a run directory, a marker file there makes
         * the report once per run */
        int say = 1;
        if (rtk_g.cfg.run_dir[0]) {
            char marker[sizeof rtk_g.cfg.run_dir + 40];
            snprintf(marker, sizeof marker, "%s/.malloc-settings-reported", rtk_g.cfg.run_dir);
            int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            say = fd >= 0 || errno != EEXIST;
            if (fd >= 0)
                close(fd);
        }
        for (int i = 0; say && i < rtk_g.nerrors; i++)
            rtk_log_line("%s", rtk_g.errors[i]);
    }
    rtk_g.plan_source = "none";
    rtk_g.profile_reason = "";
    rtk_log_set_debug(rtk_g.cfg.debug);
    if (!rtk_g.cfg.enabled) {
        rtk_g.state = RTK_STATE_OFF;
        return;
    }
    if (rtk_g.nerrors) {
        rtk_g.state = RTK_STATE_DISABLED;  /* bad setting: plain pass-through, the stats file says why */
        return;
    }
    if (rtk_census_init() != 0) {
        rtk_g.state = RTK_STATE_DISABLED;
        return;
    }
    pthread_atfork(fork_prepare, fork_parent, fork_child);  /* may allocate: re-entry goes to glibc */
    rtk_g.state = RTK_STATE_PASSTHROUGH;
    rtk_g.faults_mark = rtk_os_minor_faults();
    rtk_hot.min_size = rtk_g.cfg.min_size;
    rtk_hot.inspect = 1;
    /* the inline small path assumes heap chunks: keep it under glibc's smallest mmap threshold (128 KiB) */
    rtk_hot.fast_max = rtk_g.cfg.census ? (rtk_g.cfg.min_size < (128u << 10) ? rtk_g.cfg.min_size : (128u << 10)) : 0;
    if (rtk_hot.fast_max > rtk_tier_min)
        rtk_hot.fast_max = rtk_tier_min;  /* the inline small path never reaches the tier */
    if (!rtk_g.cfg.census)  /* nothing to count below min_size: straight to glibc (rtk_alloc would do the same) */
        rtk_hot.pass_max = rtk_g.cfg.min_size < rtk_tier_min ? rtk_g.cfg.min_size : rtk_tier_min;
    if (rtk_g.cfg.plan_path[0])
        load_plan();
    if (rtk_g.state == RTK_STATE_PASSTHROUGH && rtk_g.cfg.profile_start == 0)
        start_profiling(0);
}

void rtk_init(void)
{
    int expect = RTK_MODE_UNINIT;
    if (__atomic_compare_exchange_n(&rtk_hot.mode, &expect, RTK_MODE_INITIALIZING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        t_in_init = 1;
        do_init();
        t_in_init = 0;
        __atomic_store_n(&rtk_hot.mode, RTK_MODE_READY, __ATOMIC_RELEASE);
        return;
    }
    if (t_in_init)
        return;
    while (__atomic_load_n(&rtk_hot.mode, __ATOMIC_ACQUIRE) != RTK_MODE_READY)
        rtk_cpu_relax();
}

__attribute__((constructor)) static void rtk_ctor(void)
{
    if (rtk_hot.mode == RTK_MODE_UNINIT)
        rtk_init();
}

/* ---------------------------------------------------------------- plan file */
static char g_plan_text[64 << 10];

static void load_plan(void)
{
    char why[200] = "";
    snprintf(rtk_g.plan_path, sizeof rtk_g.plan_path, "%s", rtk_g.cfg.plan_path);
    long n = rtk_os_read_file(rtk_g.cfg.plan_path, g_plan_text, sizeof g_plan_text);
    rtk_plan_t *p = &rtk_g.plan;
    if (n < 0) {
        snprintf(rtk_g.rejected_reason, sizeof rtk_g.rejected_reason, "cannot read plan file: %s", strerror((int)-n));
    } else if (rtk_plan_parse(g_plan_text, p, why, sizeof why) != 0) {
        snprintf(rtk_g.rejected_reason, sizeof rtk_g.rejected_reason, "%s", why);
        p->nclasses = 0;
    } else {
        size_t page = rtk_os_page_size();
        if (rtk_plan_trim(p, rtk_g.cfg.arena_limit, page) < 1 || p->nclasses == 0) {
            snprintf(rtk_g.rejected_reason, sizeof rtk_g.rejected_reason,
                     "plan does not fit RTKIT_MALLOC_ARENA_LIMIT=%zu", rtk_g.cfg.arena_limit);
            p->nclasses = 0;
        } else if (install_arena(p) != 0) {
            snprintf(rtk_g.rejected_reason, sizeof rtk_g.rejected_reason, "arena reservation of %zu bytes failed",
                     p->reserved);
            p->nclasses = 0;
        } else {
            rtk_g.plan_source = "loaded";
            rtk_g.state = RTK_STATE_PLANNED;
            stash_enable(p);
            rtk_g.profile_reason = "loaded";
            rtk_g.plan_step = 0;
            rtk_g.validating = 1;
            rtk_g.faults_after_start = rtk_os_minor_faults();
            return;
        }
    }
    if (rtk_g.cfg.debug)
        rtk_log_line("RTKIT_MALLOC_PLAN=%s ignored: %s", rtk_g.cfg.plan_path, rtk_g.rejected_reason);
}

static void save_plan(void)
{
    if (!rtk_g.cfg.run_dir[0] || !rtk_g.plan.nclasses)
        return;
    char path[sizeof rtk_g.cfg.run_dir + 32];
    snprintf(path, sizeof path, "%s/malloc-plan.txt", rtk_g.cfg.run_dir);
    int n = rtk_plan_format(&rtk_g.plan, rtk_g.cfg.min_size, g_plan_text, sizeof g_plan_text);
    if (n > 0 && rtk_os_write_file_atomic(path, g_plan_text, (size_t)n) == 0)
        snprintf(rtk_g.plan_path, sizeof rtk_g.plan_path, "%s", path);
}

/* ---------------------------------------------------------------- step marks */
static void start_profiling(uint32_t step)
{
    if (profiler_buffers() != 0) {
        rtk_g.profile_reason = "profiler buffers could not be mapped";
        return;
    }
    stash_disable();
    rtk_spin_lock(&g_prof_lock);
    g_profiling = 1;
    rtk_planner_reset(&g_planner);
    g_prev.nclasses = -1;
    g_streak = 0;
    g_nlog = 0;
    g_pstep = step;
    memset(g_ptab, 0, sizeof(rtk_pent_t) * PTAB_CAP);
    g_pcount = 0;
    rtk_g.state = RTK_STATE_PROFILING;
    rtk_g.profile_start_step = step;
    rtk_g.profile_reason = "";
    rtk_g.faults_before_start = rtk_os_minor_faults();
    rtk_g.faults_before_steps = 0;
    __atomic_store_n(&rtk_hot.track_min, rtk_g.cfg.min_size, __ATOMIC_RELEASE);
    rtk_spin_unlock(&g_prof_lock);
}

/* Close one profiled step: feed its events to the planner and carry over what is still live. Allocations of
 * this step that outlive it are replayed as live from the start of the next; older ones are long-lived
 * (weights, caches) and leave the profile: an arena block would sit idle under them. */
static void profile_close_step(uint32_t next_step)
{
    rtk_spin_lock(&g_prof_lock);
    rtk_planner_add_step(&g_planner, g_plog, g_nlog);
    g_nlog = 0;
    rtk_pent_t *old = g_ptab, *tab = g_ptab_spare;
    unsigned count = 0;
    for (unsigned i = 0; i < PTAB_CAP; i++) {
        if (old[i].ptr && old[i].step == g_pstep) {
            ptab_insert(tab, &count, old[i].ptr, old[i].size, old[i].align, next_step);
            plog_add(old[i].size, old[i].align, 1);
            if (rtk_tier_min != SIZE_MAX)
                rtk_tier_note_carried(old[i].ptr, old[i].size);  /* tier mode: carried twice = long-lived */
        }
    }
    if (rtk_tier_min != SIZE_MAX)
        rtk_tier_carry_done();
    memset(old, 0, sizeof(rtk_pent_t) * PTAB_CAP);
    g_ptab = tab;
    g_ptab_spare = old;
    g_pcount = count;
    g_pstep = next_step;
    rtk_spin_unlock(&g_prof_lock);
}

static void finish_profiling(uint32_t step, const char *reason)
{
    size_t page = rtk_os_page_size();
    __atomic_store_n(&rtk_hot.track_min, SIZE_MAX, __ATOMIC_RELEASE);
    rtk_spin_lock(&g_prof_lock);
    g_profiling = 0;
    rtk_spin_unlock(&g_prof_lock);
    rtk_tier_plan_ready();
    rtk_g.profile_end_step = step;
    rtk_g.profile_reason = reason;
    rtk_g.profiled_steps = (uint32_t)g_planner.steps;
    memcpy(&rtk_g.plan, &g_cand, sizeof g_cand);
    if (rtk_g.plan.reserved > rtk_g.cfg.arena_limit) {
        rtk_plan_trim(&rtk_g.plan, rtk_g.cfg.arena_limit, page);
        rtk_g.plan_trimmed = 1;
    }
    if (rtk_g.plan.nclasses == 0) {
        rtk_g.state = RTK_STATE_PASSTHROUGH;
        rtk_g.plan_source = "none";
        if (!rtk_g.plan_trimmed)
            rtk_g.profile_reason = "no recurring allocation at or above min_size";
        return;
    }
    /* Between steps the profiled tensors are free but glibc keeps their pages; the arena takes over their
     * sizes, so give those pages back before pre-faulting it, or the job holds both at the switch. */
    malloc_trim(0);
    if (install_arena(&rtk_g.plan) != 0) {
        rtk_g.state = RTK_STATE_PASSTHROUGH;
        rtk_g.plan_source = "none";
        rtk_g.profile_reason = "arena reservation failed";
        rtk_g.plan.nclasses = 0;
        return;
    }
    rtk_g.state = RTK_STATE_PLANNED;
    rtk_g.plan_source = "profiled";
    rtk_g.plan_step = step;
    stash_enable(&rtk_g.plan);
    save_plan();
    rtk_g.faults_after_start = rtk_os_minor_faults();
}

/* A loaded plan must earn its place: over the check window its arenas must serve at least half of the
 * allocations at or above min_size; otherwise it is retired and the job is profiled afresh. */
static void validate_loaded(const rtk_totals_t *t, uint32_t steps)
{
    uint32_t begin = (uint32_t)rtk_g.cfg.profile_start, end = begin + (uint32_t)rtk_g.cfg.profile_stable;
    if (steps == begin) {
        rtk_g.val_hits0 = t->arena_hits;
        rtk_g.val_large0 = t->arena_hits + t->fallbacks;
    }
    if (steps < end)
        return;
    rtk_g.validating = 0;
    uint64_t hits = t->arena_hits - rtk_g.val_hits0, large = t->arena_hits + t->fallbacks - rtk_g.val_large0;
    const char *what = NULL;
    if (large == 0)
        what = "sizes absent";
    else if (hits * 2 < large)
        what = "hit rate too low";
    if (!what)
        return;
    snprintf(rtk_g.rejected_reason, sizeof rtk_g.rejected_reason,
             "loaded plan does not match the job (%s): arenas served %llu of %llu allocations >= min_size in steps %u..%u",
             what, (unsigned long long)hits, (unsigned long long)large, begin, end - 1);
    retire_arena();
    rtk_g.plan_hits0 = t->arena_hits;
    rtk_g.plan_large0 = t->arena_hits + t->fallbacks;
    rtk_g.plan_source = "none";
    rtk_g.plan.nclasses = 0;
    start_profiling(steps);
}

static int stats_due(uint64_t now)
{
    if (!rtk_g.cfg.run_dir[0])
        return 0;
    return now - rtk_g.last_write_ns >= 500000000ull;
}

EXPORT void rtkit_step_mark(void)
{
    if (rtk_hot.mode != RTK_MODE_READY)
        rtk_init();
    rtk_tier_step_mark();
    if (rtk_hot.mode != RTK_MODE_READY || rtk_g.state == RTK_STATE_OFF || rtk_g.state == RTK_STATE_DISABLED) {
        if (rtk_g.state == RTK_STATE_DISABLED)
            __atomic_add_fetch(&rtk_g.steps, 1, __ATOMIC_RELAXED);
        return;
    }
    rtk_spin_lock(&g_step_lock);
    rtk_totals_t t;
    rtk_census_sum(&t);
    uint64_t faults = rtk_os_minor_faults();
    uint32_t steps = ++rtk_g.steps;          /* the step that just ended has index steps - 1 */
    rtk_step_t *e = &rtk_g.ring[(steps - 1) % RTK_RING_STEPS];
    e->step = steps - 1;
    e->allocs = t.allocs - rtk_g.last.allocs;
    e->frees = t.frees - rtk_g.last.frees;
    e->bytes = t.bytes - rtk_g.last.bytes;
    e->live = t.live;
    e->arena_hits = t.arena_hits - rtk_g.last.arena_hits;
    e->fallbacks = t.fallbacks - rtk_g.last.fallbacks;
    e->minor_faults = faults - rtk_g.faults_mark;
    if (rtk_g.state == RTK_STATE_PROFILING) {
        rtk_g.faults_before_sum += e->minor_faults;
        rtk_g.faults_before_steps++;
    } else if (rtk_g.state == RTK_STATE_PLANNED) {
        rtk_g.faults_after_sum += e->minor_faults;
        rtk_g.faults_after_steps++;
    }
    rtk_g.last = t;
    if (t.live > rtk_g.peak_live)
        rtk_g.peak_live = t.live;
    int force = 0;
    if (rtk_g.state == RTK_STATE_PASSTHROUGH && !rtk_g.profile_done && steps == (uint32_t)rtk_g.cfg.profile_start) {
        start_profiling(steps);
    } else if (rtk_g.state == RTK_STATE_PROFILING) {
        profile_close_step(steps);
        size_t page = rtk_os_page_size();
        rtk_planner_best(&g_planner, page, &g_cand);
        if (g_cand.nclasses > 0 && rtk_plan_equal(&g_cand, &g_prev))
            g_streak++;
        else
            g_streak = g_cand.nclasses > 0 ? 1 : 0;
        memcpy(&g_prev, &g_cand, sizeof g_cand);
        rtk_g.plan_hits0 = t.arena_hits;
        rtk_g.plan_large0 = t.arena_hits + t.fallbacks;
        if (g_streak >= rtk_g.cfg.profile_stable) {
            finish_profiling(steps, "stable");
            rtk_g.profile_done = 1;
            force = 1;
        } else if (g_planner.steps >= rtk_g.cfg.profile_max) {
            finish_profiling(steps, "max_steps");
            rtk_g.profile_done = 1;
            force = 1;
        }
    } else if (rtk_g.state == RTK_STATE_PLANNED && rtk_g.validating) {
        validate_loaded(&t, steps);
        force = 1;
    }
    rtk_g.faults_mark = rtk_os_minor_faults();  /* after any arena pre-faulting done by this mark */
    uint64_t now = rtk_os_now_ns();
    if (force || stats_due(now))
        rtk_stats_write_locked(now);
    rtk_spin_unlock(&g_step_lock);
}

EXPORT int rtkit_malloc_state(void)
{
    if (rtk_hot.mode != RTK_MODE_READY)
        rtk_init();
    switch (rtk_g.state) {
    case RTK_STATE_PROFILING: return 2;
    case RTK_STATE_PLANNED: return 3;
    case RTK_STATE_PASSTHROUGH: return 1;
    default: return 0;
    }
}

EXPORT int rtkit_malloc_in_arena(const void *p)
{
    return p && rtk_in_range(p) && rtk_arena_of(p) != NULL;
}

EXPORT int rtkit_malloc_in_pmem(const void *p)
{
    return p && rtk_in_tier(p) && rtk_tier_usable(p) != 0;
}

EXPORT int rtkit_malloc_write_stats(void)
{
    if (rtk_hot.mode != RTK_MODE_READY)
        rtk_init();
    if (rtk_g.state == RTK_STATE_OFF || !rtk_g.cfg.run_dir[0])
        return -1;
    rtk_spin_lock(&g_step_lock);
    if (rtk_g.state != RTK_STATE_DISABLED)
        rtk_census_sum(&rtk_g.last);
    int r = rtk_stats_write_locked(rtk_os_now_ns());
    rtk_spin_unlock(&g_step_lock);
    return r;
}

__attribute__((destructor)) static void rtk_dtor(void)
{
    if (rtk_hot.mode != RTK_MODE_READY || rtk_g.state == RTK_STATE_OFF || !rtk_g.cfg.run_dir[0])
        goto out;
    if (rtk_g.steps == 0 && (rtk_g.forked || !rtk_g.is_root))
        goto out;  /* a helper process that never marked a step: the job's own file tells the story */
    rtkit_malloc_write_stats();
out:
    rtk_tier_exit();
}

/* ---------------------------------------------------------------- fork */
static void fork_prepare(void)
{
    rtk_spin_lock(&g_step_lock);
    rtk_census_fork_prepare();
    rtk_spin_lock(&g_prof_lock);
    rtk_spin_lock(&g_stash_lock);
    for (int i = 0; i < 2; i++)
        rtk_arena_lock_all(g_arenas[i]);
}

static void fork_parent(void)
{
    for (int i = 1; i >= 0; i--)
        rtk_arena_unlock_all(g_arenas[i]);
    rtk_spin_unlock(&g_stash_lock);
    rtk_spin_unlock(&g_prof_lock);
    rtk_census_fork_parent();
    rtk_spin_unlock(&g_step_lock);
}

static void fork_child(void)
{
    for (int i = 0; i < 2; i++)
        rtk_arena_reset_locks(g_arenas[i]);
    rtk_spin_reset(&g_stash_lock);
    rtk_spin_reset(&g_prof_lock);
    rtk_census_fork_child();
    rtk_spin_reset(&g_step_lock);
    rtk_tier_fork_child();
    rtk_g.forked = 1;
    rtk_g.pid = getpid();
    rtk_g.is_root = 0;
    rtk_g.last_write_ns = 0;
}
