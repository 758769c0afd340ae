/* large_internal.h -- what the large-object heap's files share: the page map's tags, the free lists, the heap's state. */
#ifndef RTK_PRMALLOC_LARGE_INTERNAL_H
#define RTK_PRMALLOC_LARGE_INTERNAL_H

#include "common/lock.h"
#include "prmalloc/large.h"

#define PAGE_SHIFT 12
#define PAGE ((size_t)1 << PAGE_SHIFT)
#define NBINS 128
#define NIL UINT32_MAX

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

typedef struct rtk_large_heap {
    rtk_spin_t lock;
    char *base;
    pmeta_t *meta;
    uint32_t pages, top;      /* pages the range may span; pages ever handed out from the bottom */
    uint32_t mapped;          /* pages mapped so far (rtk_large_span) */
    int thp;
    /* two sets of segregated lists: [0] wholly resident free extents, [1] given-back or mixed ones, so a request
     * finds a resident extent whenever one fits, in O(1) past its own bin, however many given-back ones lie around */
    uint32_t head[2][NBINS];
    uint64_t map[2][NBINS / 64];  /* non-empty lists */
    uint32_t step, decay;
    size_t in_use, idle, released;  /* pages */
    size_t peak;                    /* most pages in use at once since the epoch (plan install) */
    size_t keep;                    /* idle pages the decay spares (within the high-water mark) */
    uint64_t blocks, decayed, trims;
    size_t prefaulted;              /* bytes */
    int debug;                      /* RTKIT_MALLOC_DEBUG: free extents' starts hold the poison */
} rtk_large_heap_t;

RTK_HIDDEN extern rtk_large_heap_t rtk_large;

/* the free lists (caller holds the lock): onto the list its tag names, and off it (counted out of idle/released) */
RTK_HIDDEN void rtk_large_list_push(uint32_t x);
/* Map the range and its page map up to at least `pages` pages (whole pieces, at most rtk_large.pages), in place
 * after what is mapped (caller holds the lock). 0 when it reaches that far now; -1 when the address space past it
 * is taken or RLIMIT_AS refuses: the heap is then full, and requests fall back to glibc. */
RTK_HIDDEN int rtk_large_grow_to(uint64_t pages);
RTK_HIDDEN void rtk_large_list_remove(uint32_t x);
/* a block (resident_only: from wholly resident free pages only) and its free (giveback: pages released first) */
RTK_HIDDEN void *rtk_large_take(size_t n, size_t align, size_t *usable, int resident_only);
RTK_HIDDEN int rtk_large_put(void *p, size_t *bytes, int giveback);

#endif
