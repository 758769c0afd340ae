/* arenas.c -- the arenas in service: the current one and any number of retired ones (whose memory goes back once
 * drained), their published address range. A slot once used keeps its metadata: a concurrent lookup may read it. */
#include "common/os.h"
#include "prmalloc/arenas.h"
#include "prmalloc/large.h"

rtk_arena_t *volatile rtk_cur_arena;         /* serving arena, NULL when none */
static rtk_arena_t *g_arenas[RTK_MAX_ARENAS];
static int g_narenas, g_retired;
static rtk_spin_t g_lock = RTK_SPIN_INIT;    /* install, retire, step and trim (not the lookups) */

static void publish_range(void)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < g_narenas; i++)
        if (g_arenas[i]->span) {
            uintptr_t b = (uintptr_t)g_arenas[i]->base;
            if (b < lo)
                lo = b;
            if (b + g_arenas[i]->span > hi)
                hi = b + g_arenas[i]->span;
        }
    /* widen first (span from the new low), so a reader never sees a range missing a live arena; the range only
     * grows: a destroyed arena's addresses may be the large heap's again, which the free path tells apart */
    if (hi) {
        uintptr_t olo = rtk_hot.arena_lo, ohi = rtk_hot.arena_span ? olo + rtk_hot.arena_span : 0;
        if (olo < lo)
            lo = olo;
        if (ohi > hi)
            hi = ohi;
        __atomic_store_n(&rtk_hot.arena_span, (uintptr_t)-1 / 2, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.arena_lo, lo, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.arena_span, hi - lo, __ATOMIC_RELEASE);
    }
    rtk_publish_any();
}

rtk_arena_t *rtk_arena_of(const void *p)
{
    int n = __atomic_load_n(&g_narenas, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        rtk_arena_t *a = g_arenas[i];
        if ((const char *)p >= a->base && (const char *)p < a->base + a->span)
            return a;
    }
    return NULL;
}

int rtk_arenas_install(const rtk_plan_t *plan, int thp, int debug, const char **why)
{
    rtk_spin_lock(&g_lock);
    /* a slot of a drained, given-back arena is reused for its metadata only once no lookup can need it: never
     * (lookups are lock-free), so slots are not reused; RTK_MAX_ARENAS bounds how often a job may re-plan */
    if (g_narenas >= RTK_MAX_ARENAS) {
        rtk_spin_unlock(&g_lock);
        *why = "too many plans in one process";
        return -1;
    }
    rtk_arena_t *a = rtk_arena_create(plan, thp, debug, why);
    if (!a) {
        rtk_spin_unlock(&g_lock);
        return -1;
    }
    g_arenas[g_narenas] = a;
    __atomic_store_n(&g_narenas, g_narenas + 1, __ATOMIC_RELEASE);
    publish_range();
    __atomic_store_n(&rtk_cur_arena, a, __ATOMIC_RELEASE);
    rtk_spin_unlock(&g_lock);
    return 0;
}

size_t rtk_arenas_retire(void)
{
    rtk_spin_lock(&g_lock);
    rtk_arena_t *a = rtk_cur_arena;
    size_t bytes = 0;
    if (a) {
        __atomic_store_n(&a->retired, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_cur_arena, NULL, __ATOMIC_RELEASE);
        g_retired++;
        bytes = rtk_arena_release_free(a, 1);
        if (__atomic_load_n(&a->live_blocks, __ATOMIC_ACQUIRE) == 0)
            rtk_arena_destroy(a);
    }
    rtk_spin_unlock(&g_lock);
    return bytes;
}

int rtk_arenas_step(uint32_t steps)
{
    rtk_spin_lock(&g_lock);
    int dropped = rtk_arena_recheck(rtk_cur_arena, steps);
    for (int i = 0; i < g_narenas; i++) {
        rtk_arena_t *a = g_arenas[i];
        if (a->retired && a->span && __atomic_load_n(&a->live_blocks, __ATOMIC_ACQUIRE) == 0)
            rtk_arena_destroy(a);
    }
    rtk_spin_unlock(&g_lock);
    return dropped;
}

void rtk_arenas_bytes(size_t *reserved, size_t *retired)
{
    *reserved = *retired = 0;
    int n = __atomic_load_n(&g_narenas, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        rtk_arena_t *a = g_arenas[i];
        if (a->retired)
            *retired += a->span;
        else
            *reserved += a->span;
    }
}

size_t rtk_arenas_trim(void)
{
    size_t bytes = 0;
    rtk_spin_lock(&g_lock);
    for (int i = 0; i < g_narenas; i++)
        bytes += rtk_arena_release_free(g_arenas[i], g_arenas[i]->retired);
    rtk_spin_unlock(&g_lock);
    return bytes;
}

int rtk_arenas_retired(void) { return g_retired; }

void rtk_arenas_usage(size_t *live, size_t *free_bytes, size_t *from_large)
{
    *live = *free_bytes = *from_large = 0;
    int n = __atomic_load_n(&g_narenas, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        rtk_arena_t *a = g_arenas[i];
        if (!a->span)
            continue;
        if (a->from_large)
            *from_large += a->span;
        for (int k = 0; k < a->n; k++) {
            const rtk_aclass_t *c = &a->cls[k];
            uint32_t top = __atomic_load_n(&c->top, __ATOMIC_RELAXED);
            *live += (size_t)(c->blocks - top) * c->size;
            if (!c->dropped && !a->retired)
                *free_bytes += (size_t)top * c->size;
        }
    }
}

void rtk_arenas_fork_prepare(void)
{
    rtk_spin_lock(&g_lock);
    for (int i = 0; i < g_narenas; i++)
        rtk_arena_lock_all(g_arenas[i]);
}

void rtk_arenas_fork_parent(void)
{
    for (int i = g_narenas - 1; i >= 0; i--)
        rtk_arena_unlock_all(g_arenas[i]);
    rtk_spin_unlock(&g_lock);
}

void rtk_arenas_fork_child(void)
{
    for (int i = 0; i < g_narenas; i++)
        rtk_arena_reset_locks(g_arenas[i]);
    rtk_spin_reset(&g_lock);
}
