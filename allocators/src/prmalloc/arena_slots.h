/* arena_slots.h -- the arenas in service (the current one and any number retired), by the slot their blocks' owner words name. */
#ifndef RTK_PRMALLOC_ARENA_SLOTS_H
#define RTK_PRMALLOC_ARENA_SLOTS_H

#include "prmalloc/state.h"

#define RTK_MAX_ARENAS 64

RTK_HIDDEN extern rtk_arena_t *volatile rtk_cur_arena;   /* serving arena, NULL when none */
/* Every arena set up so far, by slot (the slot its blocks' owner words name): the owner lookup reads it lock-free.
 * A slot once used keeps its metadata; a given-back arena has span 0. */
RTK_HIDDEN extern rtk_arena_t *rtk_arena_slots[RTK_MAX_ARENAS];
RTK_HIDDEN extern int rtk_arena_slots_used;

/* Reserve an arena for plan and serve from it; -1 when it cannot be set up (*why says why). */
RTK_HIDDEN int rtk_arenas_install(const rtk_plan_t *plan, int thp, int debug, const char **why);
/* Stop serving from the current arena: its free blocks' pages go back now, each later free's at its free, and
 * its memory once its last block is freed. Returns the bytes released now. */
RTK_HIDDEN size_t rtk_arenas_retire(void);
/* Step mark: re-check the current arena's classes (drop those idle for `steps` steps) and give back retired
 * arenas whose blocks are all free. Returns the classes dropped. */
RTK_HIDDEN int rtk_arenas_step(uint32_t steps);
/* Bytes of large-heap blocks held by arenas in service, and by retired ones not yet drained. */
RTK_HIDDEN void rtk_arenas_bytes(size_t *reserved, size_t *retired);
/* malloc_trim: give back the free blocks of dropped classes and retired arenas. A serving class keeps its free
 * blocks' pages: libraries call malloc_trim on their own, and the step after each would refault them all. */
RTK_HIDDEN size_t rtk_arenas_trim(void);
RTK_HIDDEN int rtk_arenas_retired(void);
/* Bytes in live arena blocks, in free ones, and held from the large heap (page-rounded). */
RTK_HIDDEN void rtk_arenas_usage(size_t *live, size_t *free_bytes, size_t *held);
/* Freed large-heap blocks the classes took in so far, and blocks they still wait to take (live at the plan's install). */
RTK_HIDDEN void rtk_arenas_adoption(uint64_t *adopted, uint64_t *awaited, uint64_t *grown, uint64_t *grown_bytes);
RTK_HIDDEN void rtk_arenas_fork_prepare(void);
RTK_HIDDEN void rtk_arenas_fork_parent(void);
RTK_HIDDEN void rtk_arenas_fork_child(void);

#endif
