# recommend.py -- `rtkit recommend`: from a run's report, the settings or profile to try next, each with its measured reason.
"""Rules read the report (finished, or a running job's live snapshot) under the contract's keys, and each one
that fires gives: what to try, the measured reason, the effect to expect, and the exact command (the run's own
command and the settings it was given on the command line, with the change). None fires: it says so, with the
figures that were looked at. Rules, in order:

- input: the scheduler measured the input stage's share of the op time, and no step was staged
  -> `--profile throughput` (stage the input ahead of compute, tune the thread pools);
- plan: the allocator profiled this run and the steps before its plan faulted far more than those after
  -> `--plan RUN_DIR/malloc-plan.txt` (the rerun serves planned sizes from its first step);
- capacity: the run's peak RSS is a large share of the memory available (the caller's: MemAvailable now, or
  --mem-available for another machine) -> `--profile capacity` with a pool sized from the run and the DRAM head
  bounded from that memory (so the command fits the machine it is made for, not only this one);
- pool: a tier run sent requests of a table's size to DRAM for want of room in its pool
  -> `--set tier_pool_size=...` grown by every byte that fell back (the tier line's warning says the same);
- rows: the rows the script used lie scattered over its embedding tables (measured by scripts that report
  their id -> row maps: pages holding the rows used against the pages they fill packed) -> a vocabulary lookup
  (ids get rows in first-seen order) instead of hashing ids to rows; for the bundled workload,
  `--row-assign first-seen`."""
from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report import scheduler_outcome, tier_view
from rtkit.report.contract import Allocator as A, Scheduler as S
from rtkit.report.fmt import get

INPUT_SHARE_PCT = 15.0        # an input stage below this share of the op time leaves little for staging to hide
FAULTS_GAIN = 10.0            # faults/step before the plan must exceed those after by this many...
FAULTS_RATIO = 2.0            # ...and by this factor, for --plan to be worth a rerun
MEMORY_SHARE = 0.5            # peak RSS above this share of the memory available: tables against DRAM
POOL_HEADROOM = 1.5           # the pool file is sized at this many times the run's peak RSS (tables grow)
PLAN_FILE = "malloc-plan.txt"
SCATTER_X = 4.0               # rows on this many times the pages they fill packed...
SCATTER_BYTES = 16 << 20      # ...and this much table memory on scattered rows, for a change of row layout


@dataclass
class Recommendation:
    rule: str            # input | plan | capacity | pool | rows | none
    change: str          # what to try, as flags
    reason: str          # the measured reason
    expect: str          # the expected effect
    command: Optional[str]


def _cli_args(report: Dict[str, Any], drop: tuple = ()) -> List[str]:
    """The flags the run was given (--profile and its --set values), less the keys in `drop`."""
    run = report.get("run") or {}
    args: List[str] = []
    if run.get("profile") and "profile" not in drop:
        args += ["--profile", str(run["profile"])]
    for key, s in sorted((run.get("settings") or {}).items()):
        if isinstance(s, dict) and s.get("source") == "cli" and key not in drop:
            if key == "malloc_plan":
                args += ["--plan", str(s.get("value"))]
            else:
                value = s.get("value")
                value = ("on" if value else "off") if isinstance(value, bool) else value
                args += ["--set", f"{key}={value}"]
    return args


def _command(report: Dict[str, Any], extra: List[str], drop: tuple = ()) -> Optional[str]:
    cmd = (report.get("run") or {}).get("command")
    if not isinstance(cmd, list) or not cmd:
        return None
    return shlex.join(["rtkit", "run", *_cli_args(report, drop), *extra, "--", *map(str, cmd)])


def _input_rule(report: Dict[str, Any]) -> Optional[Recommendation]:
    s = report.get("scheduler")
    share = get(s, S.INPUT_SHARE) if isinstance(s, dict) else None
    staged = get(s, S.STAGED_STEPS) if isinstance(s, dict) else None
    if not fmt.is_num(share) or share < INPUT_SHARE_PCT or (fmt.is_num(staged) and staged > 0):
        return None
    med = G.value(report, "step_ms_median")
    hidden = med * share / 100.0 if fmt.is_num(med) else None
    expect = ("staging runs the input stage of the next step while this one computes: at most the input's "
              f"share hidden, {fmt.ms(hidden)} of the {G.name('step_ms_median')} {fmt.ms(med)}"
              if hidden is not None else "at most the input stage's share of the step time hidden")
    return Recommendation(
        "input", "--profile throughput",
        f"the scheduler measured the input stage at {share:.0f}% of the op time, and no step was staged "
        f"({G.name('pipelined_steps')} {fmt.num(staged or 0)})",
        expect + "; the tuner also tries thread splits in the first steps",
        _command(report, ["--profile", "throughput"], drop=("profile", "sched", "sched_stage", "sched_tune")))


def _plan_rule(report: Dict[str, Any], run_dir: str) -> Optional[Recommendation]:
    a = report.get("allocator")
    if not isinstance(a, dict) or get(a, A.PLAN_SOURCE) != "profiled":
        return None
    if fmt.is_num(get(a, A.REPLANS)) and get(a, A.REPLANS) > 0:
        return None   # the plan on file is the last phase's: a rerun's earlier phases would have none of its sizes
    before, after = G.value(report, "faults_before_plan"), G.value(report, "faults_after_plan")
    at = get(a, A.PLAN_MADE_AT_STEP)
    plan = os.path.join(run_dir, PLAN_FILE)
    if not (fmt.is_num(before) and fmt.is_num(after) and fmt.is_num(at)) or not os.path.isfile(plan):
        return None
    if before - after < FAULTS_GAIN or before < FAULTS_RATIO * max(after, 1.0):
        return None
    saved = (before - after) * at
    first = G.training_step(report, at)
    span = (f"the {at} allocator steps before step {first} (start-up included)" if first is not None else
            f"the allocator's first {at} steps")
    return Recommendation(
        "plan", f"--plan {plan}",
        f"{G.name('faults_before_plan')} {fmt.num(before)} against {G.name('faults_after_plan')} "
        f"{fmt.num(after)}: the plan was {G.plan_from_words(report, at)}, the steps before it were profiled",
        f"a rerun with this plan serves the planned sizes from its first step: about {fmt.num(round(saved))} "
        f"fewer minor faults over {span}, and the arena hit rate of the whole run near "
        f"{G.name('hit_rate_after_plan')} {G.text(report, 'hit_rate_after_plan')} "
        f"(this run: {G.text(report, 'hit_rate')})",
        _command(report, ["--plan", plan], drop=("malloc_plan",)))


def _non_table_bytes(report: Dict[str, Any], peak: float) -> tuple:
    """The run's peak RSS less what its tables held of it, where the report knows the tables (scripts that report
    their id -> row maps): (bytes, how it was found). Otherwise the whole peak RSS: the tables' share unknown."""
    rows = report.get("rows") if isinstance(report.get("rows"), dict) else {}
    tables = rows.get("table_bytes")
    if not fmt.is_num(tables) or rows.get("table_fill") not in ("eager", "lazy"):
        return peak, f"{G.name('peak_rss_bytes')}, the tables' share of it not measured"
    if rows["table_fill"] == "lazy":   # filled row by row: resident only where rows were used
        page = rows.get("page_bytes") or 4096
        tables = min(tables, (rows.get("row_pages") or 0) * page) if fmt.is_num(rows.get("row_pages")) else 0
    return max(0.0, peak - tables), f"{G.name('peak_rss_bytes')} less the tables' {fmt.nbytes(tables)} resident"


def _dram_head(report: Dict[str, Any], peak: float, available: float) -> tuple:
    """tier_dram_head for a machine with `available` bytes: half of what the budget leaves after the run's
    non-table memory (as tier mode itself takes at most half of MemAvailable at the first step, leaving the page
    cache room for the pool's pages), in whole MiB; 0 when nothing is left. (bytes, the reason in words)."""
    other, how = _non_table_bytes(report, peak)
    left = max(0.0, available - other)
    head = int(left // 2) & ~((1 << 20) - 1)
    why = (f"the DRAM head bounded from the memory available: {fmt.nbytes(available)} less the run's non-table "
           f"memory {fmt.nbytes(other)} ({how}) leaves {fmt.nbytes(left)}, ")
    why += (f"half of it {fmt.nbytes(head)} for the tables' leading rows in anonymous DRAM, the rest for the "
            "page cache holding the pool's pages" if head else
            "no room for anonymous table rows: tier_dram_head=0, every table row stays in the pool file")
    return head, why


def _capacity_rule(report: Dict[str, Any], available: Optional[int], where: str) -> Optional[Recommendation]:
    peak = G.value(report, "peak_rss_bytes")
    if G.tier_on(report) or not fmt.is_num(peak) or not available or peak < MEMORY_SHARE * available:
        return None
    size_g = max(1, int(-(-peak * POOL_HEADROOM // (1 << 30))))
    pool = "/tmp/rtkit-capacity.pool"
    growth = G.value(report, "rss_growth_bytes")
    head, head_why = _dram_head(report, peak, available)
    head_set = f"tier_dram_head={head >> 20}M" if head else "tier_dram_head=0"
    sets = ["--set", f"tier_pool_path={pool}", "--set", f"tier_pool_size={size_g}G", "--set", head_set]
    return Recommendation(
        "capacity", f"--profile capacity --set tier_pool_path={pool} --set tier_pool_size={size_g}G --set {head_set}",
        f"{G.name('peak_rss_bytes')} {fmt.nbytes(peak)} is {peak / available:.0%} of the memory available "
        f"({fmt.nbytes(available)}, {where}); {head_why}",
        "tier mode puts the long-lived large allocations (tables, optimizer slots) in a pool file the page cache "
        f"keeps in DRAM as far as it fits: anonymous memory down by the tables' resident bytes beyond the DRAM head "
        f"of {fmt.nbytes(head)} (peak RSS {fmt.nbytes(peak)}, {G.name('rss_growth_bytes')} {fmt.nbytes(growth)}); "
        "steps slow down as rows are faulted in from the file (docs/pmem.md). The profile's own DRAM head (up to "
        "half of MemAvailable at the first step) would hold whole tables on a machine with more memory than "
        "planned for, so the head is set from the memory planned for; tables filled row by row are resident only "
        "where rows are used, so a short run saves only those; tables filled by an initializer whose temporaries "
        f"are freed before the first step stop the pool's placement (docs/results.md). The pool is sized "
        f"{POOL_HEADROOM}x the peak RSS; put tier_pool_path on a local disk with that much room",
        _command(report, ["--profile", "capacity", *sets],
                 drop=("profile", "tier_pool_path", "tier_pool_size", "tier_dram_head")))


def _pool_room_rule(report: Dict[str, Any]) -> Optional[Recommendation]:
    p = report.get("pmem")
    enough = tier_view.pool_size_with_room(p) if G.tier_on(report) and isinstance(p, dict) else None
    if enough is None:
        return None
    size = f"{enough >> 20}M"
    return Recommendation(
        "pool", f"--set tier_pool_size={size}", tier_view.no_room_words(p),
        f"room beside what the pool held for every byte that fell back: they go in the pool, anonymous memory down by up to "
        f"{fmt.nbytes(get(p, 'tier_fallback_bytes'))}; put tier_pool_path on a disk with {fmt.nbytes(enough)} of room",
        _command(report, ["--set", f"tier_pool_size={size}"], drop=("tier_pool_size",)))


def _workload_rows_command(report: Dict[str, Any]) -> Optional[str]:
    """The bundled workload's own command with first-seen rows (its --row-assign hashed dropped), else None."""
    cmd = (report.get("run") or {}).get("command")
    if not isinstance(cmd, list) or "rtkit.workloads" not in cmd:
        return None
    argv = [str(a) for a in cmd]
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--row-assign" and i + 1 < len(argv):
            i += 2
            continue
        if argv[i].startswith("--row-assign="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return shlex.join(["rtkit", "run", *_cli_args(report), "--", *out, "--row-assign", "first-seen"])


def _rows_rule(report: Dict[str, Any]) -> Optional[Recommendation]:
    scatter, extra = G.value(report, "row_scatter_x"), G.value(report, "row_scatter_bytes")
    if not fmt.is_num(scatter) or scatter < SCATTER_X or not fmt.is_num(extra) or extra < SCATTER_BYTES:
        return None
    rows = report["rows"]
    lazy = rows.get("table_fill") == "lazy"
    where = ("resident memory (the tables are filled row by row, so a page is resident once a row on it is used)"
             if lazy else "the memory the steps touch (the tables are filled whole, so all of it is resident; the "
             "pages the steps touch are what a cache, the page cache under tier mode, or the TLB must hold)")
    command = _workload_rows_command(report)
    return Recommendation(
        "rows", "a vocabulary lookup (ids get rows in first-seen order) instead of hashing ids to rows" +
        (": --row-assign first-seen" if command else ""),
        f"{fmt.num(rows['rows_used'])} table rows used lie on {fmt.num(rows['row_pages'])} pages, "
        f"{G.name('row_scatter_x')} {G.text(report, 'row_scatter_x')} ({G.name('row_pages_per_row')} "
        f"{G.text(report, 'row_pages_per_row')}): ids are hashed over the whole table",
        f"rows packed from each table's start fill {fmt.num(rows['packed_pages'])} pages: up to "
        f"{fmt.nbytes(extra)} less {where}. In the script: map ids to rows with a vocabulary lookup, "
        "tf.keras.layers.IntegerLookup / StringLookup (vocabulary from the data) or an EmbeddingVariable-style "
        "id -> row table that hands out rows in first-seen order, instead of Hashing / to_hash_bucket / id % size",
        command)


def _share_unmeasured(report: Dict[str, Any]) -> str:
    """Why the input stage's share is not known: the scheduler was off, or it ran and traced no session step (it
    measures the stages on Session.run steps; Keras fit and tf.function steps run none)."""
    sc = report.get("scheduler")
    if not isinstance(sc, dict) or scheduler_outcome.alone(sc):
        return "the scheduler was off: --set sched=on measures it"
    runs = {"keras": "Keras fit runs none", "function": "tf.function calls run none"}.get(
        get(report, "steps.source"), "none was traced")
    return f"the scheduler measures it on session steps; {runs}"


def recommend(report: Dict[str, Any], run_dir: str, available: Optional[int], where: str) -> List[Recommendation]:
    """The rules that fire on `report` (of `run_dir`), against `available` bytes of memory (`where`: whence)."""
    found = [r for r in (_input_rule(report), _plan_rule(report, run_dir),
                         _capacity_rule(report, available, where), _pool_room_rule(report), _rows_rule(report))
             if r]
    if found:
        return found
    looked = [f"{G.name(fid)} {G.text(report, fid)}" for fid in
              ("step_ms_median", "faults_before_plan", "faults_after_plan", "peak_rss_bytes")]
    share = get(report.get("scheduler"), S.INPUT_SHARE) if isinstance(report.get("scheduler"), dict) else None
    looked.append(f"input stage share {fmt.num(share)}%" if fmt.is_num(share) else
                  f"input stage share not measured ({_share_unmeasured(report)})")
    scatter = G.value(report, "row_scatter_x")
    looked.append(f"{G.name('row_scatter_x')} {G.text(report, 'row_scatter_x')}" if fmt.is_num(scatter) else
                  f"table row layout not measured ({G.rows_not_measured(report)})")
    return [Recommendation("none", "", "nothing to gain that this report shows: " + "; ".join(looked),
                           "keep these settings", None)]


def lines(report: Dict[str, Any], recs: List[Recommendation]) -> List[str]:
    from rtkit.report.load import running_since

    run = report.get("run") or {}
    as_of = running_since(report)
    head = f"rtkit recommend: {run.get('name')} ({'running, as of ' + as_of if as_of else run.get('status')})"
    out = [head]
    for i, r in enumerate(recs, 1):
        if r.rule == "none":
            out += [f"  {r.reason}"]
            continue
        out += [f"{i}. {r.change}", f"   why: {r.reason}", f"   expect: {r.expect}", f"   run: {r.command}"]
    return out


def as_json(recs: List[Recommendation]) -> List[Dict[str, Any]]:
    return [asdict(r) for r in recs]
