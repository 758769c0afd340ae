# contract.py -- the report's keys, declared once per component: what each writer puts in report.json and each reader takes.
"""Writers: the parent (run, process, steps: rtkit/runner.py and report/model.py), the C library
(allocator-<pid>.json from prmalloc/stats.c, pmem-<pid>.json from prmalloc/tier_stats.c) and the scheduler
(scheduler-<pid>.json from scheduler/measure.py). Readers (sections.py, terminal.py, html.py, compare.py) look a
figure up under exactly the path declared here, never under guessed alternatives. A declared key that a
report lacks is listed by missing() and shown as a note in its section, so a key renamed on one side
shows up as a note in every report instead of a silent dash. Paths are dotted, relative to the section."""
from __future__ import annotations

from typing import Any, Dict, List


class Run:
    NAME, COMMAND, STATUS, EXIT_CODE, SIGNAL, ERROR = "name", "command", "status", "exit_code", "signal", "error"
    DURATION_S, START_TIME, PROFILE, SETTINGS = "duration_s", "start_time", "profile", "settings"
    CHILD_ENV, VERSIONS, HOST, RUN_DIR = "child_env", "versions", "host", "run_dir"
    REQUIRED = (NAME, COMMAND, STATUS, EXIT_CODE, DURATION_S, START_TIME, SETTINGS, VERSIONS, RUN_DIR)


class Process:
    PEAK_RSS_BYTES, MINOR_FAULTS, MAJOR_FAULTS = "peak_rss_bytes", "minor_faults", "major_faults"
    CPU_USER_S, CPU_SYSTEM_S, MAX_THREADS = "cpu_user_s", "cpu_system_s", "max_threads"
    SAMPLES, SAMPLE_INTERVAL_MS = "samples", "sample_interval_ms"
    # the child process's own /proc/PID/io at exit (optional: absent where /proc lacks io accounting)
    DISK_READ_BYTES, DISK_WRITTEN_BYTES, DISK_CANCELLED_BYTES = (
        "disk_read_bytes", "disk_written_bytes", "disk_cancelled_bytes")
    # of the bytes written, those of rtkit's own run files (the child's files report what they wrote before them)
    RUN_FILES_WRITTEN_BYTES = "run_files_written_bytes"
    REQUIRED = (PEAK_RSS_BYTES, MINOR_FAULTS, MAJOR_FAULTS, CPU_USER_S, CPU_SYSTEM_S, MAX_THREADS, SAMPLES,
                SAMPLE_INTERVAL_MS)


class Steps:
    COUNT, SOURCE, SIGNATURE, PER_STEP, WARMUP_STEPS = "count", "source", "signature", "per_step", "warmup_steps"
    HOOK, HOOK_STATUS, OTHER_SIGNATURES = "hook", "hook.status", "other_signatures"
    MEASURED = "summary.measured_steps"
    MEDIAN_MS, P5_MS, P95_MS, MEAN_MS = ("summary.step_ms_median", "summary.step_ms_p5", "summary.step_ms_p95",
                                         "summary.step_ms_mean")
    STEPS_PER_S, FAULTS_PER_STEP = "summary.steps_per_s", "summary.minor_faults_per_step_median"
    API = "api"                           # the API that produced the steps, in words (Session.run, Keras Model.fit...)
    NO_STEP_REASON = "no_step_reason"     # why none was counted although TensorFlow ran, and how to mark steps
    # how NO_STEP_REASON begins when nothing recurred at all (an eager loop, or a job that ended before training)
    NOTHING_RECURRED = "no step signature: no tf.function, Session.run or Keras fit call recurred"
    # the step that first told the allocator (its first mark): the allocator's step k is this step + k (null: not known)
    FIRST_TOLD_STEP = "first_told_step"
    # Keras fit only: epoch wall times (validation and callbacks included) next to the train-batch times
    KERAS, KERAS_EPOCHS, KERAS_EPOCH_S = "keras", "keras.epochs", "keras.epoch_s"
    KERAS_EPOCH_S_MEDIAN, KERAS_EPOCH_STEP_MS = "keras.epoch_s_median", "keras.epoch_step_ms_median"
    KERAS_VALIDATION = "keras.validation"
    KERAS_FIT_CALLS = "keras.fit_calls"   # optional: absent from reports of older rtkit
    REQUIRED = (COUNT, SOURCE, PER_STEP, WARMUP_STEPS, HOOK_STATUS, MEASURED, MEDIAN_MS, P5_MS, P95_MS, MEAN_MS,
                STEPS_PER_S, FAULTS_PER_STEP)


class Allocator:
    """allocator-<pid>.json (prmalloc/stats.c)."""
    STATE = "state"
    SETTINGS_ECHO = "config"              # the settings the library read, under the settings table's keys
    PROFILE_START, PROFILE_END = "profile.start_step", "profile.end_step"
    PROFILE_REASON, PROFILED_STEPS = "profile.reason", "profile.profiled_steps"   # why profiling ended; how long
    PLAN, PLAN_CLASSES, PLAN_RESERVED_BYTES = "plan", "plan.classes", "plan.reserved_bytes"
    PLAN_MADE_AT_STEP = "plan.made_at_step"
    # optional: the most bytes of the planned sizes live at once in a profiled step (null: not known)
    PLAN_STEP_PEAK_BYTES = "plan.step_peak_bytes"
    PLAN_SOURCE = "plan.source"           # "profiled" | "loaded" | "none"
    PLAN_REJECTED = "plan.rejected_reason"  # why a loaded plan was not used (null when none was rejected)
    PLAN_PATH = "plan.plan_path"           # the plan in use: the file loaded, or the one this run saved
    PLAN_GIVEN = "config.malloc_plan"      # the plan file the run was given (empty: none)
    HIT_RATE_AFTER_PLAN = "hit_rate_after_plan"
    # optional (absent from older files): plans retired because the job's sizes drifted, and the last one's window
    REPLANS, REPLANS_HELD = "replans.count", "replans.held_at_limit"
    REPLAN_STEP, REPLAN_FROM = "replans.last_step", "replans.last_from_step"
    REPLAN_CLASSED, REPLAN_ALLOCS = "replans.last_classed", "replans.last_allocations"
    AFTER_PLAN_FROM_STEP = "after_plan_from_step"   # optional: the first step counted after the plan
    # optional: FAULTS_AFTER_PLAN's own sum and count (per_step from AFTER_PLAN_FROM_STEP on adds up to them)
    FAULTS_AFTER_PLAN_SUM, AFTER_PLAN_STEPS = "minor_faults_after_plan", "after_plan_steps"
    ERRORS = "errors"                     # what went wrong in the library, one string each
    STEP_FAULTS = "minor_faults"          # in each per-step record
    CLASS_BLOCKS = "blocks"               # in each plan class
    ARENA_HITS, FALLBACKS = "totals.arena_hits", "totals.fallbacks"
    HIT_RATE = "hit_rate"                 # a fraction (0..1), null before the first large allocation
    FAULTS_BEFORE_PLAN = "minor_faults_per_step_before_plan"
    FAULTS_AFTER_PLAN = "minor_faults_per_step_after_plan"
    PER_STEP = "per_step"                 # records with STEP, STEP_ARENA_HITS, STEP_FALLBACKS
    STEP, STEP_ARENA_HITS, STEP_FALLBACKS = "step", "arena_hits", "fallbacks"
    STEP_LIVE_BYTES = "live_bytes"        # in each per-step record: heap live at the step's end (glibc's + rtkit's)
    PEAK_LIVE_BYTES = "totals.peak_live_bytes"   # the highest of those (and of the stats writes)
    LARGE_IDLE_BYTES, ARENA_FREE_BYTES = "large_heap.idle_bytes", "arenas.free_bytes"   # rtkit's memory held idle
    # optional: the heap's footprint at the step mark where it was largest, split into live and each part's idle
    FOOTPRINT = "peak_footprint"
    FP_STEP, FP_LIVE, FP_ARENA_IDLE, FP_LARGE_IDLE, FP_GLIBC_FREE = (
        "step", "live_bytes", "arena_idle_bytes", "large_idle_bytes", "glibc_free_bytes")
    REQUIRED = (STATE, SETTINGS_ECHO, PROFILE_START, PROFILE_END, PLAN_CLASSES, PLAN_RESERVED_BYTES, PLAN_MADE_AT_STEP,
                PLAN_SOURCE, PLAN_REJECTED, ARENA_HITS, FALLBACKS, HIT_RATE, HIT_RATE_AFTER_PLAN, FAULTS_BEFORE_PLAN,
                FAULTS_AFTER_PLAN, PER_STEP)
    # The settings echo names each setting by its table key (rtkit/config.py).


class Pmem:
    """pmem-<pid>.json (prmalloc/tier_stats.c): the allocator's PMEM tier; the report's `pmem` section."""
    STATE, MEDIUM = "state", "medium"
    # the settings the tier read, under the settings table's keys (rtkit/config.py); the pool's size once it is made
    PATH, POOL_SIZE, MIN_SIZE, RESIDENT_MAX = "tier_pool_path", "tier_pool_size", "tier_min_size", "tier_resident_max"
    SETTINGS_ECHO = (PATH, POOL_SIZE, MIN_SIZE, RESIDENT_MAX)
    TIER_BYTES, TIER_PEAK_BYTES = "tier_bytes", "tier_peak_bytes"
    TIER_ALLOCS, TIER_FALLBACKS = "tier_allocs", "tier_fallbacks"
    DRAM_SAVED_BYTES = "dram_bytes_saved_estimate"
    POOL, POOL_CLASSES = "pool", "pool.classes"   # pool: null unless the pool is open (state on)
    # the pool file's geometry, under the names the pool's own stats use (rtkit.allocators.pmem Pool.stats)
    POOL_GEOMETRY = ("pool.segment_size", "pool.block_size", "pool.max_record")
    NOTES = "notes"
    # the tier view (report/tier_view.py): pool pages in DRAM (mincore), the largest records, residency over time
    RESIDENT_BYTES, RECORDS, TIMELINE = "pool_resident_bytes", "records", "timeline"
    # at the highest RSS the tier sampled (before exit): that RSS, every pool page in DRAM, the bytes live in the pool
    AT_RSS_PEAK = "at_rss_peak"
    # page heat under the resident budget (prmalloc/tier_budget.c): mechanism "pagemap_scan", "off", "unavailable"
    HEAT, HEAT_MECHANISM, HEAT_SAMPLES = "heat", "heat.mechanism", "heat.samples"
    HEAT_DEMOTED, HEAT_PROMOTED = "heat.chunks_demoted", "heat.chunks_promoted"
    HEAT_DEMOTED_BYTES, HEAT_WRITTEN_OUT_BYTES, HEAT_SECONDS = (
        "heat.demoted_bytes", "heat.written_out_bytes", "heat.seconds")
    # pool pages the heat samples saw written since the heat was armed (summed over samples), the samples' spacing
    HEAT_PAGES_WRITTEN, HEAT_EVERY = "heat.pages_written_seen", "heat.every_steps"
    REQUIRED = (STATE, MEDIUM, *SETTINGS_ECHO, TIER_BYTES, TIER_PEAK_BYTES, TIER_ALLOCS, TIER_FALLBACKS,
                DRAM_SAVED_BYTES, POOL, NOTES, RESIDENT_BYTES, RECORDS, TIMELINE)


class Scheduler:
    """scheduler-<pid>.json (scheduler/core.py Scheduler.report)."""
    STAGES, CHOSEN, TUNING = "stages", "chosen", "tuning"
    SESSIONS, KERAS = "sessions", "keras"   # where the configuration went: per session ("applied"), Keras
    TRIALS, TRIALS_STEPS_USED = "tuning.trials", "tuning.steps_used"
    TRIAL_STEP_MS = "step_ms_median"      # in each trial
    SPEEDUP = "speedup_over_first_x"
    PIPELINE_ENABLED = "pipeline.enabled"
    # what the pipeline and the tuner did; absent from reports of schedulers that neither staged nor tuned
    STATE = "state"                       # one line in words
    STAGED_STEPS, NOT_STAGED_REASON = "pipeline.staged_steps", "pipeline.not_staged_reason"
    # steps that read the input with nothing staged: the script's own run of its own graph (no put, no extra run)
    UNSTAGED_STEPS = "pipeline.unstaged_steps"
    TUNING_VERDICT, TUNING_GAIN_PCT = "tuning.verdict", "tuning.gain_pct"
    # what tuning cost: the trials' extra time over the chosen configuration, for a 1000-step job and for this one
    TUNING_COST_1000, TUNING_COST_JOB = "tuning.cost_pct_of_1000_step_job", "tuning.cost_pct_of_job"
    ERRORS = "errors"
    INPUT_SHARE = "input_share_pct"       # the input stage's share of op time: what staging can hide at most
    HIDDEN_PCT = "pipeline.input_hidden_pct_median"
    # the overlap bound of the unstaged step (probe steps: the put alone, then the staged compute alone):
    # bound_x = max(input, compute) / (input + compute); x_of_bound = the staged steps' median over max(input, compute)
    OVERLAP_BOUND = "pipeline.overlap_bound"
    BOUND_X, X_OF_BOUND = "pipeline.overlap_bound.bound_x", "pipeline.overlap_bound.x_of_bound"
    QUEUE_DEPTH_SAMPLES = "pipeline.queue_depth_samples"   # [[t, items staged]] per step (plotted, not tabled)
    OVERLAP_SAMPLES = "pipeline.overlap_samples"           # [[step, put_ms, wait_ms, hidden_pct]] per step
    OCCUPANCY_MEAN = "pipeline.occupancy_mean_batches"
    # the lookahead (scheduler/lookahead.py): state, off_reason, batches, pages_requested, pages_checked,
    # pages_resident, resident_share (of the pages checked just before their step), late_batches, wasted_pages,
    # bytes_requested, worker_cpu_s, wait_s (sched_lookahead_wait_ms), tables_measured, budget_pages_told (to the
    # tier's heat budget), budget_pages_kept / budget_pages_dropped (what it did with them; None: it was not told),
    # rows_from ("staged batch" or "feeds": a step's rows from its own feed_dict, asked for just before it runs)
    LOOKAHEAD = "pipeline.lookahead"
    # true when the scheduler was off (sched=0) and only its lookahead of fed ids ran (tier mode,
    # scheduler/feeds_only.py): the other keys are then null, nothing of the rest of the scheduler ran
    LOOKAHEAD_ONLY = "lookahead_only"
    LOOKAHEAD_SHARE = "pipeline.lookahead.resident_share"
    OCCUPANCY_SAMPLES = "pipeline.occupancy_samples_batches"
    NOTES = "notes"
    # echoed or internal: not shown as figures
    HIDDEN = ("schema_version", "pid", "settings", "step_signature", "sessions", "keras")
    REQUIRED = (STAGES, CHOSEN, TUNING, SPEEDUP, PIPELINE_ENABLED, OCCUPANCY_MEAN, OCCUPANCY_SAMPLES, NOTES)


class Rows:
    """rows-<pid>.json (rtkit/workloads/ev.py row_layout): how the rows a script used lie in its embedding tables,
    written by scripts that know their id -> row maps (the bundled workloads); the report's `rows` section."""
    ROW_ASSIGN, TABLE_FILL, PAGE_BYTES = "row_assign", "table_fill", "page_bytes"
    TABLES, TABLE_BYTES = "tables", "table_bytes"
    ROWS_USED, ROW_PAGES, PACKED_PAGES = "rows_used", "row_pages", "packed_pages"   # null when not measured
    NOT_MEASURED = "not_measured"         # why not, or null
    REQUIRED = (PAGE_BYTES, TABLES, TABLE_BYTES, ROWS_USED, ROW_PAGES, PACKED_PAGES, NOT_MEASURED)


class Bounds:
    """What bounds the peak RSS (report/bounds.py, built by the parent from the sections above)."""
    PEAK_RSS_BYTES, BASELINE_RSS_BYTES, BASELINE_AT_S = "peak_rss_bytes", "baseline_rss_bytes", "baseline_at_s"
    GROWTH_BYTES = "growth_bytes"         # peak RSS - baseline
    PEAK_LIVE_BYTES, FIRST_STEP_LIVE_BYTES = "peak_live_bytes", "first_step_live_bytes"   # null without rtkit's allocator
    STEP_LIVE_BYTES, OVERHEAD_BYTES = "step_live_bytes", "overhead_bytes"   # growth = step live + overhead
    RTKIT_IDLE_BYTES = "rtkit_idle_bytes"
    # peak RSS over the heap's live bytes, per component, at the allocator's largest footprint (null without it):
    # over live = arenas idle + large heap idle + glibc heap free + runtime (the rest)
    FOOTPRINT_STEP, FOOTPRINT_LIVE_BYTES = "footprint_step", "footprint_live_bytes"
    OVER_LIVE_BYTES, OVER_ARENAS_BYTES = "over_live_bytes", "over_live_arenas_bytes"
    OVER_LARGE_IDLE_BYTES, OVER_GLIBC_BYTES = "over_live_large_idle_bytes", "over_live_glibc_free_bytes"
    OVER_RUNTIME_BYTES = "over_live_runtime_bytes"
    # tier mode: the pool's live bytes in DRAM at its highest RSS sample (pmem at_rss_peak), counted live beside the
    # heap's (null without a tier pool, or when that sample was not near the peak)
    POOL_LIVE_DRAM_BYTES = "footprint_pool_live_dram_bytes"
    ESTIMATES = "estimates"               # the keys above that are estimates, not measurements
    REQUIRED = (PEAK_RSS_BYTES, BASELINE_RSS_BYTES, BASELINE_AT_S, GROWTH_BYTES, PEAK_LIVE_BYTES, FIRST_STEP_LIVE_BYTES,
                STEP_LIVE_BYTES, OVERHEAD_BYTES, RTKIT_IDLE_BYTES, FOOTPRINT_STEP, FOOTPRINT_LIVE_BYTES,
                OVER_LIVE_BYTES, OVER_ARENAS_BYTES, OVER_LARGE_IDLE_BYTES, OVER_GLIBC_BYTES, OVER_RUNTIME_BYTES,
                POOL_LIVE_DRAM_BYTES, ESTIMATES)


# report section -> its declaration; None for the sections a component may leave out (component off)
SECTIONS = {"run": Run, "process": Process, "steps": Steps, "allocator": Allocator, "pmem": Pmem,
            "scheduler": Scheduler, "rows": Rows, "bounds": Bounds}


def _has(d: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return False
        d = d[part]
    return True


def missing(section: str, data: Any) -> List[str]:
    """The declared keys `data` (one section of a report) lacks; a key present with null is not missing.
    Conditional keys are only required when their parent is there (tuning.trials when tuning is on, the pool's
    geometry when the pool is open)."""
    if not isinstance(data, dict):
        return []
    spec = SECTIONS[section]
    out = [p for p in spec.REQUIRED if not _has(data, p)]
    if spec is Scheduler and isinstance(data.get(Scheduler.TUNING), dict) and not _has(data, Scheduler.TRIALS):
        out.append(Scheduler.TRIALS)
    if spec is Pmem and isinstance(data.get(Pmem.POOL), dict):
        out.extend(p for p in Pmem.POOL_GEOMETRY if not _has(data, p))
    return out


def missing_note(section: str, data: Any) -> List[str]:
    gone = missing(section, data)
    if not gone:
        return []
    return [f"report contract: the {section} section lacks {', '.join(gone)} (written by another version of "
            "its component?); those figures are not shown"]


def settings_echo(alloc: Any) -> Dict[str, Any]:
    """Table key -> value the allocator read (the C library echoes its settings under the table's keys)."""
    echo = alloc.get(Allocator.SETTINGS_ECHO) if isinstance(alloc, dict) else None
    return dict(echo) if isinstance(echo, dict) else {}
