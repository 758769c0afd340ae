/* alloc.h -- PRMalloc's allocation paths below the entry points: census, arenas, tier, stash, glibc fallback. */
#ifndef RTK_PRMALLOC_ALLOC_H
#define RTK_PRMALLOC_ALLOC_H

#include "prmalloc/owner.h"

/* Every allocation that is not the inline small malloc: census, arenas, profiler, glibc fallback.
 * align: 0 for malloc's default alignment, else a power of two. zero: calloc semantics. */
RTK_HIDDEN void *rtk_alloc(size_t n, size_t align, int zero);
/* Free of a block the owner lookup (prmalloc/owner.h) placed in rtkit's memory (the tier pool, a planned class, the
 * large heap) or in the fallback stash (kept, so freed already). A corrupt free of a class's, the large heap's or a
 * kept block (interior pointer, second free) aborts. */
RTK_HIDDEN void rtk_free_owned(void *p, const rtk_owner_t *op);
/* A corrupt heap operation by the program on rtkit's memory: one line naming the call and the address, abort. */
RTK_HIDDEN void rtk_heap_corrupt(const char *call, const char *what, const void *p) __attribute__((noreturn, cold));
RTK_HIDDEN void *rtk_realloc(void *p, size_t n);

RTK_HIDDEN size_t rtk_usable_size(const void *p);

#endif
