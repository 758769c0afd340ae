/* tier_resident.c -- which pool pages are in DRAM (mincore, one shared vector) and the highest-RSS sample for the report. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "prmalloc/tier_internal.h"

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

unsigned char *rtk_tier_vec;
double rtk_tier_t0;

/* The mincore vector, mapped at first use; the first mark's RSS sample (under the live lock) and the samples of the
 * step marks may both come first, so it is published once and a second mapping is given back */
unsigned char *rtk_tier_mincore_vec(void)
{
    unsigned char *v = __atomic_load_n(&rtk_tier_vec, __ATOMIC_ACQUIRE), *none = NULL;
    if (v)
        return v;
    if (!(v = rtk_os_map(VEC_PAGES, 0)))
        return NULL;
    if (!__atomic_compare_exchange_n(&rtk_tier_vec, &none, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        rtk_os_unmap(v, VEC_PAGES);
        return none;
    }
    return v;
}

uint64_t rtk_tier_resident_of(char *lo, uint64_t len) { return rtk_tier_resident_in(lo, len, rtk_tier_vec); }

uint64_t rtk_tier_resident_in(char *lo, uint64_t len, unsigned char *vec)
{
    uint64_t pages = 0;
    uintptr_t a = (uintptr_t)lo & ~(uintptr_t)4095, end = (uintptr_t)lo + len;
    while (a < end) {
        uint64_t n = (end - a + 4095) / 4096;
        if (n > VEC_PAGES)
            n = VEC_PAGES;
        if (rtk_os_resident((void *)a, n * 4096, vec) != 0)
            return pages * 4096;
        for (uint64_t i = 0; i < n; i++)
            pages += vec[i] & 1;
        a += n * 4096;
    }
    return pages * 4096;
}

/* At the highest RSS sampled (every residency sample, and the first step mark before it gives the pre-step frees'
 * pages back), what tier mode held in DRAM against what lived in the pool: whether the pool cost more memory than
 * it saved. The whole used span is read once (records sharing a page counted once, freed records' pages not yet
 * given back counted too; pool_dram: that figure when the caller has just read it, else UINT64_MAX). Not at exit:
 * frees then keep their pages for the unlink. */
void rtk_tier_sample_rss(uint64_t pool_dram)
{
    char buf[256], *end;
    if (rtk_tier.state != T_ON || rtk_tier.exiting || rtk_os_read_file("/proc/self/statm", buf, sizeof buf) < 0)
        return;
    strtoull(buf, &end, 10);  /* size, then resident pages */
    uint64_t rss = (uint64_t)strtoull(end, NULL, 10) * TIER_PAGE;
    /* under the live lock: the first step mark runs outside the step lock, and rtk_tier_vec is shared with the samples */
    rtk_spin_lock(&rtk_tier.live_lock);
    if (rss > rtk_tier_view.at_rss_peak.rss && rtk_tier_mincore_vec()) {
        rtk_tier_view.at_rss_peak.rss = rss;
        rtk_tier_view.at_rss_peak.live = LD(rtk_tier.bytes);
        rtk_tier_view.at_rss_peak.pool_dram =
            pool_dram != UINT64_MAX ? pool_dram : rtk_tier_resident_of(rtk_tier.base, LD(rtk_tier.high));
        rtk_tier_view.at_rss_peak.step = rtk_tier.steps;
        rtk_tier_view.at_rss_peak.t_s = rtk_tier_t0 ? rtk_tier_now_s() - rtk_tier_t0 : 0;
    }
    rtk_spin_unlock(&rtk_tier.live_lock);
}
