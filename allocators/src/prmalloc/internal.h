/* internal.h -- PRMalloc's shared internal types: thread census slots, plans, arenas, profiler and global state. */
#ifndef RTK_PRMALLOC_INTERNAL_H
#define RTK_PRMALLOC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/lock.h"
#include "common/log.h"

#define RTK_BUCKETS 64          /* census buckets: sizes in [2^b, 2^(b+1)); requests of 0..7 bytes land in bucket 3 */
#define RTK_MAX_CLASSES 128     /* most size classes a plan may hold */
#define RTK_SPACINGS 5          /* exact, 1/8, 1/4, 1/2, 1/1 of a power of two */
#define RTK_MAX_SLOTS 4096      /* per-thread census slots (reused after thread exit) */
#define RTK_RING_STEPS 2000     /* per-step history kept for the stats file */
#define RTK_MIN_BLOCK_ALIGN 64

#define RTK_MAX_BLOCK_ALIGN ((size_t)2 << 20)  /* a class may be aligned up to a huge page (posix_memalign(64K, ...)) */

#if defined(__SANITIZE_ADDRESS__) && defined(RTK_NO_INTERPOSE)
/* unit tests under AddressSanitizer: delegate to the sanitizer's allocator so it owns (and checks) it all */
#include <malloc.h>
#include <stdlib.h>
#define __libc_malloc malloc
#define __libc_free free
#define __libc_calloc calloc
#define __libc_realloc realloc
#define __libc_memalign memalign
#endif

/* glibc's own allocator, exported by libc.so.6: delegation without dlsym, so nothing recurses. noplt: the
 * entry points tail-call them with one indirect jump through the GOT, not a jump to a PLT stub that jumps. */
#if defined(__x86_64__) && !defined(__clang__)
#define RTK_NOPLT __attribute__((noplt))
#else
#define RTK_NOPLT
#endif
extern void *__libc_malloc(size_t) RTK_NOPLT;
extern void __libc_free(void *) RTK_NOPLT;
extern void *__libc_calloc(size_t, size_t) RTK_NOPLT;
extern void *__libc_realloc(void *, size_t) RTK_NOPLT;
extern void *__libc_memalign(size_t, size_t) RTK_NOPLT;

#if (defined(__SANITIZE_ADDRESS__) || defined(RTK_CHECKED_LIBC)) && defined(RTK_NO_INTERPOSE)
/* unit tests under AddressSanitizer or valgrind (build.py --valgrind): their allocator owns __libc_malloc's
 * memory and has no glibc chunk header before a block, so ask it */
#include <malloc.h>
static inline size_t rtk_chunk_bytes(const void *p) { return malloc_usable_size((void *)p); }
static inline size_t rtk_libc_usable(const void *p) { return malloc_usable_size((void *)p); }
#else
/* glibc chunk header: the size word before the user pointer (low 3 bits are flags; bit 1 = mmapped).
 * Reading it costs one load and gives live bytes (chunk bytes, overhead included) without a table. */
static inline size_t rtk_chunk_bytes(const void *p) { return ((const size_t *)p)[-1] & ~(size_t)7; }
static inline size_t rtk_libc_usable(const void *p)
{
    size_t h = ((const size_t *)p)[-1];
    return (h & ~(size_t)7) - ((h & 2) ? 16 : 8);
}
#endif

/* ---- per-thread census slot (written only by its owner thread; summed by the step mark) */
typedef struct rtk_tslot {
    int64_t live;               /* chunk bytes allocated minus freed by this thread (may go negative) */
    uint64_t frees;             /* live and frees share the first line: a free touches one cache line */
    uint64_t calloc_calls, realloc_calls, memalign_calls;
    uint64_t arena_hits, fallbacks, arena_misses, arena_exhausted;
    uint64_t large_hits;        /* fallbacks (no planned block) served by the large-object heap, not glibc */
    uint64_t arena_above;       /* misses above malloc_class_max: sizes the plan leaves to the large heap by rule */
    int owned;                  /* 1 while a live thread owns the slot */
    /* two arrays, not an array of pairs: an 8-byte stride is an x86 scaled index, so a small malloc adds to
     * count[b] and bytes[b] with no index arithmetic (two lines touched, both hot in the owner's cache) */
    uint64_t count[RTK_BUCKETS] __attribute__((aligned(64)));
    uint64_t bytes[RTK_BUCKETS];
} rtk_tslot_t;

typedef struct rtk_totals {
    uint64_t allocs, bytes, frees, calloc_calls, realloc_calls, memalign_calls;
    uint64_t arena_hits, fallbacks, arena_misses, arena_exhausted, small_calls, large_hits, arena_above;
    int64_t live;
    uint64_t count[RTK_BUCKETS], bucket_bytes[RTK_BUCKETS];
} rtk_totals_t;

RTK_HIDDEN rtk_tslot_t *rtk_slot_claim(void);
RTK_HIDDEN void rtk_census_sum(rtk_totals_t *t);
RTK_HIDDEN int rtk_census_init(void);
RTK_HIDDEN void rtk_census_fork_prepare(void);
RTK_HIDDEN void rtk_census_fork_parent(void);
RTK_HIDDEN void rtk_census_fork_child(void);
extern __thread rtk_tslot_t *rtk_t_slot __attribute__((tls_model("initial-exec"), visibility("hidden")));

static inline rtk_tslot_t *rtk_slot(void)
{
    rtk_tslot_t *s = rtk_t_slot;
    return __builtin_expect(s != NULL, 1) ? s : rtk_slot_claim();
}

/* requests under 8 bytes count in the 8..15 B class (same 32-byte glibc chunk; interpose.c census_small) */
static inline unsigned rtk_bucket(size_t n) { return 63u - (unsigned)__builtin_clzl(n | 8); }

/* ---- plans */
typedef struct rtk_class {
    size_t size;                /* block bytes */
    uint32_t blocks;
    uint32_t align;             /* guaranteed alignment of each block */
} rtk_class_t;

typedef struct rtk_plan {
    int nclasses;
    size_t min_size;            /* a parsed plan file's min_size (0: not given) */
    int spacing;                /* index into rtk_spacing_name */
    size_t reserved;            /* bytes the arena reserves (page-rounded per class) */
    size_t step_peak;           /* most bytes of the planned sizes live at once in a profiled step, page-rounded
                                 * (0: not known): what one shared pool would need, against `reserved` */
    int above_max;              /* recurring sizes above the planner's class_max, left to the large heap */
    rtk_class_t cls[RTK_MAX_CLASSES];
} rtk_plan_t;

/* one profiled event: kind 1 = alloc, 2 = free (sizes are the requested ones) */
typedef struct rtk_event {
    uint64_t size;
    uint32_t align;
    uint32_t kind;
} rtk_event_t;

typedef struct rtk_ctab {
    int n;
    int overflow;               /* more distinct classes than RTK_MAX_CLASSES: spacing unusable */
    size_t size[RTK_MAX_CLASSES];
    uint32_t blocks[RTK_MAX_CLASSES];
    uint32_t align[RTK_MAX_CLASSES];
} rtk_ctab_t;

/* The planner keeps, per spacing, the most concurrently-live blocks of every class over the profiled steps. */
typedef struct rtk_planner {
    int steps;
    size_t step_peak;           /* most page-rounded bytes live at once within one profiled step */
    size_t class_max;           /* sizes above it get no class (0: no bound): the large heap serves them */
    rtk_ctab_t tab[RTK_SPACINGS];
} rtk_planner_t;

RTK_HIDDEN extern const char *const rtk_spacing_name[RTK_SPACINGS];
RTK_HIDDEN size_t rtk_class_round(size_t size, int spacing);
RTK_HIDDEN void rtk_planner_reset(rtk_planner_t *pl);
RTK_HIDDEN void rtk_planner_add_step(rtk_planner_t *pl, const rtk_event_t *ev, size_t n);
RTK_HIDDEN int rtk_planner_plan(const rtk_planner_t *pl, int spacing, size_t page, rtk_plan_t *out);
RTK_HIDDEN int rtk_planner_best(const rtk_planner_t *pl, size_t page, rtk_plan_t *out);
RTK_HIDDEN int rtk_plan_equal(const rtk_plan_t *a, const rtk_plan_t *b);
RTK_HIDDEN size_t rtk_plan_trim(rtk_plan_t *p, size_t limit, size_t page);
/* what a plan's arena takes: each block a large-heap block of whole pages */
RTK_HIDDEN size_t rtk_plan_reserved(const rtk_plan_t *p, size_t page);

/* ---- arenas */
typedef struct rtk_aclass {
    size_t size;
    uint32_t blocks, align;     /* blocks: planned, plus those grown since */
    uint32_t cap;               /* the stack's room: the most `blocks` may grow to (GROW_FACTOR x the plan's) */
    uint32_t grown;             /* blocks added because a request found the class exhausted */
    uint32_t wanted;            /* blocks to add still, from the job's frees of blocks of its size (want_more, adopt) */
    int keep_pages;             /* retired while in use: its blocks' pages stay resident in the large heap */
    void **stack;               /* free blocks (large-heap blocks this class holds) */
    rtk_spin_t lock;
    uint32_t top;
    uint32_t made;              /* blocks held: on the stack or handed out (at most `blocks`) */
    int dropped;                /* re-check found it unused: its blocks went back, nothing new is served */
    uint64_t pops;              /* blocks handed out so far (the re-check compares it across steps) */
    uint64_t pops_seen;
    uint32_t idle_steps;
    uint32_t awaited;           /* blocks left to adopt: of this size, live in the large heap when the plan came */
    uint64_t adopted;           /* freed large-heap blocks taken in (rtk_arena_adopt) */
} rtk_aclass_t;

typedef struct rtk_arena {
    int slot;                   /* index among the arenas in service: written into its blocks' owner words */
    size_t span;                /* bytes the plan allows it (page-rounded blocks); 0 once given back */
    int n;
    int retired;                /* a rejected plan: frees still land here (blocks go back), nothing new is served */
    int spacing;                /* its plan's (rtk_class_round): a class grows only for the sizes it was made for */
    int debug;
    size_t meta_size;
    uint64_t live_blocks;
    rtk_aclass_t cls[RTK_MAX_CLASSES];
} rtk_arena_t;

enum { RTK_ARENA_OK = 0, RTK_ARENA_MISS = 1, RTK_ARENA_EXHAUSTED = 2 };

/* The arena for plan p in slot `slot`: its classes' blocks are the large-object heap's (set up here if the job runs
 * without it), its idle resident extents first; only blocks taking other pages are faulted in. NULL and *why
 * when the plan could never fit or the machine lacks the memory. */
RTK_HIDDEN rtk_arena_t *rtk_arena_create(const rtk_plan_t *p, int slot, int thp, int debug, const char **why);
/* No block is live or held any more: lookups stop naming it. The metadata stays: a late reader may hold it. */
RTK_HIDDEN void rtk_arena_destroy(rtk_arena_t *a);
/* Give the free blocks back to the large heap, pages released (or, keep_pages, left resident there for the heap's
 * next blocks); dropped classes only, or all when all is set. */
RTK_HIDDEN size_t rtk_arena_release_free(rtk_arena_t *a, int all, int keep_pages);
/* Step re-check: a class that handed out no block for `steps` steps is dropped and its free blocks given back. */
RTK_HIDDEN int rtk_arena_recheck(rtk_arena_t *a, uint32_t steps);
/* A block of the smallest class that fits (*bytes: the class's size), or NULL with RTK_ARENA_MISS or _EXHAUSTED. */
RTK_HIDDEN void *rtk_arena_alloc(rtk_arena_t *a, size_t size, size_t align, int *why, size_t *bytes);
/* A freed large-heap block of `bytes` (page-rounded) taken by a class of its size that is short of its planned
 * blocks: 1 taken (it is the class's, free), 0 not (free it to the large heap). */
RTK_HIDDEN int rtk_arena_adopt(rtk_arena_t *a, void *p, size_t bytes);
/* Free p, a block of a's class k (the owner lookup names both). 0 ok; -1 p starts no block of that class (interior
 * or foreign pointer); -2 double free. In every mode. */
RTK_HIDDEN int rtk_arena_free(rtk_arena_t *a, int k, void *p);
/* bytes in handed-out blocks, in free ones, and held from the large heap (page-rounded) */
RTK_HIDDEN void rtk_arena_usage(const rtk_arena_t *a, size_t *live, size_t *free_bytes, size_t *held);
/* fork's handlers over every class lock (common/lock.h: a lock the forking thread holds itself is left alone) */
RTK_HIDDEN void rtk_arena_lock_all(rtk_arena_t *a);
RTK_HIDDEN void rtk_arena_unlock_all(rtk_arena_t *a);
RTK_HIDDEN void rtk_arena_reset_locks(rtk_arena_t *a);

#endif
