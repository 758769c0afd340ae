/* profile.h -- the large-allocation profiler: what is live across steps, fed to the planner for a candidate plan. */
#ifndef RTK_PRMALLOC_PROFILE_H
#define RTK_PRMALLOC_PROFILE_H

#include "prmalloc/state.h"

RTK_HIDDEN extern int rtk_prof_active;   /* the profiler records (read unlocked on the allocation path) */

/* Map the profiler's tables (once); -1 when they cannot be mapped. */
RTK_HIDDEN int rtk_profile_buffers(void);
/* Start recording at step index `step` with an empty planner; frees at or above min_size start asking. */
RTK_HIDDEN void rtk_profile_begin(uint32_t step, size_t min_size);
/* Stop recording; large frees stop asking. */
RTK_HIDDEN void rtk_profile_end(void);
RTK_HIDDEN void rtk_profile_alloc(void *p, size_t size, size_t align);
RTK_HIDDEN void rtk_profile_free(void *p);
/* Close one profiled step, then pick the best plan so far: returns how many steps in a row it has not changed. */
RTK_HIDDEN int rtk_profile_step(uint32_t next_step, size_t page);
RTK_HIDDEN int rtk_profile_steps(void);                  /* steps the planner has seen */
/* allocations (or events) the profiler could not record: its table or log was full */
RTK_HIDDEN uint64_t rtk_profile_dropped(void);
RTK_HIDDEN const rtk_plan_t *rtk_profile_candidate(void);
RTK_HIDDEN void rtk_profile_fork_prepare(void);
RTK_HIDDEN void rtk_profile_fork_parent(void);
RTK_HIDDEN void rtk_profile_fork_child(void);

#endif
