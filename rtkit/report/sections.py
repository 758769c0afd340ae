# sections.py -- turns a report.json dict into titled sections of rows and tables, shared by the terminal and HTML views.
"""One place decides what a person sees; terminal.py and html.py only lay it out.

Every headline figure is read under the one key path report/contract.py declares for it; a declared key
that a report lacks becomes a note in its section. The allocator, pmem and scheduler sections are embedded
as their components wrote them: besides the headline figures, every other figure they hold is shown too,
formatted by the unit in its key."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from rtkit.report import contract
from rtkit.report import figures as F
from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report import load
from rtkit.report import scheduler_outcome
from rtkit.report.contract import Allocator as A, Pmem as PM, Rows as RW, Scheduler as S
from rtkit.report.contract import Steps as ST
from rtkit.report.fmt import get

MAX_TABLE_ROWS = 24          # longer tables show their head and a "... N more" row
PER_STEP_KEYS = ("per_step", "steps", "samples", "census", "timeline", "per_step_census", "events")


@dataclass
class Table:
    title: str
    headers: List[str]
    rows: List[List[str]]
    numeric: List[bool] = field(default_factory=list)   # right-align these columns


@dataclass
class Section:
    key: str
    title: str
    rows: List[Tuple[str, str]] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)
    off: Optional[str] = None          # one-line reason when the section is off
    notes: List[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# helpers


def command_text(cmd: Any, limit: int = 0) -> str:
    if isinstance(cmd, (list, tuple)):
        text = " ".join(shlex.quote(str(c)) for c in cmd)
    else:
        text = str(cmd or "")
    if limit and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _value_text(key: str, value: Any) -> str:
    if isinstance(value, dict):
        parts = [f"{k}={_value_text(k, v)}" for k, v in value.items() if not isinstance(v, (dict, list))]
        return ", ".join(parts) if parts else fmt.by_key(key, value)
    return fmt.by_key(key, value)


def _add(rows: List[Tuple[str, str]], name: str, value: Any, key: str = "", text: Optional[str] = None) -> None:
    """Append a row unless the value is absent."""
    if value is None and text is None:
        return
    rows.append((name, text if text is not None else _value_text(key or name, value)))


def table_from_records(title: str, records: Any, key_name: str = "name", limit: int = MAX_TABLE_ROWS) -> Optional[Table]:
    """A table from a list of dicts (columns = union of scalar keys, in first-seen order) or from a
    dict of dicts (first column = the outer key)."""
    if isinstance(records, dict):
        items = []
        for k, v in records.items():
            if isinstance(v, dict):
                items.append({key_name: k, **v})
            else:
                items.append({key_name: k, "value": v})
        records = items
    if not isinstance(records, list) or not records:
        return None
    if not all(isinstance(r, dict) for r in records):
        return Table(title, ["value"], [[fmt.by_key(title, r)] for r in records[:limit]], [False])
    cols: List[str] = []
    for r in records:
        for k, v in r.items():
            if k not in cols and not isinstance(v, list):
                cols.append(k)
    cols = cols[:8]          # keep tables readable on 80 columns
    rows = []
    for r in records[:limit]:
        rows.append([_value_text(c, r.get(c)) if isinstance(r.get(c), dict) else fmt.by_key(c, r.get(c)) for c in cols])
    numeric = [all(fmt.is_num(r.get(c)) or r.get(c) is None for r in records[:limit]) for c in cols]
    if len(records) > limit:
        rows.append([f"... {len(records) - limit} more"] + [""] * (len(cols) - 1))
    return Table(title, [fmt.label(c) for c in cols], rows, numeric)


def generic_rows(d: Dict[str, Any], skip: Iterable[str] = (), prefix: str = "", depth: int = 0) -> List[Tuple[str, str]]:
    """Every scalar figure in `d`, except keys in `skip` (a bare key, or a dotted path from the
    section's top). Nested dicts become a heading row and indented rows; nulls are left out."""
    skip = set(skip)
    rows: List[Tuple[str, str]] = []
    indent = "  " * depth
    for k, v in d.items():
        path = prefix + k
        if path in skip or k in skip or v is None or v == "" or v == []:
            continue
        if isinstance(v, dict):
            if depth < 2:
                inner = generic_rows(v, skip, path + ".", depth + 1)
                if inner:
                    rows.append((indent + fmt.label(k), ""))
                    rows.extend(inner)
        elif isinstance(v, list):
            if all(not isinstance(x, (dict, list)) for x in v) and len(v) <= 16:
                rows.append((indent + fmt.label(k), fmt.by_key(k, v)))
        else:
            rows.append((indent + fmt.label(k), fmt.by_key(k, v)))
    return rows


def generic_tables(d: Dict[str, Any], skip: Iterable[str] = ()) -> List[Table]:
    """Tables for the lists of records in `d` (per-step lists are plotted, not tabled)."""
    skip = set(skip)
    out = []
    for k, v in d.items():
        if k in skip or k in PER_STEP_KEYS:
            continue
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            t = table_from_records(fmt.label(k), v)
            if t:
                out.append(t)
    return out


def _notes(d: Any) -> List[str]:
    n = get(d, "notes")
    if isinstance(n, list):
        return [str(x) for x in n]
    if isinstance(n, str) and n:
        return [n]
    return []


# ---------------------------------------------------------------------------------------------
# sections


def run_section(report: Dict[str, Any]) -> Section:
    run = report.get("run") or {}
    s = Section("run", "Run")
    _add(s.rows, "name", run.get("name"))
    _add(s.rows, "command", None, text=command_text(run.get("command")) or fmt.MISSING)
    status = run.get("status") or "unknown"
    _add(s.rows, "status", None, text=str(status))
    code = run.get("exit_code")
    code_text = fmt.MISSING if code is None else str(code)
    if run.get("signal"):
        code_text += f" ({run['signal']})"
    _add(s.rows, "exit code", None, text=code_text)
    if run.get("error"):
        _add(s.rows, "error", run.get("error"))
    _fig(s.rows, report, "duration_s")
    _add(s.rows, "started", run.get("start_time"))
    _add(s.rows, "profile", None, text=run.get("profile") or "(none)")
    settings = run.get("settings") or {}
    changed = F.settings_differ(F.default_settings(settings), settings)
    if changed:
        s.rows.append(("settings", f"{len(changed)} not default:"))
        for d in changed:
            s.rows.append((f"  {d['key']}", f"{F.setting_text(d['key'], d['b'])}  [{d['source_b']}]"))
    elif settings:
        s.rows.append(("settings", "all defaults"))
    env = run.get("child_env") or {}
    interesting = {k: v for k, v in env.items() if not k.startswith("RTKIT_")}
    if interesting:
        s.rows.append(("child env", ", ".join(f"{k}={_shorten_env(k, str(v))}" for k, v in sorted(interesting.items()))))
    versions = run.get("versions") or {}
    if versions:
        parts = [f"{k} {v}" for k, v in versions.items() if v and k != "platform"]
        _add(s.rows, "versions", None, text=", ".join(parts) or fmt.MISSING)
        if versions.get("platform"):
            _add(s.rows, "platform", versions.get("platform"))
    host = run.get("host") or {}
    if host:
        _add(s.rows, "host", None, text=f"{host.get('cpus', '?')} CPUs, {fmt.nbytes(host.get('memory_bytes'))}")
    _add(s.rows, "run dir", run.get("run_dir"))
    return s


def _shorten_env(name: str, value: str) -> str:
    if name in ("LD_PRELOAD", "PYTHONPATH"):
        import os
        parts = value.split(":" if name == "PYTHONPATH" else None) if value else []
        return " ".join(os.path.basename(p.rstrip("/")) or p for p in parts) or value
    return value


def _fig(rows: List[Tuple[str, str]], report: Dict[str, Any], fid: str, extra: str = "") -> None:
    """A row for a glossary figure the report has, under the figure's one name."""
    v = G.value(report, fid)
    if v is not None:
        rows.append((G.name(fid), G.FIGURES[fid].text(v) + extra))


def steps_section(report: Dict[str, Any], view: str = "terminal") -> Section:
    st = report.get("steps")
    s = Section("steps", "Steps")
    if not isinstance(st, dict):
        s.off = "no step data"
        return s
    count = st.get("count")
    api = G.steps_api(report)
    _add(s.rows, G.name("steps"), None, text=f"{fmt.num(count)} from {api}" if api and count
         else f"{fmt.num(count)} (source: {st.get('source') or 'none'})")
    if count:
        _fig(s.rows, report, "measured_steps", f" (first {fmt.num(st.get('warmup_steps'))} left out as warm-up)")
    for fid in ("step_ms_median", "step_ms_p5", "step_ms_p95", "step_ms_mean", "steps_per_s", "faults_per_step_median",
                "epochs", "epoch_s_median", "epoch_step_ms"):
        _fig(s.rows, report, fid)
    epochs = get(st, ST.KERAS_EPOCH_S)
    if isinstance(epochs, list) and epochs:
        _add(s.rows, "epoch times", None, text=", ".join(fmt.seconds(e) for e in epochs[:12])
             + (f" ... ({len(epochs)} epochs)" if len(epochs) > 12 else ""))
    if st.get("signature"):
        _add(s.rows, "signature", None, text=fmt.shorten(str(st.get("signature")), 200))
    if not count and st.get(ST.NO_STEP_REASON):
        _add(s.rows, "why none", None, text=str(st.get(ST.NO_STEP_REASON)))
    hook = st.get("hook") or {}
    if hook:
        text = str(hook.get("status") or fmt.MISSING)
        if hook.get("tensorflow_version"):
            text += f", TensorFlow {hook['tensorflow_version']}"
        if hook.get("detail"):
            text += f": {hook['detail']}"
        _add(s.rows, "hooks", None, text=text)
    others = st.get("other_signatures") or []
    if others:
        t = table_from_records("other run signatures (not counted as steps)",
                               [{"signature": fmt.shorten(str(o.get("signature")), 60), "count": o.get("count")}
                                for o in others if isinstance(o, dict)])
        if t:
            s.tables.append(t)
    return s


def process_section(report: Dict[str, Any], view: str = "terminal") -> Section:
    p = report.get("process")
    s = Section("process", "Process")
    if not isinstance(p, dict):
        s.off = "no process samples"
        return s
    for fid in ("peak_rss_bytes", "minor_faults", "major_faults"):
        _fig(s.rows, report, fid)
    cpu = G.cpu_seconds(report)
    if cpu is not None:
        util = F.cpu_utilization(report)
        text = (f"{fmt.seconds(cpu)} (user {fmt.seconds(p.get('cpu_user_s'))}, "
                f"system {fmt.seconds(p.get('cpu_system_s'))})")
        if util is not None:
            text += f", {util:.2f} cores busy on average"
        _add(s.rows, G.name("cpu_s"), None, text=text)
    _fig(s.rows, report, "cpu_ms_per_step")
    _fig(s.rows, report, "max_threads")
    samples = p.get("samples") or []
    _add(s.rows, "samples", None,
         text=f"{len(samples)} every {fmt.num(p.get('sample_interval_ms'))} ms")
    return s


def bounds_section(report: Dict[str, Any], view: str = "terminal") -> Section:
    """What bounds the peak RSS (report/bounds.py): the runtime, the heap the steps added, the overhead."""
    from rtkit.report import bounds

    s = Section("bounds", "Memory bounds")
    if not isinstance(report.get("bounds"), dict):
        s.off = "no RSS sample before the first step"
        return s
    s.rows.extend(bounds.rows(report))
    s.notes += contract.missing_note("bounds", report.get("bounds"))
    return s


def allocator_section(report: Dict[str, Any], view: str = "terminal") -> Section:
    a = report.get("allocator")
    s = Section("allocator", "Allocator (PRMalloc)")
    if not isinstance(a, dict):
        s.off = "off"
        return s
    _fig(s.rows, report, "allocator_state")
    _fig(s.rows, report, "allocator_plan")
    classes = F.plan_classes(a)
    plan = get(a, A.PLAN)
    if isinstance(classes, list) and classes:
        bl = [c.get(A.CLASS_BLOCKS) for c in classes if isinstance(c, dict) and fmt.is_num(c.get(A.CLASS_BLOCKS))]
        text = f"{len(classes)} classes"
        if bl:
            text += f", {fmt.num(sum(bl))} blocks"
        if isinstance(plan, dict):   # the plan's other scalars (spacing, trimmed...) on the same line
            text += "".join(f", {fmt.label(k)} {fmt.by_key(k, v)}" for k, v in plan.items()
                            if k not in ("classes", "reserved_bytes", "step_peak_bytes", "source", "made_at_step",
                                         "rejected_reason")
                            and v not in (None, "", False) and not isinstance(v, (dict, list)) and not k.endswith("path"))
        _add(s.rows, "plan classes", None, text=text)
    if isinstance(plan, dict):
        for k, v in plan.items():
            if k.endswith("path") and v:
                _add(s.rows, "plan file" if k == "plan_path" else fmt.label(k), v)
    if G.replan_words(report):
        _fig(s.rows, report, "replans")
    for fid in ("reserved_bytes", "plan_step_peak_bytes", "hit_rate", "hit_rate_after_plan"):
        _fig(s.rows, report, fid)
    hits, falls = F.allocator_counts(a)
    _add(s.rows, "arena hits (whole run)", hits, "arena_hits")
    _add(s.rows, "fallbacks (whole run)", falls, "fallbacks")
    for fid in ("faults_before_plan", "faults_after_plan"):
        _fig(s.rows, report, fid)
    shown = {A.STATE, A.HIT_RATE, A.HIT_RATE_AFTER_PLAN, A.ARENA_HITS, A.FALLBACKS, A.FAULTS_BEFORE_PLAN,
             A.FAULTS_AFTER_PLAN, A.PLAN, A.SETTINGS_ECHO, A.ERRORS, "schema_version", "pid", "notes"}
    s.rows.extend((_census_label(name), value) for name, value in generic_rows(a, skip=shown))
    t = table_from_records("plan classes", classes, key_name="class") if isinstance(classes, list) else None
    if t:
        s.tables.append(t)
    for t in generic_tables(a):
        if t.title == "size classes":
            t.headers = [SIZE_CLASS_COUNT if c == "count" else c for c in t.headers]
        s.tables.append(t)
    per = F.allocator_per_step(a)
    if per and view == "terminal":
        s.rows.append(("per-step census", f"{len(per)} steps (plotted by `rtkit report --html`)"))
    errs = get(a, A.ERRORS)
    s.notes = ([f"error: {e}" for e in errs] if isinstance(errs, list) else []) + _notes(a) + \
        contract.missing_note("allocator", a) + _echo_notes(report, a)
    return s


# The allocator's call totals are not all counts of every call: the small-object census is sampled by bytes (a
# thread's malloc that overdraws its byte budget stands for the bytes of the ones before it), and a free of
# glibc's memory takes no counted path unless large glibc frees are being watched (profiling, the stash). The
# labels say so, or "malloc calls 56,119,441 / free calls 14,985" reads as a leak.
CENSUS_LABELS = {
    "malloc calls": "malloc calls (estimate)",
    "small calls": "small calls (estimate)",
    "free calls": "free calls (partial)",
}
SIZE_CLASS_COUNT = "count (estimate)"


def _census_label(name: str) -> str:
    bare = name.lstrip(" ")
    return name[: len(name) - len(bare)] + CENSUS_LABELS[bare] if bare in CENSUS_LABELS else name


def _echo_notes(report: Dict[str, Any], alloc: Dict[str, Any]) -> List[str]:
    """A setting the C library read with another value than rtkit resolved is worth one note."""
    echo = contract.settings_echo(alloc)
    settings = get(report, "run.settings") or {}
    out = []
    for key, value in echo.items():
        want = settings.get(key)
        if isinstance(want, dict) and "value" in want and want["value"] != value:
            out.append(f"the allocator read {key}={F.setting_text(key, value)}, rtkit resolved "
                       f"{F.setting_text(key, want['value'])}")
    return out


def pmem_section(report: Dict[str, Any], view: str = "terminal") -> Section:
    p = report.get("pmem")
    s = Section("pmem", "PMEM tier")
    if not G.tier_on(report):
        s.off = "off (tier mode needs tier_pool_path)"
        return s
    for fid in ("tier_bytes", "tier_peak_bytes", "dram_saved_bytes", "tier_fallbacks"):
        _fig(s.rows, report, fid)
    shown = {PM.NOTES, PM.TIER_BYTES, PM.TIER_PEAK_BYTES, PM.DRAM_SAVED_BYTES, PM.TIER_FALLBACKS, "schema_version",
             "pid"}
    s.rows.extend(generic_rows(p, skip=shown))
    s.tables.extend(generic_tables(p))
    t = table_from_records("pool classes", get(p, PM.POOL_CLASSES), key_name="class")
    if t:
        s.tables.append(t)
    s.notes = _notes(p) + contract.missing_note("pmem", p)
    return s


def scheduler_section(report: Dict[str, Any], view: str = "terminal") -> Section:
    sc = report.get("scheduler")
    s = Section("scheduler", "Scheduler")
    if not isinstance(sc, dict):
        s.off = "off"
        return s
    if scheduler_outcome.alone(sc):   # the scheduler off, its lookahead of fed ids alone (tier mode)
        _add(s.rows, "state", None, text=scheduler_outcome.alone(sc))
        _add(s.rows, "lookahead", None, text=scheduler_outcome.lookahead(sc, scheduler_outcome.pager_ran(report)))
        errs = get(sc, S.ERRORS)
        s.notes = ([f"error: {e}" for e in errs] if isinstance(errs, list) else []) + _notes(sc)
        return s
    _fig(s.rows, report, "sched_chosen")
    _add(s.rows, "what was applied", None, text=scheduler_outcome.applied(sc, get(report, "steps." + ST.SOURCE)))
    _add(s.rows, "pipelining", None, text=scheduler_outcome.pipeline(sc, get(report, "steps." + ST.SOURCE)))
    trials = F.sched_trials(sc)
    tuning = get(sc, S.TUNING)
    if isinstance(tuning, dict):
        _add(s.rows, "tuning outcome", None, text=scheduler_outcome.tuning(report, tuning))
    if isinstance(trials, list):
        text = str(len(trials))
        if get(sc, S.TRIALS_STEPS_USED) is not None:
            text += f" ({fmt.num(get(sc, S.TRIALS_STEPS_USED))} steps used)"
        _add(s.rows, "tuning trials", None, text=text)
    for fid in ("pipelined_steps", "tuning_gain_pct", "tuning_cost_pct", "occupancy_mean"):
        _fig(s.rows, report, fid)
    if fmt.is_num(get(sc, S.HIDDEN_PCT)):
        _add(s.rows, "input stage hidden behind compute", None, text=f"{fmt.num(get(sc, S.HIDDEN_PCT))}% (median step)")
    if fmt.is_num(get(sc, S.INPUT_SHARE)):
        _add(s.rows, "input stage share of op time", None, text=f"{fmt.num(get(sc, S.INPUT_SHARE))}% (bounds the gain)")
    if scheduler_outcome.bound(sc):
        _add(s.rows, G.name("overlap_bound"), None, text=scheduler_outcome.bound(sc, named=False))
    ahead = scheduler_outcome.lookahead(sc, scheduler_outcome.pager_ran(report))
    if ahead:
        _add(s.rows, "lookahead", None, text=ahead)
    shown = {S.NOTES, S.STAGES, S.CHOSEN, S.SPEEDUP, S.TRIALS, S.OCCUPANCY_MEAN, S.OCCUPANCY_SAMPLES, S.STAGED_STEPS,
             S.TUNING_GAIN_PCT, S.TUNING_COST_1000, S.ERRORS, S.HIDDEN_PCT, S.INPUT_SHARE, S.QUEUE_DEPTH_SAMPLES, S.OVERLAP_SAMPLES,
             S.OVERLAP_BOUND, S.LOOKAHEAD, *S.HIDDEN}
    s.rows.extend(generic_rows(sc, skip=shown))
    t = table_from_records("stages", get(sc, S.STAGES), key_name="stage")
    if t:
        s.tables.append(t)
    if isinstance(trials, list):
        t = table_from_records("tuning trials", [_flat_trial(x) for x in trials])
        if t:
            s.tables.append(t)
    s.tables.extend(generic_tables(sc, skip={S.STAGES}))
    errs = get(sc, S.ERRORS)
    s.notes = ([f"error: {e}" for e in errs] if isinstance(errs, list) else []) + _notes(sc) + \
        contract.missing_note("scheduler", sc)
    return s


def _flat_trial(tr: Any) -> Any:
    """A trial's nested config dict flattened into its row, so the table shows the knobs."""
    if not isinstance(tr, dict):
        return {"value": tr}
    out = {}
    for k, v in tr.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if not isinstance(v2, (dict, list)):
                    out[k2] = v2
        else:
            out[k] = v
    return out


def notes_section(report: Dict[str, Any]) -> Section:
    s = Section("notes", "Notes")
    s.notes = _notes(report)
    if not s.notes:
        s.off = "none"
    return s


def rows_section(report: Dict[str, Any]) -> Section:
    """How the rows the run used lie in its embedding tables (rows-<pid>.json, from scripts that know their id -> row
    maps): the scatter figures, the layout they were measured on, and why not when they could not be."""
    r = report.get("rows")
    s = Section("rows", "Embedding rows")
    if not isinstance(r, dict):
        s.off = "not measured (no id -> row map reported)"
        return s
    for fid in ("row_pages_per_row", "row_scatter_x", "row_scatter_bytes"):
        _fig(s.rows, report, fid)
    s.rows.extend(generic_rows(r, skip={RW.NOT_MEASURED, "schema_version", "pid"}))
    if r.get(RW.NOT_MEASURED):
        s.notes.append(f"scatter not measured: {r[RW.NOT_MEASURED]}")
    s.notes += contract.missing_note("rows", r)
    return s


def _tier_view(report: Dict[str, Any]) -> Section:
    from rtkit.report.tier_view import tier_view

    view = tier_view(report)
    s = Section("tier", "Tier view (pooled allocations)", rows=view["rows"], off=view["off"])
    s.tables = [Table(title, headers, rows, numeric=[True] * len(headers)) for title, headers, rows in view["tables"]]
    s.notes = list(view["notes"])
    return s


def build_sections(report: Dict[str, Any], view: str = "terminal") -> List[Section]:
    """The sections in order; `view` is "terminal" or "html" (the HTML draws what the terminal only mentions)."""
    report = load.normalize(report)
    out = [run_section(report), steps_section(report, view), process_section(report, view),
           bounds_section(report, view), allocator_section(report, view), pmem_section(report, view), _tier_view(report),
           rows_section(report), scheduler_section(report, view), notes_section(report)]
    for s in out[:3]:  # the parent's own sections follow the same contract
        s.notes += contract.missing_note(s.key, report.get(s.key))
    return out
