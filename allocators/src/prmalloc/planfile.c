/* planfile.c -- the guards in front of a plan file (docs/safety.md): bounded reading, the plan's cost checked
 * once, and the rule that only the process that marks steps (or the one the user names) reserves arenas. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/options.h"
#include "common/os.h"
#include "prmalloc/planfile.h"

long rtk_planfile_read(const char *path, char *buf, size_t cap, char *why, size_t why_cap)
{
    long n = rtk_os_read_file_flags(path, buf, cap, RTK_READ_NOFOLLOW);
    if (n < 0) {
        if (n == -EFBIG)
            snprintf(why, why_cap, "cannot read plan file: larger than %zu bytes, not a plan", cap - 1);
        else
            snprintf(why, why_cap, "cannot read plan file: %s", rtk_os_read_error(n));
        return -1;
    }
    return n;
}

int rtk_planfile_fits(const rtk_plan_t *p, size_t limit, size_t page, char *why, size_t why_cap)
{
    /* what the arena takes: whole pages per block (a 64-byte class costs a page a block). The parser bounds
     * size x blocks to 1 TiB, so a class is below 2^45 here and the sum over RTK_MAX_CLASSES cannot overflow */
    size_t total = 0;
    for (int i = 0; i < p->nclasses; i++)
        total += (p->cls[i].size + page - 1) / page * page * p->cls[i].blocks;
    size_t phys = (size_t)rtk_os_phys_bytes();
    if (total > limit) {
        snprintf(why, why_cap, "plan reserves %zu bytes, more than %s=%zu", total,
                 rtk_settings[RTK_OPT_MALLOC_ARENA_LIMIT].env, limit);
        return -1;
    }
    if (phys && total > phys) {
        snprintf(why, why_cap, "plan reserves %zu bytes, more than this machine's memory (%zu bytes)", total, phys);
        return -1;
    }
    return 0;
}

int rtk_planfile_reserve_at_start(void)
{
    const char *named = rtk_opt_str(RTK_OPT_MALLOC_PLAN_PROCESS);
    return named && program_invocation_short_name && !strcmp(named, program_invocation_short_name);
}
