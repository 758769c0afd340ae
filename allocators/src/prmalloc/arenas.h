/* arenas.h -- the arenas in service (current and retired) and the lookup of the one owning a pointer. */
#ifndef RTK_PRMALLOC_ARENAS_H
#define RTK_PRMALLOC_ARENAS_H

#include "prmalloc/state.h"

RTK_HIDDEN extern rtk_arena_t *volatile rtk_cur_arena;   /* serving arena, NULL when none */

/* Reserve an arena for plan and serve from it; -1 when it cannot be reserved (or one is already retired). */
RTK_HIDDEN int rtk_arenas_install(const rtk_plan_t *plan, int thp, int debug);
/* Stop serving from the current arena (frees still land there). */
RTK_HIDDEN void rtk_arenas_retire(void);
/* The arena owning p, or NULL. */
RTK_HIDDEN rtk_arena_t *rtk_arena_of(const void *p);
RTK_HIDDEN void rtk_arenas_fork_prepare(void);
RTK_HIDDEN void rtk_arenas_fork_parent(void);
RTK_HIDDEN void rtk_arenas_fork_child(void);

#endif
