/* prmalloc_unit_peer_cases.c -- the peer-suite cases of prmalloc_peer_cases.c linked against the allocator's sources
 * (-DRTK_NO_INTERPOSE: the entry points are rtk_api_*), so they run under AddressSanitizer (build.py --asan), where
 * a preloaded allocator cannot take malloc from the sanitizer's interceptors. The cases' own calls go to rtkit;
 * what glibc allocates inside (stdio) goes to the sanitizer's allocator, as rtkit's own fallbacks do in this build. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>

void *rtk_api_malloc(size_t);
void rtk_api_free(void *);
void *rtk_api_calloc(size_t, size_t);
void *rtk_api_realloc(void *, size_t);
void *rtk_api_reallocarray(void *, size_t, size_t);
int rtk_api_posix_memalign(void **, size_t, size_t);
void *rtk_api_aligned_alloc(size_t, size_t);
void *rtk_api_memalign(size_t, size_t);
void *rtk_api_valloc(size_t);
void *rtk_api_pvalloc(size_t);
size_t rtk_api_malloc_usable_size(void *);

#define malloc rtk_api_malloc
#define free rtk_api_free
#define calloc rtk_api_calloc
#define realloc rtk_api_realloc
#define reallocarray rtk_api_reallocarray
#define posix_memalign rtk_api_posix_memalign
#define aligned_alloc rtk_api_aligned_alloc
#define memalign rtk_api_memalign
#define valloc rtk_api_valloc
#define pvalloc rtk_api_pvalloc
#define malloc_usable_size rtk_api_malloc_usable_size

#define PRMALLOC_TEST_LINKED
#include "prmalloc_peer_cases.c"
