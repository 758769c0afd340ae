/* glibc_heap.h -- huge pages for the small objects that stay with glibc while rtkit's large heap takes the big blocks. */
#ifndef RTK_PRMALLOC_GLIBC_HEAP_H
#define RTK_PRMALLOC_GLIBC_HEAP_H

#include "common/log.h"

/* At init, with the large heap on and huge pages asked for: glibc's thread heaps are made writable whole when
 * created (M_TOP_PAD), unless GLIBC_TUNABLES chose otherwise. Returns 1 when the heaps seen later get huge pages. */
RTK_HIDDEN int rtk_glibc_heap_setup(int thp);
/* p: a small block glibc just returned (a sampled malloc). Its thread heap, seen for the first time, is advised
 * MADV_HUGEPAGE. Cheap: a header load and a short table scan. */
RTK_HIDDEN void rtk_glibc_heap_seen(const void *p);

#endif
