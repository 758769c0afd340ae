/* glibc_heap.c -- huge pages for glibc's thread heaps. While rtkit's large heap serves the big blocks, the small
 * objects that stay with glibc (a recommender's hash nodes for new ids: ~150 KiB more live data every step on wdl)
 * find none of the touched free chunks that big blocks leave in glibc's heaps when glibc serves them: they grow the
 * heaps into fresh pages, one minor fault per 4 KiB (measured: ~40 per step after the plan, the whole of the excess
 * over RTKIT_MALLOC_LARGE=0). glibc's own THP tunable (glibc.malloc.hugetlb=1) advises only the main heap; its
 * thread heaps grow by mprotect a few pages at a time, and a 2 MiB page needs its whole aligned range writable. So:
 * the top pad is the heap size (glibc then makes each new thread heap writable whole; untouched pages cost nothing),
 * and each thread heap is advised MADV_HUGEPAGE when a sampled malloc first returns a block from it. Faults then
 * come one per 2 MiB. glibc's heap layout used: a thread heap is HEAP_MAX-aligned (2 * DEFAULT_MMAP_THRESHOLD_MAX)
 * and a chunk's size word has NON_MAIN_ARENA (4) set when it lies in one. */
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "common/options.h"
#include "common/os.h"
#include "prmalloc/glibc_heap.h"

extern int __libc_mallopt(int, int);

#define HEAP_MAX ((uintptr_t)2 * 4 * 1024 * 1024 * sizeof(long))
#define MAX_HEAPS 256

static int g_on;
static uintptr_t g_heaps[MAX_HEAPS];

#if !(defined(__SANITIZE_ADDRESS__) || defined(RTK_CHECKED_LIBC) || defined(RTK_NO_INTERPOSE))
/* the value the user gave a glibc.malloc tunable in GLIBC_TUNABLES, or NULL */
static const char *tunable(const char *name)
{
    const char *t = rtk_opt_internal(RTK_ENV_GLIBC_TUNABLES);
    size_t n = strlen(name);
    for (const char *s = t; s && *s;) {
        if (!strncmp(s, name, n) && s[n] == '=')
            return s + n + 1;
        s = strchr(s, ':');
        s = s ? s + 1 : NULL;
    }
    return NULL;
}
#endif

int rtk_glibc_heap_setup(int thp)
{
#if defined(__SANITIZE_ADDRESS__) || defined(RTK_CHECKED_LIBC) || defined(RTK_NO_INTERPOSE)
    (void)thp;
    return 0;  /* no glibc heaps under a checking allocator */
#else
    const char *h = tunable("glibc.malloc.hugetlb");
    if (!thp || (h && strncmp(h, "1", 1) != 0) || (h && h[1] && h[1] != ':'))
        return 0;  /* huge pages off, or the user chose glibc's hugetlbfs mode or none */
    if (!tunable("glibc.malloc.top_pad"))
        __libc_mallopt(M_TOP_PAD, (int)HEAP_MAX);
    /* M_TOP_PAD turns glibc's dynamic mmap threshold off (it rises only when glibc frees an mmapped chunk, and the
     * big blocks are rtkit's now): set it to the ceiling that rule would reach, so a glibc block grown by realloc
     * stays in the heap and is reused, as under glibc alone, instead of mmapped afresh each time */
    if (!tunable("glibc.malloc.mmap_threshold"))
        __libc_mallopt(M_MMAP_THRESHOLD, (int)(HEAP_MAX / 2));
    g_on = 1;
    return 1;
#endif
}

void rtk_glibc_heap_seen(const void *p)
{
    if (!g_on || !p)
        return;
    size_t w = ((const size_t *)p)[-1];
    if ((w & 6) != 4)
        return;  /* main heap (glibc advises it itself) or an mmapped chunk */
    uintptr_t heap = (uintptr_t)p & ~(HEAP_MAX - 1);
    for (unsigned i = 0; i < MAX_HEAPS; i++) {
        uintptr_t v = __atomic_load_n(&g_heaps[i], __ATOMIC_RELAXED);
        if (v == heap)
            return;
        if (v == 0) {
            if (!__atomic_compare_exchange_n(&g_heaps[i], &v, heap, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                if (v == heap)
                    return;
                continue;
            }
            rtk_os_hugepage((void *)heap, HEAP_MAX);
            return;
        }
    }
}
