/* heap_usage.c -- live and idle bytes for the step marks and mallinfo: rtkit's arenas and large heap, and glibc's
 * own books (its mallinfo2, found with dlsym so that ours, which adds rtkit's memory, is not counted twice). */
#include <dlfcn.h>
#include <malloc.h>

#include "prmalloc/arena_slots.h"
#include "prmalloc/large.h"
#include "prmalloc/heap_usage.h"

void rtk_rtkit_usage(size_t *live, size_t *idle)
{
    rtk_large_info_t li;
    size_t alive, afree, aspan;
    rtk_large_info(&li);
    rtk_arenas_usage(&alive, &afree, &aspan);
    /* the blocks an arena holds are live large-heap blocks: count its handed-out blocks as live, the rest idle */
    *live = li.in_use - (aspan < li.in_use ? aspan : li.in_use) + alive;
    *idle = li.idle + afree;
}

static size_t glibc_in_use(void)
{
    static void *next;
    struct mallinfo2 (*f)(void) = (struct mallinfo2 (*)(void))__atomic_load_n(&next, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (struct mallinfo2 (*)(void))dlsym(RTLD_NEXT, "mallinfo2");  /* glibc's own: ours adds rtkit's */
        __atomic_store_n(&next, (void *)f, __ATOMIC_RELEASE);
    }
    if (!f)
        return 0;
    struct mallinfo2 m = f();
    return m.uordblks + m.hblkhd;
}

int64_t rtk_live_bytes(uint64_t now_ns, uint64_t max_age_ns)
{
    /* glibc's mallinfo2 walks every arena's bins (~2 ms on a TF worker): a step mark reuses its last answer */
    static size_t glibc;
    static uint64_t read_ns;
    static int have;
    if (!have || now_ns - read_ns >= max_age_ns) {
        glibc = glibc_in_use();
        read_ns = now_ns;
        have = 1;
    }
    size_t live, idle;
    rtk_rtkit_usage(&live, &idle);
    return (int64_t)(glibc + live);
}
