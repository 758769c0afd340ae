/* stats.h -- PRMalloc's reportable state (settings, plan, counters, per-step ring) and the JSON stats writer. */
#ifndef RTK_PRMALLOC_STATS_H
#define RTK_PRMALLOC_STATS_H

#include <sys/types.h>

#include "prmalloc/internal.h"

#define RTK_MAX_ERRORS 12

enum { RTK_STATE_OFF = 0, RTK_STATE_DISABLED, RTK_STATE_PASSTHROUGH, RTK_STATE_PROFILING, RTK_STATE_PLANNED };

typedef struct rtk_config {
    int enabled, thp, census, debug;
    long profile_start, profile_stable, profile_max;
    size_t min_size, arena_limit;
    char plan_path[1024];
    char run_dir[1024];
} rtk_config_t;

typedef struct rtk_step {
    uint64_t step, allocs, frees, bytes, arena_hits, fallbacks, minor_faults;
    int64_t live;
} rtk_step_t;

typedef struct rtk_state {
    rtk_config_t cfg;
    int state;
    pid_t pid;
    int forked;
    int is_root;                       /* first preloaded process of the tree (see core.c do_init) */
    char errors[RTK_MAX_ERRORS][320];
    int nerrors;
    uint32_t steps;
    uint32_t profile_start_step, profile_end_step, profiled_steps, plan_step;
    int profile_done;
    const char *profile_reason;
    const char *plan_source;
    char plan_path[1100];
    char rejected_reason[400];
    int plan_trimmed;
    int validating;
    uint64_t fallback_reused;   /* fallbacks served by a kept glibc block (core.c: fallback stash), no fault */
    uint64_t val_hits0, val_large0;
    uint64_t plan_hits0, plan_large0;  /* totals when the current plan took over (hit_rate_after_plan) */
    rtk_plan_t plan;
    rtk_totals_t last;                 /* totals at the last step mark / stats write */
    uint64_t faults_mark, faults_before_start, faults_after_start;
    uint64_t faults_before_sum, faults_before_steps, faults_after_sum, faults_after_steps;
    uint64_t debug_errors;
    int64_t peak_live;              /* highest live bytes seen at a step mark or stats write */
    uint64_t last_write_ns;
    rtk_step_t ring[RTK_RING_STEPS];
} rtk_state_t;

RTK_HIDDEN extern rtk_state_t rtk_g;

/* Format and atomically write $RTKIT_RUN_DIR/allocator-<pid>.json. Caller holds the step lock. */
RTK_HIDDEN int rtk_stats_write_locked(uint64_t now_ns);
/* Format into buf (for tests); returns length or -1 when it does not fit. */
RTK_HIDDEN long rtk_stats_format(char *buf, size_t cap);

#endif
