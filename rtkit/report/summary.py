# summary.py -- the end-of-run summary of `rtkit run`: what happened, in about 8 lines, named as in every view.
"""Lines, in order: status; steps and step time; Keras epoch time (Keras fit only); memory; allocator (with
where its plan came from, or why a loaded plan was rejected); tier mode; scheduler (what it applied, pipelined
steps, the tuner's choice); what went wrong in rtkit (one line each, at most MAX_PROBLEMS); the report path.
A line only appears when its component ran; a figure only when the report has it. Words come from
report/glossary.py so that the summary, `rtkit report`, the HTML and `rtkit compare` agree."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report import load
from rtkit.report import scheduler_outcome
from rtkit.report import tier_view
from rtkit.report.contract import Allocator as A, Pmem as PM, Scheduler as S, Steps as ST
from rtkit.report.fmt import get

MAX_PROBLEMS = 2
# The plan's arenas reserving this much more than a step's planned sizes hold at once, and this share of the peak RSS,
# is worth a warning: each class is sized by its own peak, so classes that peak at different moments of the step
# sit idle, yet resident, while the others peak (a retrieval model's 256 MiB in-batch score matrices: +530 MiB, before
# malloc_class_max left blocks that large to the large heap).
ARENA_EXCESS_MIN_BYTES = 64 << 20
ARENA_EXCESS_SHARE = 0.10
ROWS_SCATTERED = 2.0   # rows on this many times the pages they fill packed: worth a summary line


def _fig(r: Dict[str, Any], fid: str, label: Optional[str] = None) -> Optional[str]:
    """'<name> <value>' for a figure the report has, else None."""
    v = G.value(r, fid)
    if v is None:
        return None
    return f"{label if label is not None else G.name(fid)} {G.FIGURES[fid].text(v)}"


def _join(parts: List[Optional[str]], sep: str = ", ") -> str:
    return sep.join(p for p in parts if p)


def status_line(r: Dict[str, Any]) -> str:
    run = r.get("run") or {}
    head = f"rtkit: {run.get('status') or 'unknown'}"
    code = run.get("exit_code")
    if code is not None:
        head += f" (exit {code}{', ' + str(run['signal']) if run.get('signal') else ''})"
    if run.get("duration_s") is not None:
        head += f" after {fmt.seconds(run.get('duration_s'))}"
    if run.get("error"):
        head += f": {run['error']}"
    return head


def steps_line(r: Dict[str, Any]) -> str:
    st = r.get("steps") or {}
    count = G.value(r, "steps")
    if not count:
        hook = st.get("hook") if isinstance(st.get("hook"), dict) else {}
        why, reason = hook.get("status"), st.get(ST.NO_STEP_REASON)
        code = (r.get("run") or {}).get("exit_code")
        if isinstance(reason, str) and reason.startswith(ST.NOTHING_RECURRED) and code not in (None, 0):
            # a job that failed before training has no loop to mark: the hint would send its user the wrong way
            reason = f"the command ended (exit {code}) before any tf.function, Session.run or Keras fit call recurred"
        return "rtkit: steps: none counted" + (f" (hooks: {why}: {hook.get('detail')})" if why and why != "ok" else
                                               f" ({reason})" if reason else "")
    api = G.steps_api(r)
    text = f"rtkit: steps: {fmt.num(count)} counted" + (f" from {api}" if api else "")
    measured, warm = G.value(r, "measured_steps"), get(st, ST.WARMUP_STEPS)
    if measured is not None and fmt.is_num(warm):
        text += f", {fmt.num(measured)} measured (first {fmt.num(warm)} left out)"
    figs = _join([_fig(r, "step_ms_median"), _fig(r, "step_ms_p95"), _fig(r, "steps_per_s")])
    return text + (f"; {figs}" if figs else "")


def keras_line(r: Dict[str, Any]) -> Optional[str]:
    epochs, per_epoch = G.value(r, "epochs"), G.value(r, "epoch_s_median")
    if not epochs or per_epoch is None:
        return None
    val = get(r, "steps." + ST.KERAS_VALIDATION)
    inc = "validation and callbacks included" if val else "callbacks included, no validation"
    fits = get(r, "steps." + ST.KERAS_FIT_CALLS)
    # the step and epoch medians pool every fit's batches: with several fits (often several models) they mix them
    over = f" over {fmt.num(fits)} fit calls (the medians pool them)" if fmt.is_num(fits) and fits > 1 else ""
    return (f"rtkit: keras: {fmt.num(epochs)} epoch(s){over}, " + _join([_fig(r, "epoch_s_median"), _fig(r, "epoch_step_ms")])
            + f" ({inc}); the step times count the train batches alone")


def memory_line(r: Dict[str, Any]) -> str:
    parts = [_fig(r, "peak_rss_bytes"), _fig(r, "faults_per_step_median")]
    if G.value(r, "faults_per_step_median") is None:
        parts.append(_fig(r, "minor_faults"))
    if G.value(r, "allocator_state") == "planned":
        parts.append(_fig(r, "faults_after_plan"))
    over = _fig(r, "over_live_bytes")
    if over:
        held = _join([_fig(r, fid) for fid in ("over_live_arenas_bytes", "over_live_large_idle_bytes",
                                               "over_live_glibc_free_bytes", "over_live_runtime_bytes")])
        parts.append(f"{over} ({held})")
    return "rtkit: memory: " + _join(parts)


def rows_line(r: Dict[str, Any]) -> Optional[str]:
    """The embedding rows' layout, for scripts that report it (rows-<pid>.json), when the rows are scattered
    (ROWS_SCATTERED or more) or the layout could not be measured; nothing for packed rows or other scripts."""
    if not isinstance(r.get("rows"), dict):
        return None
    scatter = G.value(r, "row_scatter_x")
    if scatter is None:
        return f"rtkit: table rows: layout not measured ({G.rows_not_measured(r)})"
    if scatter < ROWS_SCATTERED:
        return None
    return "rtkit: table rows: " + _join([_fig(r, "row_scatter_x"), _fig(r, "row_pages_per_row"),
                                          _fig(r, "row_scatter_bytes")])


def allocator_line(r: Dict[str, Any]) -> Optional[str]:
    a = r.get("allocator")
    if not isinstance(a, dict):
        return None
    state = G.value(r, "allocator_state") or "on"
    reason, profiled = get(a, A.PROFILE_REASON), get(a, A.PROFILED_STEPS)
    if state == "passthrough":   # no plan: the arenas served nothing, a hit rate would only say 0%
        if not reason and not get(a, "steps"):
            reason = "no training step reached the allocator"
        said = "passthrough, no plan" + (f" ({reason})" if reason else "")
        return "rtkit: allocator: " + _join([said, G.plan_words(r), G.replan_words(r)])
    if state == "profiling":
        return "rtkit: allocator: " + _join([
            "still profiling when the run ended" + (f" ({fmt.num(profiled)} steps profiled)" if fmt.is_num(profiled)
                                                    else ""), G.plan_words(r), G.replan_words(r)])
    parts = [state, G.plan_words(r), G.replan_words(r)]
    if state == "planned":
        parts.append(_fig(r, "hit_rate_after_plan"))
    parts.append(_fig(r, "hit_rate"))
    if fmt.is_num(G.value(r, "reserved_bytes")) and G.value(r, "reserved_bytes"):
        reserved = _fig(r, "reserved_bytes")
        peak = _fig(r, "plan_step_peak_bytes", "a step's planned sizes at most")
        parts.append(f"{reserved} ({peak} live at once)" if peak else reserved)
    warning = arena_excess_warning(r)
    return "rtkit: allocator: " + _join(parts) + (f"; {warning}" if warning else "")


def arena_excess_warning(r: Dict[str, Any]) -> Optional[str]:
    """A warning when the plan's arenas hold much more than a step's planned sizes need at once: that excess is idle
    but resident while the step's peak passes, peak RSS an allocator returning those blocks would not reach. No
    setting trims it reliably (a lower malloc_arena_limit drops the largest classes to the large heap, which keeps
    its idle extents resident for malloc_decay_steps: -21% peak RSS on the retrieval example, -2% on the test's), so
    the line names the run that shows what the job needs without the plan."""
    reserved, at_once = G.value(r, "reserved_bytes"), G.value(r, "plan_step_peak_bytes")
    peak_rss = G.value(r, "peak_rss_bytes")
    if not (fmt.is_num(reserved) and fmt.is_num(at_once) and fmt.is_num(peak_rss)) or peak_rss <= 0:
        return None
    excess = reserved - at_once
    if excess < ARENA_EXCESS_MIN_BYTES or excess < ARENA_EXCESS_SHARE * peak_rss:
        return None
    return (f"warning: the arenas reserve {fmt.nbytes(excess)} more than a step's planned sizes hold at once "
            f"({excess / peak_rss:.0%} of peak RSS): each class is sized by its own peak, so those that peak at other "
            "moments of the step are idle, yet resident, while the step's peak passes; --set malloc=off shows the "
            "peak RSS without the plan")


def tier_line(r: Dict[str, Any]) -> Optional[str]:
    if not G.tier_on(r):
        return None
    p = r["pmem"]
    where = get(p, PM.PATH)
    medium = get(p, PM.MEDIUM)
    head = f"rtkit: tier: {get(p, PM.STATE)}" + (f", pool {where}" if where else "") + (f" ({medium})" if medium else "")
    parts = [_fig(r, "tier_bytes"), _fig(r, "tier_peak_bytes"), _fig(r, "dram_saved_bytes")]
    falls = G.value(r, "tier_fallbacks")
    if falls:   # with their bytes: one fallback may be a whole table
        fell = get(p, "tier_fallback_bytes")
        parts.append(_fig(r, "tier_fallbacks") + (f" ({fmt.nbytes(fell)} in DRAM)" if fmt.is_num(fell) else ""))
    parts += tier_view.cost_words(r)
    return head + "; " + _join(parts) + "".join(f"; {w}" for w in tier_view.warning_words(r))


def scheduler_line(r: Dict[str, Any]) -> Optional[str]:
    sc = r.get("scheduler")
    if not isinstance(sc, dict):
        return None
    if scheduler_outcome.alone(sc):   # only the lookahead ran: nothing was applied, staged or tuned to speak of
        ahead = scheduler_outcome.lookahead(sc, scheduler_outcome.pager_ran(r))
        return "rtkit: scheduler: " + _join([scheduler_outcome.alone(sc), ahead], "; ")
    source = get(r, "steps." + ST.SOURCE)
    parts = [scheduler_outcome.applied(sc, source), scheduler_outcome.pipeline(sc, source),
             scheduler_outcome.bound(sc), scheduler_outcome.lookahead(sc, scheduler_outcome.pager_ran(r))]
    tuning = get(sc, S.TUNING)
    if isinstance(tuning, dict):
        parts.append(scheduler_outcome.tuning(r, tuning))
    return "rtkit: scheduler: " + _join(parts, "; ")


def problems(r: Dict[str, Any]) -> List[str]:
    """What went wrong in rtkit, one string each, with the report section that says more."""
    out = [(str(n), "Notes") for n in (r.get("notes") or [])]
    for name, title in (("allocator", "Allocator"), ("scheduler", "Scheduler"), ("pmem", "PMEM tier")):
        errs = get(r.get(name), A.ERRORS)
        if isinstance(errs, list):
            out.extend((str(e), title) for e in errs if e)
    return [f"{text} [report: {where}]" for text, where in out]


def lines(report: Dict[str, Any], report_path: Optional[str] = None) -> List[str]:
    """The summary's lines, each 'rtkit: ...' (see the module's doc); the last is `rtkit: report: <path>` (report_path,
    else run.run_dir/report.json)."""
    r = load.normalize(report)
    out = [status_line(r), steps_line(r)]
    for line in (keras_line(r), memory_line(r), rows_line(r), allocator_line(r), tier_line(r), scheduler_line(r)):
        if line:
            out.append(line)
    probs = problems(r)
    for p in probs[:MAX_PROBLEMS]:
        out.append("rtkit: note: " + fmt.shorten(p, 160))
    if len(probs) > MAX_PROBLEMS:
        out.append(f"rtkit: {len(probs) - MAX_PROBLEMS} more note(s) in the report")
    run = r.get("run") or {}
    path = report_path or (os.path.join(run["run_dir"], "report.json") if run.get("run_dir") else None)
    if path:
        out.append(f"rtkit: report: {path}")
    return out
