/* alloc.c -- PRMalloc's allocation paths below the entry points: census, arena serving, the large-object heap,
 * tier placement, the fallback stash and glibc; free of rtkit's memory (aborting on a corrupt free, as glibc
 * does); realloc and usable size across all of them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/options.h"
#include "prmalloc/alloc.h"
#include "prmalloc/arenas.h"
#include "prmalloc/init.h"
#include "prmalloc/large.h"
#include "prmalloc/profile.h"
#include "prmalloc/stash.h"
#include "prmalloc/tier.h"

static void *libc_alloc(size_t n, size_t align, int zero)
{
    if (align <= 16)
        return zero ? __libc_calloc(1, n) : __libc_malloc(n);
    void *p = __libc_memalign(align, n);
    if (p && zero)
        memset(p, 0, n);
    return p;
}

/* RTKIT_MALLOC_DEBUG's deeper check: a freed block of rtkit's memory gets its first bytes poisoned; when it
 * is handed out again they must still be poison (or zero: pages given back read as zero), else the program
 * wrote to it after freeing it. Reported with one line, counted; the block is still handed out. */
#define POISON_BYTES RTK_POISON_BYTES
#define POISON RTK_POISON

static void debug_poison(void *p, size_t size)
{
    memset(p, POISON, size < POISON_BYTES ? size : POISON_BYTES);
}

static void debug_check(const void *p, size_t size)
{
    const unsigned char *c = p;
    size_t k = size < POISON_BYTES ? size : POISON_BYTES, poison = 0, zero = 0;
    for (size_t i = 0; i < k; i++) {
        poison += c[i] == POISON;
        zero += c[i] == 0;
    }
    if (poison != k && zero != k && poison) {
        __atomic_add_fetch(&rtk_g.debug_errors, 1, __ATOMIC_RELAXED);
        rtk_log_line("%s: block %p was written after it was freed", rtk_settings[RTK_OPT_MALLOC_DEBUG].env, p);
    }
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
    if (!rtk_hot.inspect || (n < rtk_hot.min_size && !rtk_setting_on(RTK_OPT_MALLOC_CENSUS)))
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
    rtk_arena_t *a = __atomic_load_n(&rtk_cur_arena, __ATOMIC_ACQUIRE);
    if (a) {
        int why;
        void *p = rtk_arena_alloc(a, n, align, &why);
        if (p) {
            s->arena_hits++;
            s->live += (int64_t)rtk_arena_block_size(a, p);
            if (__builtin_expect(rtk_setting_on(RTK_OPT_MALLOC_DEBUG), 0))
                debug_check(p, rtk_arena_block_size(a, p));
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
    if (n >= rtk_g.large_min) {
        /* no planned block: the large-object heap, whose freed pages stay resident across steps */
        size_t u;
        void *p = rtk_large_alloc(n, align, &u);
        if (p) {
            s->large_hits++;
            s->live += (int64_t)u;
            if (__builtin_expect(rtk_setting_on(RTK_OPT_MALLOC_DEBUG), 0))
                debug_check(p, u);
            if (zero)
                memset(p, 0, n);
            if (rtk_prof_active)
                rtk_profile_alloc(p, n, align);
            return p;
        }
    }
    void *p = a ? rtk_stash_pop(n, align) : NULL;
    if (p) {
        s->live += (int64_t)rtk_chunk_bytes(p);
        if (zero)
            memset(p, 0, n);
        return p;
    }
    p = libc_alloc(n, align, zero);
    if (p) {
        s->live += (int64_t)rtk_chunk_bytes(p);
        if (rtk_prof_active)
            rtk_profile_alloc(p, n, align);
    }
    return p;
}

void rtk_heap_corrupt(const char *call, const char *what, const void *p)
{
    __atomic_add_fetch(&rtk_g.debug_errors, 1, __ATOMIC_RELAXED);
    rtk_log_line("%s: %s %p (rtkit's memory); aborting", call, what, p);
    abort();
}

/* a block a planned class holds (it lies in the large heap, its owner word names the class) */
static void free_arena(rtk_arena_t *a, void *p)
{
    size_t bs = rtk_arena_block_size(a, p);
    if (__builtin_expect(rtk_setting_on(RTK_OPT_MALLOC_DEBUG), 0) && rtk_arena_block_live(a, p))
        debug_poison(p, bs);  /* a live block only: a bad free aborts below */
    int r = rtk_arena_free(a, p);
    if (r < 0)
        rtk_heap_corrupt("free()", r == -2 ? "double free of" : "invalid pointer", p);
    rtk_tslot_t *s = rtk_slot();
    s->frees++;
    s->live -= (int64_t)bs;
}

void rtk_free_large(void *p)
{
    rtk_arena_t *a = rtk_arena_of(p);
    if (a) {
        free_arena(a, p);
        return;
    }
    size_t bytes;
    if (rtk_prof_active)
        rtk_profile_free(p);
    if (__builtin_expect(rtk_setting_on(RTK_OPT_MALLOC_DEBUG), 0)) {
        size_t u = rtk_large_usable(p);  /* poison only a live block: a bad free aborts below */
        if (u)
            debug_poison(p, u);
    }
    int r = rtk_large_free(p, &bytes);
    if (r < 0)
        rtk_heap_corrupt("free()", r == -2 ? "double free of" : "invalid pointer", p);
    if (rtk_hot.inspect) {
        rtk_tslot_t *s = rtk_slot();
        s->frees++;
        s->live -= (int64_t)bytes;
    }
}

size_t rtk_usable_size(const void *p)
{
    if (!p)
        return 0;
    if (rtk_in_tier(p))
        return rtk_tier_usable(p);
    if (rtk_in_large(p)) {
        rtk_arena_t *a = rtk_arena_of(p);
        /* a free block has no usable bytes (glibc reports 0 for a free chunk) */
        if (a)
            return rtk_arena_block_live(a, p) ? rtk_arena_block_size(a, p) : 0;
        return rtk_large_usable(p);
    }
    if (rtk_stash_holds(p))
        return 0;
    return rtk_libc_usable(p);
}

/* a tier record: a mild shrink keeps it; otherwise move it (to the pool again only if its new size qualifies) */
static void *tier_realloc(void *p, size_t n)
{
    size_t old;
    int keep = rtk_tier_keeps(p, n, &old);
    if (keep < 0) {
        errno = EINVAL;
        return NULL;
    }
    if (keep)
        return p;
    void *q = rtk_alloc(n, 0, 0);
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    memcpy(q, p, old < n ? old : n);
    rtk_tier_free(p);
    return q;
}

/* realloc that cannot keep the block: a new one from rtk_alloc, the bytes copied, the old one released */
static void *move_block(void *p, size_t old, size_t n, void (*release)(void *))
{
    void *q = rtk_alloc(n, 0, 0);
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    memcpy(q, p, old < n ? old : n);
    release(p);
    return q;
}

/* a large-heap block: resized in place when the heap can (its following pages are free), else moved */
static void *large_realloc(void *p, size_t n)
{
    size_t old = rtk_large_usable(p), u;
    if (!old)
        rtk_heap_corrupt("realloc()", "invalid pointer", p);
    if (n >= rtk_g.large_min && rtk_large_resize(p, n, &u)) {
        if (rtk_hot.inspect)
            rtk_slot()->live += (int64_t)u - (int64_t)old;
        return p;
    }
    return move_block(p, old, n, rtk_free_large);
}

void *rtk_realloc(void *p, size_t n)
{
    if (rtk_hot.mode != RTK_MODE_READY)
        rtk_init();
    if (rtk_in_tier(p))
        return tier_realloc(p, n);
    rtk_arena_t *a = rtk_in_large(p) ? rtk_arena_of(p) : NULL;
    if (rtk_hot.inspect)
        rtk_slot()->realloc_calls++;
    if (a) {
        /* out of or within an arena: keep the block when the new size still fits it and is large */
        size_t old = rtk_arena_block_live(a, p) ? rtk_arena_block_size(a, p) : 0;
        if (!old)  /* a free block (on its class's stack): glibc's "realloc(): invalid pointer" */
            rtk_heap_corrupt("realloc()", "invalid pointer", p);
        if (n <= old && n >= rtk_hot.min_size && !a->retired)
            return p;
        return move_block(p, old, n, rtk_free_large);
    }
    if (rtk_in_large(p))
        return large_realloc(p, n);
    /* a glibc block stays glibc's: it grows in place (or by mremap) wherever glibc can, as without rtkit */
    if (!rtk_hot.inspect || rtk_hot.mode != RTK_MODE_READY)
        return __libc_realloc(p, n);
    if (rtk_stash_holds(p))  /* freed by the program, kept by rtkit: glibc would not know it is free */
        rtk_heap_corrupt("realloc()", "invalid pointer", p);
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
            if (rtk_prof_active)
                rtk_profile_alloc(q, n, 0);
        }
    }
    return q;
}
