/* profile.c -- the large-allocation profiler: a table of live profiled blocks and an event log per step, fed to the
 * planner; the step machine (step.c) starts and stops it and asks for the candidate plan. */
#include <string.h>

#include "common/os.h"
#include "prmalloc/profile.h"
#include "prmalloc/tier.h"

#define PTAB_BITS 16
#define PTAB_CAP (1u << PTAB_BITS)
#define PLOG_CAP (1u << 18)

typedef struct { uintptr_t ptr; uint64_t size; uint32_t align; uint32_t step; } rtk_pent_t;
static rtk_pent_t *g_ptab, *g_ptab_spare;
static unsigned g_pcount;
static rtk_event_t *g_plog;
static unsigned g_nlog;
static uint64_t g_plog_dropped, g_ptab_dropped;
static uint32_t g_pstep;                     /* step index the profiler is recording */
static rtk_planner_t g_planner;
static rtk_plan_t g_cand, g_prev;
static int g_streak;
int rtk_prof_active;                         /* written under g_prof_lock */
static rtk_spin_t g_prof_lock = RTK_SPIN_INIT;

static inline unsigned ph(uintptr_t p) { return (unsigned)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - PTAB_BITS)); }

static void ptab_insert(rtk_pent_t *tab, unsigned *count, uintptr_t p, uint64_t size, uint32_t align, uint32_t step)
{
    if (*count >= PTAB_CAP / 4 * 3) {
        g_ptab_dropped++;  /* table full: this allocation is not profiled (reported as dropped) */
        return;
    }
    unsigned i = ph(p);
    while (tab[i].ptr && tab[i].ptr != p)
        i = (i + 1) & (PTAB_CAP - 1);
    if (!tab[i].ptr)
        (*count)++;
    tab[i] = (rtk_pent_t){p, size, align, step};
}

/* linear probing with backward-shift deletion: no tombstones to clean up */
static int ptab_remove(uintptr_t p, rtk_pent_t *out)
{
    unsigned i = ph(p);
    while (g_ptab[i].ptr != p) {
        if (!g_ptab[i].ptr)
            return 0;
        i = (i + 1) & (PTAB_CAP - 1);
    }
    *out = g_ptab[i];
    unsigned j = i;
    for (;;) {
        j = (j + 1) & (PTAB_CAP - 1);
        if (!g_ptab[j].ptr)
            break;
        unsigned k = ph(g_ptab[j].ptr);
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            g_ptab[i] = g_ptab[j];
            i = j;
        }
    }
    g_ptab[i].ptr = 0;
    g_pcount--;
    return 1;
}

static void plog_add(uint64_t size, uint32_t align, uint32_t kind)
{
    if (g_nlog < PLOG_CAP)
        g_plog[g_nlog++] = (rtk_event_t){size, align, kind};
    else
        g_plog_dropped++;
}

void rtk_profile_alloc(void *p, size_t size, size_t align)
{
    rtk_spin_lock(&g_prof_lock);
    if (rtk_prof_active) {
        plog_add(size, (uint32_t)align, 1);
        ptab_insert(g_ptab, &g_pcount, (uintptr_t)p, size, (uint32_t)align, g_pstep);
    }
    rtk_spin_unlock(&g_prof_lock);
}

void rtk_profile_free(void *p)
{
    rtk_pent_t e;
    if (!__atomic_load_n(&rtk_prof_active, __ATOMIC_ACQUIRE))
        return;
    rtk_spin_lock(&g_prof_lock);
    if (rtk_prof_active && ptab_remove((uintptr_t)p, &e))
        plog_add(e.size, e.align, 2);
    rtk_spin_unlock(&g_prof_lock);
}

int rtk_profile_buffers(void)
{
    if (g_ptab)
        return 0;
    g_ptab = rtk_os_map(sizeof(rtk_pent_t) * PTAB_CAP, 0);
    g_ptab_spare = rtk_os_map(sizeof(rtk_pent_t) * PTAB_CAP, 0);
    g_plog = rtk_os_map(sizeof(rtk_event_t) * PLOG_CAP, 0);
    return (g_ptab && g_ptab_spare && g_plog) ? 0 : -1;
}

void rtk_profile_begin(uint32_t step, size_t min_size)
{
    rtk_spin_lock(&g_prof_lock);
    rtk_prof_active = 1;
    rtk_planner_reset(&g_planner);
    g_planner.class_max = rtk_setting_bytes(RTK_OPT_MALLOC_CLASS_MAX);
    g_prev.nclasses = -1;
    g_streak = 0;
    g_nlog = 0;
    g_pstep = step;
    memset(g_ptab, 0, sizeof(rtk_pent_t) * PTAB_CAP);
    g_pcount = 0;
    __atomic_store_n(&rtk_fastpath.track_min, min_size, __ATOMIC_RELEASE);
    rtk_publish_any();
    rtk_spin_unlock(&g_prof_lock);
}

void rtk_profile_end(void)
{
    __atomic_store_n(&rtk_fastpath.track_min, SIZE_MAX, __ATOMIC_RELEASE);
    rtk_publish_any();
    rtk_spin_lock(&g_prof_lock);
    rtk_prof_active = 0;
    rtk_spin_unlock(&g_prof_lock);
}

/* Close one profiled step: feed its events to the planner and carry over what is still live. Allocations of
 * this step that outlive it are replayed as live from the start of the next; older ones are long-lived
 * (weights, caches) and leave the profile: an arena block would sit idle under them. */
static void close_step(uint32_t next_step)
{
    rtk_spin_lock(&g_prof_lock);
    rtk_planner_add_step(&g_planner, g_plog, g_nlog);
    g_nlog = 0;
    rtk_pent_t *old = g_ptab, *tab = g_ptab_spare;
    unsigned count = 0;
    for (unsigned i = 0; i < PTAB_CAP; i++) {
        if (old[i].ptr && old[i].step == g_pstep) {
            ptab_insert(tab, &count, old[i].ptr, old[i].size, old[i].align, next_step);
            plog_add(old[i].size, old[i].align, 1);
            if (rtk_tier_min != SIZE_MAX)
                rtk_tier_note_carried(old[i].ptr, old[i].size);  /* tier mode: carried twice = long-lived */
        }
    }
    if (rtk_tier_min != SIZE_MAX)
        rtk_tier_carry_done();
    memset(old, 0, sizeof(rtk_pent_t) * PTAB_CAP);
    g_ptab = tab;
    g_ptab_spare = old;
    g_pcount = count;
    g_pstep = next_step;
    rtk_spin_unlock(&g_prof_lock);
}

int rtk_profile_step(uint32_t next_step, size_t page)
{
    close_step(next_step);
    rtk_planner_best(&g_planner, page, &g_cand);
    /* a plan of no class because every recurring size is above class_max is a plan too: it ends profiling */
    int planned = g_cand.nclasses > 0 || g_cand.above_max > 0;
    if (planned && rtk_plan_equal(&g_cand, &g_prev))
        g_streak++;
    else
        g_streak = planned ? 1 : 0;
    memcpy(&g_prev, &g_cand, sizeof g_cand);
    return g_streak;
}

int rtk_profile_steps(void) { return g_planner.steps; }
uint64_t rtk_profile_dropped(void) { return g_ptab_dropped + g_plog_dropped; }
const rtk_plan_t *rtk_profile_candidate(void) { return &g_cand; }

void rtk_profile_fork_prepare(void) { rtk_spin_fork_prepare(&g_prof_lock); }
void rtk_profile_fork_parent(void) { rtk_spin_fork_parent(&g_prof_lock); }
void rtk_profile_fork_child(void) { rtk_spin_fork_child(&g_prof_lock); }
