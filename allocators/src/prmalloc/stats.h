/* stats.h -- the JSON stats writer of PRMalloc (allocator-<pid>.json), from the state in state.h. */
#ifndef RTK_PRMALLOC_STATS_H
#define RTK_PRMALLOC_STATS_H

#include "prmalloc/state.h"

/* Format and atomically write $RTKIT_RUN_DIR/allocator-<pid>.json. Caller holds the step lock. */
RTK_HIDDEN int rtk_stats_write_locked(uint64_t now_ns);
/* Format into buf (for tests); returns length or -1 when it does not fit. */
RTK_HIDDEN long rtk_stats_format(char *buf, size_t cap);

#endif
