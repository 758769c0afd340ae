/* fallback_stash.c -- the fallback stash: once planned, freed large glibc blocks are kept for the next fallback that fits. */
#include "prmalloc/fallback_stash.h"

/* A class that runs out after the plan (a step keeps one block more live than the profile saw: TF ordering ops
 * differently under load) falls back to glibc every step. glibc serves such a block by mmap, or from a heap
 * top it trims again at free once several are freed together, so each recurrence faults the block in anew.
 * Once planned, frees of glibc chunks at or
 * above min_size and no larger than twice the largest class are kept here (at most RTK_STASH) and handed to
 * the next fallback they fit: recurring fallbacks fault once, not every step. Memory held: at most RTK_STASH
 * blocks and max(plan's reserved bytes, 64 MiB), blocks that were live at the same time anyway (peak unchanged). */
static rtk_spin_t g_stash_lock = RTK_SPIN_INIT;
/* Fixed slots, so the owner lookup's lock-free scan (rtk_stash_holds) never misses a block that is only moved: a
 * slot is filled or emptied under the lock and never shifted; rtk_stash_top bounds the slots in use, rtk_stash_bits
 * sums them up (fallback_stash.h). */
void *rtk_stash_slot[RTK_STASH];
int rtk_stash_top;
uint64_t rtk_stash_bits;
static size_t g_stash_size[RTK_STASH];  /* usable bytes */
static uint64_t g_stash_seq[RTK_STASH], g_seq;  /* the order kept in: pop prefers the most recent */
static int g_nstash;
static int g_stash_on;
static size_t g_stash_max;
static size_t g_stash_bytes, g_stash_cap;  /* usable bytes held, and their bound */

void rtk_stash_enable(const rtk_plan_t *p, size_t min_size)
{
    size_t top = 0;
    for (int i = 0; i < p->nclasses; i++)
        if (p->cls[i].size > top)
            top = p->cls[i].size;
    g_stash_max = 2 * top;
    g_stash_cap = p->reserved > ((size_t)64 << 20) ? p->reserved : (size_t)64 << 20;
    __atomic_store_n(&g_stash_on, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_fastpath.track_min, min_size, __ATOMIC_RELEASE);  /* large frees: ask the stash */
    rtk_publish_any();
}

/* slot i out of the stash (under the lock): emptied before the bits and the top stop covering it, so a lock-free
 * reader finds it kept or not, never a stale block */
static void *take(int i)
{
    void *p = rtk_stash_slot[i];
    g_stash_bytes -= g_stash_size[i];
    g_nstash--;
    __atomic_store_n(&rtk_stash_slot[i], NULL, __ATOMIC_RELEASE);
    uint64_t bits = 0;
    int top = 0;
    for (int k = 0; k < RTK_STASH; k++)
        if (rtk_stash_slot[k]) {
            bits |= RTK_STASH_BIT(rtk_stash_slot[k]);
            top = k + 1;
        }
    __atomic_store_n(&rtk_stash_bits, bits, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_stash_top, top, __ATOMIC_RELEASE);
    return p;
}

/* empty the stash into glibc (profiling again: the blocks must not hide from the new profile) */
void rtk_stash_disable(void)
{
    __atomic_store_n(&g_stash_on, 0, __ATOMIC_RELEASE);
    for (;;) {
        void *p = NULL;
        rtk_spin_lock(&g_stash_lock);
        if (rtk_stash_top)
            p = take(rtk_stash_top - 1);  /* the top slot is never empty */
        rtk_spin_unlock(&g_stash_lock);
        if (!p)
            break;
        __libc_free(p);
    }
}

int rtk_stash_push(void *p, size_t cs)
{
    if (!__atomic_load_n(&g_stash_on, __ATOMIC_ACQUIRE) || cs > g_stash_max + 4096)
        return 0;
    int kept = 0;
    rtk_spin_lock(&g_stash_lock);
    /* a kept block is free: glibc never sees its second free, so the stash catches it (and would otherwise hand
     * the block to two callers). The owner lookup has said so already, lock-free; two frees of p racing both
     * pass it, so the stash looks again under its lock */
    for (int i = 0; i < rtk_stash_top; i++)
        if (rtk_stash_slot[i] == p) {
            rtk_spin_unlock(&g_stash_lock);
            return -1;
        }
    size_t usable = rtk_libc_usable(p);
    if (g_nstash < RTK_STASH && g_stash_bytes + usable <= g_stash_cap) {
        int i = 0;
        while (rtk_stash_slot[i])
            i++;
        g_stash_size[i] = usable;
        g_stash_seq[i] = ++g_seq;
        g_stash_bytes += usable;
        g_nstash++;
        /* the slot filled before the top and the bits cover it: a reader that sees them sees the block */
        __atomic_store_n(&rtk_stash_slot[i], p, __ATOMIC_RELEASE);
        if (i >= rtk_stash_top)
            __atomic_store_n(&rtk_stash_top, i + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_stash_bits, rtk_stash_bits | RTK_STASH_BIT(p), __ATOMIC_RELEASE);
        kept = 1;
    }
    rtk_spin_unlock(&g_stash_lock);
    return kept;
}

/* the most recently kept block that fits n at align without wasting more than n */
void *rtk_stash_pop(size_t n, size_t align)
{
    if (!__atomic_load_n(&rtk_stash_top, __ATOMIC_ACQUIRE))
        return NULL;
    void *p = NULL;
    size_t mask = align > 16 ? align - 1 : 15;
    rtk_spin_lock(&g_stash_lock);
    int best = -1;
    for (int i = 0; i < rtk_stash_top; i++) {
        void *q = rtk_stash_slot[i];
        if (q && g_stash_size[i] >= n && g_stash_size[i] - n <= n && !((uintptr_t)q & mask) &&
            (best < 0 || g_stash_seq[i] > g_stash_seq[best]))
            best = i;
    }
    if (best >= 0)
        p = take(best);
    rtk_spin_unlock(&g_stash_lock);
    if (p)
        __atomic_add_fetch(&rtk_engine.fallback_reused, 1, __ATOMIC_RELAXED);
    return p;
}

void rtk_stash_fork_prepare(void) { rtk_spin_fork_prepare(&g_stash_lock); }
void rtk_stash_fork_parent(void) { rtk_spin_fork_parent(&g_stash_lock); }
void rtk_stash_fork_child(void) { rtk_spin_fork_child(&g_stash_lock); }
