/* alloc.h -- PRMalloc's allocation paths below the entry points: census, arenas, tier, stash, glibc fallback. */
#ifndef RTK_PRMALLOC_ALLOC_H
#define RTK_PRMALLOC_ALLOC_H

#include "prmalloc/state.h"

/* Every allocation that is not the inline small malloc: census, arenas, profiler, glibc fallback.
 * align: 0 for malloc's default alignment, else a power of two. zero: calloc semantics. */
RTK_HIDDEN void *rtk_alloc(size_t n, size_t align, int zero);
/* Free of a pointer in the large-object heap's range. */
RTK_HIDDEN void rtk_free_large(void *p);
/* A corrupt heap operation by the program on rtkit's memory: one line naming the call and the address, abort. */
RTK_HIDDEN void rtk_heap_corrupt(const char *call, const char *what, const void *p) __attribute__((noreturn, cold));
RTK_HIDDEN void *rtk_realloc(void *p, size_t n);

RTK_HIDDEN size_t rtk_usable_size(const void *p);

#endif
