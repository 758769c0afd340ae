# sched.py -- `python -m rtkit.bench.sched`: the scheduler's bench: input modes x APIs x configurations, interleaved, one Markdown table.
"""Every cell (input mode x API) runs every configuration once per round; the rounds interleave the whole
matrix (cells in order, then reversed; configurations rotated within a cell), so a drift of the machine spreads
over all of them. Each run is one `rtkit run` of the bundled wdl workload (rtkit/bench/runner.run_one).

The step figure is the workload's own: the median wall time between the ends of consecutive steps after 3
warm-up steps (`wall_step_ms_median` on its summary line), i.e. what the script waited for, whatever rtkit did
before a run; rtkit's hooks are not needed for it, so tf-default and rtkit configurations are measured alike.
Ratios are per round (a configuration's run over tf-default's run of the same cell and round), shown as their
median and range; "faster"/"slower" only when every round agrees, else "same (noise)".

Output: <out>/sched.md (the table to paste), <out>/sched.json, and per cell <out>/<cell>/bench.json|md, runs/,
logs/ as `rtkit bench` writes them."""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from rtkit import atomic, rundir
from rtkit.bench import output, peers, runner

INPUTS = {
    # name: (--input, latency?)   legacy-lat: legacy input with a per-batch read latency (remote storage)
    "prefetch": ("prefetch", False),
    "legacy": ("legacy", False),
    "legacy-lat": ("legacy", True),
}
APIS = ("session", "monitored", "keras")
DEFAULT_CONFIGS = ("tf-default", "profile:throughput")
BASELINE = "tf-default"
WALL = re.compile(r"^rtkit-workload: .* wall_step_ms_median=(\S+)", re.M)


class _Progress(runner.Progress):
    """runner.Progress with the cell in front of the configuration's name."""
    cell = ""

    def show(self, round_no: int, config: str) -> None:
        super().show(round_no, f"{self.cell} {config}")

    def finished(self, message: str) -> None:
        super().finished(f"{self.cell} {message}")


def _args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rtkit.bench.sched",
        description="The scheduler's bench: wdl under each input mode x API x configuration, interleaved "
                    "rounds; writes one Markdown table (sched.md) with medians, per-round ratios to tf-default "
                    "and the scheduler's own figures.")
    p.add_argument("--inputs", default=",".join(INPUTS), help=f"input modes (default {','.join(INPUTS)})")
    p.add_argument("--apis", default=",".join(APIS), help=f"APIs (default {','.join(APIS)})")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="configurations, as `rtkit bench --configs` (default tf-default,profile:throughput; "
                        "sched-only and rtkit-stage are the staging-only ones)")
    p.add_argument("--latency-ms", type=float, default=30.0,
                   help="legacy-lat: read latency per batch, a stand-in for a remote store (default 30)")
    p.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--batch", type=int, default=2048, help="batch size (default 2048)")
    p.add_argument("--rows", type=int, default=200_000, help="rows of synthetic data (default 200000)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is stopped (default 600)")
    p.add_argument("--out", default=None, help="output folder (default rtkit-bench/sched-<time>)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    a = p.parse_args(argv)
    for name in ("steps", "rounds", "batch", "rows"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: expected a whole number >= 1")
    a.inputs = [x.strip() for x in a.inputs.split(",") if x.strip()]
    a.apis = [x.strip() for x in a.apis.split(",") if x.strip()]
    bad = [x for x in a.inputs if x not in INPUTS] + [x for x in a.apis if x not in APIS]
    if bad or not a.inputs or not a.apis:
        p.error(f"unknown input mode or API {', '.join(bad) or '(none given)'}: inputs {', '.join(INPUTS)}; "
                f"APIs {', '.join(APIS)}")
    if a.latency_ms <= 0:
        p.error("--latency-ms: expected milliseconds > 0")
    return a


def _cells(a) -> List[Dict[str, Any]]:
    cells = []
    for inp in a.inputs:
        mode, lat = INPUTS[inp]
        for api in a.apis:
            cmd = runner.workload_command("wdl", a.steps, a.batch, a.rows, api, ["--no-progress"], input_mode=mode,
                                          input_latency_ms=a.latency_ms if lat else None)
            cells.append({"name": f"{inp}-{api}", "input": inp, "api": api, "command": cmd})
    return cells


def _order(cells: List[Dict], names: List[str], rounds: int) -> List[tuple]:
    """(round, cell, config) in run order: cells forward in odd rounds, backward in even ones; configurations
    rotated by the round within each cell."""
    out = []
    for k in range(1, rounds + 1):
        for cell in (cells if k % 2 else cells[::-1]):
            for i in range(len(names)):
                out.append((k, cell, names[(k - 1 + i) % len(names)]))
    return out


def _wall_ms(log_path: str) -> Optional[float]:
    try:
        with open(log_path, errors="replace") as fh:
            m = WALL.findall(fh.read())
    except OSError:
        return None
    try:
        v = float(m[-1]) if m else None
    except ValueError:
        return None
    return v if v is not None and v == v else None


def _sched_figures(run_dir: str) -> Dict[str, Any]:
    """The scheduler's own account of one run (report.json's scheduler section), the few figures the table shows."""
    try:
        with open(os.path.join(run_dir, "report.json")) as fh:
            sc = (json.load(fh) or {}).get("scheduler")
    except (OSError, ValueError):
        return {}
    if not isinstance(sc, dict):
        return {}
    p = sc.get("pipeline") or {}
    t = sc.get("tuning") or {}
    chosen = (t.get("chosen") or {}) if t.get("done") else {}
    b = p.get("overlap_bound") or {}
    return {
        "bound_x": b.get("bound_x"), "x_of_bound": b.get("x_of_bound"), "input_ms": b.get("input_ms"),
        "compute_ms": b.get("compute_ms"), "input_cpu_pct": b.get("input_cpu_pct"),
        "staged_steps": p.get("staged_steps"), "input_runs": p.get("input_runs"),
        "hidden_pct": p.get("input_hidden_pct_median"), "input_share_pct": sc.get("input_share_pct"),
        "tuned": bool(t.get("done")), "kept_script": bool(t.get("done")) and (t.get("gain_pct") or 0) == 0,
        "chose_staged": chosen.get("stage_pipelined"), "chose_read_ahead": chosen.get("stage_read_ahead"),
        "tuning_cost_pct_1000": t.get("cost_pct_of_1000_step_job"),
        "keras_datasets": len((sc.get("keras") or {}).get("datasets") or []),
        "state": sc.get("state"),
    }


def _med(values) -> Optional[float]:
    v = [x for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return statistics.median(v) if v else None


def _f(v: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def summarize(cells: List[Dict], names: List[str], runs: List[Dict]) -> List[Dict[str, Any]]:
    """One row per cell x configuration: medians over the ok runs, per-round ratios to the baseline."""
    rows = []
    for cell in cells:
        mine = [r for r in runs if r["cell"] == cell["name"]]
        base = {r["round"]: r["wall_ms"] for r in mine if r["config"] == BASELINE and r["wall_ms"]}
        for name in names:
            rs = [r for r in mine if r["config"] == name]
            ok = [r for r in rs if r["status"] == "ok" and r["wall_ms"]]
            walls = [r["wall_ms"] for r in ok]
            med = _med(walls)
            ratios = [r["wall_ms"] / base[r["round"]] for r in ok if base.get(r["round"])]
            verdict = None
            if name != BASELINE and len(ratios) >= 2:
                verdict = "faster" if max(ratios) < 1.0 else "slower" if min(ratios) > 1.0 else "same (noise)"
            sf = [r.get("sched") or {} for r in ok]
            tuned = [s for s in sf if s.get("tuned")]
            tuning = None
            if tuned:
                staged = sum(1 for s in tuned if s.get("chose_staged") and not s.get("kept_script"))
                kept = sum(1 for s in tuned if s.get("kept_script"))
                tuning = f"kept script {kept}/{len(tuned)}, chose staging {staged}/{len(tuned)}"
                ahead = sum(1 for s in tuned if s.get("chose_read_ahead") and not s.get("kept_script"))
                if ahead:
                    tuning += f" (read-ahead {ahead}/{len(tuned)})"
            elif any(s.get("keras_datasets") for s in sf):
                # the tuner switches pools and staging per session run; fit's steps are tf.function calls whose
                # dataset options are fixed when fit makes its iterator
                tuning = "Keras: dataset options (no tuner: fit runs no session step to switch)"
            bound = _med([s.get("bound_x") for s in sf])
            rows.append({
                "cell": cell["name"], "input": cell["input"], "api": cell["api"], "config": name,
                "runs": len(rs), "ok": len(ok), "wall_ms_median": med,
                "step_range_pct": (100.0 * (max(walls) - min(walls)) / med) if med and len(walls) >= 2 else None,
                "ratio_median": _med(ratios), "ratio_min": min(ratios) if ratios else None,
                "ratio_max": max(ratios) if ratios else None, "verdict": verdict,
                "staged_steps": _med([s.get("staged_steps") for s in sf]),
                "hidden_pct": _med([s.get("hidden_pct") for s in sf]),
                "input_share_pct": _med([s.get("input_share_pct") for s in sf]),
                "bound_x": bound, "input_ms": _med([s.get("input_ms") for s in sf]),
                "compute_ms": _med([s.get("compute_ms") for s in sf]),
                "input_cpu_pct": _med([s.get("input_cpu_pct") for s in sf]),
                # the bench's own figure (wall step over tf-default's, per round) against the bound
                "x_of_bound": (_med(ratios) / bound) if bound and ratios else None,
                "x_of_bound_sched": _med([s.get("x_of_bound") for s in sf]),
                "tuning": tuning,
                "tuning_cost_pct_1000": _med([s.get("tuning_cost_pct_1000") for s in sf]),
            })
    return rows


def render(bench: Dict[str, Any]) -> str:
    a = bench["settings"]
    m = bench.get("machine") or {}
    out = ["# rtkit scheduler bench", "",
           f"- command: `{bench['command_line']}`",
           f"- wdl, batch {a['batch']}, {a['steps']} steps per run, {a['rows']} rows; {a['rounds']} interleaved "
           f"rounds (cells forward then backward, configurations rotated); started {bench['start_time']}, "
           f"took {bench['duration_s'] / 60:.1f} min",
           f"- input modes: prefetch = parsing in Dataset.map + prefetch (the default); legacy = CSV lines decoded "
           f"and hashed in the graph after get_next, no prefetch; legacy-lat = legacy + {a['latency_ms']:g} ms read "
           f"latency per batch (a tf.data sleep in the iterator: a stand-in for a remote store such as HDFS or an "
           f"object store, whose per-request latency is tens of ms)",
           f"- machine: {m.get('cpu_model', '?')}, {m.get('cpus', '?')} CPUs, load average at start "
           f"{', '.join(f'{x:.2f}' for x in (m.get('loadavg_at_start') or []))}",
           "", "| input | api | config | runs ok | step ms (wall, median) | x tf-default (median, per-round range) | "
               "overlap bound (input / compute ms) | x of bound | verdict | step range | pipelined steps | input hidden | input share | "
               "tuning | tuning cost (1000-step job) |",
           "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in bench["rows"]:
        ratio = "-" if r["ratio_median"] is None else (
            f"{r['ratio_median']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})" if r["ratio_min"] != r["ratio_max"]
            else f"{r['ratio_median']:.2f}x")
        out.append("| " + " | ".join([
            r["input"], r["api"], r["config"], f"{r['ok']}/{r['runs']}", _f(r["wall_ms_median"]),
            "1.00x" if r["config"] == BASELINE and r["ok"] else ratio, _bound_text(r),
            _f(r["x_of_bound"], "{:.2f}x"), r["verdict"] or "-",
            _f(r["step_range_pct"], "{:.0f}%"), _f(r["staged_steps"], "{:.0f}"), _f(r["hidden_pct"], "{:.0f}%"),
            _f(r["input_share_pct"], "{:.0f}%"), r["tuning"] or "-", _f(r["tuning_cost_pct_1000"], "{:.1f}%"),
        ]) + " |")
    out += ["", "Columns: step ms = the workload's median wall time per step after 3 warm-up steps "
                "(`wall_step_ms_median`: everything the script waited for, the tuning trials included), median over "
                "the rounds; x tf-default = per round, this run over tf-default's run of the same cell: median "
                "(min-max); overlap bound = max(input, compute) / (input + compute) of the unstaged step, input = the put "
                "alone and compute = the staged step's run alone (the scheduler's probe steps), median over the "
                "rounds: the ratio staging with one put in flight reaches at best; x of bound = the x tf-default "
                "median over the bound (1.00x: at the bound; <= 1.10x: within 10%); "
                "verdict: faster/slower only when every round agrees; step range = (max - min) / median "
                "of the rounds' step ms; pipelined steps, input hidden (median share of each put hidden behind "
                "compute), input share (the input stage's share of op time: the bound on what staging can hide), "
                "tuning (the tuner's choice per run) and tuning cost (the trials' extra time over the chosen "
                "configuration, as a share of a 1000-step job) are the scheduler's own report figures, medians "
                "over the rounds."]
    failed = [r for r in bench["runs"] if r["status"] != "ok" or not r["wall_ms"]]
    if failed:
        out += ["", "Failed runs:"]
        out += [f"- {r['cell']} {r['config']} round {r['round']}: {r['status']} {r.get('error') or ''}; "
                f"log {r['log']}" for r in failed]
    return "\n".join(out) + "\n"


def _bound_text(r: Dict[str, Any]) -> str:
    if r.get("bound_x") is None:
        return "-"
    return f"{r['bound_x']:.2f}x ({_f(r.get('input_ms'))} / {_f(r.get('compute_ms'))})"


def _estimate_s(cells, names, a) -> float:
    """A rough duration on a quiet 2-core host (tf-default's step times of 2026-11-30 evening): ~9 s to start TF,
    build the graph and write the report, plus the steps."""
    graph = {"prefetch": 25.0, "legacy": 42.0, "legacy-lat": 42.0 + a.latency_ms}
    keras = {"prefetch": 48.0, "legacy": 50.0, "legacy-lat": 50.0 + 0.4 * a.latency_ms}  # Keras overlaps some input
    per = sum(9.0 + a.steps * (keras if c["api"] == "keras" else graph)[c["input"]] / 1000.0 * a.batch / 2048
              for c in cells)
    return per * len(names) * a.rounds


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = _args(argv)
    try:
        chosen = peers.select([n.strip() for n in a.configs.split(",")])
    except peers.PeerError as exc:
        sys.stderr.write(f"rtkit.bench.sched: {exc}\n")
        return 2
    names = [p.name for p in chosen]
    if BASELINE not in names:
        sys.stderr.write(f"rtkit.bench.sched: --configs must include {BASELINE} (the ratios' baseline)\n")
        return 2
    lib_dirs = list(peers.DEFAULT_LIB_DIRS)
    libraries = {}
    for p in chosen:
        libraries[p.name] = p.resolve_library(lib_dirs) if p.library else None
        if p.library and not libraries[p.name]:
            sys.stderr.write(f"rtkit.bench.sched: {p.missing_note(lib_dirs)}\n")
            return 2
    cells = _cells(a)
    order = _order(cells, names, a.rounds)
    out = a.out or os.path.join("rtkit-bench", "sched-" + time.strftime("%Y%m%d-%H%M%S"))
    est = _estimate_s(cells, names, a)
    if a.dry_run:
        for k, cell, name in order:
            print(f"r{k} {cell['name']} {name}: {' '.join(cell['command'])}")
        print(f"{len(order)} runs, about {est / 60:.0f} min on a quiet 2-core host")
        return 0
    if os.path.isdir(out) and os.listdir(out):
        sys.stderr.write(f"rtkit.bench.sched: --out {out} is not empty: choose a new folder\n")
        return 2
    specs = {}
    for cell in cells:
        d = os.path.join(out, cell["name"])
        os.makedirs(os.path.join(d, "runs"), exist_ok=True)
        os.makedirs(os.path.join(d, "logs"), exist_ok=True)
        specs[cell["name"]] = runner.BenchSpec(
            peers=chosen, skipped=[], libraries=libraries, command=cell["command"], rounds=a.rounds, out=d,
            baseline=BASELINE, timeout_s=a.timeout, title=f"wdl {cell['name']}", argv=["python", "-m", "rtkit.bench.sched"],
            progress=not a.no_progress)
    from rtkit.workloads import data
    data.ensure_dataset(rows=a.rows, progress=sys.stderr.isatty())
    sys.stderr.write(f"rtkit.bench.sched: {len(order)} runs ({len(cells)} cells x {len(names)} configurations x "
                     f"{a.rounds} rounds), about {est / 60:.0f} min on a quiet 2-core host; output {out}\n")
    progress = _Progress(len(order), a.rounds, enabled=not a.no_progress)
    machine = output.machine_info()
    base_env = dict(os.environ)
    start_iso, t0 = runner._now_iso(), time.monotonic()
    by_name = {p.name: p for p in chosen}
    runs: List[Dict[str, Any]] = []
    recs: Dict[str, List[Dict]] = {c["name"]: [] for c in cells}
    bench: Dict[str, Any] = {}
    interrupted = False

    def write():
        bench.update({
            "schema_version": 1, "command_line": " ".join(["python", "-m", "rtkit.bench.sched", *(argv or sys.argv[1:])]),
            "settings": {"steps": a.steps, "rounds": a.rounds, "batch": a.batch, "rows": a.rows,
                         "latency_ms": a.latency_ms, "inputs": a.inputs, "apis": a.apis, "configs": names},
            "start_time": start_iso, "duration_s": round(time.monotonic() - t0, 1), "machine": machine,
            "complete": not interrupted and len(runs) == len(order),
            "rows": summarize(cells, names, runs), "runs": runs})
        atomic.write_json(os.path.join(out, "sched.json"), bench)
        atomic.write_text(os.path.join(out, "sched.md"), render(bench))

    try:
        for pos, (k, cell, name) in enumerate(order):
            progress.cell = cell["name"]
            spec = specs[cell["name"]]
            try:
                rec = runner.run_one(spec, by_name[name], k, pos, progress, base_env)
            except runner._Interrupted as stop:
                rec, interrupted = stop.record, True
            rec["cell"] = cell["name"]
            rec["wall_ms"] = _wall_ms(rec["log"])
            rec["sched"] = _sched_figures(rec["run_dir"])
            runs.append(rec)
            recs[cell["name"]].append(rec)
            progress.finished(runner._result_line(rec) + (f", wall {rec['wall_ms']:.1f} ms/step" if rec["wall_ms"] else ""))
            runner.write_outputs(spec, runner.assemble(spec, recs[cell["name"]], [], start_iso, t0, machine,
                                                       complete=False))
            write()
            if interrupted:
                break
    except KeyboardInterrupt:
        interrupted = True
    write()
    sys.stdout.write(render(bench))
    sys.stderr.write(f"rtkit.bench.sched: wrote {os.path.join(out, 'sched.md')} and sched.json\n")
    if interrupted:
        return 130
    return 1 if any(r["status"] != "ok" or not r["wall_ms"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
