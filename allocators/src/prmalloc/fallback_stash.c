/* fallback_stash.c -- the fallback stash: once planned, freed large glibc blocks are kept for the next fallback that fits. */
#include "prmalloc/fallback_stash.h"

/* A class that runs out after the plan (a step keeps one block more live than the profile saw: TF ordering ops
 * differently under load) falls back to glibc every step. glibc serves such a block by mmap, or from a heap
 * top it trims again at free once several are freed together, so each recurrence faults the block in anew.
 * Once planned, frees of glibc chunks at or
 * above min_size and no larger than twice the largest class are kept here (at most RTK_STASH) and handed to
 * the next fallback they fit: recurring fallbacks fault once, not every step. Memory held: at most RTK_STASH
 * blocks and max(plan's reserved bytes, 64 MiB), blocks that were live at the same time anyway (peak unchanged). */
#define RTK_STASH 16
static rtk_spin_t g_stash_lock = RTK_SPIN_INIT;
static void *g_stash[RTK_STASH];
static size_t g_stash_size[RTK_STASH];  /* usable bytes */
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

/* empty the stash into glibc (profiling again: the blocks must not hide from the new profile) */
void rtk_stash_disable(void)
{
    __atomic_store_n(&g_stash_on, 0, __ATOMIC_RELEASE);
    for (;;) {
        void *p = NULL;
        rtk_spin_lock(&g_stash_lock);
        if (g_nstash) {
            p = g_stash[--g_nstash];
            g_stash_bytes -= g_stash_size[g_nstash];
        }
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
    /* a kept block is free: glibc never sees its second free, so the stash catches it (and would otherwise
     * hand the block to two callers) */
    for (int i = 0; i < g_nstash; i++)
        if (g_stash[i] == p) {
            rtk_spin_unlock(&g_stash_lock);
            return -1;
        }
    size_t usable = rtk_libc_usable(p);
    if (g_nstash < RTK_STASH && g_stash_bytes + usable <= g_stash_cap) {
        g_stash[g_nstash] = p;
        g_stash_size[g_nstash++] = usable;
        g_stash_bytes += usable;
        kept = 1;
    }
    rtk_spin_unlock(&g_stash_lock);
    return kept;
}

int rtk_stash_holds(const void *p)
{
    if (!__atomic_load_n(&g_nstash, __ATOMIC_ACQUIRE))
        return 0;
    int held = 0;
    rtk_spin_lock(&g_stash_lock);
    for (int i = 0; i < g_nstash && !held; i++)
        held = g_stash[i] == p;
    rtk_spin_unlock(&g_stash_lock);
    return held;
}

/* the most recently kept block that fits n at align without wasting more than n */
void *rtk_stash_pop(size_t n, size_t align)
{
    if (!__atomic_load_n(&g_nstash, __ATOMIC_ACQUIRE))
        return NULL;
    void *p = NULL;
    size_t mask = align > 16 ? align - 1 : 15;
    rtk_spin_lock(&g_stash_lock);
    for (int i = g_nstash - 1; i >= 0; i--) {
        if (g_stash_size[i] >= n && g_stash_size[i] - n <= n && !((uintptr_t)g_stash[i] & mask)) {
            p = g_stash[i];
            g_stash_bytes -= g_stash_size[i];
            g_stash[i] = g_stash[g_nstash - 1];
            g_stash_size[i] = g_stash_size[g_nstash - 1];
            g_nstash--;
            break;
        }
    }
    rtk_spin_unlock(&g_stash_lock);
    if (p)
        __atomic_add_fetch(&rtk_engine.fallback_reused, 1, __ATOMIC_RELAXED);
    return p;
}

void rtk_stash_fork_prepare(void) { rtk_spin_fork_prepare(&g_stash_lock); }
void rtk_stash_fork_parent(void) { rtk_spin_fork_parent(&g_stash_lock); }
void rtk_stash_fork_child(void) { rtk_spin_fork_child(&g_stash_lock); }
