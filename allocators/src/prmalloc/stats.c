/* stats.c -- allocator-<pid>.json: formatted with snprintf into an mmap'd buffer (no malloc), written atomically. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/jsonbuf.h"
#include "common/options.h"
#include "common/os.h"
#include "common/say.h"
#include "prmalloc/arena_slots.h"
#include "prmalloc/large.h"
#include "prmalloc/profile.h"
#include "prmalloc/stats.h"
#include "prmalloc/tier.h"
#include "rtkit/prmalloc.h"

#define STATS_CAP ((size_t)1 << 20)

static char *g_buf;
static uint64_t g_rewrite_bytes;  /* what the last write rewrote (this file and the tier's), appended records not counted */

uint64_t rtk_stats_rewrite_bytes(void) { return g_rewrite_bytes; }

static const char *state_name(int s)
{
    switch (s) {
    case RTK_STATE_PROFILING: return "profiling";
    case RTK_STATE_PLANNED: return "planned";
    case RTK_STATE_PASSTHROUGH: return "passthrough";
    default: return "disabled";
    }
}

static void put_avg(rtk_out_t *o, uint64_t sum, uint64_t n)
{
    if (n)
        rtk_out_put(o, "%.2f", (double)sum / (double)n);
    else
        rtk_out_put(o, "null");
}

/* the echo's value of a setting: the one in force, as the report has always read it (a loaded plan's min_size, whose
 * home is rtk_fastpath, in place of the user's) */
static rtk_value_t in_force(rtk_opt_t id, rtk_value_t set)
{
    if (id == RTK_OPT_MALLOC_MIN_SIZE && rtk_fastpath.min_size != SIZE_MAX)
        set.bytes = rtk_fastpath.min_size;
    return set;
}

long rtk_stats_format(char *buf, size_t cap)
{
    rtk_out_t o = {buf, cap, 0, 0};
    const rtk_totals_t *t = &rtk_engine.last;
    rtk_out_put(&o, "{\n  \"schema_version\": %d,\n  \"pid\": %ld,\n  \"state\": \"%s\",\n  \"errors\": [",
        RTKIT_MALLOC_STATS_SCHEMA, (long)rtk_engine.pid, state_name(rtk_engine.state));
    for (int i = 0, n = 0, part; i < rtk_kept_count(); i++) {
        const char *msg = rtk_kept_message(i, &part);
        if (part != RTK_PART_MALLOC)
            continue;  /* the tier's and the pool's are the pmem section's notes */
        rtk_out_put(&o, n++ ? ", " : "");
        rtk_out_str(&o, msg);
    }
    rtk_out_put(&o, "],\n  \"config\": {");
    rtk_opt_echo(&o, RTK_PART_MALLOC, in_force);  /* the settings under rtkit/config.py's keys */
    rtk_out_put(&o, ", \"run_dir\": ");
    rtk_out_str(&o, rtk_engine.cfg.run_dir);
    rtk_out_put(&o, "},\n  \"steps\": %u,\n", rtk_engine.steps);
    rtk_out_put(&o, "  \"profile\": {\"start_step\": ");
    if (rtk_engine.state == RTK_STATE_PROFILING || rtk_engine.profile_done)
        rtk_out_put(&o, "%u", rtk_engine.profile_start_step);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ", \"end_step\": ");
    if (rtk_engine.profile_done)
        rtk_out_put(&o, "%u", rtk_engine.profile_end_step);
    else
        rtk_out_put(&o, "null");
    /* while profiling, the steps profiled so far (the engine keeps the count from the end of profiling) */
    unsigned profiled = rtk_engine.state == RTK_STATE_PROFILING ? (unsigned)rtk_profile_steps() : rtk_engine.profiled_steps;
    rtk_out_put(&o, ", \"profiled_steps\": %u, \"dropped_allocations\": %llu, \"reason\": ", profiled,
                (unsigned long long)rtk_profile_dropped());
    rtk_out_str(&o, rtk_engine.profile_reason ? rtk_engine.profile_reason : "");
    rtk_out_put(&o, "},\n  \"plan\": {\"source\": ");
    rtk_out_str(&o, rtk_engine.plan_source ? rtk_engine.plan_source : "none");
    rtk_out_put(&o, ", \"made_at_step\": ");
    if (rtk_engine.state == RTK_STATE_PLANNED)
        rtk_out_put(&o, "%u", rtk_engine.plan_step);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ", \"classes\": [");
    int have = rtk_engine.state == RTK_STATE_PLANNED;
    for (int i = 0; have && i < rtk_engine.plan.nclasses; i++)
        rtk_out_put(&o, "%s{\"size_bytes\": %zu, \"blocks\": %u, \"align_bytes\": %u}", i ? ", " : "", rtk_engine.plan.cls[i].size,
            rtk_engine.plan.cls[i].blocks, rtk_engine.plan.cls[i].align);
    rtk_out_put(&o, "], \"reserved_bytes\": %zu, \"step_peak_bytes\": ", have ? rtk_engine.plan.reserved : 0);
    if (have && rtk_engine.plan.step_peak)
        rtk_out_put(&o, "%zu", rtk_engine.plan.step_peak);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ", \"spacing\": ");
    rtk_out_str(&o, have ? rtk_spacing_name[rtk_engine.plan.spacing] : "");
    rtk_out_put(&o, ", \"trimmed_to_limit\": %s, \"sizes_above_class_max\": %d, \"plan_path\": ",
        rtk_engine.plan_trimmed ? "true" : "false", rtk_engine.plan.above_max);
    rtk_out_str(&o, rtk_engine.plan_path);
    rtk_out_put(&o, ", \"rejected_reason\": ");
    if (rtk_engine.rejected_reason[0])
        rtk_out_str(&o, rtk_engine.rejected_reason);
    else
        rtk_out_put(&o, "null");
    uint64_t malloc_calls = t->allocs - t->calloc_calls - t->memalign_calls - t->realloc_calls;
    if (malloc_calls > t->allocs)
        malloc_calls = 0;
    rtk_out_put(&o, "},\n  \"totals\": {\"malloc_calls\": %llu, \"free_calls\": %llu, \"calloc_calls\": %llu, "
            "\"realloc_calls\": %llu, \"memalign_calls\": %llu, \"bytes_allocated\": %llu, \"arena_hits\": %llu, "
            "\"fallbacks\": %llu, \"small_calls\": %llu, \"arena_misses\": %llu, \"arena_exhausted\": %llu, "
            "\"live_bytes\": %lld, \"peak_live_bytes\": %lld, \"debug_errors\": %llu, \"fallbacks_reused\": %llu, "
            "\"large_hits\": %llu, \"arena_above_max\": %llu},\n",
        (unsigned long long)malloc_calls, (unsigned long long)t->frees, (unsigned long long)t->calloc_calls,
        (unsigned long long)t->realloc_calls, (unsigned long long)t->memalign_calls, (unsigned long long)t->bytes,
        (unsigned long long)t->arena_hits, (unsigned long long)t->fallbacks, (unsigned long long)t->small_calls,
        (unsigned long long)t->arena_misses, (unsigned long long)t->arena_exhausted, (long long)t->live,
        (long long)rtk_engine.peak_live, (unsigned long long)rtk_engine.debug_errors,
        (unsigned long long)__atomic_load_n(&rtk_engine.fallback_reused, __ATOMIC_RELAXED),
        (unsigned long long)t->large_hits, (unsigned long long)t->arena_above);
    /* the drift check (step.c): plans retired because the job's sizes changed under them, and the last one's window */
    rtk_out_put(&o, "  \"replans\": {\"count\": %u, \"held_at_limit\": %u, \"window_steps\": %u, \"last_step\": ",
                rtk_engine.replans, rtk_engine.replans_held,
                rtk_engine.drift_window ? rtk_engine.drift_window : (unsigned)rtk_setting_num(RTK_OPT_MALLOC_DRIFT_STEPS));
    if (rtk_engine.replans)
        rtk_out_put(&o, "%u, \"last_from_step\": %u, \"last_classed\": %llu, \"last_allocations\": %llu, "
                    "\"last_reason\": \"sizes drifted\"},\n", rtk_engine.replan_step, rtk_engine.replan_from,
                    (unsigned long long)rtk_engine.replan_fit, (unsigned long long)rtk_engine.replan_large);
    else
        rtk_out_put(&o, "null, \"last_from_step\": null, \"last_classed\": null, \"last_allocations\": null, "
                    "\"last_reason\": null},\n");
    /* rtkit's own memory: what bounds its share of RSS (live blocks) and what it holds idle or gave back */
    rtk_large_info_t li;
    rtk_large_info(&li);
    size_t ar_live, ar_free, ar_large, ar_res, ar_ret;
    rtk_arenas_usage(&ar_live, &ar_free, &ar_large);
    rtk_arenas_bytes(&ar_res, &ar_ret);
    rtk_out_put(&o, "  \"large_heap\": {\"reserved_bytes\": %zu, \"used_bytes\": %zu, \"live_bytes\": %zu, "
            "\"idle_bytes\": %zu, \"released_bytes\": %zu, \"decayed_bytes\": %llu, \"blocks\": %llu, \"trims\": %llu, "
            "\"prefaulted_bytes\": %zu},\n",
        li.reserved, li.used, li.in_use, li.idle, li.released, (unsigned long long)li.decayed_bytes,
        (unsigned long long)li.blocks, (unsigned long long)li.trims, li.prefaulted);
    uint64_t adopted, awaited, grown, grown_bytes;
    rtk_arenas_adoption(&adopted, &awaited, &grown, &grown_bytes);
    rtk_out_put(&o, "  \"arenas\": {\"reserved_bytes\": %zu, \"retired_bytes\": %zu, \"live_bytes\": %zu, "
            "\"free_bytes\": %zu, \"retired\": %d, \"classes_dropped\": %u, \"returned_at_retirement_bytes\": %zu, "
            "\"adopted_blocks\": %llu, \"awaited_blocks\": %llu, \"grown_blocks\": %llu, \"grown_bytes\": %llu},\n",
        ar_res, ar_ret, ar_live, ar_free, rtk_arenas_retired(), rtk_engine.classes_dropped, rtk_engine.retired_released,
        (unsigned long long)adopted, (unsigned long long)awaited, (unsigned long long)grown,
        (unsigned long long)grown_bytes);
    const rtk_footprint_t *fp = &rtk_engine.peak_footprint;
    rtk_out_put(&o, "  \"peak_footprint\": {\"step\": ");
    if (fp->have)
        rtk_out_put(&o, "%u", fp->step);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ", \"live_bytes\": %zu, \"arena_idle_bytes\": %zu, \"large_idle_bytes\": %zu, \"glibc_free_bytes\": %zu},\n",
                fp->live, fp->arena_idle, fp->large_idle, fp->glibc_free);
    uint64_t large = t->arena_hits + t->fallbacks;
    rtk_out_put(&o, "  \"hit_rate\": ");
    if (large)
        rtk_out_put(&o, "%.4f", (double)t->arena_hits / (double)large);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ",\n  \"hit_rate_after_plan\": ");
    uint64_t large_after = large - rtk_engine.plan_large0, hits_after = t->arena_hits - rtk_engine.plan_hits0;
    if (rtk_engine.state == RTK_STATE_PLANNED && large >= rtk_engine.plan_large0 && large_after)
        rtk_out_put(&o, "%.4f", (double)hits_after / (double)large_after);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ",\n  \"minor_faults_per_step_before_plan\": ");
    put_avg(&o, rtk_engine.faults_before_sum, rtk_engine.faults_before_steps);
    rtk_out_put(&o, ",\n  \"after_plan_from_step\": ");
    if (rtk_engine.state == RTK_STATE_PLANNED)
        rtk_out_put(&o, "%u", rtk_engine.after_from);
    else
        rtk_out_put(&o, "null");
    rtk_out_put(&o, ",\n  \"minor_faults_per_step_after_plan\": ");
    put_avg(&o, rtk_engine.faults_after_sum, rtk_engine.faults_after_steps);
    /* the mean's own sum and count: per_step's records from after_plan_from_step on add up to them (the ring
     * keeps the last RTK_RING_STEPS) */
    rtk_out_put(&o, ",\n  \"minor_faults_after_plan\": %llu, \"after_plan_steps\": %llu",
                (unsigned long long)rtk_engine.faults_after_sum, (unsigned long long)rtk_engine.faults_after_steps);
    /* the run files this process wrote before this one (the parent adds the last allocator and pmem files' sizes) */
    rtk_out_put(&o, ",\n  \"run_files_written_bytes\": %llu", (unsigned long long)rtk_os_files_written_bytes());
    /* the per-step records are in their own files, each appended once (stats_steps.c): this file stays small */
    rtk_out_put(&o, ",\n  \"per_step_files\": [\"allocator-%ld.steps.0.jsonl\", \"allocator-%ld.steps.1.jsonl\"], "
                "\"per_step_written\": %u, \"per_step_kept\": %d", (long)rtk_engine.pid, (long)rtk_engine.pid,
                rtk_stats_steps_written(), RTK_RING_STEPS);
    rtk_out_put(&o, ",\n  \"size_classes\": [");
    int first = 1;
    for (int b = 0; b < RTK_BUCKETS; b++) {
        if (!t->count[b])
            continue;
        rtk_out_put(&o, "%s{\"bucket_bytes\": %llu, \"count\": %llu, \"bytes\": %llu}", first ? "" : ", ",
            (unsigned long long)1 << b, (unsigned long long)t->count[b], (unsigned long long)t->bucket_bytes[b]);
        first = 0;
    }
    /* tier mode's figures have one file of their own, pmem-<pid>.json (tier_stats.c) */
    rtk_out_put(&o, "]\n}\n");
    return o.full ? -1 : (long)o.off;
}

int rtk_stats_write_locked(uint64_t now_ns)
{
    if (!rtk_engine.cfg.run_dir[0])
        return -1;
    if (!g_buf && !(g_buf = rtk_os_map(STATS_CAP, 0)))
        return -1;
    if (rtk_engine.last.live > rtk_engine.peak_live)
        rtk_engine.peak_live = rtk_engine.last.live;
    rtk_stats_steps_append();  /* first: the file below counts the bytes appended */
    long n = rtk_stats_format(g_buf, STATS_CAP);
    if (n < 0)
        return -1;
    char path[sizeof rtk_engine.cfg.run_dir + 64];
    snprintf(path, sizeof path, "%s/allocator-%ld.json", rtk_engine.cfg.run_dir, (long)rtk_engine.pid);
    rtk_engine.last_write_ns = now_ns;
    uint64_t before = rtk_os_files_written_bytes();
    int r = rtk_os_write_file_atomic(path, g_buf, (size_t)n);
    rtk_tier_write_file(rtk_engine.cfg.run_dir, (long)rtk_engine.pid);
    g_rewrite_bytes = rtk_os_files_written_bytes() - before;
    return r;
}
