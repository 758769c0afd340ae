/* large.c -- the retained large-object heap. One reserved address range (MAP_NORESERVE) carved into page
 * extents from a bump top; freed extents coalesce with free neighbours through boundary tags and wait in
 * segregated free lists (4 lists per power of two of pages), newest first, with their pages still resident:
 * a size that recurs every step, or varies with the batch, reuses faulted pages instead of faulting anew.
 * A free extent unused for N steps (RTKIT_MALLOC_DECAY_STEPS) gives its pages back (MADV_DONTNEED); so does
 * malloc_trim. Per-page metadata lives outside the blocks, so free pages are never touched by bookkeeping,
 * and the tag of a block's first page is its O(1) state: a double free or an interior pointer is caught. */
#include <string.h>

#include "common/lock.h"
#include "common/os.h"
#include "prmalloc/large.h"

#define PAGE_SHIFT 12
#define PAGE ((size_t)1 << PAGE_SHIFT)
#define NBINS 128
#define NIL UINT32_MAX
#if UINTPTR_MAX > 0xffffffffu
uintptr_t rtk_large_hint = 0x7fe000000000ull;
#else
uintptr_t rtk_large_hint = 0;
#endif

/* tag of a page: bits 0-1 state, bits 2-3 residency (free starts only: T_REL all given back, T_MIX merged from
 * resident and given-back parts, neither: all resident), bits 4-31 pages of the extent */
enum { T_NONE = 0, T_ALLOC = 1, T_FREE = 2, T_FEND = 3 };
#define T_REL 4u
#define T_MIX 8u
#define T_RES (T_REL | T_MIX)
#define TAG(state, n, res) ((uint32_t)(n) << 4 | (res) | (state))
#define T_STATE(t) ((t) & 3u)
#define T_PAGES(t) ((t) >> 4)

typedef struct pmeta {
    uint32_t tag;
    uint32_t prev, next;   /* free-list links (free starts only); prev of a live block's start: its owner word */
    uint32_t step;         /* step the extent became free (free starts only) */
} pmeta_t;

uintptr_t rtk_large_lo, rtk_large_span, rtk_large_reach;

static rtk_spin_t g_lock = RTK_SPIN_INIT;
static char *g_base;
static pmeta_t *g_meta;
static uint32_t g_pages, g_top;      /* pages the range may span; pages ever handed out from the bottom */
static uint32_t g_mapped;            /* pages mapped so far (rtk_large_span) */
static int g_thp;
/* two sets of segregated lists: [0] wholly resident free extents, [1] given-back or mixed ones, so a request finds a
 * resident extent whenever one fits, in O(1) past its own bin, however many given-back ones lie around */
static uint32_t g_head[2][NBINS];
static uint64_t g_map[2][NBINS / 64];   /* non-empty lists */
static uint32_t g_step, g_decay;
static size_t g_in_use, g_idle, g_released;  /* pages */
static size_t g_peak;                        /* most pages in use at once since the epoch (plan install) */
static size_t g_keep;                        /* idle pages the decay spares (within the high-water mark) */
static uint64_t g_blocks, g_decayed, g_trims;
static size_t g_prefaulted;                  /* bytes */
static int g_debug;                          /* RTKIT_MALLOC_DEBUG: free extents' starts hold the poison */

void rtk_large_set_debug(int on) { g_debug = on; }

static void poison_page(uint32_t x) { memset(g_base + ((size_t)x << PAGE_SHIFT), RTK_POISON, RTK_POISON_BYTES); }

static unsigned bin_of(uint32_t n)
{
    if (n < 4)
        return n;
    unsigned fl = 31u - (unsigned)__builtin_clz(n);
    return fl * 4 + ((n >> (fl - 2)) & 3);
}

int rtk_large_init(size_t limit, int thp)
{
    if (g_base)
        return 0;
    size_t as = rtk_os_as_limit();
    if (as != SIZE_MAX && limit > as / 4)
        limit = as / 4;
    if (limit > ((size_t)1 << 40))
        limit = (size_t)1 << 40;  /* 28 bits of pages in a tag */
    limit &= ~(((size_t)2 << 20) - 1);
    if (limit < ((size_t)64 << 20))
        return -1;
    /* over-reserve by 2 MiB so the range starts on a huge-page boundary (THP-friendly, and aligned blocks).
     * Asked for high in the address space, above where mmap places glibc's heaps and the libraries (below the
     * stack): then every glibc pointer lies below it, and free's range test leaves after one compare. A smaller
     * range is tried when the kernel refuses this one (strict overcommit counts it; valgrind's address-space
     * manager holds less than 64 GiB): a smaller heap is better than none. */
    char *raw = NULL;
    pmeta_t *m = NULL;
    size_t meta = 0;
    for (; limit >= ((size_t)64 << 20); limit = (limit / 2) & ~(((size_t)2 << 20) - 1)) {
        meta = (limit >> PAGE_SHIFT) * sizeof(pmeta_t);
        m = rtk_os_reserve(meta, 0);
        if (!m)
            continue;
        raw = rtk_os_reserve(limit + ((size_t)2 << 20), rtk_large_hint);
        if (raw)
            break;
        rtk_os_unmap(m, meta);
    }
    if (!raw)
        return -1;
    char *base = (char *)(((uintptr_t)raw + ((2u << 20) - 1)) & ~(uintptr_t)((2u << 20) - 1));
    /* the whole range was free: keep its first piece, give the rest of the address space back until needed (the
     * range sits above where mmap places other mappings, so it is normally still free when the heap grows) */
    size_t first = limit < RTK_LARGE_PIECE ? limit : RTK_LARGE_PIECE;
    rtk_os_unmap(base + first, (size_t)(raw + limit + ((size_t)2 << 20) - (base + first)));
    if (thp)
        rtk_os_hugepage(base, first);
    for (unsigned b = 0; b < NBINS; b++)
        g_head[0][b] = g_head[1][b] = NIL;
    g_meta = m;
    g_pages = (uint32_t)(limit >> PAGE_SHIFT);
    g_mapped = (uint32_t)(first >> PAGE_SHIFT);
    g_thp = thp;
    g_base = base;
    __atomic_store_n(&rtk_large_reach, (uintptr_t)limit, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_large_lo, (uintptr_t)base, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_large_span, (uintptr_t)first, __ATOMIC_RELEASE);
    return 0;
}

/* Map the range up to at least `pages` pages (whole pieces, at most g_pages), in place after what is mapped (caller
 * holds the lock). 0 when it reaches that far now; -1 when the address space past it is taken or RLIMIT_AS refuses:
 * the heap is then full, and requests fall back to glibc. */
static int grow_to(uint64_t pages)
{
    if (pages <= g_mapped)
        return 0;
    if (pages > g_pages)
        return -1;
    size_t piece = RTK_LARGE_PIECE >> PAGE_SHIFT;
    uint64_t want = (pages + piece - 1) / piece * piece;
    if (want > g_pages)
        want = g_pages;
    char *at = g_base + ((size_t)g_mapped << PAGE_SHIFT);
    size_t bytes = (size_t)(want - g_mapped) << PAGE_SHIFT;
    if (rtk_os_reserve_at(at, bytes) != 0)
        return -1;
    if (g_thp)
        rtk_os_hugepage(at, bytes);
    g_mapped = (uint32_t)want;
    __atomic_store_n(&rtk_large_span, (uintptr_t)want << PAGE_SHIFT, __ATOMIC_RELEASE);
    return 0;
}

static unsigned set_of(uint32_t tag) { return (tag & T_RES) ? 1 : 0; }

/* onto the list its tag names (the tag is set already) */
static void list_push(uint32_t x)
{
    uint32_t t = g_meta[x].tag;
    unsigned s = set_of(t), b = bin_of(T_PAGES(t));
    g_meta[x].prev = NIL;
    g_meta[x].next = g_head[s][b];
    if (g_head[s][b] != NIL)
        g_meta[g_head[s][b]].prev = x;
    g_head[s][b] = x;
    g_map[s][b / 64] |= 1ull << (b % 64);
}

static void list_remove(uint32_t x)
{
    uint32_t t = g_meta[x].tag;
    unsigned s = set_of(t), b = bin_of(T_PAGES(t));
    uint32_t p = g_meta[x].prev, n = g_meta[x].next;
    if (p != NIL)
        g_meta[p].next = n;
    else
        g_head[s][b] = n;
    if (n != NIL)
        g_meta[n].prev = p;
    if (g_head[s][b] == NIL)
        g_map[s][b / 64] &= ~(1ull << (b % 64));
    if (t & T_REL)
        g_released -= T_PAGES(t);
    else
        g_idle -= T_PAGES(t);
}

/* a free extent [x, x + n): tags at both ends, onto its list */
static void insert_free(uint32_t x, uint32_t n, unsigned rel, uint32_t step)
{
    g_meta[x].tag = TAG(T_FREE, n, rel);
    if (n >= 2)
        g_meta[x + n - 1].tag = TAG(T_FEND, n, 0);
    g_meta[x].step = step;
    list_push(x);
    if (g_debug && !(rel & T_REL))
        poison_page(x);  /* a start inside old data (a split, a shrink) must not read as a write after free */
    if (rel & T_REL)
        g_released += n;
    else
        g_idle += n;
}

static void clear_free_tags(uint32_t x, uint32_t n)
{
    g_meta[x].tag = 0;
    if (n >= 2)
        g_meta[x + n - 1].tag = 0;
}

/* A free extent of at least need pages in list set s, unlinked; NIL when none. In need's own bin the first that
 * fits among a few (newest first); past it any extent fits, so the head of the next non-empty bin. */
static uint32_t find_in(unsigned s, uint32_t need)
{
    unsigned b = bin_of(need);
    int tries = 32;
    for (uint32_t x = g_head[s][b]; x != NIL && tries-- > 0; x = g_meta[x].next)
        if (T_PAGES(g_meta[x].tag) >= need) {
            list_remove(x);
            return x;
        }
    for (unsigned w = (b + 1) / 64; w < NBINS / 64; w++) {
        uint64_t bits = g_map[s][w];
        if (w == (b + 1) / 64)
            bits &= (b + 1) % 64 ? ~0ull << ((b + 1) % 64) : ~0ull;
        if (bits) {
            uint32_t x = g_head[s][w * 64 + (unsigned)__builtin_ctzll(bits)];
            list_remove(x);
            return x;
        }
    }
    return NIL;
}

/* A free extent for need pages, unlinked; NIL when none. A wholly resident extent whenever one fits anywhere: a
 * block on pages the heap holds costs no fault and no new RSS (measured on wdl 2048: with a bounded scan that
 * settled for given-back pages, blocks of 0.5-1 MiB faulted in steps after the plan while hundreds of MiB lay idle
 * and resident). Given-back or mixed extents only after that; resident_only: NIL then. */
static uint32_t find_free(uint32_t need, int resident_only)
{
    uint32_t x = find_in(0, need);
    if (x != NIL || resident_only)
        return x;
    return find_in(1, need);
}

/* the first page index at or after x whose address is a multiple of ap pages. Aligned by address, not by index:
 * the range is only 2 MiB-aligned where the kernel placed it (the asked-for address refused), so an index multiple
 * of a larger alignment is not an aligned address (posix_memalign(4 MiB) came back misaligned on such a machine) */
static uint32_t align_page(uint32_t x, uint32_t ap)
{
    uint64_t first = (uintptr_t)g_base >> PAGE_SHIFT;
    return (uint32_t)(((first + x + ap - 1) & ~(uint64_t)(ap - 1)) - first);
}

static void *alloc_block(size_t n, size_t align, size_t *usable, int resident_only)
{
    /* both bounds before the 32-bit page counts: a larger alignment would lose its high bits there */
    if (!g_base || n > ((size_t)g_pages << PAGE_SHIFT) || align > ((size_t)g_pages << PAGE_SHIFT))
        return NULL;
    uint32_t np = (uint32_t)((n + PAGE - 1) >> PAGE_SHIFT), ap = align > PAGE ? (uint32_t)(align >> PAGE_SHIFT) : 1;
    if (np == 0)
        np = 1;
    if (ap > g_pages)
        return NULL;
    uint32_t need = np + ap - 1;
    rtk_spin_lock(&g_lock);
    uint32_t x = find_free(need, resident_only), len;
    unsigned rel = 0;
    uint32_t step = g_step;
    if (x != NIL) {
        uint32_t t = g_meta[x].tag;
        len = T_PAGES(t);
        rel = t & T_RES;
        step = g_meta[x].step;
        clear_free_tags(x, len);
    } else if (resident_only) {
        rtk_spin_unlock(&g_lock);
        return NULL;
    } else {
        /* fresh pages from the top: start there already aligned, the skipped pages become a free extent */
        uint32_t a = align_page(g_top, ap);
        if ((uint64_t)a + np > g_pages || grow_to((uint64_t)a + np) != 0) {
            rtk_spin_unlock(&g_lock);
            return NULL;
        }
        if (a > g_top)
            insert_free(g_top, a - g_top, T_REL, g_step);
        x = a;
        len = np;
        rel = T_REL;
        g_top = a + np;
    }
    uint32_t a = align_page(x, ap);
    if (a > x) {
        insert_free(x, a - x, rel, step);
        if (g_debug)
            poison_page(a);  /* inside the extent: old data, not a freed block's start */
    }
    uint32_t tail = len - (a - x) - np;
    if (tail)
        insert_free(a + np, tail, rel, step);
    g_meta[a].tag = TAG(T_ALLOC, np, 0);
    g_meta[a].prev = 0;  /* no owner: a stale free-list link never carries the owner mark, but keep it clean */
    g_in_use += np;
    if (g_in_use > g_peak)
        g_peak = g_in_use;
    g_blocks++;
    rtk_spin_unlock(&g_lock);
    *usable = (size_t)np << PAGE_SHIFT;
    return g_base + ((size_t)a << PAGE_SHIFT);
}

void *rtk_large_alloc(size_t n, size_t align, size_t *usable) { return alloc_block(n, align, usable, 0); }

void *rtk_large_alloc_resident(size_t n, size_t align, size_t *usable) { return alloc_block(n, align, usable, 1); }

/* the page index of p when p starts a live block, else a negative rtk_large_free code */
static int64_t block_index(const void *p)
{
    uintptr_t off = (uintptr_t)p - (uintptr_t)g_base;
    if (off & (PAGE - 1))
        return -1;
    uint32_t x = (uint32_t)(off >> PAGE_SHIFT);
    if (x >= g_top)
        return -1;
    uint32_t s = T_STATE(g_meta[x].tag);
    if (s == T_ALLOC)
        return x;
    return s == T_FREE ? -2 : -1;
}

/* A neighbour about to merge with a fresh extent takes its age (the merged extent is stamped now): one that
 * has been idle for half the decay window gives its pages back first, or a large idle extent next to the
 * step's churn would never age (measured on wdl: 725 MB idle from the input pipeline's start, never decayed). */
static uint32_t age_neighbour(uint32_t x)
{
    uint32_t t = g_meta[x].tag;
    if ((t & T_REL) || !g_decay || g_step - g_meta[x].step < (g_decay + 1) / 2 || g_idle <= g_keep)
        return t & T_RES;
    uint32_t n = T_PAGES(t);
    rtk_os_release(g_base + ((size_t)x << PAGE_SHIFT), (size_t)n << PAGE_SHIFT);
    g_decayed += (size_t)n << PAGE_SHIFT;
    return T_REL;
}

/* residency of two merged extents: the same, or mixed */
static unsigned merge_res(unsigned a, unsigned b) { return a == b ? a : T_MIX; }

/* put [x, x + n) back, merged with free neighbours (caller holds the lock, the pages carry no tags); rel: its
 * pages were given back already (kept as released only when no resident neighbour joins it) */
static void release_extent(uint32_t x, uint32_t n, unsigned rel)
{
    uint32_t r = x + n;
    if (r < g_top && T_STATE(g_meta[r].tag) == T_FREE) {
        uint32_t m = T_PAGES(g_meta[r].tag);
        rel = merge_res(rel, age_neighbour(r));
        list_remove(r);
        clear_free_tags(r, m);
        n += m;
    }
    if (x > 0) {
        uint32_t t = g_meta[x - 1].tag, l = NIL;
        if (T_STATE(t) == T_FEND)
            l = x - T_PAGES(t);
        else if (T_STATE(t) == T_FREE)
            l = x - 1;
        if (l != NIL) {
            uint32_t m = T_PAGES(g_meta[l].tag);
            rel = merge_res(rel, age_neighbour(l));
            list_remove(l);
            clear_free_tags(l, m);
            x = l;
            n += m;
        }
    }
    insert_free(x, n, rel, g_step);
}

static int free_block(void *p, size_t *bytes, int giveback)
{
    rtk_spin_lock(&g_lock);
    int64_t i = block_index(p);
    if (i < 0) {
        rtk_spin_unlock(&g_lock);
        return (int)i;
    }
    uint32_t x = (uint32_t)i, n = T_PAGES(g_meta[x].tag);
    g_meta[x].tag = 0;  /* neither live nor free until it is back on a list: no neighbour merges with it */
    g_meta[x].prev = 0;
    g_in_use -= n;
    if (giveback) {
        /* the madvise of a multi-MiB block must not stall every other thread's large malloc and free */
        rtk_spin_unlock(&g_lock);
        rtk_os_release(p, (size_t)n << PAGE_SHIFT);
        rtk_spin_lock(&g_lock);
    }
    release_extent(x, n, giveback ? T_REL : 0);
    rtk_spin_unlock(&g_lock);
    *bytes = (size_t)n << PAGE_SHIFT;
    return 0;
}

int rtk_large_free(void *p, size_t *bytes) { return free_block(p, bytes, 0); }

int rtk_large_free_release(void *p, size_t *bytes) { return free_block(p, bytes, 1); }

/* Lock-free: a block's owner word is written only by its owner while the block is live, and a live block's start
 * tag does not change; a racing bad free reads some other word, which never carries the mark (free-list links are
 * page indexes below 2^29, NIL has both top bits set) and is told apart by the owner anyway. */
uint32_t rtk_large_owner(const void *p)
{
    uintptr_t off = (uintptr_t)p - (uintptr_t)g_base;
    if ((off & (PAGE - 1)) || off >= ((size_t)__atomic_load_n(&g_top, __ATOMIC_ACQUIRE) << PAGE_SHIFT))
        return 0;
    uint32_t x = (uint32_t)(off >> PAGE_SHIFT);
    if (T_STATE(__atomic_load_n(&g_meta[x].tag, __ATOMIC_ACQUIRE)) != T_ALLOC)
        return 0;
    uint32_t w = __atomic_load_n(&g_meta[x].prev, __ATOMIC_ACQUIRE);
    return (w & RTK_LARGE_OWNED_MASK) == RTK_LARGE_OWNED ? w : 0;
}

void rtk_large_set_owner(void *p, uint32_t w)
{
    uint32_t x = (uint32_t)(((uintptr_t)p - (uintptr_t)g_base) >> PAGE_SHIFT);
    __atomic_store_n(&g_meta[x].prev, w, __ATOMIC_RELEASE);
}

size_t rtk_large_usable(const void *p)
{
    rtk_spin_lock(&g_lock);
    int64_t i = block_index(p);
    size_t r = i < 0 ? 0 : (size_t)T_PAGES(g_meta[i].tag) << PAGE_SHIFT;
    rtk_spin_unlock(&g_lock);
    return r;
}

int rtk_large_resize(void *p, size_t n, size_t *usable)
{
    uint32_t np = (uint32_t)((n + PAGE - 1) >> PAGE_SHIFT);
    if (np == 0 || n > ((size_t)g_pages << PAGE_SHIFT))
        return 0;
    rtk_spin_lock(&g_lock);
    int64_t i = block_index(p);
    if (i < 0) {
        rtk_spin_unlock(&g_lock);
        return 0;
    }
    uint32_t x = (uint32_t)i, old = T_PAGES(g_meta[x].tag), r = x + old;
    int ok = 0;
    if (np <= old) {
        if (np < old) {
            g_meta[x].tag = TAG(T_ALLOC, np, 0);
            g_in_use -= old - np;
            release_extent(x + np, old - np, 0);
        }
        ok = 1;
    } else if (r == g_top && (uint64_t)x + np <= g_pages && grow_to((uint64_t)x + np) == 0) {
        g_top = x + np;
        ok = 1;
    } else if (r < g_top && T_STATE(g_meta[r].tag) == T_FREE && old + T_PAGES(g_meta[r].tag) >= np) {
        uint32_t t = g_meta[r].tag, m = T_PAGES(t), step = g_meta[r].step;
        list_remove(r);
        clear_free_tags(r, m);
        if (old + m > np)
            insert_free(x + np, old + m - np, t & T_RES, step);
        ok = 1;
    }
    if (ok && np > old) {
        g_in_use += np - old;
        if (g_in_use > g_peak)
            g_peak = g_in_use;
    }
    if (ok)
        g_meta[x].tag = TAG(T_ALLOC, np, 0);
    rtk_spin_unlock(&g_lock);
    if (ok)
        *usable = (size_t)np << PAGE_SHIFT;
    return ok;
}

/* give back the pages of resident free extents idle for `min_age` to `max_age` steps (0 and UINT32_MAX: every
 * one), until `keep` idle pages remain; returns pages released */
static size_t release_idle(uint32_t now, uint32_t min_age, uint32_t max_age, size_t keep)
{
    size_t pages = 0;
    for (unsigned b = 0; b < NBINS && g_idle > keep; b++)
        for (unsigned set = 0; set < 2; set++)
            for (uint32_t x = g_head[set][b], nx; x != NIL && g_idle > keep; x = nx) {
                uint32_t t = g_meta[x].tag, age = now - g_meta[x].step;
                nx = g_meta[x].next;
                if ((t & T_REL) || age < min_age || age > max_age)
                    continue;
                uint32_t n = T_PAGES(t);
                rtk_os_release(g_base + ((size_t)x << PAGE_SHIFT), (size_t)n << PAGE_SHIFT);
                list_remove(x);  /* counts it out of g_idle */
                g_meta[x].tag = (t & ~T_MIX) | T_REL;
                list_push(x);    /* the given-back set: a later pass over it skips it */
                g_released += n;
                pages += n;
            }
    return pages;
}

/* Step decay. Idle pages within the heap's own high-water mark since the plan (plus 1/8) are kept however old:
 * a size that comes back only now and then (a hash table's growth, a larger batch of new ids) reuses them
 * instead of refaulting them (measured on wdl batch 2048, 60 steps: age-only decay cost 19-40 minor faults a step
 * after the plan, this rule 1). Idle pages beyond that footprint go back, the oldest first, once idle for `decay` steps. */
void rtk_large_step(uint32_t step, uint32_t decay_steps)
{
    if (!g_base)
        return;
    rtk_spin_lock(&g_lock);
    g_step = step;
    g_decay = decay_steps;
    size_t need = g_peak + g_peak / 8, keep = need > g_in_use ? need - g_in_use : 0;
    g_keep = keep;
    if (decay_steps && g_idle > keep) {
        size_t pages = 0;
        for (uint64_t age = (uint64_t)decay_steps * 8; age >= decay_steps && g_idle > keep; age /= 2)
            pages += release_idle(step, age > UINT32_MAX ? UINT32_MAX : (uint32_t)age, UINT32_MAX, keep);
        g_decayed += pages << PAGE_SHIFT;
    }
    rtk_spin_unlock(&g_lock);
}

/* a new epoch (a plan installed): the high-water mark the decay keeps restarts from what is in use now */
void rtk_large_epoch(void)
{
    rtk_spin_lock(&g_lock);
    g_peak = g_in_use;
    rtk_spin_unlock(&g_lock);
}

/* The plan's classes took the heap's resident idle extents; the sizes no class serves (the batch's unique ids,
 * a table's growth) then found none and grew the heap at its top, ~1 MiB at a time, in steps long after the plan
 * (wdl batch 2048: 5-14 minor faults a step on average against 0.2 with this reserve). */
size_t rtk_large_reserve(size_t bytes)
{
    if (!g_base)
        return 0;
    rtk_spin_lock(&g_lock);
    size_t have = g_idle << PAGE_SHIFT;
    rtk_spin_unlock(&g_lock);
    if (have >= bytes)
        return 0;
    size_t usable;
    void *p = alloc_block(bytes - have, PAGE, &usable, 0);
    if (!p)
        return 0;
    rtk_os_populate(p, usable);
    free_block(p, &usable, 0);  /* back as a resident free extent */
    rtk_spin_lock(&g_lock);
    g_blocks--;                 /* not a block the program asked for */
    g_prefaulted += usable;
    rtk_spin_unlock(&g_lock);
    return usable;
}

size_t rtk_large_trim(void)
{
    if (!g_base)
        return 0;
    rtk_spin_lock(&g_lock);
    size_t pages = release_idle(g_step, 0, UINT32_MAX, 0);
    g_trims++;
    rtk_spin_unlock(&g_lock);
    return pages << PAGE_SHIFT;
}

void rtk_large_info(rtk_large_info_t *out)
{
    memset(out, 0, sizeof *out);
    if (!g_base)
        return;
    rtk_spin_lock(&g_lock);
    out->reserved = (size_t)g_pages << PAGE_SHIFT;
    out->mapped = (size_t)g_mapped << PAGE_SHIFT;
    out->used = (size_t)g_top << PAGE_SHIFT;
    out->in_use = g_in_use << PAGE_SHIFT;
    out->idle = g_idle << PAGE_SHIFT;
    out->released = g_released << PAGE_SHIFT;
    out->blocks = g_blocks;
    out->decayed_bytes = g_decayed;
    out->trims = g_trims;
    out->prefaulted = g_prefaulted;
    rtk_spin_unlock(&g_lock);
}

void rtk_large_lock(void) { rtk_spin_fork_prepare(&g_lock); }
void rtk_large_unlock(void) { rtk_spin_fork_parent(&g_lock); }
void rtk_large_reset_lock(void) { rtk_spin_fork_child(&g_lock); }
