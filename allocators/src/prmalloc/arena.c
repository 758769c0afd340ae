/* arena.c -- planned arenas: one pre-faulted reservation per plan, a spinlock free stack per class, lookup of a
 * block by address (no per-allocation header). Freed blocks stay mapped and faulted in (never MADV_DONTNEED). */
#include <string.h>

#include "common/os.h"
#include "prmalloc/internal.h"

static size_t page_round(size_t v)
{
    size_t page = rtk_os_page_size();
    return (v + page - 1) & ~(page - 1);
}

rtk_arena_t *rtk_arena_create(const rtk_plan_t *p, int thp, int debug)
{
    if (p->nclasses <= 0)
        return NULL;
    size_t span = 0, nblocks = 0;
    for (int i = 0; i < p->nclasses; i++) {
        span += page_round(p->cls[i].size * p->cls[i].blocks);
        nblocks += p->cls[i].blocks;
    }
    size_t meta_size = page_round(sizeof(rtk_arena_t) + nblocks * sizeof(uint32_t) + (debug ? nblocks : 0));
    rtk_arena_t *a = rtk_os_map(meta_size, 0);
    if (!a)
        return NULL;
    char *base = rtk_os_map(span, RTK_MAP_POPULATE | (thp ? RTK_MAP_HUGEPAGE : 0));
    if (!base) {
        rtk_os_unmap(a, meta_size);
        return NULL;
    }
    a->base = base;
    a->span = span;
    a->n = p->nclasses;
    a->debug = debug;
    a->meta_size = meta_size;
    uint32_t *stacks = (uint32_t *)(a + 1);
    uint8_t *inuse = (uint8_t *)(stacks + nblocks);
    char *cur = base;
    for (int i = 0; i < p->nclasses; i++) {
        rtk_aclass_t *c = &a->cls[i];
        c->size = p->cls[i].size;
        c->blocks = p->cls[i].blocks;
        c->align = p->cls[i].align;
        c->start = cur;
        c->stack = stacks;
        c->inuse = debug ? inuse : NULL;
        /* block 0 on top: the lowest addresses are reused first, which keeps the hot set compact */
        for (uint32_t b = 0; b < c->blocks; b++)
            c->stack[b] = c->blocks - 1 - b;
        c->top = c->blocks;
        stacks += c->blocks;
        if (debug)
            inuse += c->blocks;
        cur += page_round(c->size * c->blocks);
    }
    return a;
}

static void *pop(rtk_arena_t *a, rtk_aclass_t *c)
{
    void *p = NULL;
    rtk_spin_lock(&c->lock);
    if (c->top) {
        uint32_t idx = c->stack[--c->top];
        if (c->inuse)
            c->inuse[idx] = 1;
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
        if (align > c->align)
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
        return NULL;  /* page-rounding tail between classes */
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
    if (c->inuse) {
        if (!c->inuse[idx]) {
            rtk_spin_unlock(&c->lock);
            return -2;
        }
        c->inuse[idx] = 0;
    }
    if (c->top < c->blocks)
        c->stack[c->top++] = idx;
    rtk_spin_unlock(&c->lock);
    __atomic_sub_fetch(&a->live_blocks, 1, __ATOMIC_RELAXED);
    return 0;
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
