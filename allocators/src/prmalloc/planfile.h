/* planfile.h -- the plan file: its versioned text, the guards in front of it, load and save. */
#ifndef RTK_PRMALLOC_PLANFILE_H
#define RTK_PRMALLOC_PLANFILE_H

#include <stddef.h>

#include "prmalloc/internal.h"

/* The plan file's text (RTKIT_MALLOC_PLAN_VERSION), its fingerprint over the classes, and its parse: 0, or -1 with
 * the reason in why. */
RTK_HIDDEN int rtk_plan_format(const rtk_plan_t *p, size_t min_size, char *buf, size_t cap);
RTK_HIDDEN int rtk_plan_parse(const char *text, rtk_plan_t *out, char *why, size_t why_cap);
RTK_HIDDEN uint64_t rtk_plan_fingerprint(const rtk_plan_t *p);
/* Read the plan file at path (a regular file only, not through a symbolic link, never blocking, bounded), parse it
 * and check its total, computed once, against the arena limit and the machine's memory (a plan is never trimmed
 * block by block here). 0 when out holds a plan to install; -1 when it cannot be read or does not fit (worth a line
 * on stderr), -2 when it is no valid plan; the reason is in why. */
RTK_HIDDEN int rtk_planfile_load(const char *path, size_t limit, rtk_plan_t *out, char *why, size_t why_cap);
/* Write run_dir/malloc-plan.txt atomically; 0 with its path in path. */
RTK_HIDDEN int rtk_planfile_save(const rtk_plan_t *p, size_t min_size, const char *run_dir, char *path, size_t path_cap);
/* Whether this process reserves the plan's arenas as soon as it starts: only the process the user names
 * (RTKIT_MALLOC_PLAN_PROCESS, matched against the program's name); any other process waits for its first
 * step mark, so helpers that never mark steps (sh, sleep) never reserve. */
RTK_HIDDEN int rtk_planfile_reserve_at_start(void);

#endif
