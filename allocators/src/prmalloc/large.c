/* large.c -- the retained large-object heap. One reserved address range (MAP_NORESERVE) carved into page
 * extents from a bump top; freed extents coalesce with free neighbours through boundary tags and wait in
 * segregated free lists (4 lists per power of two of pages), newest first, with their pages still resident:
 * a size that recurs every step, or varies with the batch, reuses faulted pages instead of faulting anew.
 * A free extent unused for N steps (RTKIT_MALLOC_DECAY_STEPS) gives its pages back (MADV_DONTNEED); so does
 * malloc_trim (both in large_idle.c). Per-page metadata lives outside the blocks, so free pages are never touched by bookkeeping,
 * and the tag of a block's first page is its O(1) state: a double free or an interior pointer is caught.
 * Where the range and the page map lie, and their growth a piece at a time: large_map.c. */
#include <string.h>

#include "common/os.h"
#include "prmalloc/large_internal.h"

void rtk_large_set_debug(int on) { rtk_large.debug = on; }

static void poison_page(uint32_t x) { memset(rtk_large.base + ((size_t)x << PAGE_SHIFT), RTK_POISON, RTK_POISON_BYTES); }

static unsigned bin_of(uint32_t n)
{
    if (n < 4)
        return n;
    unsigned fl = 31u - (unsigned)__builtin_clz(n);
    return fl * 4 + ((n >> (fl - 2)) & 3);
}

static unsigned set_of(uint32_t tag) { return (tag & T_RES) ? 1 : 0; }

/* onto the list its tag names (the tag is set already) */
void rtk_large_list_push(uint32_t x)
{
    uint32_t t = rtk_large.meta[x].tag;
    unsigned s = set_of(t), b = bin_of(T_PAGES(t));
    rtk_large.meta[x].prev = NIL;
    rtk_large.meta[x].next = rtk_large.head[s][b];
    if (rtk_large.head[s][b] != NIL)
        rtk_large.meta[rtk_large.head[s][b]].prev = x;
    rtk_large.head[s][b] = x;
    rtk_large.map[s][b / 64] |= 1ull << (b % 64);
}

void rtk_large_list_remove(uint32_t x)
{
    uint32_t t = rtk_large.meta[x].tag;
    unsigned s = set_of(t), b = bin_of(T_PAGES(t));
    uint32_t p = rtk_large.meta[x].prev, n = rtk_large.meta[x].next;
    if (p != NIL)
        rtk_large.meta[p].next = n;
    else
        rtk_large.head[s][b] = n;
    if (n != NIL)
        rtk_large.meta[n].prev = p;
    if (rtk_large.head[s][b] == NIL)
        rtk_large.map[s][b / 64] &= ~(1ull << (b % 64));
    if (t & T_REL)
        rtk_large.released -= T_PAGES(t);
    else
        rtk_large.idle -= T_PAGES(t);
}

/* a free extent [x, x + n): tags at both ends, onto its list */
static void insert_free(uint32_t x, uint32_t n, unsigned rel, uint32_t step)
{
    rtk_large.meta[x].tag = TAG(T_FREE, n, rel);
    if (n >= 2)
        rtk_large.meta[x + n - 1].tag = TAG(T_FEND, n, 0);
    rtk_large.meta[x].step = step;
    rtk_large_list_push(x);
    if (rtk_large.debug && !(rel & T_REL))
        poison_page(x);  /* a start inside old data (a split, a shrink) must not read as a write after free */
    if (rel & T_REL)
        rtk_large.released += n;
    else
        rtk_large.idle += n;
}

static void clear_free_tags(uint32_t x, uint32_t n)
{
    rtk_large.meta[x].tag = 0;
    if (n >= 2)
        rtk_large.meta[x + n - 1].tag = 0;
}

/* A free extent of at least need pages in list set s, unlinked; NIL when none. In need's own bin the first that
 * fits among a few (newest first); past it any extent fits, so the head of the next non-empty bin. */
static uint32_t find_in(unsigned s, uint32_t need)
{
    unsigned b = bin_of(need);
    int tries = 32;
    for (uint32_t x = rtk_large.head[s][b]; x != NIL && tries-- > 0; x = rtk_large.meta[x].next)
        if (T_PAGES(rtk_large.meta[x].tag) >= need) {
            rtk_large_list_remove(x);
            return x;
        }
    for (unsigned w = (b + 1) / 64; w < NBINS / 64; w++) {
        uint64_t bits = rtk_large.map[s][w];
        if (w == (b + 1) / 64)
            bits &= (b + 1) % 64 ? ~0ull << ((b + 1) % 64) : ~0ull;
        if (bits) {
            uint32_t x = rtk_large.head[s][w * 64 + (unsigned)__builtin_ctzll(bits)];
            rtk_large_list_remove(x);
            return x;
        }
    }
    return NIL;
}

/* A free extent for need pages, unlinked; NIL when none. A wholly resident extent whenever one fits anywhere: a
 * block on pages the heap holds costs no fault and no new RSS, where settling for given-back pages would fault
 * while resident ones lie idle. Given-back or mixed extents only after that; resident_only: NIL then. */
static uint32_t find_free(uint32_t need, int resident_only)
{
    uint32_t x = find_in(0, need);
    if (x != NIL || resident_only)
        return x;
    return find_in(1, need);
}

/* the first page index at or after x whose address is a multiple of ap pages. Aligned by address, not by index:
 * the range is only 2 MiB-aligned where the kernel placed it (the asked-for address refused), so an index multiple
 * of a larger alignment need not be an aligned address */
static uint32_t align_page(uint32_t x, uint32_t ap)
{
    uint64_t first = (uintptr_t)rtk_large.base >> PAGE_SHIFT;
    return (uint32_t)(((first + x + ap - 1) & ~(uint64_t)(ap - 1)) - first);
}

void *rtk_large_take(size_t n, size_t align, size_t *usable, int resident_only)
{
    /* both bounds before the 32-bit page counts: a larger alignment would lose its high bits there */
    if (!rtk_large.base || n > ((size_t)rtk_large.pages << PAGE_SHIFT) || align > ((size_t)rtk_large.pages << PAGE_SHIFT))
        return NULL;
    uint32_t np = (uint32_t)((n + PAGE - 1) >> PAGE_SHIFT), ap = align > PAGE ? (uint32_t)(align >> PAGE_SHIFT) : 1;
    if (np == 0)
        np = 1;
    if (ap > rtk_large.pages)
        return NULL;
    uint32_t need = np + ap - 1;
    rtk_spin_lock(&rtk_large.lock);
    uint32_t x = find_free(need, resident_only), len;
    unsigned rel = 0;
    uint32_t step = rtk_large.step;
    if (x != NIL) {
        uint32_t t = rtk_large.meta[x].tag;
        len = T_PAGES(t);
        rel = t & T_RES;
        step = rtk_large.meta[x].step;
        clear_free_tags(x, len);
    } else if (resident_only) {
        rtk_spin_unlock(&rtk_large.lock);
        return NULL;
    } else {
        /* fresh pages from the top: start there already aligned, the skipped pages become a free extent */
        uint32_t a = align_page(rtk_large.top, ap);
        if ((uint64_t)a + np > rtk_large.pages || rtk_large_grow_to((uint64_t)a + np) != 0) {
            rtk_spin_unlock(&rtk_large.lock);
            return NULL;
        }
        if (a > rtk_large.top)
            insert_free(rtk_large.top, a - rtk_large.top, T_REL, rtk_large.step);
        x = a;
        len = np;
        rel = T_REL;
        rtk_large.top = a + np;
    }
    uint32_t a = align_page(x, ap);
    if (a > x) {
        insert_free(x, a - x, rel, step);
        if (rtk_large.debug)
            poison_page(a);  /* inside the extent: old data, not a freed block's start */
    }
    uint32_t tail = len - (a - x) - np;
    if (tail)
        insert_free(a + np, tail, rel, step);
    rtk_large.meta[a].tag = TAG(T_ALLOC, np, 0);
    rtk_large.meta[a].prev = 0;  /* no owner: a stale free-list link never carries the owner mark, but keep it clean */
    rtk_large.meta[a].next = 0;  /* not watched (rtk_large_watch) */
    rtk_large.in_use += np;
    if (rtk_large.in_use > rtk_large.peak)
        rtk_large.peak = rtk_large.in_use;
    rtk_large.blocks++;
    rtk_spin_unlock(&rtk_large.lock);
    *usable = (size_t)np << PAGE_SHIFT;
    return rtk_large.base + ((size_t)a << PAGE_SHIFT);
}

void *rtk_large_alloc(size_t n, size_t align, size_t *usable) { return rtk_large_take(n, align, usable, 0); }

void *rtk_large_alloc_resident(size_t n, size_t align, size_t *usable) { return rtk_large_take(n, align, usable, 1); }

/* the page index of p when p starts a live block, else a negative rtk_large_free code */
static int64_t block_index(const void *p)
{
    uintptr_t off = (uintptr_t)p - (uintptr_t)rtk_large.base;
    if (off & (PAGE - 1))
        return -1;
    uint32_t x = (uint32_t)(off >> PAGE_SHIFT);
    if (x >= rtk_large.top)
        return -1;
    uint32_t s = T_STATE(rtk_large.meta[x].tag);
    if (s == T_ALLOC)
        return x;
    return s == T_FREE ? -2 : -1;
}

/* A neighbour about to merge with a fresh extent takes its age (the merged extent is stamped now): one that
 * has been idle for half the decay window gives its pages back first, or a large idle extent next to the
 * step's churn would never age (an input pipeline's start-up buffers would stay resident for good). */
static uint32_t age_neighbour(uint32_t x)
{
    uint32_t t = rtk_large.meta[x].tag;
    if ((t & T_REL) || !rtk_large.decay || rtk_large.step - rtk_large.meta[x].step < (rtk_large.decay + 1) / 2 || rtk_large.idle <= rtk_large.keep)
        return t & T_RES;
    uint32_t n = T_PAGES(t);
    rtk_os_release(rtk_large.base + ((size_t)x << PAGE_SHIFT), (size_t)n << PAGE_SHIFT);
    rtk_large.decayed += (size_t)n << PAGE_SHIFT;
    return T_REL;
}

/* residency of two merged extents: the same, or mixed */
static unsigned merge_res(unsigned a, unsigned b) { return a == b ? a : T_MIX; }

/* put [x, x + n) back, merged with free neighbours (caller holds the lock, the pages carry no tags); rel: its
 * pages were given back already (kept as released only when no resident neighbour joins it) */
static void release_extent(uint32_t x, uint32_t n, unsigned rel)
{
    uint32_t r = x + n;
    if (r < rtk_large.top && T_STATE(rtk_large.meta[r].tag) == T_FREE) {
        uint32_t m = T_PAGES(rtk_large.meta[r].tag);
        rel = merge_res(rel, age_neighbour(r));
        rtk_large_list_remove(r);
        clear_free_tags(r, m);
        n += m;
    }
    if (x > 0) {
        uint32_t t = rtk_large.meta[x - 1].tag, l = NIL;
        if (T_STATE(t) == T_FEND)
            l = x - T_PAGES(t);
        else if (T_STATE(t) == T_FREE)
            l = x - 1;
        if (l != NIL) {
            uint32_t m = T_PAGES(rtk_large.meta[l].tag);
            rel = merge_res(rel, age_neighbour(l));
            rtk_large_list_remove(l);
            clear_free_tags(l, m);
            x = l;
            n += m;
        }
    }
    insert_free(x, n, rel, rtk_large.step);
}

int rtk_large_put(void *p, size_t *bytes, int giveback)
{
    rtk_spin_lock(&rtk_large.lock);
    int64_t i = block_index(p);
    if (i < 0) {
        rtk_spin_unlock(&rtk_large.lock);
        return (int)i;
    }
    uint32_t x = (uint32_t)i, n = T_PAGES(rtk_large.meta[x].tag);
    if ((rtk_large.meta[x].prev & RTK_LARGE_OWNED_MASK) == RTK_LARGE_OWNED) {
        /* an arena class holds it (adopted while a racing second free of p looked it up): a double free */
        rtk_spin_unlock(&rtk_large.lock);
        return -2;
    }
    rtk_large.meta[x].tag = 0;  /* neither live nor free until it is back on a list: no neighbour merges with it */
    rtk_large.meta[x].prev = 0;
    rtk_large.in_use -= n;
    if (giveback) {
        /* the madvise of a multi-MiB block must not stall every other thread's large malloc and free */
        rtk_spin_unlock(&rtk_large.lock);
        rtk_os_release(p, (size_t)n << PAGE_SHIFT);
        rtk_spin_lock(&rtk_large.lock);
    }
    release_extent(x, n, giveback ? T_REL : 0);
    rtk_spin_unlock(&rtk_large.lock);
    *bytes = (size_t)n << PAGE_SHIFT;
    return 0;
}

int rtk_large_free(void *p, size_t *bytes) { return rtk_large_put(p, bytes, 0); }

int rtk_large_free_release(void *p, size_t *bytes) { return rtk_large_put(p, bytes, 1); }

/* Lock-free: a block's owner word is written only by its owner while the block is live, and a live block's start
 * tag changes only by its owner's realloc or free; a racing bad free reads some other word, which never carries the
 * mark (free-list links are page indexes below 2^29, NIL has both top bits set), and the freeing paths look again
 * under their locks. */
/* The page map's entry of the block p starts, its tag in *t and its owner word in *w (0 unless live); NULL when p
 * is no page of the heap's used range */
static inline pmeta_t *block_meta(const void *p, uint32_t *t, uint32_t *w)
{
    uintptr_t off = (uintptr_t)p - (uintptr_t)rtk_large.base;
    *t = *w = 0;
    if ((off & (PAGE - 1)) || off >= ((size_t)__atomic_load_n(&rtk_large.top, __ATOMIC_ACQUIRE) << PAGE_SHIFT))
        return NULL;
    pmeta_t *m = &rtk_large.meta[off >> PAGE_SHIFT];
    *t = __atomic_load_n(&m->tag, __ATOMIC_ACQUIRE);
    if (T_STATE(*t) == T_ALLOC)
        *w = __atomic_load_n(&m->prev, __ATOMIC_ACQUIRE);
    return m;
}

int rtk_large_block(const void *p, size_t *bytes, uint32_t *owner)
{
    uint32_t t, w;
    block_meta(p, &t, &w);
    int live = T_STATE(t) == T_ALLOC;
    *bytes = live ? (size_t)T_PAGES(t) << PAGE_SHIFT : 0;
    *owner = (w & RTK_LARGE_OWNED_MASK) == RTK_LARGE_OWNED ? w : 0;
    return live ? RTK_BLOCK_LIVE : T_STATE(t) == T_FREE ? RTK_BLOCK_FREE : RTK_BLOCK_NONE;
}

int rtk_large_adopt(void *p, uint32_t w)
{
    rtk_spin_lock(&rtk_large.lock);
    int64_t i = block_index(p);
    if (i >= 0 && (rtk_large.meta[i].prev & RTK_LARGE_OWNED_MASK) == RTK_LARGE_OWNED)
        i = -2;
    if (i >= 0)
        __atomic_store_n(&rtk_large.meta[i].prev, w, __ATOMIC_RELEASE);
    rtk_spin_unlock(&rtk_large.lock);
    return i < 0 ? (int)i : 0;
}

/* Calls fn for every live extent no arena owns, under the heap lock (so fn must not allocate). */
static void walk_unowned_live(void (*fn)(uint32_t x, uint32_t len, void *arg), void *arg)
{
    if (!rtk_large.meta)
        return;
    rtk_spin_lock(&rtk_large.lock);
    for (uint32_t x = 0, len; x < rtk_large.top; x += len) {
        uint32_t t = rtk_large.meta[x].tag;
        len = T_PAGES(t);
        if (!len)
            break;  /* no extent starts here: the map is not what this walk expects, so count no further */
        if (T_STATE(t) == T_ALLOC && (rtk_large.meta[x].prev & RTK_LARGE_OWNED_MASK) != RTK_LARGE_OWNED)
            fn(x, len, arg);
    }
    rtk_spin_unlock(&rtk_large.lock);
}

struct live_by_pages {
    const uint32_t *pages;
    int n;
    uint32_t *counts;
};

static void count_by_pages(uint32_t x, uint32_t len, void *arg)
{
    (void)x;
    struct live_by_pages *c = arg;
    int lo = 0, hi = c->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (c->pages[mid] < len)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < c->n && c->pages[lo] == len)
        c->counts[lo]++;
}

void rtk_large_count_live(const uint32_t *pages, int n, uint32_t *counts)
{
    memset(counts, 0, (size_t)n * sizeof *counts);
    struct live_by_pages c = {pages, n, counts};
    walk_unowned_live(count_by_pages, &c);
}

void rtk_large_watch(void *p, uint32_t step)
{
    uint32_t x = (uint32_t)(((uintptr_t)p - (uintptr_t)rtk_large.base) >> PAGE_SHIFT);
    __atomic_store_n(&rtk_large.meta[x].next, step + 1, __ATOMIC_RELAXED);
}

struct watched {
    uint32_t made_by;
    uint64_t blocks, bytes;
};

static void count_watched(uint32_t x, uint32_t len, void *arg)
{
    struct watched *c = arg;
    uint32_t w = __atomic_load_n(&rtk_large.meta[x].next, __ATOMIC_RELAXED);
    if (!w || w - 1 > c->made_by)
        return;
    c->blocks++;
    c->bytes += (uint64_t)len << PAGE_SHIFT;
}

void rtk_large_count_watched(uint32_t made_by, uint64_t *blocks, uint64_t *bytes)
{
    struct watched c = {made_by, 0, 0};
    walk_unowned_live(count_watched, &c);
    *blocks = c.blocks;
    *bytes = c.bytes;
}

void rtk_large_set_owner(void *p, uint32_t w)
{
    uint32_t x = (uint32_t)(((uintptr_t)p - (uintptr_t)rtk_large.base) >> PAGE_SHIFT);
    __atomic_store_n(&rtk_large.meta[x].prev, w, __ATOMIC_RELEASE);
}

uint32_t rtk_large_swap_owner(void *p, uint32_t expect, uint32_t w)
{
    uint32_t t, seen;
    pmeta_t *m = block_meta(p, &t, &seen);
    if ((seen & RTK_LARGE_OWNED_MASK) != RTK_LARGE_OWNED)
        return 0;
    if (seen == expect)
        __atomic_store_n(&m->prev, w, __ATOMIC_RELEASE);
    return seen;
}

int rtk_large_resize(void *p, size_t n, size_t *usable)
{
    uint32_t np = (uint32_t)((n + PAGE - 1) >> PAGE_SHIFT);
    if (np == 0 || n > ((size_t)rtk_large.pages << PAGE_SHIFT))
        return 0;
    rtk_spin_lock(&rtk_large.lock);
    int64_t i = block_index(p);
    if (i < 0) {
        rtk_spin_unlock(&rtk_large.lock);
        return 0;
    }
    uint32_t x = (uint32_t)i, old = T_PAGES(rtk_large.meta[x].tag), r = x + old;
    int ok = 0;
    if (np <= old) {
        if (np < old) {
            rtk_large.meta[x].tag = TAG(T_ALLOC, np, 0);
            rtk_large.in_use -= old - np;
            release_extent(x + np, old - np, 0);
        }
        ok = 1;
    } else if (r == rtk_large.top && (uint64_t)x + np <= rtk_large.pages && rtk_large_grow_to((uint64_t)x + np) == 0) {
        rtk_large.top = x + np;
        ok = 1;
    } else if (r < rtk_large.top && T_STATE(rtk_large.meta[r].tag) == T_FREE && old + T_PAGES(rtk_large.meta[r].tag) >= np) {
        uint32_t t = rtk_large.meta[r].tag, m = T_PAGES(t), step = rtk_large.meta[r].step;
        rtk_large_list_remove(r);
        clear_free_tags(r, m);
        if (old + m > np)
            insert_free(x + np, old + m - np, t & T_RES, step);
        ok = 1;
    }
    if (ok && np > old) {
        rtk_large.in_use += np - old;
        if (rtk_large.in_use > rtk_large.peak)
            rtk_large.peak = rtk_large.in_use;
    }
    if (ok)
        rtk_large.meta[x].tag = TAG(T_ALLOC, np, 0);
    rtk_spin_unlock(&rtk_large.lock);
    if (ok)
        *usable = (size_t)np << PAGE_SHIFT;
    return ok;
}

void rtk_large_lock(void) { rtk_spin_fork_prepare(&rtk_large.lock); }
void rtk_large_unlock(void) { rtk_spin_fork_parent(&rtk_large.lock); }
void rtk_large_reset_lock(void) { rtk_spin_fork_child(&rtk_large.lock); }
