/* say.h -- the one sink of messages about bad settings: kept for the stats files, said on stderr once per run. */
#ifndef RTK_COMMON_SAY_H
#define RTK_COMMON_SAY_H

#include <stddef.h>

#include "common/log.h"

/* Keep one message (no stderr), tagged with the part (RTK_PART_*) whose setting it names. Past the sink's
 * capacity the last slot is overwritten. No malloc. */
RTK_HIDDEN void rtk_keep_message(int part, const char *msg);
RTK_HIDDEN int rtk_kept_count(void);
/* The i-th kept message; *part (when not NULL) is its part. */
RTK_HIDDEN const char *rtk_kept_message(int i, int *part);

/* 1 when this process is the first of the run to say what `marker` names: it creates run_dir/marker (a
 * process tree shares one run directory even where a shell drops rtkit's environment markers). Without a run
 * directory every caller says it. */
RTK_HIDDEN int rtk_say_once(const char *run_dir, const char *marker);
/* Say the kept messages from index `from` on, one stderr line each, when rtk_say_once(run_dir, marker) allows. */
RTK_HIDDEN void rtk_say_kept(int from, const char *run_dir, const char *marker);

#endif
