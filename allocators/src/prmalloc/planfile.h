/* planfile.h -- the guards in front of a plan file: bounded reading, the plan's cost check, and which process reserves. */
#ifndef RTK_PRMALLOC_PLANFILE_H
#define RTK_PRMALLOC_PLANFILE_H

#include <stddef.h>

#include "prmalloc/internal.h"

/* Read the plan file into buf: a regular file only (not through a symbolic link), never blocking, at most
 * cap - 1 bytes. Returns the length, or -1 with the reason in why. */
RTK_HIDDEN long rtk_planfile_read(const char *path, char *buf, size_t cap, char *why, size_t why_cap);
/* The plan's total, computed once, against the arena limit and the machine's memory: 0 when it fits,
 * -1 with the reason in why (the caller rejects the plan; it is never trimmed block by block). */
RTK_HIDDEN int rtk_planfile_fits(const rtk_plan_t *p, size_t limit, size_t page, char *why, size_t why_cap);
/* Whether this process reserves the plan's arenas as soon as it starts: only the process the user names
 * (RTKIT_MALLOC_PLAN_PROCESS, matched against the program's name); any other process waits for its first
 * step mark, so helpers that never mark steps (sh, sleep) never reserve. */
RTK_HIDDEN int rtk_planfile_reserve_at_start(void);

#endif
