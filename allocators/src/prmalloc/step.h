/* step.h -- the step-mark state machine (warm-up -> profiling -> planned) and a plan's install. */
#ifndef RTK_PRMALLOC_STEP_H
#define RTK_PRMALLOC_STEP_H

#include "prmalloc/state.h"

/* At init, with a plan file named: load and install it now in the process RTKIT_MALLOC_PLAN_PROCESS names; elsewhere
 * at the step mark that ends the warm-up (a process that never marks reserves nothing). 1 when it waits for that
 * mark (profiling, too, then waits). */
RTK_HIDDEN int rtk_step_plan_at_init(void);
RTK_HIDDEN void rtk_step_start_profiling(uint32_t step);
/* min_size from its setting, and everything derived from it (fast path bound, large heap threshold); a plan loaded
 * later replaces it. */
RTK_HIDDEN void rtk_step_apply_min_size_setting(void);
/* One step mark of an enabled, initialised allocator: census, state machine, stats file when due. */
RTK_HIDDEN void rtk_step_mark(void);
/* Sum the census and write the stats file now (under the step lock). */
RTK_HIDDEN int rtk_step_write_stats(void);
RTK_HIDDEN void rtk_step_fork_prepare(void);
RTK_HIDDEN void rtk_step_fork_parent(void);
RTK_HIDDEN void rtk_step_fork_child(void);

#endif
