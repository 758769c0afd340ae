/* core.h -- PRMalloc's global state shared by the entry points (interpose.c) and the engine (core.c). */
#ifndef RTK_PRMALLOC_CORE_H
#define RTK_PRMALLOC_CORE_H

#include "prmalloc/internal.h"

enum { RTK_MODE_UNINIT = 0, RTK_MODE_INITIALIZING = 1, RTK_MODE_READY = 2 };

/* What the hot paths read, together on one cache line. */
typedef struct rtk_hot {
    size_t fast_max;        /* malloc/new below this size take the inline small path (0: all go slow) */
    uintptr_t arena_lo;     /* [arena_lo, arena_lo + arena_span) covers every arena */
    uintptr_t arena_span;
    size_t track_min;       /* free of a chunk this large asks the profiler (SIZE_MAX: not profiling) */
    size_t min_size;        /* RTKIT_MALLOC_MIN_SIZE when active, SIZE_MAX otherwise */
    int inspect;            /* free counts and reads the chunk header */
    int mode;
    uintptr_t tier_lo;      /* [tier_lo, tier_lo + tier_span) is the tier-mode pool (span 0: none), tier.c */
    uintptr_t tier_span;
    uintptr_t any_lo;       /* [any_lo, any_lo + any_span) covers the arenas and the tier pool: free tests */
    uintptr_t any_span;     /* this one range, then sorts out which (rtk_publish_any) */
    size_t pass_max;        /* RTKIT_MALLOC_CENSUS=0: malloc below this is a plain tail call to glibc */
} rtk_hot_t;

RTK_HIDDEN extern rtk_hot_t rtk_hot;

RTK_HIDDEN void rtk_init(void);
/* Every allocation that is not the inline small malloc: census, arenas, profiler, glibc fallback.
 * align: 0 for malloc's default alignment, else a power of two. zero: calloc semantics. */
RTK_HIDDEN void *rtk_alloc(size_t n, size_t align, int zero);
/* Free of a pointer inside the arena range (it may still be a glibc pointer between two arenas). */
RTK_HIDDEN void rtk_free_range(void *p);
RTK_HIDDEN void rtk_profile_free(void *p);
/* Once planned: keep a freed glibc chunk of cs bytes (>= min_size) for a later fallback. 1 when kept: the
 * caller must not free it. */
RTK_HIDDEN int rtk_stash_push(void *p, size_t cs);
/* The arena owning p, or NULL. */
RTK_HIDDEN rtk_arena_t *rtk_arena_of(const void *p);
RTK_HIDDEN void *rtk_realloc(void *p, size_t n);
RTK_HIDDEN size_t rtk_usable_size(const void *p);
/* Recompute any_lo/any_span after arena_* or tier_* changed (widened first: never misses a live range). */
RTK_HIDDEN void rtk_publish_any(void);

static inline int rtk_in_range(const void *p)
{
    return (uintptr_t)p - rtk_hot.arena_lo < rtk_hot.arena_span;
}

#endif
