/* large_map.c -- the large-object heap's address space: where its range and page map are placed, and how both are
 * mapped a piece at a time as the heap grows, so a program that lowers RLIMIT_AS after start (glibc's
 * tst-malloc-thread-fail sets 200 MiB) keeps its room for threads and its own mappings. */
#include <stdio.h>

#include "common/options.h"
#include "common/os.h"
#include "common/say.h"
#include "prmalloc/large_internal.h"

#if UINTPTR_MAX > 0xffffffffu
uintptr_t rtk_large_hint = 0x7fe000000000ull;
#else
uintptr_t rtk_large_hint = 0;
#endif

uintptr_t rtk_large_lo, rtk_large_span, rtk_large_reach;
rtk_large_heap_t rtk_large = {.lock = RTK_SPIN_INIT};

/* bytes of page map for the first `pages` pages, whole pages of it */
static size_t meta_bytes(uint64_t pages) { return ((size_t)pages * sizeof(pmeta_t) + PAGE - 1) & ~(size_t)(PAGE - 1); }

int rtk_large_init(size_t limit, int thp)
{
    if (rtk_large.base)
        return 0;
    size_t as = rtk_os_as_limit();
    if (as != SIZE_MAX && limit > as / 4)
        limit = as / 4;
    if (limit > ((size_t)1 << 40))
        limit = (size_t)1 << 40;  /* 28 bits of pages in a tag */
    limit &= ~(((size_t)2 << 20) - 1);
    if (limit < ((size_t)64 << 20))
        return -1;
    /* One reservation holds the range and, just below it, its page map; over-reserved by 2 MiB so the range starts
     * on a huge-page boundary (THP-friendly, and aligned blocks). Asked for high in the address space, above where
     * mmap places glibc's heaps and the libraries (below the stack): then every glibc pointer lies below it, free's
     * range test leaves after one compare, and the parts given back below stay free for both to grow into in place
     * (the kernel places unhinted mappings below its mmap base). A smaller range is tried when the kernel refuses
     * this one (strict overcommit counts it; valgrind's address-space manager holds less than 64 GiB): a smaller
     * heap is better than none. */
    char *raw = NULL;
    size_t meta = 0, total = 0;
    for (; limit >= ((size_t)64 << 20); limit = (limit / 2) & ~(((size_t)2 << 20) - 1)) {
        meta = meta_bytes(limit >> PAGE_SHIFT);
        total = limit + ((size_t)2 << 20) + meta;
        raw = rtk_os_reserve(total, rtk_large_hint);
        if (raw)
            break;
    }
    if (!raw)
        return -1;
    /* The page map lies below the range, the range's unmapped rest at the top: mappings the program makes later
     * (its libraries, thread heaps and stacks) fill the highest free gap first, from its top down. Above the page
     * map, that gap would be the map's own rest, and a few libraries there wall the map in: the heap could then
     * never grow past its first piece (wherever ASLR puts the libraries right above the range).
     * Below the range's rest, they meet the heap only after the whole range is taken. */
    char *base = (char *)(((uintptr_t)raw + meta + ((2u << 20) - 1)) & ~(uintptr_t)((2u << 20) - 1));
    pmeta_t *m = (pmeta_t *)(base - meta);
    /* the whole reservation was free: keep the range's first piece and its page map's share, give the rest back
     * until the heap grows into it */
    size_t first = limit < RTK_LARGE_FIRST ? limit : RTK_LARGE_FIRST;
    size_t first_meta = meta_bytes(first >> PAGE_SHIFT);
    if ((char *)m > raw)
        rtk_os_unmap(raw, (size_t)((char *)m - raw));
    if (meta > first_meta)
        rtk_os_unmap((char *)m + first_meta, meta - first_meta);
    if ((size_t)(raw + total - base) > first)
        rtk_os_unmap(base + first, (size_t)(raw + total - (base + first)));
    if (thp)
        rtk_os_hugepage(base, first);
    for (unsigned b = 0; b < NBINS; b++)
        rtk_large.head[0][b] = rtk_large.head[1][b] = NIL;
    rtk_large.meta = m;
    rtk_large.pages = (uint32_t)(limit >> PAGE_SHIFT);
    rtk_large.mapped = (uint32_t)(first >> PAGE_SHIFT);
    rtk_large.thp = thp;
    rtk_large.base = base;
    __atomic_store_n(&rtk_large_reach, (uintptr_t)limit, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_large_lo, (uintptr_t)base, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_large_span, (uintptr_t)first, __ATOMIC_RELEASE);
    return 0;
}

/* said once: from here on the large requests the heap cannot hold go to glibc, which the report should explain */
static int grow_refused(void)
{
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the large-object heap could not grow past %zu MiB (the address space next to it is "
                 "taken, or RLIMIT_AS reached): larger blocks went to glibc from then on",
                 ((size_t)rtk_large.mapped << PAGE_SHIFT) >> 20);
        rtk_keep_message(RTK_PART_MALLOC, msg);
    }
    return -1;
}

int rtk_large_grow_to(uint64_t pages)
{
    if (pages <= rtk_large.mapped)
        return 0;
    if (pages > rtk_large.pages)
        return -1;
    size_t piece = RTK_LARGE_PIECE >> PAGE_SHIFT;
    uint64_t want = (pages + piece - 1) / piece * piece;
    if (want > rtk_large.pages)
        want = rtk_large.pages;
    char *at = rtk_large.base + ((size_t)rtk_large.mapped << PAGE_SHIFT);
    size_t bytes = (size_t)(want - rtk_large.mapped) << PAGE_SHIFT;
    char *meta_at = (char *)rtk_large.meta + meta_bytes(rtk_large.mapped);
    size_t meta_more = meta_bytes(want) - meta_bytes(rtk_large.mapped);
    if (rtk_os_reserve_at(at, bytes) != 0)
        return grow_refused();
    if (meta_more && rtk_os_reserve_at(meta_at, meta_more) != 0) {
        rtk_os_unmap(at, bytes);
        return grow_refused();
    }
    if (rtk_large.thp)
        rtk_os_hugepage(at, bytes);
    rtk_large.mapped = (uint32_t)want;
    __atomic_store_n(&rtk_large_span, (uintptr_t)want << PAGE_SHIFT, __ATOMIC_RELEASE);
    return 0;
}
