/* arena_slots.c -- the arenas in service: the current one and any number of retired ones (whose blocks go back to the
 * large heap as they are freed), by slot: the slot is in each block's owner word (prmalloc/owner.h). A slot once used
 * keeps its metadata: a concurrent lookup may read it. */
#include "common/os.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/large.h"

rtk_arena_t *volatile rtk_cur_arena;         /* serving arena, NULL when none */
rtk_arena_t *rtk_arena_slots[RTK_MAX_ARENAS];
int rtk_arena_slots_used;
static int g_retired;
static rtk_spin_t g_lock = RTK_SPIN_INIT;    /* install, retire, step and trim (not the lookups) */

int rtk_arenas_install(const rtk_plan_t *plan, int thp, int debug, const char **why)
{
    rtk_spin_lock(&g_lock);
    /* a slot of a drained, given-back arena is reused for its metadata only once no lookup can need it: never
     * (lookups are lock-free), so slots are not reused; RTK_MAX_ARENAS bounds how often a job may re-plan */
    if (rtk_arena_slots_used >= RTK_MAX_ARENAS) {
        rtk_spin_unlock(&g_lock);
        *why = "too many plans in one process";
        return -1;
    }
    rtk_arena_t *a = rtk_arena_create(plan, rtk_arena_slots_used, thp, debug, why);
    if (!a) {
        rtk_spin_unlock(&g_lock);
        return -1;
    }
    rtk_arena_slots[rtk_arena_slots_used] = a;
    __atomic_store_n(&rtk_arena_slots_used, rtk_arena_slots_used + 1, __ATOMIC_RELEASE);
    rtk_publish_any();  /* the blocks lie in the large heap, which may have been set up just now */
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
        /* the profile that follows allocates its blocks from the large heap: these pages, kept resident there,
         * spare it a fault per page (the heap's decay gives back what it does not take) */
        bytes = rtk_arena_release_free(a, 1, 1);
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
    for (int i = 0; i < rtk_arena_slots_used; i++) {
        rtk_arena_t *a = rtk_arena_slots[i];
        if (a->retired && a->span && __atomic_load_n(&a->live_blocks, __ATOMIC_ACQUIRE) == 0)
            rtk_arena_destroy(a);
    }
    rtk_spin_unlock(&g_lock);
    return dropped;
}

void rtk_arenas_bytes(size_t *reserved, size_t *retired)
{
    *reserved = *retired = 0;
    int n = __atomic_load_n(&rtk_arena_slots_used, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        rtk_arena_t *a = rtk_arena_slots[i];
        size_t l, f, h;
        rtk_arena_usage(a, &l, &f, &h);
        if (a->retired)
            *retired += h;
        else
            *reserved += h;
    }
}

size_t rtk_arenas_trim(void)
{
    size_t bytes = 0;
    rtk_spin_lock(&g_lock);
    for (int i = 0; i < rtk_arena_slots_used; i++)
        bytes += rtk_arena_release_free(rtk_arena_slots[i], rtk_arena_slots[i]->retired, 0);
    rtk_spin_unlock(&g_lock);
    return bytes;
}

int rtk_arenas_retired(void) { return g_retired; }

void rtk_arenas_usage(size_t *live, size_t *free_bytes, size_t *held)
{
    *live = *free_bytes = *held = 0;
    int n = __atomic_load_n(&rtk_arena_slots_used, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        size_t l, f, h;
        rtk_arena_usage(rtk_arena_slots[i], &l, &f, &h);
        *live += l;
        *free_bytes += f;
        *held += h;
    }
}

void rtk_arenas_adoption(uint64_t *adopted, uint64_t *awaited, uint64_t *grown, uint64_t *grown_bytes)
{
    *adopted = *awaited = *grown = *grown_bytes = 0;
    int n = __atomic_load_n(&rtk_arena_slots_used, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++)
        for (int k = 0; rtk_arena_slots[i]->span && k < rtk_arena_slots[i]->n; k++) {
            const rtk_aclass_t *c = &rtk_arena_slots[i]->cls[k];
            *adopted += __atomic_load_n(&c->adopted, __ATOMIC_RELAXED);
            *awaited += __atomic_load_n(&c->awaited, __ATOMIC_RELAXED);
            uint32_t g = __atomic_load_n(&c->grown, __ATOMIC_RELAXED);
            *grown += g;
            *grown_bytes += (uint64_t)g * c->size;
        }
}

void rtk_arenas_fork_prepare(void)
{
    rtk_spin_fork_prepare(&g_lock);
    for (int i = 0; i < rtk_arena_slots_used; i++)
        rtk_arena_lock_all(rtk_arena_slots[i]);
}

void rtk_arenas_fork_parent(void)
{
    for (int i = rtk_arena_slots_used - 1; i >= 0; i--)
        rtk_arena_unlock_all(rtk_arena_slots[i]);
    rtk_spin_fork_parent(&g_lock);
}

void rtk_arenas_fork_child(void)
{
    for (int i = 0; i < rtk_arena_slots_used; i++)
        rtk_arena_reset_locks(rtk_arena_slots[i]);
    rtk_spin_fork_child(&g_lock);
}
