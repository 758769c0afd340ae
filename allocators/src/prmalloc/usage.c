/* usage.c -- live and idle bytes for the step marks and mallinfo: rtkit's arenas and large heap, and glibc's
 * own books (its mallinfo2, found with dlsym so that ours, which adds rtkit's memory, is not counted twice). */
#include <dlfcn.h>
#include <malloc.h>

#include "prmalloc/arenas.h"
#include "prmalloc/large.h"
#include "prmalloc/usage.h"

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

int64_t rtk_live_bytes(void)
{
    static void *next;
    struct mallinfo2 (*f)(void) = (struct mallinfo2 (*)(void))__atomic_load_n(&next, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (struct mallinfo2 (*)(void))dlsym(RTLD_NEXT, "mallinfo2");  /* glibc's own: ours adds rtkit's */
        __atomic_store_n(&next, (void *)f, __ATOMIC_RELEASE);
    }
    size_t glibc = 0, live, idle;
    if (f) {
        struct mallinfo2 m = f();
        glibc = m.uordblks + m.hblkhd;
    }
    rtk_rtkit_usage(&live, &idle);
    return (int64_t)(glibc + live);
}
