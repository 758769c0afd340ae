/* heap_usage.h -- how much memory is live and idle, from rtkit's own books (arenas, large heap) and glibc's. */
#ifndef RTK_PRMALLOC_HEAP_USAGE_H
#define RTK_PRMALLOC_HEAP_USAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/log.h"

/* rtkit's own memory: bytes in live blocks and idle resident bytes (arenas and the large heap). */
RTK_HIDDEN void rtk_rtkit_usage(size_t *live, size_t *idle);
/* Live bytes of the process's heap: glibc's in-use bytes (its own books, mallinfo2) plus rtkit's live blocks.
 * Small frees are not counted on the fast path, so the step marks take live bytes from here. glibc's part is
 * read again only when the last read is max_age_ns old (0: now); callers hold the step lock. */
RTK_HIDDEN int64_t rtk_live_bytes(uint64_t now_ns, uint64_t max_age_ns);

/* The heap's resident footprint at a step mark, split into what the program holds and what each part of the heap
 * holds over it: arenas (free class blocks, and every block's rounding up to pages), the large heap's resident
 * free pages, glibc's free chunks below its heaps' tops (read again once max_age_ns old). Step marks only: it
 * may allocate. */
typedef struct rtk_footprint {
    uint32_t step;      /* the step that had just ended */
    int have;
    size_t live, arena_idle, large_idle, glibc_free;
} rtk_footprint_t;
RTK_HIDDEN void rtk_footprint_read(size_t live, uint64_t now_ns, uint64_t max_age_ns, rtk_footprint_t *out);
RTK_HIDDEN size_t rtk_footprint_total(const rtk_footprint_t *f);

#endif
