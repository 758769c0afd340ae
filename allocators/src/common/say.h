/* say.h -- bad-setting messages: kept in a caller's fixed slots for its stats file, said on stderr once per run. */
#ifndef RTK_COMMON_SAY_H
#define RTK_COMMON_SAY_H

#include <stddef.h>

#include "common/log.h"

/* A caller's array of message slots, char slots[cap][len], and its count of used slots. */
typedef struct {
    char *slots;
    size_t len;
    int cap;
    int *count;
} rtk_kept_t;

#define RTK_KEPT(array, countp) \
    ((rtk_kept_t){&(array)[0][0], sizeof (array)[0], (int)(sizeof (array) / sizeof (array)[0]), (countp)})

/* Parse one setting with its error message, if any, kept in the next slot (the last slot when all are used).
 * `call` is an rtk_opt_* parser call (0: good value); the expression's value is the call's. */
#define RTK_KEEP_ERROR(kept, call) (rtk_kept_begin(kept), rtk_kept_end((kept), (call)))
RTK_HIDDEN void rtk_kept_begin(rtk_kept_t kept);
RTK_HIDDEN int rtk_kept_end(rtk_kept_t kept, int rc);

/* 1 when this process is the first of the run to say what `marker` names: it creates run_dir/marker (a
 * process tree shares one run directory even where a shell drops rtkit's environment markers). Without a run
 * directory every caller says it. */
RTK_HIDDEN int rtk_say_once(const char *run_dir, const char *marker);

#endif
