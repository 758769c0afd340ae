# scheduler_outcome.py -- what the scheduler did, in words, for the summary and the Scheduler section alike.
"""Said from what happened, not from the settings: where the configuration was applied (sessions, Keras fit,
nothing), how many steps were pipelined (never "pipelined" when none was), what the tuner chose."""
from __future__ import annotations

from typing import Any, Dict, Optional

from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report.contract import Scheduler as S, Steps as ST
from rtkit.report.fmt import get


def applied(sc: Dict[str, Any], steps_source: Optional[str] = None) -> str:
    """What the scheduler applied and where: to the sessions it configured, to Keras (said when the steps came
    from Keras fit), to TensorFlow's global pools (said when they came from tf.function calls: those run there),
    or nothing. steps_source: the report's steps.source."""
    chosen = get(sc, S.CHOSEN)
    knobs = ""
    if isinstance(chosen, dict):   # pipelining is said apart, from what happened, not from the setting
        knobs = ", ".join(f"{k}={v}" for k, v in chosen.items()
                          if not isinstance(v, (dict, list, bool)) and not k.startswith("stage_"))
    sessions = [x for x in (get(sc, S.SESSIONS) or []) if isinstance(x, dict)]
    keras = get(sc, S.KERAS)
    ours = [x for x in sessions if str(x.get("applied", "")).startswith("rtkit")]
    out = []
    if ours:
        out.append(f"applied {knobs} to {len(ours)} session(s)" if knobs else f"applied to {len(ours)} session(s)")
    if len(ours) < len(sessions):
        out.append(f"{len(sessions) - len(ours)} session(s) kept the script's thread settings")
    if steps_source not in ("keras", "function"):   # set for Keras, but neither fit nor a tf.function ran the steps
        keras = None
    if isinstance(keras, dict) and keras.get("applied"):
        ks = ", ".join(f"{k}={v}" for k, v in keras.items()
                       if k not in ("applied", "fit_inputs_not_datasets") and not isinstance(v, (dict, list)))
        where = "Keras" if steps_source == "keras" else "TensorFlow's global thread pools (the tf.function steps run on them)"
        out.append(f"applied to {where}: {ks}" if ks else f"applied to {where}")
        ds = [d for d in (keras.get("datasets") or []) if isinstance(d, dict)]
        if steps_source == "keras":
            out.extend(_keras_inputs(keras, ds))
        elif ds:   # the loop's tf.data input: what the scheduler set, or that the dataset's own option was kept
            whose = "the loop's tf.data input" if len(ds) == 1 else f"the loop's {len(ds)} tf.data inputs"
            out.append(f"{whose}: {_options(ds[0])}")
    elif isinstance(keras, dict) and keras.get("detail"):
        out.append(f"not applied to Keras ({keras['detail']})")
    if not out:
        if isinstance(get(sc, S.KERAS), dict) and get(sc, S.KERAS).get("applied"):
            return "no session or Keras fit used its configuration (only TensorFlow's global thread pools were set)"
        return f"nothing applied (no session or Keras fit seen){'; would apply ' + knobs if knobs else ''}"
    return ", ".join(out)


def _options(d: Dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in d.items() if k != "input")


def _fit_datasets(keras: Any):
    """(fit's own tf.data inputs, the others (iterated outside fit), fit calls given no tf.data dataset). Reports
    before the scheduler said where a dataset came from have no "input": those count as fit's, as they were said."""
    ds = [d for d in ((keras or {}).get("datasets") or []) if isinstance(d, dict)] if isinstance(keras, dict) else []
    fit = [d for d in ds if d.get("input", "fit") == "fit"]
    not_ds = keras.get("fit_inputs_not_datasets") if isinstance(keras, dict) else None
    return fit, [d for d in ds if d not in fit], not_ds if fmt.is_num(not_ds) else 0


def _keras_inputs(keras: Dict[str, Any], ds) -> list:
    """Fit's input in words (its tf.data input's options, or that Keras made its own), then the tf.data inputs
    iterated outside fit (predict, evaluate, an eager loop), which got the options instead."""
    fit, other, not_ds = _fit_datasets(keras)
    out = []
    if fit:
        out.append(f"fit's tf.data input: {_options(fit[0])}")
    elif not_ds:
        out.append("fit's input is not a tf.data dataset (Keras makes its own, left as it is)")
    if other:
        n = len(other)
        out.append(f"{n} tf.data input{'' if n == 1 else 's'} outside fit (predict, evaluate or an eager loop): "
                   f"{_options(other[0])}")
    return out


# what an unstaged step on a staged graph runs (scheduler reports that count unstaged steps say it)
_OWN_GRAPH = "the script's own graph ran, 0 extra runs per step"


def pipeline(sc: Dict[str, Any], steps_source: Optional[str] = None) -> str:
    """Pipelined steps, or why none (steps_source: the report's steps.source; for Keras fit, fit's own input)."""
    staged = get(sc, S.STAGED_STEPS)
    reason = get(sc, S.NOT_STAGED_REASON)
    if fmt.is_num(staged):
        if staged > 0:
            text = f"{G.name('pipelined_steps')} {fmt.num(staged)}"
            tuning = get(sc, S.TUNING)
            if isinstance(tuning, dict) and tuning.get("done") and \
                    (tuning.get("chosen") or {}).get("stage_pipelined") is False:
                text += " (in tuning trials; the chosen configuration does not pipeline"
                text += f": {_OWN_GRAPH})" if fmt.is_num(get(sc, S.UNSTAGED_STEPS)) else ")"
            return text
        keras = get(sc, S.KERAS)
        ds = [d for d in ((keras or {}).get("datasets") or []) if isinstance(d, dict)] if isinstance(keras, dict) else []
        fit, _other, not_ds = _fit_datasets(keras)
        if not reason and steps_source == "keras" and get(sc, S.PIPELINE_ENABLED):   # fit's input could prefetch
            if any(fmt.is_num(d.get("prefetch")) for d in fit):
                return "no session step staged (fit's tf.data input prefetches instead)"
            if any(d.get("prefetch") == "the dataset's own" for d in fit):
                return "no session step staged (fit's tf.data input prefetches already)"
            if not fit and not_ds:
                return "no step pipelined (fit's input is not a tf.data dataset)"
        elif not reason and any(fmt.is_num(d.get("prefetch")) for d in ds):
            return "no session step staged (the tf.data input prefetches instead)"
        if not reason and fmt.is_num(get(sc, S.UNSTAGED_STEPS)) and get(sc, S.UNSTAGED_STEPS) > 0:
            return f"no step pipelined (staging off: {_OWN_GRAPH})"
        return "no step pipelined" + (f" ({reason})" if reason else "")
    return "no step pipelined"


def pager_ran(report: Dict[str, Any]) -> bool:
    """Whether tier mode's own pager (tier_pager) ran in this report's process."""
    return bool(get(report, "pmem.pager.on"))


def lookahead(sc: Dict[str, Any], pager: bool = False) -> str:
    """What the lookahead did: '' when staging was off (nothing to look ahead of), else off with why, or its
    figures. pager: tier mode's own pager ran (the report's pmem.pager.on), whose books, not mincore, said which
    pages of the tables it held were in DRAM (rtkit_tier_resident)."""
    la = get(sc, S.LOOKAHEAD)
    fed = isinstance(la, dict) and la.get("rows_from") == "feeds"
    if not isinstance(la, dict) or not (get(sc, S.PIPELINE_ENABLED) or fed or get(sc, S.LOOKAHEAD_ONLY)):
        return ""
    if la.get("state") != "on":
        return f"lookahead off ({la.get('off_reason') or 'no reason given'})"
    measure = la.get("mode") == "measure"
    text = "lookahead measured only (nothing touched)" if measure else (
        f"lookahead {fmt.num(la.get('pages_requested'))} pages ({fmt.nbytes(la.get('bytes_requested'))} of rows) "
        + ("requested together just before their steps (rows from the steps' feeds)" if fed else "requested ahead"))
    text += f" over {fmt.num(la.get('batches'))} " + ("steps" if fed else "batches")
    if fmt.is_num(la.get("resident_share")):
        n_tables = la.get("tables_measured")
        text += (f", {fmt.pct(la.get('resident_share'))} of " + ("the step's pages resident already" if fed else
                 "the next step's pages resident before it") + f" ({'the pager' if pager else 'mincore'}, {fmt.num(n_tables)} table{'' if n_tables == 1 else 's'})")
    else:
        text += ", resident share not measured (no table found in a tier pool)"
    found, regions = la.get("regions_found"), la.get("regions")
    if fmt.is_num(found) and fmt.is_num(regions) and 0 < found < regions:   # the rest are not counted above
        text += f", {fmt.num(found)} of {fmt.num(regions)} tables and optimizer slots found in the pool"
    kept = f", {fmt.num(la['budget_pages_kept'])} kept for it by the tier budget" \
        if fmt.is_num(la.get("budget_pages_kept")) else ""   # the tier's heat budget heard of the pages read ahead
    if not measure and fed:
        if fmt.is_num(la.get("pages_read_ahead")):   # the others were in DRAM: told to the budget, not read
            text += f", {fmt.num(la['pages_read_ahead'])} not resident read ahead"
        text += f"{kept}, CPU {fmt.num(la.get('worker_cpu_s'))} s"
    elif not measure:
        if la.get("pages_read_ahead"):   # the others were in DRAM when the worker looked: told, not read
            text += f", {fmt.num(la['pages_read_ahead'])} not resident read ahead"
        text += f", {fmt.num(la.get('late_batches'))} late, {fmt.num(la.get('wasted_pages'))} pages wasted{kept}"
        text += f", worker CPU {fmt.num(la.get('worker_cpu_s'))} s"
        if la.get("wait_s"):   # sched_lookahead_wait_ms: the steps waited for their batches
            text += f", steps waited {fmt.seconds(la['wait_s'])} for it"
    if fed and fmt.is_num(la.get("before_s")):   # part of the steps' times: they ran after it
        text += f", the steps waited {fmt.seconds(la['before_s'])} for it in all"
    if la.get("skipped_steps"):   # backing off: too few of the looked-at steps' pages were out of DRAM
        unit = "steps" if fed else "batches"
        text += (f", {fmt.num(la['skipped_steps'])} {unit} not looked at (backing off: the {unit} looked at before "
                 "them had almost all their pages in DRAM already)")
    skipped = la.get("gathers_skipped")
    if isinstance(skipped, list) and skipped:   # their tables' rows are faulted in by the step, as without it
        many = len(skipped) >= 10   # the report keeps the first 10
        text += (f", {'10 or more' if many else len(skipped)} other table gather{'' if len(skipped) == 1 else 's'} "
                 "not looked at (gathers_skipped says why)")
    return text


def alone(sc: Dict[str, Any]) -> str:
    """'' unless the scheduler was off and only its lookahead of fed ids ran (tier mode); then that, in words."""
    if not get(sc, S.LOOKAHEAD_ONLY):
        return ""
    return "off (sched=0: no thread pools, staging or tuning); only its lookahead of fed ids ran (tier mode)"


def tuning(r: Dict[str, Any], tuning: Dict[str, Any]) -> str:
    if not tuning.get("done", True):
        used = tuning.get("steps_used")
        if used == 0:
            if get(r, "steps." + ST.SOURCE) == "keras":
                return "no tuning (the tuner times session steps; Keras fit runs none)"
            if get(r, "steps." + ST.SOURCE) == "function":
                return "no tuning (the tuner times session steps; tf.function calls run none)"
            return "tuning saw no step (the tuner times session steps only)"
        return f"tuning not finished ({fmt.num(used)} of {fmt.num(tuning.get('budget_steps'))} steps used)"
    chosen = tuning.get("chosen")
    pick = ", ".join(f"{k}={'on' if v is True else 'off' if v is False else v}" for k, v in chosen.items()
                     if not isinstance(v, (dict, list))) if isinstance(chosen, dict) else "?"
    text = f"tuning chose {pick}"
    gain = G.value(r, "tuning_gain_pct")
    if gain is not None:
        text += f", {G.name('tuning_gain_pct')} {G.text(r, 'tuning_gain_pct')}"
    if tuning.get("verdict"):
        text += f" ({tuning['verdict']})"
    cost = G.value(r, "tuning_cost_pct")
    if cost is not None:
        text += f", {G.name('tuning_cost_pct')} {G.text(r, 'tuning_cost_pct')}"
        job = tuning.get("cost_pct_of_job")
        if fmt.is_num(job):
            text += f" ({fmt.num(job)}% of this job)"
    return text


def bound(sc: Dict[str, Any], named: bool = True) -> str:
    """The overlap bound beside the staged step: '' when no probe step measured the unstaged step's parts."""
    b = get(sc, S.OVERLAP_BOUND)
    if not isinstance(b, dict) or not fmt.is_num(b.get("bound_x")):
        return ""
    text = (f"{G.name('overlap_bound') + ' ' if named else ''}{fmt.ratio(b['bound_x'])} (input {fmt.ms(b.get('input_ms'))}, compute "
            f"{fmt.ms(b.get('compute_ms'))}, each alone")
    if fmt.is_num(b.get("input_cpu_pct")):
        text += f"; input CPU {fmt.num(b['input_cpu_pct'])}% of its wall time"
    text += ")"
    if fmt.is_num(b.get("x_of_bound")):
        text += f", {G.name('x_of_bound')} {fmt.ratio(b['x_of_bound'])}"
    else:
        text += ", no staged step after tuning to set against it"
    return text
