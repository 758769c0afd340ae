/* large_idle.c -- the large-object heap's idle pages: the step decay that gives back what the heap's own footprint
 * does not need, malloc_trim, the headroom reserve after a plan, and the heap's figures. */
#include <string.h>

#include "common/os.h"
#include "prmalloc/large_internal.h"

/* give back the pages of resident free extents idle for `min_age` to `max_age` steps (0 and UINT32_MAX: every
 * one), until `keep` idle pages remain; returns pages released */
static size_t release_idle(uint32_t now, uint32_t min_age, uint32_t max_age, size_t keep)
{
    size_t pages = 0;
    for (unsigned b = 0; b < NBINS && rtk_large.idle > keep; b++)
        for (unsigned set = 0; set < 2; set++)
            for (uint32_t x = rtk_large.head[set][b], nx; x != NIL && rtk_large.idle > keep; x = nx) {
                uint32_t t = rtk_large.meta[x].tag, age = now - rtk_large.meta[x].step;
                nx = rtk_large.meta[x].next;
                if ((t & T_REL) || age < min_age || age > max_age)
                    continue;
                uint32_t n = T_PAGES(t);
                rtk_os_release(rtk_large.base + ((size_t)x << PAGE_SHIFT), (size_t)n << PAGE_SHIFT);
                rtk_large_list_remove(x);  /* counts it out of rtk_large.idle */
                rtk_large.meta[x].tag = (t & ~T_MIX) | T_REL;
                rtk_large_list_push(x);    /* the given-back set: a later pass over it skips it */
                rtk_large.released += n;
                pages += n;
            }
    return pages;
}

/* Step decay. Idle pages within the heap's own high-water mark since the plan (plus 1/8) are kept however old:
 * a size that comes back only now and then (a hash table's growth, a larger batch of new ids) reuses them
 * instead of refaulting them, as a decay by age alone would make it. Idle pages beyond that footprint go back, the oldest first, once idle for `decay` steps. */
void rtk_large_step(uint32_t step, uint32_t decay_steps)
{
    if (!rtk_large.base)
        return;
    rtk_spin_lock(&rtk_large.lock);
    rtk_large.step = step;
    rtk_large.decay = decay_steps;
    size_t need = rtk_large.peak + rtk_large.peak / 8, keep = need > rtk_large.in_use ? need - rtk_large.in_use : 0;
    rtk_large.keep = keep;
    if (decay_steps && rtk_large.idle > keep) {
        size_t pages = 0;
        for (uint64_t age = (uint64_t)decay_steps * 8; age >= decay_steps && rtk_large.idle > keep; age /= 2)
            pages += release_idle(step, age > UINT32_MAX ? UINT32_MAX : (uint32_t)age, UINT32_MAX, keep);
        rtk_large.decayed += pages << PAGE_SHIFT;
    }
    rtk_spin_unlock(&rtk_large.lock);
}

/* a new epoch (a plan installed): the high-water mark the decay keeps restarts from what is in use now */
void rtk_large_epoch(void)
{
    rtk_spin_lock(&rtk_large.lock);
    rtk_large.peak = rtk_large.in_use;
    rtk_spin_unlock(&rtk_large.lock);
}

/* The plan's classes take the heap's resident idle extents; the sizes no class serves (the batch's unique ids,
 * a table's growth) would then find none and grow the heap at its top, faulting, in steps long after the plan. */
size_t rtk_large_reserve(size_t bytes)
{
    if (!rtk_large.base)
        return 0;
    rtk_spin_lock(&rtk_large.lock);
    size_t have = rtk_large.idle << PAGE_SHIFT;
    rtk_spin_unlock(&rtk_large.lock);
    if (have >= bytes)
        return 0;
    size_t usable;
    void *p = rtk_large_take(bytes - have, PAGE, &usable, 0);
    if (!p)
        return 0;
    rtk_os_populate(p, usable);
    rtk_large_put(p, &usable, 0);  /* back as a resident free extent */
    rtk_spin_lock(&rtk_large.lock);
    rtk_large.blocks--;                 /* not a block the program asked for */
    rtk_large.prefaulted += usable;
    rtk_spin_unlock(&rtk_large.lock);
    return usable;
}

size_t rtk_large_trim(void)
{
    if (!rtk_large.base)
        return 0;
    rtk_spin_lock(&rtk_large.lock);
    size_t pages = release_idle(rtk_large.step, 0, UINT32_MAX, 0);
    rtk_large.trims++;
    rtk_spin_unlock(&rtk_large.lock);
    return pages << PAGE_SHIFT;
}

void rtk_large_info(rtk_large_info_t *out)
{
    memset(out, 0, sizeof *out);
    if (!rtk_large.base)
        return;
    rtk_spin_lock(&rtk_large.lock);
    out->reserved = (size_t)rtk_large.pages << PAGE_SHIFT;
    out->mapped = (size_t)rtk_large.mapped << PAGE_SHIFT;
    out->used = (size_t)rtk_large.top << PAGE_SHIFT;
    out->in_use = rtk_large.in_use << PAGE_SHIFT;
    out->idle = rtk_large.idle << PAGE_SHIFT;
    out->released = rtk_large.released << PAGE_SHIFT;
    out->blocks = rtk_large.blocks;
    out->decayed_bytes = rtk_large.decayed;
    out->trims = rtk_large.trims;
    out->prefaulted = rtk_large.prefaulted;
    rtk_spin_unlock(&rtk_large.lock);
}
