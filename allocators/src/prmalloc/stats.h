/* stats.h -- the JSON stats writer of PRMalloc (allocator-<pid>.json), from the state in state.h. */
#ifndef RTK_PRMALLOC_STATS_H
#define RTK_PRMALLOC_STATS_H

#include "prmalloc/state.h"

/* Format and atomically write $RTKIT_RUN_DIR/allocator-<pid>.json. Caller holds the step lock. */
RTK_HIDDEN int rtk_stats_write_locked(uint64_t now_ns);
/* Format into buf (for tests); returns length or -1 when it does not fit. */
RTK_HIDDEN long rtk_stats_format(char *buf, size_t cap);
/* Append the step records not yet written to allocator-<pid>.steps.<0|1>.jsonl (stats_steps.c); the count written. */
RTK_HIDDEN void rtk_stats_steps_append(void);
RTK_HIDDEN uint32_t rtk_stats_steps_written(void);
/* Bytes the last write rewrote whole (this file and pmem-<pid>.json): what spaces the writes (step.c). */
RTK_HIDDEN uint64_t rtk_stats_rewrite_bytes(void);

#endif
