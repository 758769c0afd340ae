/* heap_usage.c -- live and idle bytes for the step marks and mallinfo: rtkit's arenas and large heap, and glibc's
 * own books (its mallinfo2, found with dlsym so that ours, which adds rtkit's memory, is not counted twice). */
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

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

/* the sum of total="N" over malloc_info's bin entries (<size .../> and <unsorted .../>, every heap's): the free chunks
 * in its bins. Its <total type="rest"> would count each heap's top chunk too. */
static size_t xml_bins_total(const char *xml)
{
    size_t sum = 0;
    for (const char *p = strchr(xml, '<'); p; p = strchr(p + 1, '<')) {
        if (strncmp(p, "<size ", 6) != 0 && strncmp(p, "<unsorted ", 10) != 0)
            continue;
        const char *end = strchr(p, '>'), *t = strstr(p, "total=\"");
        if (!end || !t || t > end)
            continue;
        size_t v = 0;
        for (t += 7; *t >= '0' && *t <= '9'; t++)
            v = v * 10 + (size_t)(*t - '0');
        sum += v;
    }
    return sum;
}

/* Free chunks in glibc's heaps, in its bins, from malloc_info: unlike mallinfo2's fordblks it leaves out each
 * heap's top chunk, which in a thread heap made writable whole (glibc_heap.c) is address space, not RSS. Read at most once per max_age_ns (a walk of every arena's bins); step marks only, never inside malloc. */
static size_t glibc_free_chunks(uint64_t now_ns, uint64_t max_age_ns)
{
    static char xml[256 << 10];
    static size_t free_bytes;
    static uint64_t read_ns;
    static int have;
    if (have && now_ns - read_ns < max_age_ns)
        return free_bytes;
    have = 1;
    read_ns = now_ns;
    static void *next;
    int (*info)(int, FILE *) = (int (*)(int, FILE *))__atomic_load_n(&next, __ATOMIC_ACQUIRE);
    if (!info) {
        info = (int (*)(int, FILE *))dlsym(RTLD_NEXT, "malloc_info");  /* glibc's own: ours adds rtkit's element */
        __atomic_store_n(&next, (void *)info, __ATOMIC_RELEASE);
    }
    FILE *f = info ? fmemopen(xml, sizeof xml - 1, "w") : NULL;
    if (!f)
        return free_bytes;
    int r = info(0, f);
    long n = ftell(f);
    fclose(f);
    if (r != 0 || n <= 0 || (size_t)n >= sizeof xml - 1)
        return free_bytes;  /* no text, or more than the buffer: the last answer stands */
    xml[n] = 0;
    if (!strstr(xml, "</malloc>"))
        return free_bytes;
    free_bytes = xml_bins_total(xml);
    return free_bytes;
}

void rtk_footprint_read(size_t live, uint64_t now_ns, uint64_t max_age_ns, rtk_footprint_t *out)
{
    rtk_large_info_t li;
    size_t alive, afree, aheld;
    rtk_large_info(&li);
    rtk_arenas_usage(&alive, &afree, &aheld);
    out->live = live;
    out->arena_idle = aheld > alive ? aheld - alive : 0;  /* free blocks and the page rounding of every block */
    out->large_idle = li.idle;
    out->glibc_free = glibc_free_chunks(now_ns, max_age_ns);
}

size_t rtk_footprint_total(const rtk_footprint_t *f) { return f->live + f->arena_idle + f->large_idle + f->glibc_free; }
