/* tier_stats.c -- tier mode's report: the "pmem" JSON object and the pmem-<pid>.json file. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonbuf.h"
#include "common/options.h"
#include "common/say.h"
#include "prmalloc/large.h"
#include "prmalloc/tier_internal.h"

/* an allocation live this many step marks after it was made is long-lived: more than an input pipeline's prefetch
 * keeps in flight, far less than a model built between fits lives */
#define DRAM_LIVE_MARKS 16

#define U(x) ((unsigned long long)(x))
#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* pmem-<pid>.json's own schema version: it moves with rtkit/report/model.py's SCHEMA_VERSION when a key moves */
#define TIER_STATS_SCHEMA 2

static const char *state_name(int s)
{
    switch (s) {
    case T_IDLE: return "idle";
    case T_CREATING: return "creating";
    case T_ON: return "on";
    case T_FAILED: return "failed";
    case T_BUSY: return "busy";
    case T_CHILD: return "forked_child";
    default: return "off";
    }
}

/* RssAnon / RssFile / RssShmem of this process, in bytes (-1 when unknown) */
static void rss_parts(long long out[3])
{
    static const char *keys[3] = {"RssAnon:", "RssFile:", "RssShmem:"};
    char buf[8192];
    out[0] = out[1] = out[2] = -1;
    if (rtk_os_read_file("/proc/self/status", buf, sizeof buf) < 0)
        return;
    for (int i = 0; i < 3; i++) {
        const char *s = strstr(buf, keys[i]);
        if (s)
            out[i] = atoll(s + strlen(keys[i])) * 1024;
    }
}


/* the share of a record in DRAM: its file pages and its head's */
static double hot_fraction(const live_t *r)
{
    uint64_t in = r->resident + r->head_resident;
    return r->n ? (in >= r->n ? 1.0 : (double)in / (double)r->n) : 0.0;
}

/* The "pmem" JSON object (no trailing newline) into buf; length or -1 when it does not fit. */
static long tier_format(char *buf, size_t cap)
{
    const rtk_tier_t *t = &rtk_tier;
    const rtk_tier_view_t *v = &rtk_tier_view;
    rtk_out_t o = {buf, cap, 0, 0};
    const char *nl = "\n  ";
    int st = __atomic_load_n(&t->state, __ATOMIC_ACQUIRE);
    rtk_out_put(&o, "{%s\"schema_version\": %d,%s\"pid\": %ld,%s\"state\": \"%s\",%s\"tier_pool_path\": ", nl,
        TIER_STATS_SCHEMA, nl, rtk_os_pid(), nl, state_name(st), nl);
    rtk_out_str(&o, t->path);
    rtk_out_put(&o, ",%s\"medium\": ", nl);
    rtk_out_str(&o, t->medium);
    rtk_out_put(&o, ",%s\"tier_pool_size\": %llu,%s\"tier_min_size\": %llu,%s\"durable\": false,", nl,
        U(st == T_OFF ? 0 : t->size), nl, U(rtk_setting_bytes(RTK_OPT_TIER_MIN_SIZE)), nl);
    uint64_t bytes = LD(t->bytes), mark = LD(t->bytes_at_mark);
    rtk_out_put(&o, "%s\"tier_bytes\": %llu,%s\"tier_peak_bytes\": %llu,%s\"tier_last_step_bytes\": %llu,", nl, U(bytes),
        nl, U(LD(t->peak)), nl, U(mark));
    rtk_out_put(&o, "%s\"tier_allocs\": %llu,%s\"tier_frees\": %llu,%s\"tier_fallbacks\": %llu,%s\"tier_fallback_bytes\": %llu,",
        nl, U(LD(t->allocs)), nl, U(LD(t->frees)), nl, U(LD(t->fallbacks)), nl, U(LD(t->fallback_bytes)));
    rtk_out_put(&o, "%s\"tier_fallback_largest\": %llu,%s\"tier_fallback_largest_held\": %llu,"
                    "%s\"tier_fallback_largest_before_first_step\": %s,", nl, U(LD(t->fallback_largest)), nl,
        U(LD(t->fallback_largest_held)), nl, LD(t->fallback_largest_pre) ? "true" : "false");
    rtk_out_put(&o, "%s\"step_marks\": %llu,", nl, U(LD(t->steps)));
    rtk_out_put(&o, "%s\"placed_before_first_step\": {\"allocs\": %llu, \"bytes\": %llu, \"freed_bytes\": %llu, "
            "\"stopped_for_churn\": %s, \"still_placed_min_bytes\": %llu},"
            "%s\"placed_long_lived\": {\"allocs\": %llu, \"bytes\": %llu, \"sizes_known\": %u, \"active\": %s},",
        nl, U(LD(t->pre_allocs)), U(LD(t->pre_bytes)), U(LD(t->pre_freed_bytes)), LD(t->pre_stopped) ? "true" : "false",
        U(TIER_TABLE_BYTES),
        nl, U(LD(t->ll_allocs)), U(LD(t->ll_bytes)), t->ll_sizes, LD(t->plan_ready) ? "true" : "false");
    /* requests of tier_min_size or more made after the first step mark that the placement rule left in DRAM (the
     * large heap's blocks, watched there) and still live DRAM_LIVE_MARKS marks or more after they were made: models
     * built between fits, their variables and slots (the rule takes only what exists before the first step and sizes
     * the profile saw outlive steps). The most seen at one write: at exit the job may have freed them already. */
    static uint64_t peak_n, peak_b, peak_step;
    uint64_t dram_n = 0, dram_b = 0;
    uint32_t marks = __atomic_load_n(&rtk_engine.steps, __ATOMIC_RELAXED);
    int watched = rtk_engine.large_min != SIZE_MAX && rtk_tier_min != SIZE_MAX;
    if (watched && marks >= DRAM_LIVE_MARKS)
        rtk_large_count_watched(marks - DRAM_LIVE_MARKS, &dram_n, &dram_b);
    if (dram_b > peak_b) {
        peak_n = dram_n;
        peak_b = dram_b;
        peak_step = marks;
    }
    /* the heap serves requests from large_min up: below it (malloc_min_size above tier_min_size) glibc's, unwatched */
    size_t from = rtk_engine.large_min > rtk_tier_min ? rtk_engine.large_min : rtk_tier_min;
    rtk_out_put(&o, "%s\"dram_after_first_step\": {\"allocs\": %llu, \"bytes\": %llu, \"peak_allocs\": %llu, "
            "\"peak_bytes\": %llu, \"peak_at_mark\": %llu, \"live_marks_min\": %d, \"watched_min_bytes\": ", nl,
        U(dram_n), U(dram_b), U(peak_n), U(peak_b), U(peak_step), DRAM_LIVE_MARKS);
    rtk_out_put(&o, watched ? "%llu}," : "null},", U(from));
    rtk_out_put(&o, "%s\"page_release\": {\"disabled\": %s, \"errors\": %llu, \"deferred_frees\": %llu, "
            "\"deferred_bytes\": %llu, \"deferred_max_bytes\": %llu, "
            "\"first_step_punches\": %llu, \"first_step_punched_bytes\": %llu, \"first_step_cold_hint_bytes\": %llu},", nl,
        t->no_remove ? "true" : "false", U(LD(t->remove_errors)), U(LD(t->deferred_frees)), U(LD(t->deferred_bytes)),
        U(TIER_DEFER_MAX), U(t->gap_punches), U(t->gap_bytes), U(t->cold_hint_bytes));
    long long written_peak, written = rtk_tier_heads_written(&written_peak);
    rtk_out_put(&o, "%s\"dram_head\": {\"setting_bytes\": %llu, \"budget_bytes\": %llu, \"bytes\": %llu, "
            "\"records\": %llu, \"written_bytes\": %lld, \"written_peak_bytes\": %lld, \"restored_bytes\": %llu, "
            "\"seconds\": %.3f, \"not_given_back\": %llu, \"by_heat\": {\"bytes\": %llu, \"chunks\": %llu, "
            "\"restored_bytes\": %llu, \"runs\": %llu, \"runs_refused\": %llu}},", nl,
        U(rtk_setting_bytes(RTK_OPT_TIER_DRAM_HEAD)), U(t->head_budget), U(t->head_bytes), U(t->head_records),
        written < 0 ? -1LL : written, written_peak < 0 ? -1LL : written_peak, U(t->head_restored), t->head_s,
        U(LD(t->head_kept_errors)), U(t->head_promoted), U(t->head_promoted_chunks), U(t->head_promoted_restored),
        U(rtk_tier_promoted_runs()), U(t->head_runs_refused));
    const rtk_tier_pager_stats_t *pg = &rtk_tier_pager_stats;
    rtk_out_put(&o, "%s\"pager\": {\"setting\": %s, \"on\": %s, \"note\": ", nl,
        rtk_setting_on(RTK_OPT_TIER_PAGER) ? "true" : "false", rtk_tier_pager_on() ? "true" : "false");
    rtk_out_str(&o, rtk_tier_pager_note());
    rtk_out_put(&o, ", \"limit_bytes\": %llu, \"anon_peak_bytes\": %llu, \"regions\": %llu, \"adopted_bytes\": %llu, "
            "\"data_at_adopt_bytes\": %llu, \"adopt_errors\": %llu, \"adopt_seconds\": %.3f, "
            "\"forgotten_bytes\": %llu, \"filled_from_file\": %llu, \"filled_zero\": %llu, \"fill_seconds\": %.3f, "
            "\"busy_waits\": %llu, \"read_errors\": %llu, \"scans\": %llu, \"scan_errors\": %llu, \"scan_seconds\": %.3f, "
            "\"resident_at_scan_bytes\": %llu, \"passes\": %llu, \"evictions\": %llu, \"evicted_pages\": %llu, "
            "\"evicted_holes\": %llu, \"evicted_bytes\": %llu, \"evict_seconds\": %.3f, \"move_errors\": %llu, \"move_last_errno\": %llu, \"move_shared\": %llu, \"move_done_eexist\": %llu, "
            "\"write_errors\": %llu, \"fetch_calls\": %llu, \"fetch_asked\": %llu, \"fetch_filled\": %llu, \"fetch_busy\": %llu, "
            "\"fetch_seconds\": %.3f, \"evicted_same\": %llu, \"filled_same\": %llu, \"fill_cpu_seconds\": %.3f, "
            "\"scan_cpu_seconds\": %.3f, \"evict_cpu_seconds\": %.3f, \"evict_moves\": %llu, \"fetch_same\": %llu, \"heat_from_bytes\": %llu, \"first_scan_step\": %llu, "
            "\"evict_walked_pages\": %llu, \"told_pages\": %llu, \"regions_armed\": %llu, \"regions_scanned\": %llu, "
            "\"growth_bytes_per_step\": %llu, \"first_scan_by_lead\": %llu, \"back_within_two_steps\": %llu, "
            "\"room_bytes\": %llu, \"room_by_max\": %llu},",
        U(pg->limit), U(pg->anon_peak), U(pg->regions), U(pg->adopted_bytes), U(pg->data_at_adopt),
        U(pg->adopt_errors), pg->adopt_s, U(pg->forgotten_bytes), U(LD(pg->filled_from_file)), U(LD(pg->filled_zero)),
        (double)LD(pg->fill_ns) * 1e-9, U(LD(pg->busy_waits)), U(LD(pg->read_errors)), U(pg->scans), U(LD(pg->scan_errors)),
        pg->scan_s, U(pg->resident_at_scan), U(pg->passes), U(pg->evictions), U(pg->evicted_pages), U(pg->evicted_holes), U(pg->written_bytes),
        pg->evict_s, U(LD(pg->move_errors)), U(pg->move_errno), U(LD(pg->move_shared)), U(LD(pg->move_done_eexist)),
        U(LD(pg->write_errors)),
        U(LD(pg->fetch_calls)), U(LD(pg->fetch_asked)), U(LD(pg->fetch_filled)), U(LD(pg->fetch_busy)),
        (double)LD(pg->fetch_ns) * 1e-9, U(pg->evicted_same), U(LD(pg->filled_same)),
        (double)LD(pg->fill_cpu_ns) * 1e-9, (double)pg->scan_cpu_ns * 1e-9, (double)pg->evict_cpu_ns * 1e-9,
        U(pg->evict_moves), U(LD(pg->fetch_same)), U(pg->heat_from), U(pg->first_scan_step), U(pg->evict_walked), U(LD(pg->told_pages)), U(pg->regions_armed), U(pg->regions_scanned),
        U(pg->growth), U(pg->first_scan_near), U(LD(pg->back_soon)), U(pg->room), U(pg->room_by_max));
    rtk_out_put(&o, "%s\"bad_frees\": %llu,%s\"child_frees_ignored\": %llu,%s\"pool_errors\": %llu,", nl, U(LD(t->bad_frees)),
        nl, U(LD(t->child_frees)), nl, U(LD(t->errors_other)));
    /* DRAM saved: what sat in the pool at the last step mark (steady state), else what sits there now, less the
     * heads still in anonymous memory */
    uint64_t saved = t->steps ? mark : bytes, heads_live = t->steps ? t->heads_at_mark : rtk_tier_private_held();
    /* the heads' and promoted chunks' pages are anonymous only once written: the most of them seen written, where the
     * kernel tells (a page never written is the file's page cache) */
    if (written_peak >= 0)
        heads_live = (uint64_t)written_peak;
    rtk_out_put(&o, "%s\"dram_bytes_saved_estimate\": %llu,", nl, U(saved > heads_live ? saved - heads_live : 0));
    long long rss[3];
    rss_parts(rss);
    static long long anon_peak;  /* sampled at every stats write (step marks, at most every 0.5 s, and exit) */
    if (rss[0] > anon_peak)
        anon_peak = rss[0];
    rtk_out_put(&o, "%s\"process_rss_anon_bytes\": %lld,%s\"process_rss_anon_peak_sampled_bytes\": %lld,"
            "%s\"process_rss_file_bytes\": %lld,%s\"process_rss_shmem_bytes\": %lld,",
        nl, rss[0], nl, anon_peak, nl, rss[1], nl, rss[2]);
    /* the tier view: pool pages in DRAM (mincore), the largest records, and residency over time */
    rtk_out_put(&o, "%s\"at_rss_peak\": {\"rss_bytes\": %llu, \"pool_dram_bytes\": %llu, \"tier_bytes\": %llu, "
            "\"step\": %llu, \"t_s\": %.3f},", nl, U(v->at_rss_peak.rss), U(v->at_rss_peak.pool_dram),
        U(v->at_rss_peak.live), U(v->at_rss_peak.step), v->at_rss_peak.t_s);
    rtk_out_put(&o, "%s\"pool_resident_bytes\": %llu,%s\"tier_resident_max\": %llu,%s\"budget_passes\": %llu,"
            "%s\"budget_dropped_bytes\": %llu,%s\"records_live\": %u,", nl, U(v->resident), nl,
        U(rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX)), nl, U(v->passes), nl, U(v->dropped_bytes), nl, t->nlive);
    /* page heat: which chunks the budget kept, what moving them cost, the lookahead's pages it kept */
    long every = rtk_setting_num(RTK_OPT_TIER_HEAT_EVERY);
    const char *mech = !every || !rtk_setting_bytes(RTK_OPT_TIER_RESIDENT_MAX) ? "off"
                       : rtk_tier_heat_on()                                   ? "pagemap_scan"
                       : v->heat_note[0]                                      ? "unavailable"
                                                                              : "not_armed";
    rtk_out_put(&o, "%s\"heat\": {\"mechanism\": \"%s\", \"every_steps\": %ld, \"chunk_bytes\": %u, \"samples\": %llu, "
            "\"chunks_demoted\": %llu, \"chunks_promoted\": %llu, \"demoted_bytes\": %llu, \"written_out_bytes\": %llu, "
            "\"pages_written_seen\": %llu, \"hot_chunks\": %llu, \"resident_bytes\": %llu, \"watch_errors\": %llu, "
            "\"seconds\": %.4f, \"lookahead_calls\": %llu, \"lookahead_pages\": %llu, \"lookahead_kept_pages\": %llu, "
            "\"lookahead_dropped_pages\": %llu, \"mark_seconds\": %.4f, \"on_worker\": %s, \"passes_merged\": %llu, "
            "\"records_skipped\": %llu},%s\"records\": [", nl, mech, every, 65536u, U(v->heat_samples),
        U(v->heat_demoted), U(v->heat_promoted), U(v->heat_demoted_bytes), U(v->heat_written_out_bytes),
        U(v->heat_pages_written), U(v->heat_hot_chunks), U(v->heat_resident), U(v->heat_watch_errors), v->heat_s,
        U(LD(v->want_calls)), U(LD(v->want_pages)), U(LD(v->want_kept)), U(LD(v->want_dropped)), v->heat_mark_s,
        v->heat_worker > 0 ? "true" : "false", U(v->heat_merged), U(v->heat_skipped), nl);
    const live_t *top = v->top;
    for (int i = 0; i < v->ntop; i++)
        rtk_out_put(&o, "%s{\"offset\": %llu, \"bytes\": %llu, \"resident_bytes\": %llu, \"dram_head_bytes\": %llu, "
                "\"dram_by_heat_bytes\": %llu, \"hot_fraction\": %.4f}",
            i ? ", " : "", U(top[i].payload - t->base), U(top[i].n), U(top[i].resident + top[i].head_resident),
            U(top[i].head), U(top[i].promoted), hot_fraction(&top[i]));
    rtk_out_put(&o, "],%s\"timeline\": [", nl);
    unsigned first_tl = v->ntimeline > TL_CAP ? v->ntimeline - TL_CAP : 0;
    for (unsigned i = first_tl; i < v->ntimeline; i++) {
        const tl_t *x = &v->timeline[i % TL_CAP];
        rtk_out_put(&o, "%s{\"step\": %llu, \"t_s\": %.3f, \"resident_bytes\": %llu, \"tier_bytes\": %llu, "
                "\"major_faults\": %llu}", i > first_tl ? ", " : "", U(x->step), x->t_s, U(x->resident),
            U(x->tier_bytes), U(x->major_faults));
    }
    rtk_out_put(&o, "],");
    rtk_out_put(&o, "%s\"pool\": ", nl);
    if (t->pool && st == T_ON) {  /* not in a forked child: a pool lock may be held by a thread it lost */
        rtkit_pmem_stats s;
        rtkit_pmem_stats_get(t->pool, &s);
        rtk_out_put(&o, "{\"segment_size\": %llu, \"block_size\": %u, \"max_record\": %u, "
                "\"segments\": %u, \"segments_free\": %llu, \"segments_class\": %llu, \"segments_extent\": %llu, "
                "\"allocated_bytes\": %llu, \"requested_bytes\": %llu, \"extents\": %llu, \"extent_bytes\": %llu, "
                "\"fragmentation\": %.4f, \"is_pmem\": %s, \"persist\": \"%s\", \"background_runs\": %llu, "
                "\"background_moves\": %llu, \"moved_records\": %llu, \"classes\": [",
            U(s.segment_size), s.block_size, s.max_record, s.nsegments, U(s.segments_free), U(s.segments_class),
            U(s.segments_extent), U(s.allocated_bytes), U(s.requested_bytes), U(s.extents), U(s.extent_bytes),
            s.fragmentation, s.is_pmem ? "true" : "false",
            s.persist_kind == RTKIT_PMEM_PERSIST_FLUSH ? "flush" : s.persist_kind == RTKIT_PMEM_PERSIST_MSYNC ? "msync"
                                                                                                            : "none",
            U(s.background_runs), U(s.background_moves), U(s.moved_records));
        int seen = 0, first = 1;
        for (uint32_t c = 1; c < 65536; c++) {
            rtkit_pmem_class_stats cs;
            if (rtkit_pmem_class_stats_get(t->pool, c, &cs) != 0) {
                if (seen)
                    break;
                continue;
            }
            seen = 1;
            if (cs.allocated <= 0 && !cs.segments)
                continue;
            rtk_out_put(&o, "%s{\"record_size_bytes\": %u, \"allocated\": %lld, \"segments\": %u}", first ? "" : ", ",
                cs.record_size, (long long)cs.allocated, cs.segments);
            first = 0;
        }
        rtk_out_put(&o, "]}");
    } else {
        rtk_out_put(&o, "null");
    }
    rtk_out_put(&o, ",%s\"notes\": [", nl);
    int n = 0;
    if (t->reason[0]) {
        rtk_out_str(&o, t->reason);
        n++;
    }
    if (v->heat_note[0]) {
        rtk_out_put(&o, n++ ? ", " : "");
        rtk_out_str(&o, v->heat_note);
    }
    for (int i = 0, part; i < rtk_kept_count(); i++) {
        const char *msg = rtk_kept_message(i, &part);
        if (part == RTK_PART_MALLOC)
            continue;  /* the allocator section's errors */
        rtk_out_put(&o, n++ ? ", " : "");
        rtk_out_str(&o, msg);
    }
    if (st == T_ON && strcmp(t->medium, "tmpfs") == 0)
        rtk_out_put(&o, "%s\"pool on tmpfs: its pages are shared memory, still RAM; DRAM saved counts anonymous memory only\"",
            n++ ? ", " : "");
    if (st == T_IDLE)
        rtk_out_put(&o, "%s\"no allocation qualified yet: the pool is created at the first one\"", n++ ? ", " : "");
    rtk_out_put(&o, "]\n}");
    return o.full ? -1 : (long)o.off;
}

static char g_tbuf[262144];

void rtk_tier_step_sample(void)
{
    if (rtk_tier.state != T_OFF)
        rtk_tier_sample(rtk_tier.exiting);
}

void rtk_tier_write_file(const char *run_dir, long pid)
{
    if (rtk_tier.state == T_OFF || !run_dir || !run_dir[0])
        return;
    rtk_tier_sample(rtk_tier.exiting);
    long n = tier_format(g_tbuf, sizeof g_tbuf - 1);
    if (n < 0)
        return;
    g_tbuf[n++] = '\n';
    char path[1200];
    snprintf(path, sizeof path, "%s/pmem-%ld.json", run_dir, pid);
    rtk_os_write_file_atomic(path, g_tbuf, (size_t)n);
}


size_t rtk_tier_records(uint64_t (*out)[2], size_t max, uint64_t min_bytes)
{
    if (__atomic_load_n(&rtk_tier.state, __ATOMIC_ACQUIRE) != T_ON || !rtk_tier.live)
        return 0;
    size_t k = 0;
    rtk_spin_lock(&rtk_tier.live_lock);
    for (uint32_t i = 0; i < rtk_tier.nlive && k < max; i++)
        if (rtk_tier.live[i].n >= min_bytes) {
            out[k][0] = (uint64_t)(uintptr_t)rtk_tier.live[i].payload;
            out[k][1] = rtk_tier.live[i].n;
            k++;
        }
    rtk_spin_unlock(&rtk_tier.live_lock);
    return k;
}
