/* arena.c -- planned arenas: one pre-faulted reservation per plan (a block of the large-object heap when there
 * is one, so pages it already holds are reused), a spinlock free stack per class, lookup of a block by address
 * (no per-allocation header) and one state byte per block, so a double free or an interior pointer is caught in
 * every mode. Freed blocks stay faulted in, except in dropped classes and retired arenas (their pages go back). */
#include <string.h>

#include "common/os.h"
#include "prmalloc/internal.h"
#include "prmalloc/large.h"

#define HUGE ((size_t)2 << 20)

int rtk_arena_plan_release;

static size_t page_round(size_t v)
{
    size_t page = rtk_os_page_size();
    return (v + page - 1) & ~(page - 1);
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

/* bytes from the base to the end of the last class, each class starting at its own alignment */
static size_t arena_span(const rtk_plan_t *p)
{
    size_t off = 0;
    for (int i = 0; i < p->nclasses; i++) {
        size_t al = p->cls[i].align > 4096 ? p->cls[i].align : 4096;
        off = align_up(off, al) + page_round(p->cls[i].size * p->cls[i].blocks);
    }
    return off;
}

static char *arena_memory(rtk_arena_t *a, size_t span, int thp)
{
    size_t got;
    if (rtk_large_span) {
        rtk_large_info_t before, after;
        rtk_large_info(&before);
        char *m = rtk_large_alloc(span, HUGE, &got);
        if (m) {
            a->from_large = 1;
            rtk_large_info(&after);
            size_t reused = before.idle > after.idle ? before.idle - after.idle : 0;
            a->fresh = span > reused ? span - reused : 0;
            /* RTKIT_MALLOC_PLAN_RELEASE (opt-in), before the arena is faulted in so the peak never holds both: its
             * fresh pages replace as many idle ones. Measured on wdl: batch 16384 peak RSS 1762 -> 1584 MiB, but at
             * batch 2048 sizes no plan covers fault them in again (faults after the plan 1 -> ~20 a step). */
            if (rtk_arena_plan_release)
                rtk_large_shed(a->fresh);
            rtk_large_epoch();  /* the large heap's footprint is judged from here on without the planned sizes */
            if (thp)
                rtk_os_hugepage(m, span);
            return m;
        }
    }
    /* own mapping, aligned to a huge page (the largest class alignment) by over-reserving */
    char *raw = rtk_os_map(span + HUGE, 0);
    if (!raw)
        return NULL;
    char *base = (char *)align_up((uintptr_t)raw, HUGE);
    a->map = raw;
    a->fresh = span;
    a->map_size = span + HUGE;
    if (thp)
        rtk_os_hugepage(base, span);
    return base;
}

rtk_arena_t *rtk_arena_create(const rtk_plan_t *p, int thp, int debug, const char **why)
{
    static const char *no_why;
    if (!why)
        why = &no_why;
    *why = "empty plan";
    if (p->nclasses <= 0)
        return NULL;
    size_t span = arena_span(p), nblocks = 0;
    for (int i = 0; i < p->nclasses; i++)
        nblocks += p->cls[i].blocks;
    /* pre-faulting touches every page: under memory pressure that is an OOM kill, not an error return */
    size_t avail = rtk_os_mem_available();
    if (avail != SIZE_MAX && span > avail / 2) {
        *why = "not enough available memory to pre-fault it";
        return NULL;
    }
    size_t meta_size = page_round(sizeof(rtk_arena_t) + nblocks * sizeof(uint32_t) + nblocks);
    rtk_arena_t *a = rtk_os_map(meta_size, 0);
    if (!a) {
        *why = "its metadata could not be mapped";
        return NULL;
    }
    char *base = arena_memory(a, span, thp);
    if (!base) {
        rtk_os_unmap(a, meta_size);
        *why = "no memory could be reserved for it";
        return NULL;
    }
    a->base = base;
    a->span = span;
    a->n = p->nclasses;
    a->debug = debug;
    a->meta_size = meta_size;
    uint32_t *stacks = (uint32_t *)(a + 1);
    uint8_t *inuse = (uint8_t *)(stacks + nblocks);
    size_t off = 0;
    for (int i = 0; i < p->nclasses; i++) {
        rtk_aclass_t *c = &a->cls[i];
        c->size = p->cls[i].size;
        c->blocks = p->cls[i].blocks;
        c->align = p->cls[i].align;
        off = align_up(off, c->align > 4096 ? c->align : 4096);
        c->start = base + off;
        c->stack = stacks;
        c->inuse = inuse;
        /* block 0 on top: the lowest addresses are reused first, which keeps the hot set compact */
        for (uint32_t b = 0; b < c->blocks; b++)
            c->stack[b] = c->blocks - 1 - b;
        c->top = c->blocks;
        stacks += c->blocks;
        inuse += c->blocks;
        size_t bytes = page_round(c->size * c->blocks);
        rtk_os_populate(c->start, bytes);  /* pages the large heap already holds cost nothing here */
        off += bytes;
    }
    *why = NULL;
    return a;
}

void rtk_arena_destroy(rtk_arena_t *a)
{
    if (!a || !a->span)
        return;
    size_t span = a->span;
    a->span = 0;  /* nothing lies in it any more: lookups miss it */
    if (a->from_large) {
        size_t bytes;
        /* given back now: the large heap's decay keeps idle pages within its high-water mark, which the arena is in */
        rtk_os_release(a->base, span);
        rtk_large_free(a->base, &bytes);
    } else {
        rtk_os_unmap(a->map, a->map_size);
    }
}

static void *pop(rtk_arena_t *a, rtk_aclass_t *c)
{
    void *p = NULL;
    rtk_spin_lock(&c->lock);
    if (c->top) {
        uint32_t idx = c->stack[--c->top];
        c->inuse[idx] = 1;
        c->pops++;
        p = c->start + (size_t)idx * c->size;
    }
    rtk_spin_unlock(&c->lock);
    if (p)
        __atomic_add_fetch(&a->live_blocks, 1, __ATOMIC_RELAXED);
    return p;
}

/* The smallest class that fits; when it is empty, borrow from larger classes up to twice the request (sizes
 * that vary with the batch land one class up now and then). */
void *rtk_arena_alloc(rtk_arena_t *a, size_t size, size_t align, int *why)
{
    int lo = 0, hi = a->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a->cls[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    int seen = 0;
    size_t limit = size > ((size_t)-1) / 2 ? (size_t)-1 : size * 2;
    for (int i = lo; i < a->n && a->cls[i].size <= limit; i++) {
        rtk_aclass_t *c = &a->cls[i];
        if (align > c->align || c->dropped)
            continue;
        seen = 1;
        if (__atomic_load_n(&c->top, __ATOMIC_RELAXED) == 0)
            continue;
        void *p = pop(a, c);
        if (p) {
            *why = RTK_ARENA_OK;
            return p;
        }
    }
    *why = seen ? RTK_ARENA_EXHAUSTED : RTK_ARENA_MISS;
    return NULL;
}

rtk_aclass_t *rtk_arena_class_of(rtk_arena_t *a, const void *p)
{
    const char *q = p;
    if (q < a->base || q >= a->base + a->span)
        return NULL;
    int lo = 0, hi = a->n - 1;
    while (lo < hi) {  /* last class whose start <= q */
        int mid = (lo + hi + 1) / 2;
        if (a->cls[mid].start <= q)
            lo = mid;
        else
            hi = mid - 1;
    }
    rtk_aclass_t *c = &a->cls[lo];
    if (q < c->start || q >= c->start + c->size * c->blocks)
        return NULL;  /* page-rounding or alignment gap between classes */
    return c;
}

size_t rtk_arena_block_size(rtk_arena_t *a, const void *p)
{
    rtk_aclass_t *c = rtk_arena_class_of(a, p);
    if (!c)
        return 0;
    size_t off = (size_t)((const char *)p - c->start) % c->size;
    return c->size - off;
}

/* the pages wholly inside one block (a block's edges may share a page with its neighbours) */
static void release_block(const rtk_aclass_t *c, uint32_t idx)
{
    size_t page = rtk_os_page_size();
    uintptr_t s = (uintptr_t)c->start + (size_t)idx * c->size, e = s + c->size;
    s = (s + page - 1) & ~(page - 1);
    e &= ~(page - 1);
    if (e > s)
        rtk_os_release((void *)s, e - s);
}

int rtk_arena_free(rtk_arena_t *a, void *p)
{
    rtk_aclass_t *c = rtk_arena_class_of(a, p);
    if (!c)
        return -1;
    size_t off = (size_t)((char *)p - c->start);
    if (off % c->size)
        return -1;
    uint32_t idx = (uint32_t)(off / c->size);
    rtk_spin_lock(&c->lock);
    if (!c->inuse[idx]) {
        rtk_spin_unlock(&c->lock);
        return -2;
    }
    c->inuse[idx] = 0;
    if (c->top < c->blocks)
        c->stack[c->top++] = idx;
    int release = c->dropped || a->retired;
    rtk_spin_unlock(&c->lock);
    if (release)
        release_block(c, idx);
    __atomic_sub_fetch(&a->live_blocks, 1, __ATOMIC_RELAXED);
    return 0;
}

size_t rtk_arena_release_free(rtk_arena_t *a, int all)
{
    size_t bytes = 0;
    for (int i = 0; a && a->span && i < a->n; i++) {
        rtk_aclass_t *c = &a->cls[i];
        if (!all && !c->dropped)
            continue;
        rtk_spin_lock(&c->lock);
        for (uint32_t k = 0; k < c->top; k++) {
            release_block(c, c->stack[k]);
            bytes += c->size;
        }
        rtk_spin_unlock(&c->lock);
    }
    return bytes;
}

int rtk_arena_recheck(rtk_arena_t *a, uint32_t steps)
{
    int dropped = 0;
    for (int i = 0; a && steps && i < a->n; i++) {
        rtk_aclass_t *c = &a->cls[i];
        uint64_t pops = __atomic_load_n(&c->pops, __ATOMIC_RELAXED);
        if (c->dropped)
            continue;
        if (pops != c->pops_seen) {
            c->pops_seen = pops;
            c->idle_steps = 0;
            continue;
        }
        if (++c->idle_steps < steps)
            continue;
        c->dropped = 1;
        dropped++;
        rtk_spin_lock(&c->lock);
        for (uint32_t k = 0; k < c->top; k++)
            release_block(c, c->stack[k]);
        rtk_spin_unlock(&c->lock);
    }
    return dropped;
}

void rtk_arena_lock_all(rtk_arena_t *a)
{
    for (int i = 0; a && i < a->n; i++)
        rtk_spin_lock(&a->cls[i].lock);
}

void rtk_arena_unlock_all(rtk_arena_t *a)
{
    for (int i = a ? a->n - 1 : -1; i >= 0; i--)
        rtk_spin_unlock(&a->cls[i].lock);
}

void rtk_arena_reset_locks(rtk_arena_t *a)
{
    for (int i = 0; a && i < a->n; i++)
        rtk_spin_reset(&a->cls[i].lock);
}
