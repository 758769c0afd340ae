/* alloc.c -- PRMalloc's allocation paths below the entry points: census, arena serving, the large-object heap,
 * tier placement, the fallback stash and glibc; free of rtkit's memory (aborting on a corrupt free, as glibc
 * does); realloc and usable size across all of them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/options.h"
#include "prmalloc/alloc.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/init.h"
#include "prmalloc/large.h"
#include "prmalloc/owner.h"
#include "prmalloc/profile.h"
#include "prmalloc/fallback_stash.h"
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
        __atomic_add_fetch(&rtk_engine.debug_errors, 1, __ATOMIC_RELAXED);
        rtk_log_line("%s: block %p was written after it was freed", rtk_settings[RTK_OPT_MALLOC_DEBUG].env, p);
    }
}

void *rtk_alloc(size_t n, size_t align, int zero)
{
    if (__builtin_expect(rtk_fastpath.mode != RTK_MODE_READY, 0)) {
        rtk_init();
        if (rtk_fastpath.mode != RTK_MODE_READY)  /* re-entered from inside init: straight to glibc */
            return libc_alloc(n, align, zero);
    }
    if (__builtin_expect(n >= rtk_tier_min, 0) && rtk_tier_pre) {
        void *p = rtk_tier_alloc(n, align, zero, 0);  /* tier mode: made before the first step mark */
        if (p)
            return p;
    }
    if (!rtk_fastpath.inspect || (n < rtk_fastpath.min_size && !rtk_setting_on(RTK_OPT_MALLOC_CENSUS)))
        return libc_alloc(n, align, zero);  /* RTKIT_MALLOC_CENSUS=0: small requests are not counted */
    rtk_tslot_t *s = rtk_slot();
    unsigned b = rtk_bucket(n);
    s->count[b]++;
    s->bytes[b] += n;
    if (n < rtk_fastpath.min_size) {
        void *p = libc_alloc(n, align, zero);
        if (p)
            s->live += (int64_t)rtk_chunk_bytes(p);
        return p;
    }
    rtk_arena_t *a = __atomic_load_n(&rtk_cur_arena, __ATOMIC_ACQUIRE);
    if (a) {
        int why;
        size_t bs;
        void *p = rtk_arena_alloc(a, n, align, &why, &bs);
        if (p) {
            s->arena_hits++;
            s->live += (int64_t)bs;
            if (__builtin_expect(rtk_setting_on(RTK_OPT_MALLOC_DEBUG), 0))
                debug_check(p, bs);
            if (zero)
                memset(p, 0, n);
            return p;
        }
        if (why == RTK_ARENA_EXHAUSTED)
            s->arena_exhausted++;
        else if (rtk_setting_bytes(RTK_OPT_MALLOC_CLASS_MAX) && n > rtk_setting_bytes(RTK_OPT_MALLOC_CLASS_MAX))
            s->arena_above++;  /* no class by the plan's rule: not a sign the plan went stale (step.c) */
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
    if (n >= rtk_engine.large_min) {
        /* no planned block: the large-object heap, whose freed pages stay resident across steps */
        size_t u;
        void *p = rtk_large_alloc(n, align, &u);
        if (p) {
            s->large_hits++;
            if (__builtin_expect(n >= rtk_tier_min, 0) && !rtk_tier_pre)  /* tier mode left it in DRAM: watched */
                rtk_large_watch(p, __atomic_load_n(&rtk_engine.steps, __ATOMIC_RELAXED));
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
    __atomic_add_fetch(&rtk_engine.debug_errors, 1, __ATOMIC_RELAXED);
    rtk_log_line("%s: %s %p (rtkit's memory); aborting", call, what, p);
    abort();
}


void rtk_free_owned(void *p, const rtk_owner_t *op)
{
    rtk_owner_t o = *op;  /* read once: the calls below could change *op for all the compiler knows */
    if (o.state != RTK_BLOCK_LIVE)  /* a block the stash keeps is always free: its second free */
        rtk_heap_corrupt("free()", o.state == RTK_BLOCK_FREE ? "double free of" : "invalid pointer", p);
    if (o.kind == RTK_OWNER_TIER) {
        /* a pool pointer is never handed to glibc; a free that lost the race for p to another is a double free */
        if (rtk_tier_free(p, o.size, o.tier_handle) < 0)
            rtk_heap_corrupt("free()", "double free of", p);
        return;
    }
    if (o.kind == RTK_OWNER_LARGE && rtk_prof_active)
        rtk_profile_free(p);
    if (__builtin_expect(rtk_setting_on(RTK_OPT_MALLOC_DEBUG), 0))
        debug_poison(p, o.size);  /* a live block only: a free racing another free of p aborts below */
    size_t bytes = o.size;
    int r = 0;
    if (o.kind == RTK_OWNER_ARENA)
        r = rtk_arena_free(o.arena, o.cls, p);
    else if (!rtk_arena_adopt(__atomic_load_n(&rtk_cur_arena, __ATOMIC_ACQUIRE), p, o.size))
        r = rtk_large_free(p, &bytes);
    if (r < 0)
        rtk_heap_corrupt("free()", r == -2 ? "double free of" : "invalid pointer", p);
    if (rtk_fastpath.inspect || o.kind == RTK_OWNER_ARENA) {
        rtk_tslot_t *s = rtk_slot();
        s->frees++;
        s->live -= (int64_t)bytes;
    }
}

size_t rtk_usable_size(const void *p)
{
    if (!p)
        return 0;
    rtk_owner_t o = rtk_owner_of(p);
    if (o.kind == RTK_OWNER_GLIBC)
        return rtk_libc_usable(p);
    /* a free block, a kept one included, has no usable bytes (glibc reports 0 for a free chunk) */
    return o.state == RTK_BLOCK_LIVE ? o.size : 0;
}

/* realloc that cannot keep the block: a new one from rtk_alloc, the bytes copied, the old one freed */
static void *move_block(void *p, const rtk_owner_t *o, size_t n)
{
    void *q = rtk_alloc(n, 0, 0);
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    memcpy(q, p, o->size < n ? o->size : n);
    rtk_free_owned(p, o);
    return q;
}

/* a glibc block stays glibc's: it grows in place (or by mremap) wherever glibc can, as without rtkit */
static void *glibc_realloc(void *p, size_t n)
{
    if (!rtk_fastpath.inspect || rtk_fastpath.mode != RTK_MODE_READY)
        return __libc_realloc(p, n);
    size_t old_cs = rtk_chunk_bytes(p);
    if (old_cs >= rtk_fastpath.track_min)
        rtk_profile_free(p);
    void *q = __libc_realloc(p, n);
    rtk_tslot_t *s = rtk_slot();
    unsigned b = rtk_bucket(n);
    s->count[b]++;
    s->bytes[b] += n;
    if (q) {
        s->live += (int64_t)rtk_chunk_bytes(q) - (int64_t)old_cs;
        if (n >= rtk_fastpath.min_size) {
            s->fallbacks++;
            if (rtk_prof_active)
                rtk_profile_alloc(q, n, 0);
        }
    }
    return q;
}

void *rtk_realloc(void *p, size_t n)
{
    if (rtk_fastpath.mode != RTK_MODE_READY)
        rtk_init();
    rtk_owner_t o = rtk_owner_of(p);
    if (o.kind != RTK_OWNER_GLIBC && o.state != RTK_BLOCK_LIVE)
        /* a free block (a kept one too: glibc would not know it is free) or no block start: glibc's "realloc():
         * invalid pointer" */
        rtk_heap_corrupt("realloc()", "invalid pointer", p);
    if (o.kind == RTK_OWNER_TIER)
        /* a mild shrink keeps the record; otherwise it moves (to the pool again only if its new size qualifies) */
        return rtk_tier_keeps(o.size, n) ? p : move_block(p, &o, n);
    if (rtk_fastpath.inspect)
        rtk_slot()->realloc_calls++;
    if (o.kind == RTK_OWNER_GLIBC)
        return glibc_realloc(p, n);
    if (o.kind == RTK_OWNER_ARENA) {
        /* out of or within an arena: keep the block when the new size still fits it and is large */
        if (n <= o.size && n >= rtk_fastpath.min_size && !o.arena->retired)
            return p;
        return move_block(p, &o, n);
    }
    /* a large-heap block: resized in place when the heap can (its following pages are free), else moved */
    size_t u;
    if (n >= rtk_engine.large_min && rtk_large_resize(p, n, &u)) {
        if (rtk_fastpath.inspect)
            rtk_slot()->live += (int64_t)u - (int64_t)o.size;
        return p;
    }
    return move_block(p, &o, n);
}
