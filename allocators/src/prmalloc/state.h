/* state.h -- PRMalloc's shared state, defined in state.c: the hot-path words and everything the stats report. */
#ifndef RTK_PRMALLOC_STATE_H
#define RTK_PRMALLOC_STATE_H

#include <sys/types.h>

#include "common/options.h"  /* the settings' values (rtk_values) */
#include "prmalloc/heap_usage.h"
#include "prmalloc/internal.h"

enum { RTK_MODE_UNINIT = 0, RTK_MODE_INITIALIZING = 1, RTK_MODE_READY = 2 };

/* What the hot paths read, together on one cache line. */
typedef struct rtk_fastpath {
    size_t fast_max;        /* malloc/new below this size take the inline small path (0: all go slow) */
    size_t track_min;       /* free of a chunk this large asks the profiler (SIZE_MAX: not profiling) */
    size_t min_size;        /* malloc_min_size in force (the setting, or a loaded plan's): its one home; SIZE_MAX before init */
    int inspect;            /* free counts and reads the chunk header */
    int mode;
    uintptr_t tier_lo;      /* [tier_lo, tier_lo + tier_span) is the tier-mode pool (span 0: none), tier.c */
    uintptr_t tier_span;
    uintptr_t any_lo;       /* [any_lo, any_hi) covers the large heap (arenas' blocks too) and the tier pool */
    uintptr_t any_hi;       /* this one range, then sorts out which (rtk_publish_any); empty: lo = hi = 0 */
    size_t pass_max;        /* malloc below this that reaches the slow path goes straight to glibc */
    size_t sample_bytes;    /* the small-malloc census samples one request per this many bytes (< fast_max) */
} rtk_fastpath_t;

RTK_HIDDEN extern rtk_fastpath_t rtk_fastpath;

/* Recompute any_lo/any_hi after tier_* or the large heap changed (widened first: never misses a live
 * range). Its lock is taken by the fork handlers (rtk_publish_fork_*). */
RTK_HIDDEN void rtk_publish_any(void);
RTK_HIDDEN void rtk_publish_fork_prepare(void);
RTK_HIDDEN void rtk_publish_fork_parent(void);
RTK_HIDDEN void rtk_publish_fork_child(void);

enum { RTK_STATE_OFF = 0, RTK_STATE_DISABLED, RTK_STATE_PASSTHROUGH, RTK_STATE_PROFILING, RTK_STATE_PLANNED };

/* What rtkit tells the allocator that is not a setting (the settings' values: common/options.h rtk_values). */
typedef struct rtk_config {
    char run_dir[1024];
} rtk_config_t;

typedef struct rtk_step {
    uint64_t step, allocs, frees, bytes, arena_hits, fallbacks, minor_faults;
    int64_t live;
} rtk_step_t;

typedef struct rtk_engine {
    rtk_config_t cfg;
    int state;
    pid_t pid;
    int forked;
    int is_root;                       /* first preloaded process of the tree (see init.c do_init) */
    uint32_t steps;
    uint32_t profile_start_step, profile_end_step, profiled_steps, plan_step;
    int profile_done;
    const char *profile_reason;
    const char *plan_source;
    char plan_path[1100];
    char rejected_reason[400];
    int plan_trimmed;
    int validating;
    int reserve_due;                   /* a plan was installed: keep idle headroom in the large heap (step.c) */
    uint64_t fallback_reused;   /* fallbacks served by a kept glibc block (fallback_stash.c), no fault */
    uint64_t val_hits0, val_large0;
    uint64_t plan_hits0, plan_large0;  /* totals when the current plan took over (hit_rate_after_plan) */
    rtk_plan_t plan;
    rtk_totals_t last;                 /* totals at the last step mark / stats write */
    uint64_t faults_mark, faults_before_start, faults_after_start;
    uint64_t faults_before_sum, faults_before_steps, faults_after_sum, faults_after_steps;
    uint64_t debug_errors;
    size_t large_min;                  /* smallest request the large-object heap serves (SIZE_MAX: heap off) */
    uint32_t after_from;               /* first step index counted in the figures after the plan */
    uint32_t classes_dropped;          /* planned classes the re-check dropped (pages released) */
    size_t retired_released;           /* bytes of retired arenas' free blocks returned to the large heap at
                                        * retirement (resident there: the next profile reuses them) */
    /* the drift check of a plan in use (step.c check_drift): the window under way and the last re-plan it caused */
    int drift_armed;                   /* a window is under way from drift_start (its totals in drift_*0) */
    uint32_t drift_start, drift_window;
    uint64_t drift_fit0, drift_large0;
    uint32_t replans, replans_held;    /* plans retired for drift; drifted windows left alone at the re-plan limit */
    uint32_t replan_step, replan_from; /* the mark that retired the last, and its window's first step */
    uint64_t replan_fit, replan_large; /* that window's allocations >= min_size with a planned class, of all */
    int64_t peak_live;              /* highest live bytes seen at a step mark or stats write */
    rtk_footprint_t peak_footprint; /* the heap's footprint at the step mark where it was largest */
    uint64_t last_write_ns;
    rtk_step_t ring[RTK_RING_STEPS];
} rtk_engine_t;

RTK_HIDDEN extern rtk_engine_t rtk_engine;

#endif
