# glossary.py -- the report's headline figures, named once: what each is, over which steps, its unit and reader.
"""The end-of-run summary, `rtkit report`, the HTML report and `rtkit compare` all take a figure's words from
here, so the same figure has the same name everywhere and says what it is (median or mean, over which steps,
before or after the allocator's plan). Values are read under the keys report/contract.py declares.
docs/report.md's glossary is this table in prose (tests/test_report_vocab.py checks they agree)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from rtkit.report import fmt
from rtkit.report.contract import Allocator as A, Bounds as B, Pmem as PM, Process as P, Rows as R, Scheduler as S, Steps as ST
from rtkit.report.fmt import get


@dataclass(frozen=True)
class Figure:
    id: str                      # stable id (compare --json "key")
    name: str                    # the words shown in every view
    unit: str                    # ms | s | bytes | count | pct (a fraction) | percent | x | per_s | text
    lower_better: Optional[bool]  # None: no direction (a count, a state)
    meaning: str                 # one glossary line
    read: Callable[[Dict[str, Any]], Any]   # report -> value

    def text(self, value: Any) -> str:
        return FORMAT[self.unit](value)


FORMAT: Dict[str, Callable[[Any], str]] = {
    "ms": fmt.ms, "s": fmt.seconds, "bytes": fmt.nbytes, "count": fmt.num, "pct": fmt.pct, "x": fmt.ratio,
    "per_s": lambda v: fmt.MISSING if not fmt.is_num(v) else f"{fmt.num(v)}/s",
    "percent": lambda v: fmt.MISSING if not fmt.is_num(v) else f"{fmt.num(v)}%",
    "text": lambda v: fmt.MISSING if v in (None, "") else str(v),
}


def _sec(name: str, path: str) -> Callable[[Dict[str, Any]], Any]:
    def read(r: Dict[str, Any]) -> Any:
        s = r.get(name) if isinstance(r, dict) else None
        return get(s, path) if isinstance(s, dict) else None
    return read


def _num(fn: Callable[[Dict[str, Any]], Any]) -> Callable[[Dict[str, Any]], Any]:
    def read(r: Dict[str, Any]) -> Any:
        v = fn(r)
        return v if fmt.is_num(v) else None
    return read


def cpu_seconds(r: Dict[str, Any]) -> Optional[float]:
    u, s = get(r, "process." + P.CPU_USER_S), get(r, "process." + P.CPU_SYSTEM_S)
    if fmt.is_num(u) or fmt.is_num(s):
        return (u if fmt.is_num(u) else 0) + (s if fmt.is_num(s) else 0)
    return None


def _cpu_per_step(r: Dict[str, Any]) -> Optional[float]:
    cpu, n = cpu_seconds(r), get(r, "steps." + ST.COUNT)
    return cpu * 1000.0 / n if cpu is not None and fmt.is_num(n) and n else None


def tier_on(r: Dict[str, Any]) -> bool:
    """Tier mode held something or was set up: a pmem section whose state is not off."""
    p = r.get("pmem") if isinstance(r, dict) else None
    return isinstance(p, dict) and str(p.get(PM.STATE) or "off") not in ("off", "disabled")


def _tier(path: str) -> Callable[[Dict[str, Any]], Any]:
    inner = _num(_sec("pmem", path))
    return lambda r: inner(r) if tier_on(r) else None


def _dram_saved(r: Dict[str, Any]) -> Any:
    """The allocator's estimate (bytes held at the last step mark, less the heads the steps wrote), lowered by what the
    last step held over the least held at a sample while training: a record placed and freed within the steps (a
    temporary of a table's size placed by its size) is no memory saved."""
    est = _tier(PM.DRAM_SAVED_BYTES)(r)
    if not fmt.is_num(est):
        return est
    from rtkit.report import tier_view
    p = r.get("pmem")
    floor, last = tier_view.held_floor(p), get(p, "tier_last_step_bytes")
    if floor is None or not fmt.is_num(last) or floor["floor"] >= last:
        return est
    return max(0, est - (last - floor["floor"]))


def _rows(r: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The rows section when it measured the layout (rows used, the pages holding them, packed pages)."""
    s = r.get("rows") if isinstance(r, dict) else None
    ok = isinstance(s, dict) and not s.get(R.NOT_MEASURED) and all(
        fmt.is_num(s.get(k)) for k in (R.ROWS_USED, R.ROW_PAGES, R.PACKED_PAGES))
    return s if ok and s[R.ROWS_USED] > 0 else None


def rows_not_measured(r: Dict[str, Any]) -> str:
    """Why the report has no row layout figures, in words."""
    s = r.get("rows") if isinstance(r, dict) else None
    if isinstance(s, dict) and s.get(R.NOT_MEASURED):
        return str(s[R.NOT_MEASURED])
    if isinstance(s, dict):
        return "no table row was used"
    return "the script does not say which table rows it used (the bundled workloads' id -> row maps do)"


def _row_pages_per_row(r: Dict[str, Any]) -> Optional[float]:
    s = _rows(r)
    return s[R.ROW_PAGES] / s[R.ROWS_USED] if s else None


def _row_scatter(r: Dict[str, Any]) -> Optional[float]:
    s = _rows(r)
    return s[R.ROW_PAGES] / s[R.PACKED_PAGES] if s and s[R.PACKED_PAGES] else None


def _row_scatter_bytes(r: Dict[str, Any]) -> Optional[int]:
    s = _rows(r)
    return (s[R.ROW_PAGES] - s[R.PACKED_PAGES]) * int(s.get(R.PAGE_BYTES) or 4096) if s else None


_API_OF_SOURCE = {"keras": "Keras Model.fit", "manual": "rtkit.step()", "session": "tf.compat.v1 sessions",
                  "function": "tf.function calls"}


def steps_api(report: Dict[str, Any]) -> Optional[str]:
    """The API that produced the counted steps, in words; a hook that names no API is said by its source."""
    api = get(report, "steps." + ST.API)
    if api:
        return str(api)
    src = get(report, "steps." + ST.SOURCE)
    return _API_OF_SOURCE.get(str(src)) if src else None


def training_step(r: Dict[str, Any], allocator_step: Any) -> Optional[int]:
    """The training step (the steps section's numbering, 1 = the first) that the allocator's step
    `allocator_step` is: its k-th step mark ends the training step that first told it + k - 1, and its step k
    runs from that mark to the next. None when the report does not say which step first told it."""
    first = get(r.get("steps") if isinstance(r, dict) else None, ST.FIRST_TOLD_STEP)
    if not (isinstance(first, int) and isinstance(allocator_step, int)):
        return None
    return first + allocator_step


def plan_from_words(r: Dict[str, Any], at: Any) -> str:
    """'in use from step N' in the training steps' numbering (the allocator's own where that is not known)."""
    step = training_step(r, at)
    if step is None:
        return f"in use from the allocator's step {at}"
    count = get(r.get("steps"), ST.COUNT)
    if isinstance(count, int) and step > count:
        return f"made after the last step ({count}): no step ran with it"
    return f"in use from step {step}"


def plan_words(r: Dict[str, Any]) -> Optional[str]:
    """Where the allocator's plan came from, in words: profiled, in use from step N / loaded from FILE / rejected."""
    a = r.get("allocator") if isinstance(r, dict) else None
    if not isinstance(a, dict):
        return None
    source, rejected = get(a, A.PLAN_SOURCE), get(a, A.PLAN_REJECTED)
    at, path = get(a, A.PLAN_MADE_AT_STEP), get(a, A.PLAN_PATH)
    if rejected:
        # the file the user gave (the settings echo), not the plan this run profiled afresh and saved
        given = get(a, A.PLAN_GIVEN) or path
        return f"plan {given or 'file'} not used ({rejected})" + (f", profiled again, {plan_from_words(r, at)}"
                                                                 if source == "profiled" and fmt.is_num(at) else "")
    if source == "loaded":
        return f"plan loaded from {path}" if path else "plan loaded"
    if source == "profiled":
        return f"plan profiled, {plan_from_words(r, at)}" if fmt.is_num(at) else "plan profiled"
    return None


def replan_words(r: Dict[str, Any]) -> Optional[str]:
    """'re-planned N time(s): sizes drifted at step S (x of y allocations had a class)' for a plan retired by the
    drift check (prmalloc/step.c), the last one's window; None when the plan was never re-made."""
    a = r.get("allocator") if isinstance(r, dict) else None
    n = get(a, A.REPLANS) if isinstance(a, dict) else None
    held = get(a, A.REPLANS_HELD) if isinstance(a, dict) else None
    if not (fmt.is_num(n) and n):
        return None
    at, fit, allocs = get(a, A.REPLAN_STEP), get(a, A.REPLAN_CLASSED), get(a, A.REPLAN_ALLOCS)
    # the mark at allocator step `at` ended its step at - 1: the window's last
    step = training_step(r, at - 1) if isinstance(at, int) else None
    where = f"at step {step}" if step is not None else f"at the allocator's step {at}"
    text = (f"re-planned {fmt.num(n)} time(s): sizes drifted {where} ({fmt.num(fit)} of {fmt.num(allocs)} "
            f"allocations had a class)")
    if fmt.is_num(held) and held:
        text += f"; {fmt.num(held)} later drift(s) left alone at the re-plan limit"
    return text


def pipelined_steps(r: Dict[str, Any]) -> Optional[int]:
    """Steps that ran with their input staged ahead (scheduler schema 2); None when the report cannot say."""
    v = _sec("scheduler", S.STAGED_STEPS)(r)
    return v if fmt.is_num(v) else None


def tuning_gain_pct(r: Dict[str, Any]) -> Optional[float]:
    v = _sec("scheduler", S.TUNING_GAIN_PCT)(r)
    if fmt.is_num(v):
        return v
    sp = _sec("scheduler", S.SPEEDUP)(r)
    return round((sp - 1.0) * 100.0, 2) if fmt.is_num(sp) else None


def _bound(fid: str, name: str, key: str, meaning: str) -> "Figure":
    """A figure of the bounds section (report/bounds.py): bytes, lower is better."""
    return Figure(fid, name, "bytes", True, meaning, _num(_sec("bounds", key)))


def _keras(path: str) -> Callable[[Dict[str, Any]], Any]:
    return _num(_sec("steps", path))


def _running(fn: Callable[[Dict[str, Any]], Any]) -> Callable[[Dict[str, Any]], Any]:
    """A figure of a running job's snapshot only (run.status running), a number."""
    def read(r: Dict[str, Any]) -> Any:
        if get(r, "run.status") != "running":
            return None
        v = fn(r)
        return v if fmt.is_num(v) else None
    return read


def _last_sample(r: Dict[str, Any], key: str) -> Any:
    s = get(r, "process." + P.SAMPLES)
    v = s[-1].get(key) if isinstance(s, list) and s and isinstance(s[-1], dict) else None
    return v if fmt.is_num(v) else None


def _tier_last(r: Dict[str, Any]) -> Any:
    tl = _sec("pmem", PM.TIMELINE)(r) if tier_on(r) else None
    v = tl[-1].get("resident_bytes") if isinstance(tl, list) and tl and isinstance(tl[-1], dict) else None
    return v if fmt.is_num(v) else None


_F: List[Figure] = [
    # steps (the training process's hooks; statistics over the measured steps: counted minus warm-up)
    Figure("steps", "steps counted", "count", None,
           "training steps the hooks counted: the session run or tf.function that recurs most (a tf.function that "
           "computes gradients first), each Keras train batch, or each rtkit.step()", _num(_sec("steps", ST.COUNT))),
    Figure("measured_steps", "measured steps", "count", None,
           "steps counted minus the first warmup_steps; every step statistic below is over these",
           _num(_sec("steps", ST.MEASURED))),
    Figure("step_ms_median", "median step time", "ms", True, "median wall time of one measured step",
           _num(_sec("steps", ST.MEDIAN_MS))),
    Figure("step_ms_p5", "p5 step time", "ms", True, "5th percentile of the measured steps' wall times",
           _num(_sec("steps", ST.P5_MS))),
    Figure("step_ms_p95", "p95 step time", "ms", True, "95th percentile of the measured steps' wall times",
           _num(_sec("steps", ST.P95_MS))),
    Figure("step_ms_mean", "mean step time", "ms", True, "mean wall time of the measured steps",
           _num(_sec("steps", ST.MEAN_MS))),
    Figure("steps_per_s", "steps/s at median step time", "per_s", False,
           "1000 / median step time: the step rate the training loop sustains, without time between steps "
           "(Keras: validation, callbacks)", _num(_sec("steps", ST.STEPS_PER_S))),
    Figure("faults_per_step_median", "median minor faults/step (in step)", "count", True,
           "median, over the measured steps, of the minor page faults the training process took inside the step: "
           "the hooks' window around each step (a Session.run, a Keras batch), time between steps left out",
           _num(_sec("steps", ST.FAULTS_PER_STEP))),
    Figure("epochs", "Keras epochs", "count", None, "epochs Keras fit ran (each with its validation, if any)",
           _keras(ST.KERAS_EPOCHS)),
    Figure("epoch_s_median", "median epoch time", "s", True,
           "median wall time of one Keras epoch, validation and callbacks included", _keras(ST.KERAS_EPOCH_S_MEDIAN)),
    Figure("epoch_step_ms", "median epoch time per train batch", "ms", True,
           "median over the epochs of the epoch's time / its train batches: the ms/step Keras prints, validation "
           "and callbacks included",
           _keras(ST.KERAS_EPOCH_STEP_MS)),
    # the process (whole run: the command and its children)
    Figure("peak_rss_bytes", "peak RSS", "bytes", True,
           "largest resident memory of the command and its children over the whole run",
           _num(_sec("process", P.PEAK_RSS_BYTES))),
    # what bounds the peak RSS (report/bounds.py): runtime before the first step + heap the steps added + overhead
    _bound("baseline_rss_bytes", "RSS before the first step", B.BASELINE_RSS_BYTES,
           "resident memory sampled just before the first counted step began: the runtime itself (TensorFlow, "
           "Python, the graph, the variables)"),
    _bound("rss_growth_bytes", "RSS growth while training", B.GROWTH_BYTES, "peak RSS minus RSS before the first step"),
    _bound("peak_live_bytes", "heap live at a step end (max)", B.PEAK_LIVE_BYTES,
           "rtkit's allocator only: the most heap bytes the program held at the end of a step (glibc's books plus "
           "rtkit's blocks)"),
    _bound("step_live_bytes", "heap the steps added (estimate)", B.STEP_LIVE_BYTES,
           "heap live at a step end (max) minus the heap live at the end of the first step; an estimate: live "
           "bytes are read at step ends, not inside a step"),
    _bound("rss_overhead_bytes", "RSS overhead (estimate)", B.OVERHEAD_BYTES,
           "RSS growth while training minus the heap the steps added: allocator memory held idle or retained, "
           "fragmentation, the steps' peak between step ends"),
    _bound("rtkit_idle_bytes", "rtkit idle at exit", B.RTKIT_IDLE_BYTES,
           "rtkit's own memory held but unused when the report was written (large-object heap idle + free arena "
           "blocks); read at exit, so it also holds what the job freed at its end"),
    # peak RSS over the heap's live bytes, by who holds it (report/bounds.py), at the heap's largest footprint
    _bound("over_live_bytes", "RSS over live", B.OVER_LIVE_BYTES,
           "rtkit's allocator only: peak RSS minus the heap live at the step end where the heap's footprint (live + "
           "idle) was largest (in tier mode, minus the pool's live bytes in DRAM at its highest RSS sample too); the "
           "sum of the four parts below: how far the peak RSS is from the live bytes"),
    _bound("over_live_arenas_bytes", "arenas idle", B.OVER_ARENAS_BYTES,
           "at that step end: free blocks of the plan's classes and every class block's rounding up to whole pages"),
    _bound("over_live_large_idle_bytes", "large heap idle", B.OVER_LARGE_IDLE_BYTES,
           "at that step end: resident free pages of rtkit's large-object heap (kept within its high-water mark, and "
           "the headroom faulted in after a plan)"),
    _bound("over_live_glibc_free_bytes", "glibc heap free", B.OVER_GLIBC_BYTES,
           "at that step end: free chunks in glibc's heaps, where the small objects live, by glibc's books "
           "(malloc_info's bins: each heap's untouched top is left out); an upper bound on their resident part"),
    _bound("over_live_runtime_bytes", "runtime and the rest (estimate)", B.OVER_RUNTIME_BYTES,
           "RSS over live minus the three heap parts: libraries, stacks, Python, TensorFlow's own mappings, and what "
           "a step holds between step ends"),
    Figure("minor_faults", "minor faults (whole run)", "count", True, "minor page faults of the whole run",
           _num(_sec("process", P.MINOR_FAULTS))),
    Figure("major_faults", "major faults (whole run)", "count", True, "major page faults of the whole run",
           _num(_sec("process", P.MAJOR_FAULTS))),
    Figure("cpu_s", "CPU time (whole run)", "s", True, "user + system CPU time of the whole run", cpu_seconds),
    Figure("cpu_ms_per_step", "CPU time / steps counted", "ms", True,
           "CPU time of the whole run divided by the steps counted (start-up included)", _cpu_per_step),
    Figure("max_threads", "max threads", "count", None, "most threads seen in one sample",
           _num(_sec("process", P.MAX_THREADS))),
    Figure("duration_s", "wall time (whole run)", "s", True, "from start to exit of the command",
           _num(_sec("run", "duration_s"))),
    # the allocator (its own step count: every training step it was told about)
    Figure("allocator_state", "allocator state", "text", None,
           "profiling, planned (arenas serve the planned sizes), passthrough or disabled", _sec("allocator", A.STATE)),
    Figure("allocator_plan", "allocator plan", "text", None,
           "where the plan came from: profiled in this run, loaded with --plan, or a loaded plan rejected",
           plan_words),
    Figure("replans", "plan re-made", "text", None,
           "a plan in use whose sizes drifted (fewer than half of a window's allocations >= min_size had a class: "
           "another model, batch size or phase) is retired and the job profiled and planned again: how often, and "
           "the last drift's window; the figures after plan are the latest plan's", replan_words),
    Figure("hit_rate", "arena hit rate (whole run)", "pct", False,
           "share of large allocations served from the planned arenas, over the whole run (profiling included)",
           _num(_sec("allocator", A.HIT_RATE))),
    Figure("hit_rate_after_plan", "arena hit rate after plan", "pct", False,
           "the same share over the steps after the plan in use was in place (after a re-plan, the latest plan's)",
           _num(_sec("allocator", A.HIT_RATE_AFTER_PLAN))),
    Figure("faults_before_plan", "mean minor faults/step before plan (step to step)", "count", True,
           "mean minor page faults per step, over the allocator's steps profiled for its plan in use (after a "
           "re-plan, the latest plan's), each from one step mark to the next: what runs between steps (input waits, "
           "Keras validation and callbacks) included",
           _num(_sec("allocator", A.FAULTS_BEFORE_PLAN))),
    Figure("faults_after_plan", "mean minor faults/step after plan (step to step)", "count", True,
           "mean minor page faults per step, over the allocator's steps after its plan in use was in place (after "
           "a re-plan, the latest plan's), each from one "
           "step mark to the next: what runs between steps (input waits, Keras validation and callbacks) included, "
           "the marks' own work not (the headroom faulted in at the plan's first mark is "
           "large_heap.prefaulted_bytes)",
           _num(_sec("allocator", A.FAULTS_AFTER_PLAN))),
    Figure("reserved_bytes", "arena bytes reserved", "bytes", True, "most bytes the plan's classes hold (blocks of the large heap, its resident pages first)",
           _num(_sec("allocator", A.PLAN_RESERVED_BYTES))),
    Figure("plan_step_peak_bytes", "a step's planned sizes live at once (most)", "bytes", True,
           "the most bytes of the plan's sizes live at the same moment of a profiled step (page-rounded): what one "
           "pool shared by all sizes would need; arena bytes reserved above it are blocks of sizes that peak at other "
           "moments of the step, idle while the step's peak passes",
           _num(_sec("allocator", A.PLAN_STEP_PEAK_BYTES))),
    # tier mode (PMEM): only when it is on
    Figure("tier_bytes", "tier bytes held (at exit)", "bytes", None,
           "bytes tier mode held in the pool file when the report was written", _tier(PM.TIER_BYTES)),
    Figure("tier_peak_bytes", "tier bytes held (peak)", "bytes", None, "most bytes held in the pool file at once",
           _tier(PM.TIER_PEAK_BYTES)),
    Figure("dram_saved_bytes", "anonymous memory saved (estimate)", "bytes", False,
           "bytes held in the pool file at the last step (steady state; the least held at a sample while training "
           "when that is less, since records placed and freed within steps come and go), less the pages of the table heads "
           "(tier_dram_head) the steps wrote, which are anonymous DRAM (all of the heads where the kernel cannot "
           "tell): anonymous memory not used; the pool's pages may still sit in DRAM as page cache (see pool "
           "resident)",
           _dram_saved),
    Figure("tier_fallbacks", "tier fallbacks to DRAM", "count", True,
           "allocations tier mode meant for the pool that went to DRAM (pool full)", _tier(PM.TIER_FALLBACKS)),
    # the embedding tables' row layout (rows-<pid>.json, from scripts that know their id -> row maps)
    Figure("row_pages_per_row", "table pages per row used", "count", True,
           "pages (4 KiB) of the embedding tables and their optimizer slots that hold a row the run used, divided "
           "by the rows used: about 1 when each row sits on a page of its own (ids hashed over the whole table), a "
           "row's share of a page when the rows in use are packed", _row_pages_per_row),
    Figure("row_scatter_x", "row scatter (pages / packed pages)", "x", True,
           "pages holding the rows used, divided by the pages the same rows fill packed from each table's start: "
           "1.00x when packed", _row_scatter),
    Figure("row_scatter_bytes", "table memory on scattered rows", "bytes", True,
           "(pages holding the rows used - the pages they fill packed) x 4 KiB: table memory the steps touch "
           "only because the rows are scattered (resident when tables are filled row by row)", _row_scatter_bytes),
    # the scheduler
    Figure("sched_chosen", "scheduler configuration", "text", None,
           "the thread pools and pipelining the scheduler applied at the end", lambda r: chosen_text(r)),
    Figure("pipelined_steps", "pipelined steps", "count", None,
           "steps whose input was staged ahead by the scheduler's pipeline", pipelined_steps),
    Figure("tuning_gain_pct", "tuning gain", "percent", False,
           "how much faster the tuner's choice was than the first configuration, in percent of step time",
           tuning_gain_pct),
    Figure("tuning_cost_pct", "tuning cost (share of a 1000-step job)", "percent", True,
           "the tuning trials' extra time (every trial step against the chosen configuration's median step time) "
           "as a share of 1000 steps at the chosen configuration",
           _num(_sec("scheduler", S.TUNING_COST_1000))),
    Figure("overlap_bound", "overlap bound (staged step / unstaged step, at best)", "x", None,
           "max(input, compute) / (input + compute) of the unstaged step, input = the put alone and compute = the "
           "staged step's run alone (the scheduler's probe steps, medians): the step-time ratio staging with one "
           "put in flight reaches at best", _num(_sec("scheduler", S.BOUND_X))),
    Figure("x_of_bound", "staged step / the bound", "x", True,
           "the staged steps' median step time after tuning over max(input, compute) of the probe steps: 1.00x "
           "at the overlap bound, 1.10x 10% short of it", _num(_sec("scheduler", S.X_OF_BOUND))),
    Figure("lookahead_resident", "lookahead: next step's pages resident", "pct", False,
           "the share of the pages of each staged batch's table rows (table and optimizer slots) that mincore found "
           "in DRAM just before the batch's step ran, on the tables the lookahead found in the tier pool (a "
           "script that feeds its ids: of each step's rows, when its run was called, before they were asked for)",
           _num(_sec("scheduler", S.LOOKAHEAD_SHARE))),
    Figure("occupancy_mean", "mean pipeline occupancy", "count", False,
           "mean number of input batches ready when a step asked for one", _num(_sec("scheduler", S.OCCUPANCY_MEAN))),
    # a running job (the live snapshot, `rtkit top`, the exporters): the latest steps and the latest sample;
    # only a running job's snapshot has them (a finished report's views show the whole-run figures)
    Figure("live_steps_per_s", "steps/s at median step time, last window", "per_s", False,
           "1000 / the median step time of the latest measured steps (the last window: up to 100 steps)",
           _running(_sec("live", "window.steps_per_s"))),
    Figure("live_step_ms_median", "median step time, last window", "ms", True,
           "median wall time of the latest measured steps (up to 100)",
           _running(_sec("live", "window.step_ms_median"))),
    Figure("live_step_ms_p95", "p95 step time, last window", "ms", True,
           "95th percentile of the latest measured steps' wall times (up to 100)",
           _running(_sec("live", "window.step_ms_p95"))),
    Figure("live_faults_per_step", "median minor faults/step, last window (in step)", "count", True,
           "median minor page faults per step over the latest measured steps (up to 100), counted by the hooks "
           "inside the step",
           _running(_sec("live", "window.minor_faults_per_step_median"))),
    Figure("rss_now_bytes", "RSS (latest sample)", "bytes", True,
           "resident memory of the command and its children at the parent's latest sample",
           _running(lambda r: _last_sample(r, "rss_bytes"))),
    Figure("major_faults_now", "major faults (so far)", "count", True,
           "major page faults of the command and its children up to the latest sample",
           _running(lambda r: _last_sample(r, "major_faults"))),
    Figure("hit_rate_now", "arena hit rate (so far)", "pct", False,
           "share of large allocations served from the planned arenas from the start up to the allocator's latest "
           "file (profiling included)", _running(_num(_sec("allocator", A.HIT_RATE)))),
    Figure("tier_bytes_now", "tier bytes held (latest file)", "bytes", None,
           "bytes tier mode held in the pool file when it last wrote its file (at step marks, every 2-5 s)",
           _running(_tier(PM.TIER_BYTES))),
    Figure("pool_resident_now_bytes", "pool resident (latest sample)", "bytes", None,
           "tier mode: pool pages in DRAM (mincore) at the tier's latest timeline sample", _running(_tier_last)),
]


FIGURES: Dict[str, Figure] = {f.id: f for f in _F}


def name(fid: str) -> str:
    return FIGURES[fid].name


def value(report: Dict[str, Any], fid: str) -> Any:
    return FIGURES[fid].read(report)


def text(report: Dict[str, Any], fid: str) -> str:
    f = FIGURES[fid]
    return f.text(f.read(report))


def chosen_text(r: Dict[str, Any]) -> Optional[str]:
    c = _sec("scheduler", S.CHOSEN)(r)
    if not isinstance(c, dict):
        return None
    return ", ".join(f"{k}={'on' if v is True else 'off' if v is False else v}" for k, v in c.items()
                     if not isinstance(v, (dict, list)))


# ---------------------------------------------------------------------------------------------
# the runs' own noise: how far a ratio may stray from 1.0 before it says anything


def _robust_rel_se(values: List[float], of_mean: bool = False) -> Optional[float]:
    """Relative standard error of the median (or mean) of `values`, from their spread (MAD, robust to the
    odd slow step)."""
    vals = [v for v in values if fmt.is_num(v)]
    if len(vals) < 5:
        return None
    centre = statistics.median(vals) if not of_mean else statistics.fmean(vals)
    if centre <= 0:
        return None
    if of_mean:
        spread = statistics.pstdev(vals)
        return spread / len(vals) ** 0.5 / centre
    mad = statistics.median(abs(v - centre) for v in vals) * 1.4826
    return 1.2533 * mad / len(vals) ** 0.5 / centre


def _measured(r: Dict[str, Any], key: str) -> List[float]:
    per = get(r, "steps." + ST.PER_STEP) or []
    warm = get(r, "steps." + ST.WARMUP_STEPS)
    warm = warm if fmt.is_num(warm) else 0
    return [x.get(key) for x in per[int(warm):] if isinstance(x, dict)]


def after_plan_faults(r: Dict[str, Any]) -> List[float]:
    """The per-step faults the allocator's after-plan mean is taken over: its steps from after_plan_from_step on
    (the first step served by the plan included, as the C side counts it)."""
    a = r.get("allocator") if isinstance(r, dict) else None
    per = get(a, A.PER_STEP)
    start = get(a, A.AFTER_PLAN_FROM_STEP)
    if not fmt.is_num(start):
        start = get(a, A.PLAN_MADE_AT_STEP)
    if not isinstance(per, list) or not fmt.is_num(start):
        return []
    return [x.get(A.STEP_FAULTS) for x in per if isinstance(x, dict) and fmt.is_num(x.get(A.STEP))
            and x[A.STEP] >= start]


# figure id -> (per-step samples of a run, statistic is a mean, band multiplier: tails are noisier)
_NOISE_FROM = {
    "step_ms_median": (lambda r: _measured(r, "step_ms"), False, 1.0),
    "steps_per_s": (lambda r: _measured(r, "step_ms"), False, 1.0),
    "step_ms_mean": (lambda r: _measured(r, "step_ms"), True, 1.0),
    "step_ms_p5": (lambda r: _measured(r, "step_ms"), False, 2.0),
    "step_ms_p95": (lambda r: _measured(r, "step_ms"), False, 3.0),
    "faults_per_step_median": (lambda r: _measured(r, "minor_faults"), False, 1.0),
    "faults_after_plan": (after_plan_faults, True, 1.0),
    "epoch_s_median": (lambda r: get(r, "steps." + ST.KERAS_EPOCH_S) or [], False, 1.0),
    "epoch_step_ms": (lambda r: get(r, "steps." + ST.KERAS_EPOCH_S) or [], False, 1.0),
}
# below these absolute differences a ratio says nothing, whatever the spread (a 0.05 vs 1.9 faults/step ratio)
_ABS_FLOOR = {"faults_per_step_median": 1.0, "faults_after_plan": 1.0, "faults_before_plan": 1.0,
              "tier_fallbacks": 1.0, "pipelined_steps": 1.0, "tuning_gain_pct": 2.0,
              "tuning_cost_pct": 1.0, "major_faults": 100.0, "minor_faults": 1000.0}
SAME_BAND = 0.02      # ratios closer to 1.0 than this are the same whatever the spread
# The noise rule. A figure taken over samples (steps, epochs) gets a verdict only with at least MIN_SAMPLES of
# them in each run (fewer say nothing of their own spread: a median of 5 epochs) and a ratio beyond both runs'
# spread (noise_band). A figure that is one number per run (the whole run's time and fault counts) has no spread
# of its own: it gets a verdict only beyond WHOLE_RUN_BAND (a 1.27x wall time on a shared machine is not one) and,
# for counts, beyond its absolute floor (4 vs 14 major faults is not one).
MIN_SAMPLES = 10
WHOLE_RUN_BAND = 0.5
_WHOLE_RUN = {"minor_faults", "major_faults", "cpu_s", "cpu_ms_per_step", "duration_s"}


def noise_band(fid: str, a: Dict[str, Any], b: Dict[str, Any], va: Any = None, vb: Any = None) -> Optional[float]:
    """How far B may differ from A, as a fraction of A, before the difference says more than the two runs'
    own per-step spread (about 2 standard errors of the difference); None without per-step samples."""
    src = _NOISE_FROM.get(fid)
    if src is None:
        return None
    samples, of_mean, mult = src
    ra, rb = _robust_rel_se(samples(a), of_mean), _robust_rel_se(samples(b), of_mean)
    va = FIGURES[fid].read(a) if va is None else va
    vb = FIGURES[fid].read(b) if vb is None else vb
    if ra is None or rb is None or not fmt.is_num(va) or not fmt.is_num(vb) or not va:
        return None
    # standard errors in the figure's own unit: a spiky run (mostly 0, one step of 50) has a wide one
    return 2.0 * mult * ((ra * va) ** 2 + (rb * vb) ** 2) ** 0.5 / abs(va)


def _sample_count(fid: str, r: Dict[str, Any]) -> int:
    return len([v for v in _NOISE_FROM[fid][0](r) if fmt.is_num(v)])


def verdict(fid: str, a: Dict[str, Any], b: Dict[str, Any], va: Any, vb: Any) -> Dict[str, Any]:
    """{'ratio', 'better': 'a'|'b'|None, 'noise': band (fraction of A) or None, 'within_noise': bool, and
    'noise_why' when the noise rule, not the spread, holds the verdict back}."""
    f = FIGURES[fid]
    ratio = fmt.safe_ratio(vb, va)
    band = noise_band(fid, a, b, va, vb)
    out = {"ratio": ratio, "better": None, "noise": None if band is None else round(band, 4), "within_noise": False}
    if ratio is None or f.lower_better is None:
        return out
    floor = _ABS_FLOOR.get(fid)
    quiet = abs(ratio - 1.0) <= max(SAME_BAND, band or 0.0)
    if floor is not None and abs(vb - va) < floor:
        quiet = True
        out["noise_why"] = f"difference under {floor:g}"
    if fid in _WHOLE_RUN and abs(ratio - 1.0) <= WHOLE_RUN_BAND:
        quiet = True
        out["noise_why"] = "one sample per run"
    if fid in _NOISE_FROM and min(_sample_count(fid, a), _sample_count(fid, b)) < MIN_SAMPLES:
        quiet = True
        out["noise_why"] = f"under {MIN_SAMPLES} samples"
    if quiet:
        out["within_noise"] = True
        return out
    out["better"] = "b" if (ratio < 1.0) == f.lower_better else "a"
    return out


def glossary_lines() -> List[str]:
    """The glossary as Markdown table rows (docs/report.md holds them)."""
    return [f"| {f.name} | {f.meaning} |" for f in _F]
