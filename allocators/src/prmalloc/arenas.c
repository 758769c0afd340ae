/* arenas.c -- the arenas in service: the current one and at most one retired, their published address range. */
#include "common/os.h"
#include "prmalloc/arenas.h"

rtk_arena_t *volatile rtk_cur_arena;         /* serving arena, NULL when none */
static rtk_arena_t *g_arenas[2];             /* current and (at most one) retired arena */

static void publish_range(void)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < 2; i++)
        if (g_arenas[i]) {
            uintptr_t b = (uintptr_t)g_arenas[i]->base;
            if (b < lo)
                lo = b;
            if (b + g_arenas[i]->span > hi)
                hi = b + g_arenas[i]->span;
        }
    /* widen first (span from the new low), so a reader never sees a range missing a live arena */
    if (hi) {
        __atomic_store_n(&rtk_hot.arena_span, (uintptr_t)-1 / 2, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.arena_lo, lo, __ATOMIC_RELEASE);
        __atomic_store_n(&rtk_hot.arena_span, hi - lo, __ATOMIC_RELEASE);
    }
    rtk_publish_any();
}

rtk_arena_t *rtk_arena_of(const void *p)
{
    for (int i = 0; i < 2; i++) {
        rtk_arena_t *a = g_arenas[i];
        if (a && (const char *)p >= a->base && (const char *)p < a->base + a->span)
            return a;
    }
    return NULL;
}

int rtk_arenas_install(const rtk_plan_t *plan, int thp, int debug)
{
    rtk_arena_t *a = rtk_arena_create(plan, thp, debug);
    if (!a)
        return -1;
    int slot = g_arenas[0] ? 1 : 0;
    if (g_arenas[slot]) {
        /* already one retired arena: retire no further; drop the new one rather than leak more */
        rtk_os_unmap(a->base, a->span);
        rtk_os_unmap(a, a->meta_size);
        return -1;
    }
    g_arenas[slot] = a;
    publish_range();
    __atomic_store_n(&rtk_cur_arena, a, __ATOMIC_RELEASE);
    return 0;
}

void rtk_arenas_retire(void)
{
    rtk_arena_t *a = rtk_cur_arena;
    if (a) {
        a->retired = 1;
        __atomic_store_n(&rtk_cur_arena, NULL, __ATOMIC_RELEASE);
    }
}

void rtk_arenas_fork_prepare(void)
{
    for (int i = 0; i < 2; i++)
        rtk_arena_lock_all(g_arenas[i]);
}

void rtk_arenas_fork_parent(void)
{
    for (int i = 1; i >= 0; i--)
        rtk_arena_unlock_all(g_arenas[i]);
}

void rtk_arenas_fork_child(void)
{
    for (int i = 0; i < 2; i++)
        rtk_arena_reset_locks(g_arenas[i]);
}
