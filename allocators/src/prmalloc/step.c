/* step.c -- the step-mark state machine: warm-up -> profiling -> planned, a plan's install and the loaded plan's
 * check (its file is planfile.c's); the stats file is written from here when due. */
#include <stdio.h>
#include <string.h>

#include "common/options.h"
#include "common/os.h"
#include "prmalloc/alloc.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/large.h"
#include "prmalloc/heap_usage.h"
#include "prmalloc/planfile.h"
#include "prmalloc/profile.h"
#include "prmalloc/fallback_stash.h"
#include "prmalloc/stats.h"
#include "prmalloc/step.h"
#include "prmalloc/tier.h"

#define STATS_PERIOD_NS 500000000ull  /* stats.json is rewritten at most this often between forced writes */
/* ... and, as its rewrites cost their size (pages dirtied, a rename's flush), at most this many bytes a second of them
 * on average (their pages, and a page each for the files' metadata): a 4 KiB file every 2 s, as often as the live
 * view's snapshots and more often than the steps' file they show beside it (5 s); with a 9.5 KB pmem file, 5 s */
#define STATS_REWRITE_BUDGET 4096ull
#define MAX_REPLANS 8  /* re-plans for drift a process may make (rtkit/config.py's malloc_drift_steps says so) */

static rtk_spin_t g_step_lock = RTK_SPIN_INIT;
static void finish_profiling(uint32_t step, const char *reason);

static int g_plan_deferred;  /* the plan file is loaded at a later step mark (under g_step_lock) */

/* A deferred plan takes over at the mark that ends the warm-up, where a profiled run starts profiling: the blocks
 * a job takes while it imports, builds and initialises, and keeps (variables, caches, the graph's constants), are
 * then the large heap's, as they are in the run that made the plan. Installed earlier, they would fill the classes
 * for good, and the steps' own blocks would fall back. */
static uint32_t plan_install_step(void)
{
    return rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START) > 0 ? (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START) : 1u;
}

/* min_size decides what the arenas and the large heap see; the profiling or plan loading that follows uses it.
 * Its home is rtk_fastpath.min_size (a loaded plan's replaces the setting there); rtk_values keeps the user's. */
static void apply_min_size(size_t min_size)
{
    rtk_fastpath.min_size = min_size;
    rtk_engine.large_min = rtk_setting_on(RTK_OPT_MALLOC_LARGE) && rtk_large_span ? (min_size > (16u << 10) ? min_size : (16u << 10)) : SIZE_MAX;
    /* below fast_max malloc is glibc's (sampled by the census); at or above it, rtk_alloc: min_size, or the
     * tier's threshold when lower. The sampling budget stays below fast_max so large requests always overdraw */
    size_t fast = min_size < rtk_tier_min ? min_size : rtk_tier_min;
    rtk_fastpath.pass_max = 0;
    rtk_fastpath.sample_bytes = rtk_setting_on(RTK_OPT_MALLOC_CENSUS) ? (fast > (8u << 10) ? (8u << 10) : fast - 1) : fast - 1;
    rtk_fastpath.fast_max = fast;
}

void rtk_step_apply_min_size_setting(void) { apply_min_size(rtk_setting_bytes(RTK_OPT_MALLOC_MIN_SIZE)); }

/* Load, check and install the plan file the settings name. */
static void load_plan(void)
{
    char why[200] = "";
    const char *arena_why = "";
    snprintf(rtk_engine.plan_path, sizeof rtk_engine.plan_path, "%s", rtk_setting_text(RTK_OPT_MALLOC_PLAN));
    rtk_plan_t *p = &rtk_engine.plan;
    int loaded = rtk_planfile_load(rtk_setting_text(RTK_OPT_MALLOC_PLAN), rtk_setting_bytes(RTK_OPT_MALLOC_ARENA_LIMIT), p, why,
                                   sizeof why);
    if (loaded < 0)
        snprintf(rtk_engine.rejected_reason, sizeof rtk_engine.rejected_reason, "%s", why);
    if (loaded == -1) {
        rtk_log_line("%s=%s not used: %s", rtk_settings[RTK_OPT_MALLOC_PLAN].env, rtk_setting_text(RTK_OPT_MALLOC_PLAN), why);
        return;
    } else if (loaded == 0) {
        size_t page = rtk_os_page_size();
        /* the plan was made for its min_size: sizes below it were never profiled (an explicit setting wins) */
        if (p->min_size && !rtk_opt_given(RTK_OPT_MALLOC_MIN_SIZE) && p->min_size != rtk_fastpath.min_size)
            apply_min_size(p->min_size);
        if (rtk_plan_trim(p, rtk_setting_bytes(RTK_OPT_MALLOC_ARENA_LIMIT), page) < 1 || p->nclasses == 0) {
            snprintf(rtk_engine.rejected_reason, sizeof rtk_engine.rejected_reason,
                     "plan does not fit %s=%zu", rtk_settings[RTK_OPT_MALLOC_ARENA_LIMIT].env,
                     rtk_setting_bytes(RTK_OPT_MALLOC_ARENA_LIMIT));
            p->nclasses = 0;
        } else if (rtk_arenas_install(p, rtk_setting_on(RTK_OPT_MALLOC_THP), rtk_setting_on(RTK_OPT_MALLOC_DEBUG), &arena_why) != 0) {
            snprintf(rtk_engine.rejected_reason, sizeof rtk_engine.rejected_reason, "arena of %zu bytes not set up: %s",
                     p->reserved, arena_why);
            p->nclasses = 0;
            /* memory pressure is worth a line even without debug: the job runs on without the plan */
            rtk_log_line("%s=%s not used: %s; the job runs on without a plan", rtk_settings[RTK_OPT_MALLOC_PLAN].env,
                         rtk_setting_text(RTK_OPT_MALLOC_PLAN), rtk_engine.rejected_reason);
            return;
        } else {
            rtk_engine.plan_source = "loaded";
            rtk_engine.state = RTK_STATE_PLANNED;
            if (rtk_engine.large_min == SIZE_MAX)  /* no large heap serves the fallbacks (the arenas may still use one) */
                rtk_stash_enable(p, rtk_fastpath.min_size);
            rtk_engine.profile_reason = "loaded";
            rtk_engine.plan_step = 0;
            rtk_engine.after_from = (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START);  /* warm-up steps (imports, graph build) excluded */
            rtk_engine.validating = 1;
            rtk_engine.reserve_due = 1;
            rtk_engine.faults_after_start = rtk_os_minor_faults();
            return;
        }
    }
    if (rtk_setting_on(RTK_OPT_MALLOC_DEBUG))
        rtk_log_line("%s=%s ignored: %s", rtk_settings[RTK_OPT_MALLOC_PLAN].env, rtk_setting_text(RTK_OPT_MALLOC_PLAN), rtk_engine.rejected_reason);
}

/* Safety rule (docs/safety.md): RTKIT_MALLOC_PLAN is inherited by every descendant, but only the process that
 * marks steps (or the one RTKIT_MALLOC_PLAN_PROCESS names) reserves the plan's arenas; a shell and its `sleep`s
 * never do. */
int rtk_step_plan_at_init(void)
{
    if (!rtk_setting_text(RTK_OPT_MALLOC_PLAN))
        return 0;
    if (rtk_planfile_reserve_at_start()) {
        load_plan();
        return 0;
    }
    g_plan_deferred = 1;
    return 1;
}

void rtk_step_start_profiling(uint32_t step)
{
    if (rtk_profile_buffers() != 0) {
        rtk_engine.profile_reason = "profiler buffers could not be mapped";
        return;
    }
    rtk_stash_disable();
    rtk_engine.state = RTK_STATE_PROFILING;
    rtk_engine.profile_start_step = step;
    rtk_engine.profile_reason = "";
    rtk_engine.faults_before_start = rtk_os_minor_faults();
    rtk_engine.faults_before_sum = rtk_engine.faults_before_steps = 0;  /* the figures are the plan in use's */
    rtk_profile_begin(step, rtk_fastpath.min_size);
}

static void finish_profiling(uint32_t step, const char *reason)
{
    size_t page = rtk_os_page_size();
    rtk_profile_end();
    rtk_tier_plan_ready();
    rtk_engine.profile_end_step = step;
    rtk_engine.profile_reason = reason;
    rtk_engine.profiled_steps = (uint32_t)rtk_profile_steps();
    memcpy(&rtk_engine.plan, rtk_profile_candidate(), sizeof rtk_engine.plan);
    if (rtk_engine.plan.reserved > rtk_setting_bytes(RTK_OPT_MALLOC_ARENA_LIMIT)) {
        rtk_plan_trim(&rtk_engine.plan, rtk_setting_bytes(RTK_OPT_MALLOC_ARENA_LIMIT), page);
        rtk_engine.plan_trimmed = 1;
    }
    if (rtk_engine.plan.nclasses == 0) {
        rtk_engine.state = RTK_STATE_PASSTHROUGH;
        rtk_engine.plan_source = "none";
        if (rtk_engine.plan.above_max)
            rtk_engine.profile_reason = "every recurring size is above malloc_class_max: the large heap serves them";
        else if (!rtk_engine.plan_trimmed)
            rtk_engine.profile_reason = "no recurring allocation at or above min_size";
        return;
    }
    /* The profiled blocks are free now, their pages idle in the large heap: the arena is carved from it, so
     * it reuses those pages rather than holding a second copy (glibc's heap is left alone). */
    const char *why = "";
    if (rtk_arenas_install(&rtk_engine.plan, rtk_setting_on(RTK_OPT_MALLOC_THP), rtk_setting_on(RTK_OPT_MALLOC_DEBUG), &why) != 0) {
        rtk_engine.state = RTK_STATE_PASSTHROUGH;
        rtk_engine.plan_source = "none";
        rtk_engine.profile_reason = "arena reservation failed";
        snprintf(rtk_engine.rejected_reason, sizeof rtk_engine.rejected_reason, "arena of %zu bytes not set up: %s",
                 rtk_engine.plan.reserved, why);
        rtk_log_line("allocator plan not used: %s; the job runs on without a plan", rtk_engine.rejected_reason);
        rtk_engine.plan.nclasses = 0;
        return;
    }
    rtk_engine.state = RTK_STATE_PLANNED;
    rtk_engine.reserve_due = 1;
    rtk_engine.drift_armed = 0;
    rtk_engine.plan_source = "profiled";
    rtk_engine.plan_step = step;
    rtk_engine.after_from = step;
    rtk_engine.faults_after_sum = rtk_engine.faults_after_steps = 0;
    if (rtk_engine.large_min == SIZE_MAX)
        rtk_stash_enable(&rtk_engine.plan, rtk_fastpath.min_size);
    if (rtk_engine.cfg.run_dir[0])
        rtk_planfile_save(&rtk_engine.plan, rtk_fastpath.min_size, rtk_engine.cfg.run_dir, rtk_engine.plan_path,
                          sizeof rtk_engine.plan_path);
    rtk_engine.faults_after_start = rtk_os_minor_faults();
}

/* Retire the plan in use (its free blocks go back to the large heap now, its live ones as the job frees them) and
 * profile the job afresh from this mark. */
static void replace_plan(const rtk_totals_t *t, uint32_t steps)
{
    rtk_engine.retired_released += rtk_arenas_retire();
    rtk_engine.plan_hits0 = t->arena_hits;
    rtk_engine.plan_large0 = t->arena_hits + t->fallbacks;
    rtk_engine.plan_source = "none";
    rtk_engine.plan.nclasses = 0;
    rtk_engine.drift_armed = 0;
    rtk_engine.profile_done = 0;  /* the profile window in the stats is the one under way */
    rtk_engine.faults_after_sum = rtk_engine.faults_after_steps = 0;  /* the retired plan's steps are no plan's figures */
    rtk_step_start_profiling(steps);
}

/* The criterion a plan is judged by, from the census totals: step allocations >= min_size that had a planned class
 * (served, or their class exhausted), and all those the plan could have classed (sizes above malloc_class_max are
 * left to the large heap by rule, and counted by neither). */
static uint64_t planned_fit(const rtk_totals_t *t) { return t->arena_hits + t->arena_exhausted; }
static uint64_t planned_large(const rtk_totals_t *t) { return t->arena_hits + t->arena_exhausted + t->arena_misses; }

/* A loaded plan must earn its place, judged on what it can know: the sizes the job's steps ask for. Over the
 * check window, at least half of the step allocations at or above min_size must have a planned class (served
 * or not: blocks the job took before its first step and still holds are not the plan's fault; the large heap
 * serves what does not fit). Otherwise it is retired and the job is profiled afresh. */
static void validate_loaded(const rtk_totals_t *t, uint32_t steps)
{
    uint32_t begin = (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START), end = begin + (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_PROFILE_STABLE);
    if (steps == begin || !rtk_engine.val_large0) {
        rtk_engine.val_hits0 = planned_fit(t);
        rtk_engine.val_large0 = planned_large(t) + 1;  /* +1: marks "taken" */
    }
    if (steps < end)
        return;
    rtk_engine.validating = 0;
    uint64_t fit = planned_fit(t) - rtk_engine.val_hits0;
    uint64_t large = planned_large(t) + 1 - rtk_engine.val_large0;
    const char *what = NULL;
    if (large == 0)
        what = "sizes absent";
    else if (fit * 2 < large)
        what = "sizes do not match";
    if (!what)
        return;
    snprintf(rtk_engine.rejected_reason, sizeof rtk_engine.rejected_reason,
             "loaded plan does not match the job (%s): %llu of %llu allocations >= min_size in steps %u..%u had a planned class",
             what, (unsigned long long)fit, (unsigned long long)large, begin, end - 1);
    replace_plan(t, steps);
}

/* A plan in use goes stale when the job changes under it (a second fit of another model, a new batch size, a
 * fine-tuning phase): its classes idle, the new sizes fall back. Over each window of malloc_drift_steps steps after
 * the plan, the loaded plan's rule applies: fewer than half of the window's allocations that the plan could class
 * had a class, and the plan is retired and the job profiled afresh. A window with no such allocation says nothing
 * (a plan idle in a phase without large blocks harms nothing). Against a job that alternates phases, the window
 * doubles after each re-plan and MAX_REPLANS bounds them: each costs a profile, and an arena slot
 * (RTK_MAX_ARENAS). The retired arena's live blocks stay the job's until freed (rtk_arenas_retire). */
static void drift_arm(const rtk_totals_t *t, uint32_t steps)
{
    if (!rtk_setting_num(RTK_OPT_MALLOC_DRIFT_STEPS))
        return;
    rtk_engine.drift_armed = 1;
    rtk_engine.drift_start = steps;
    rtk_engine.drift_fit0 = planned_fit(t);
    rtk_engine.drift_large0 = planned_large(t);
    if (!rtk_engine.drift_window)
        rtk_engine.drift_window = (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_DRIFT_STEPS);
}

static int check_drift(const rtk_totals_t *t, uint32_t steps)
{
    if (!rtk_engine.drift_armed || steps - rtk_engine.drift_start < rtk_engine.drift_window)
        return 0;
    uint64_t fit = planned_fit(t) - rtk_engine.drift_fit0, large = planned_large(t) - rtk_engine.drift_large0;
    uint32_t from = rtk_engine.drift_start;
    if (large == 0 || fit * 2 >= large || rtk_engine.replans >= MAX_REPLANS) {
        rtk_engine.replans_held += large && fit * 2 < large;
        drift_arm(t, steps);  /* the next window starts at this mark */
        return 0;
    }
    rtk_engine.replans++;
    rtk_engine.replan_step = steps;
    rtk_engine.replan_from = from;
    rtk_engine.replan_fit = fit;
    rtk_engine.replan_large = large;
    /* doubled from the window that found the drift, so repeated re-plans grow further and further apart */
    rtk_engine.drift_window = rtk_engine.drift_window > UINT32_MAX / 2 ? UINT32_MAX : rtk_engine.drift_window * 2;
    rtk_engine.plan_trimmed = 0;
    replace_plan(t, steps);
    return 1;
}

/* Idle headroom for the sizes no class serves, faulted in at the mark before the first step counted after the plan:
 * 1/128 of the large heap in use, 4-64 MiB. The bytes are in large_heap.prefaulted. The heap in use is mostly the
 * job's long-lived blocks (tables, variables), which need none: a larger share only sits idle (on wdl 1/32 held
 * 21-27 MiB, with the same 0.2-0.4 faults a step after the plan as 1/128 at batch 2048 and 16384). */
static void reserve_headroom(uint32_t steps)
{
    if (!rtk_engine.reserve_due || rtk_engine.state != RTK_STATE_PLANNED || steps < rtk_engine.after_from)
        return;
    rtk_engine.reserve_due = 0;
    rtk_large_info_t li;
    rtk_large_info(&li);
    size_t want = li.in_use / 128, lo = (size_t)4 << 20, hi = (size_t)64 << 20;
    rtk_large_reserve(want < lo ? lo : want > hi ? hi : want);
}

static int stats_due(uint64_t now)
{
    if (!rtk_engine.cfg.run_dir[0])
        return 0;
    uint64_t pages = (rtk_stats_rewrite_bytes() + 2 * 4095) / 4096 * 4096;  /* in pages already: + the metadata's */
    uint64_t period = pages * 1000000000ull / STATS_REWRITE_BUDGET;
    return now - rtk_engine.last_write_ns >= (period > STATS_PERIOD_NS ? period : STATS_PERIOD_NS);
}

void rtk_step_mark(void)
{
    rtk_spin_lock(&g_step_lock);
    rtk_totals_t t;
    rtk_census_sum(&t);
    /* the census misses small frees (not counted): glibc's books, read at the stats period, + rtkit's */
    t.live = rtk_live_bytes(rtk_os_now_ns(), STATS_PERIOD_NS);
    uint64_t faults = rtk_os_minor_faults();
    uint32_t steps = ++rtk_engine.steps;          /* the step that just ended has index steps - 1 */
    rtk_step_t *e = &rtk_engine.ring[(steps - 1) % RTK_RING_STEPS];
    e->step = steps - 1;
    e->allocs = t.allocs - rtk_engine.last.allocs;
    e->frees = t.frees - rtk_engine.last.frees;
    e->bytes = t.bytes - rtk_engine.last.bytes;
    e->live = t.live;
    e->arena_hits = t.arena_hits - rtk_engine.last.arena_hits;
    e->fallbacks = t.fallbacks - rtk_engine.last.fallbacks;
    e->minor_faults = faults - rtk_engine.faults_mark;
    if (rtk_engine.state == RTK_STATE_PROFILING) {
        rtk_engine.faults_before_sum += e->minor_faults;
        rtk_engine.faults_before_steps++;
    } else if (rtk_engine.state == RTK_STATE_PLANNED && e->step >= rtk_engine.after_from) {
        rtk_engine.faults_after_sum += e->minor_faults;
        rtk_engine.faults_after_steps++;
    }
    rtk_engine.last = t;
    if (t.live > rtk_engine.peak_live)
        rtk_engine.peak_live = t.live;
    rtk_footprint_t fp;
    rtk_footprint_read(t.live > 0 ? (size_t)t.live : 0, rtk_os_now_ns(), STATS_PERIOD_NS, &fp);
    if (!rtk_engine.peak_footprint.have || rtk_footprint_total(&fp) > rtk_footprint_total(&rtk_engine.peak_footprint)) {
        fp.step = steps - 1;
        fp.have = 1;
        rtk_engine.peak_footprint = fp;
    }
    int force = 0, loaded_now = 0;
    if (g_plan_deferred && steps >= plan_install_step()) {
        g_plan_deferred = 0;
        loaded_now = force = 1;
        load_plan();
        rtk_engine.plan_hits0 = t.arena_hits;  /* the plan's figures count from its install, as a profiled plan's do */
        rtk_engine.plan_large0 = t.arena_hits + t.fallbacks;
    }
    if (g_plan_deferred) {
        /* warm-up of a run with a plan to load: nothing to profile */
    } else if (rtk_engine.state == RTK_STATE_PASSTHROUGH && !rtk_engine.profile_done &&
               (steps == (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START) || (loaded_now && rtk_setting_num(RTK_OPT_MALLOC_PROFILE_START) == 0))) {
        rtk_step_start_profiling(steps);
    } else if (rtk_engine.state == RTK_STATE_PROFILING) {
        int streak = rtk_profile_step(steps, rtk_os_page_size());
        rtk_engine.plan_hits0 = t.arena_hits;
        rtk_engine.plan_large0 = t.arena_hits + t.fallbacks;
        if (streak >= rtk_setting_num(RTK_OPT_MALLOC_PROFILE_STABLE)) {
            finish_profiling(steps, "stable");
            rtk_engine.profile_done = 1;
            force = 1;
        } else if (rtk_profile_steps() >= rtk_setting_num(RTK_OPT_MALLOC_PROFILE_MAX)) {
            finish_profiling(steps, "max_steps");
            rtk_engine.profile_done = 1;
            force = 1;
        }
    } else if (rtk_engine.state == RTK_STATE_PLANNED && rtk_engine.validating) {
        validate_loaded(&t, steps);
        force = 1;
    } else if (rtk_engine.state == RTK_STATE_PLANNED && check_drift(&t, steps)) {
        force = 1;
    } else if (rtk_engine.state == RTK_STATE_PLANNED) {
        /* re-check: a class idle for the decay window is dropped, its free pages go back (until the drift check
         * re-plans, sizes that drifted since the plan are the large heap's) */
        int dropped = rtk_arenas_step((uint32_t)rtk_setting_num(RTK_OPT_MALLOC_DECAY_STEPS));
        rtk_engine.classes_dropped += (uint32_t)dropped;
        force |= dropped > 0;
    }
    /* a plan took over at this mark (profiled, or a loaded one past its check): its first drift window starts */
    if (rtk_engine.state == RTK_STATE_PLANNED && !rtk_engine.validating && !rtk_engine.drift_armed)
        drift_arm(&t, steps);
    rtk_large_step(steps, (uint32_t)rtk_setting_num(RTK_OPT_MALLOC_DECAY_STEPS));
    reserve_headroom(steps);
    rtk_engine.faults_mark = rtk_os_minor_faults();  /* after any arena pre-faulting done by this mark */
    uint64_t now = rtk_os_now_ns();
    /* also at steps 1, 2, 4, 8, ...: a short run's files (and the tier's residency samples) see its training; and
     * before the ring wraps over records not yet appended to the step files (a loop of thousands of steps a second) */
    if (force || stats_due(now) || !(steps & (steps - 1)) || steps - rtk_stats_steps_written() >= RTK_RING_STEPS)
        rtk_stats_write_locked(now);
    else if (rtk_engine.cfg.run_dir[0] && now - rtk_engine.last_write_ns >= STATS_PERIOD_NS)
        rtk_tier_step_sample();  /* the files are spaced by their size; the tier's samples and budget are not */
    rtk_spin_unlock(&g_step_lock);
}

int rtk_step_write_stats(void)
{
    rtk_spin_lock(&g_step_lock);
    if (rtk_engine.state != RTK_STATE_DISABLED) {
        rtk_census_sum(&rtk_engine.last);
        rtk_engine.last.live = rtk_live_bytes(rtk_os_now_ns(), 0);
    }
    int r = rtk_stats_write_locked(rtk_os_now_ns());
    rtk_spin_unlock(&g_step_lock);
    return r;
}

void rtk_step_fork_prepare(void) { rtk_spin_fork_prepare(&g_step_lock); }
void rtk_step_fork_parent(void) { rtk_spin_fork_parent(&g_step_lock); }
void rtk_step_fork_child(void) { rtk_spin_fork_child(&g_step_lock); }
