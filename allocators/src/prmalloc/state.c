/* state.c -- the definitions of PRMalloc's shared state (state.h): a leaf every other file may read. */
#include "prmalloc/large.h"
#include "prmalloc/state.h"

rtk_fastpath_t rtk_fastpath __attribute__((aligned(64))) = {
    .fast_max = 0, .track_min = SIZE_MAX, .min_size = SIZE_MAX,
    .any_lo = 0, .any_hi = 0,
};

rtk_engine_t rtk_engine;  /* everything the stats writer reports (stats.c) */

static rtk_spin_t g_publish_lock = RTK_SPIN_INIT;

void rtk_publish_fork_prepare(void) { rtk_spin_fork_prepare(&g_publish_lock); }
void rtk_publish_fork_parent(void) { rtk_spin_fork_parent(&g_publish_lock); }
void rtk_publish_fork_child(void) { rtk_spin_fork_child(&g_publish_lock); }

void rtk_publish_any(void)
{
    rtk_spin_lock(&g_publish_lock);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    uintptr_t tl = __atomic_load_n(&rtk_fastpath.tier_lo, __ATOMIC_ACQUIRE), ts = __atomic_load_n(&rtk_fastpath.tier_span, __ATOMIC_ACQUIRE);
    /* all the large heap may grow to: it grows without publishing again */
    uintptr_t ll = __atomic_load_n(&rtk_large_lo, __ATOMIC_ACQUIRE), ls = __atomic_load_n(&rtk_large_reach, __ATOMIC_ACQUIRE);
    if (ls) {
        if (ll < lo)
            lo = ll;
        if (ll + ls > hi)
            hi = ll + ls;
    }
    if (ts) {
        if (tl < lo)
            lo = tl;
        if (tl + ts > hi)
            hi = tl + ts;
    }
    if (__atomic_load_n(&rtk_fastpath.track_min, __ATOMIC_ACQUIRE) != SIZE_MAX) {
        lo = 0;  /* large glibc frees are watched (profiler, stash): every free takes the careful path */
        hi = UINTPTR_MAX;
    }
    if (!hi)
        lo = 0;  /* nothing of rtkit's to find: the empty range [0, 0) */
    /* a reader may see any mix of the stores: grow to the union first, then shrink to the new range, so it
     * never sees a range missing memory that is live in the old or the new one */
    uintptr_t olo = rtk_fastpath.any_lo, ohi = rtk_fastpath.any_hi;
    if (olo < ohi) {
        __atomic_store_n(&rtk_fastpath.any_lo, lo < olo ? lo : olo, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_fastpath.any_hi, hi > ohi ? hi : ohi, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&rtk_fastpath.any_lo, lo, __ATOMIC_RELEASE);
    __atomic_store_n(&rtk_fastpath.any_hi, hi, __ATOMIC_RELEASE);
    rtk_spin_unlock(&g_publish_lock);
}
