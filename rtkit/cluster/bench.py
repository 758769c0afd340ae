# bench.py -- cluster benchmarks: merge time for thousands of task dirs; rtkit launch against a bare TF cluster.
"""Benchmarks, not tests (run by hand; figures go to docs/cluster.md)::

    python -m rtkit.cluster.bench merge --tasks 3000
    python -m rtkit.cluster.bench launch --ps 2 --workers 2 --rounds 3 -- wdl --steps 200 --batch 1024

``launch`` runs the same cluster of the bundled workload A B A B...: A = bare (each task a plain
``python -m rtkit.workloads`` process with its TF_CONFIG, started by this script), B = ``rtkit launch``,
optionally C = ``rtkit launch --ps-set tier_pool_path=/dev/shm/...-{task}`` (tier mode on the PS tasks).
Per round: cluster examples/s = the sum of the workers' own printed examples_per_s, and each PS's
peak RSS = its ru_maxrss (wait4 on the bare PS; the PS report's peak for rtkit, which includes wait4's
ru_maxrss of the same process); CPU ms per training step of every process of the cluster and of the
workers' loops alone (cpuwatch.py: CPU time holds on a busy machine, where examples/s is noise).
Medians over the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from rtkit.cluster import cpuwatch, merge, render
from rtkit.cluster.launcher import build_cluster
from rtkit.cluster.spec import tf_config
from rtkit.cluster.taskdir import TIMELINE_POINTS


def make_synthetic(folder: str, tasks: int, ps: int, steps: int = 1000, seed: int = 0) -> None:
    """`tasks` task dirs (ps PS tasks, the rest workers; 2% of workers restarted once) like rtkit run writes."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    for n in range(tasks):
        role, index = ("ps", n) if n < ps else ("worker", n - ps)
        attempts = 2 if role == "worker" and rng.random() < 0.02 else 1
        for attempt in range(attempts):
            d = os.path.join(folder, f"{role}-{index}" + (f".restart{attempt}" if attempt else ""))
            os.mkdir(d)
            ms = rng.gauss(40.0, 4.0) * (2.0 if rng.random() < 0.01 else 1.0)
            n_steps = 0 if role == "ps" else (steps // 3 if attempt + 1 < attempts else steps)
            rec = {"task_schema": 1, "role": role, "index": index, "attempt": attempt, "address": f"h{n}:2222",
                   "is_chief": n == ps, "source": "TF_CONFIG", "cluster": {},
                   "status": "killed" if attempt + 1 < attempts else "ok", "exit_code": 0, "signal": None,
                   "start_unix": 1e9 + rng.random() * 5, "duration_s": steps * ms / 1000, "steps": n_steps,
                   "step_ms_median": None if role == "ps" else round(ms, 3),
                   "steps_per_s": None if role == "ps" else round(1000 / ms, 3),
                   "minor_faults_per_step": 20, "peak_rss_bytes": rng.randint(1 << 29, 1 << 31),
                   "allocator_state": "planned",
                   "steps_timeline": [[round(i * n_steps * ms / 1000 / 59, 3), round(i * n_steps / 59)]
                                      for i in range(TIMELINE_POINTS)] if n_steps else [],
                   "rss_timeline": [[i * 0.5, 1 << 30] for i in range(TIMELINE_POINTS)]}
            with open(os.path.join(d, "task.json"), "w") as fh:
                json.dump(rec, fh, indent=1)      # as rtkit run writes it (rtkit.atomic.write_json)
            with open(os.path.join(d, "report.json"), "w") as fh:
                json.dump({"schema_version": 1, "run": {"status": rec["status"]}, "cluster": {"role": role}}, fh)


def bench_merge(tasks: int, ps: int, rounds: int) -> None:
    folder = tempfile.mkdtemp(prefix="rtkit-merge-bench-")
    try:
        t = time.perf_counter()
        make_synthetic(folder, tasks, ps)
        print(f"made {tasks} task dirs in {time.perf_counter() - t:.1f} s ({folder})")
        for r in range(rounds):
            t0 = time.perf_counter()
            m = merge.merge(folder)
            t1 = time.perf_counter()
            text = render.render_text(m)
            t2 = time.perf_counter()
            html = render.render_html(m)
            t3 = time.perf_counter()
            print(f"round {r + 1}: merge {t1 - t0:.2f} s ({len(m['tasks'])} runs, {len(m['stragglers'])} stragglers), "
                  f"terminal {t2 - t1:.2f} s, html {t3 - t2:.2f} s ({len(text) // 1024} KiB text, "
                  f"{len(html) // 1024} KiB html)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------ launch A/B

_EPS = re.compile(r"examples_per_s=([0-9.]+)")
_LOOP = re.compile(r"steps=(\d+) .*train_cpu_s=([0-9.]+) train_start_unix=([0-9.]+) train_end_unix=([0-9.]+)")


def _cpu(text: str, watcher: cpuwatch.Watcher) -> dict:
    """CPU per training step, from the workers' summary lines (steps, their loop's own CPU and wall window)
    and the watcher's samples of every process in the window from the first loop's start to the last's end:
    ms per step of the training processes' loops alone, of each kind of process, and of all of them."""
    loops = [(int(m[0]), float(m[1]), float(m[2]), float(m[3])) for m in _LOOP.findall(text)]
    steps = sum(x[0] for x in loops)
    if not loops or not steps:
        return {}
    t0, t1 = min(x[2] for x in loops), max(x[3] for x in loops)
    kinds = watcher.cpu_in(t0, t1)
    per = {k: 1000.0 * v / steps for k, v in kinds.items()}
    groups: Dict[str, float] = {}
    for k, v in per.items():
        group = ("ps" if k.startswith("ps-") else "train") + " " + k.split(" ")[-1] if " " in k else k
        groups[group] = groups.get(group, 0.0) + v
    return {"steps": steps, "window_s": t1 - t0, "loop_ms_per_step": 1000.0 * sum(x[1] for x in loops) / steps,
            "all_ms_per_step": sum(per.values()), "groups": groups, "kinds": per}


def _bare_round(cluster: Dict[str, List[str]], command: List[str]) -> dict:
    procs = {}
    for role in ("ps", "chief", "worker"):
        for i in range(len(cluster.get(role, []))):
            env = dict(os.environ, TF_CONFIG=tf_config(cluster, role, i))
            procs[(role, i)] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                text=True, stdin=subprocess.DEVNULL)
    eps, rss, text = [], {}, ""
    for (role, i), p in procs.items():
        if role != "ps":
            out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"bare {role}:{i} failed with exit code {p.returncode}")
            eps += [float(x) for x in _EPS.findall(out)]
            text += out
    for (role, i), p in procs.items():
        if role == "ps":
            p.send_signal(signal.SIGTERM)
            _, _, ru = os.wait4(p.pid, 0)
            p.returncode = 0
            p.stdout.close()
            rss[f"ps-{i}"] = ru.ru_maxrss * 1024
    return {"examples_per_s": sum(eps), "ps_peak_rss_bytes": rss, "stdout": text}


TIER_POOL = "/dev/shm/rtkit-cluster-bench-{task}"


def _rtkit_round(args, command: List[str], folder: str, tier: bool = False) -> dict:
    argv = [sys.executable, "-m", "rtkit", "launch", "--ps", str(args.ps), "--workers", str(args.workers),
            "--cluster-dir", folder, *sum((["--set", s] for s in args.set), []),
            *(["--ps-set", f"tier_pool_path={TIER_POOL}"] if tier else []), "--", *command]
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"rtkit launch failed with exit code {proc.returncode}: {proc.stderr[-2000:]}")
    eps = [float(x) for x in _EPS.findall(proc.stdout)]
    m = merge.merge(folder)
    for i in range(args.ps):
        try:
            os.unlink(TIER_POOL.format(task=f"ps-{i}"))
        except OSError:
            pass
    ps = [r for r in m["tasks"] if r["role"] == "ps"]
    return {"examples_per_s": sum(eps), "ps_peak_rss_bytes": {r["task"]: r["peak_rss_bytes"] for r in ps},
            "stdout": proc.stdout,
            "ps_anon": {r["task"]: r["rss_anon_peak_bytes"] for r in ps},
            "ps_pool": {r["task"]: r["tier_peak_bytes"] for r in ps},
            # what the chief's graph puts on each PS (variables, slots, hash tables; see docs/cluster.md)
            "ps_tables": {n: p["tables_bytes"] for n, p in ((m.get("ps_memory") or {}).get("by_ps") or {}).items()}}


def bench_launch(args) -> None:
    command = [sys.executable, "-m", "rtkit.workloads", *args.workload, "--no-progress"]
    warm = subprocess.run(command + ["--steps", "1"], capture_output=True, text=True,   # makes the data set once
                          env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    if warm.returncode != 0:
        raise SystemExit(f"the workload does not run: {warm.stderr[-2000:]}")
    modes = args.modes.split(",")
    results = {m: [] for m in modes}
    root = tempfile.mkdtemp(prefix="rtkit-launch-bench-")
    try:
        for r in range(args.rounds):
            for mode in modes:
                cluster = build_cluster(args.ps, args.workers, False)
                t = time.perf_counter()
                watcher = cpuwatch.Watcher().start()
                try:
                    res = (_bare_round(cluster, command) if mode == "bare"
                           else _rtkit_round(args, command, os.path.join(root, f"r{r}-{mode}"), mode == "rtkit-tier"))
                finally:
                    watcher.stop()
                res["wall_s"] = time.perf_counter() - t
                res["cpu"] = _cpu(res.pop("stdout"), watcher)
                results[mode].append(res)
                rss = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(res["ps_peak_rss_bytes"].items()))
                if res.get("ps_anon"):
                    rss += "; anon " + ", ".join(f"{k} {_mib(v)}" for k, v in sorted(res["ps_anon"].items()))
                    rss += "; pool " + ", ".join(f"{k} {_mib(v)}" for k, v in sorted(res["ps_pool"].items()))
                if res.get("ps_tables"):
                    rss += "; tables " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(res["ps_tables"].items()))
                print(f"round {r + 1} {mode:5}: {res['examples_per_s']:9.1f} examples/s  PS peak RSS: {rss}  "
                      f"({res['wall_s']:.1f} s)", flush=True)
                if res["cpu"]:
                    print("  " + _cpu_line(res["cpu"]), flush=True)
        print("medians:")
        for mode, rows in results.items():
            eps = statistics.median(x["examples_per_s"] for x in rows)
            names = sorted(rows[0]["ps_peak_rss_bytes"])
            rss = ", ".join(f"{n} {statistics.median(x['ps_peak_rss_bytes'][n] for x in rows) / 2**20:.0f} MiB"
                            for n in names)
            if rows[0].get("ps_anon"):
                rss += "; anon " + ", ".join(
                    f"{n} {_mib(_median_known(x['ps_anon'][n] for x in rows))}" for n in names)
            print(f"  {mode:5}: {eps:9.1f} examples/s  PS peak RSS: {rss}")
            print(f"         {_cpu_medians(rows)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cpu_line(cpu: dict) -> str:
    groups = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu["groups"].items()))
    return (f"CPU ms per training step: all processes {cpu['all_ms_per_step']:.1f} ({groups}); "
            f"the training loops' own {cpu['loop_ms_per_step']:.1f}  ({cpu['steps']} steps in {cpu['window_s']:.1f} s)")


def _cpu_medians(rows: List[dict]) -> str:
    cpus = [x["cpu"] for x in rows if x.get("cpu")]
    if not cpus:
        return "no CPU figures (no worker summary lines)"
    names = sorted({k for c in cpus for k in c["groups"]})
    groups = ", ".join(f"{n} {statistics.median(c['groups'].get(n, 0.0) for c in cpus):.1f}" for n in names)
    return (f"CPU ms/step: all {statistics.median(c['all_ms_per_step'] for c in cpus):.1f} ({groups}); "
            f"loops {statistics.median(c['loop_ms_per_step'] for c in cpus):.1f}")


def _mib(v) -> str:
    """A byte figure in MiB, or '-' where the task did not report it (anonymous and pool bytes come from the
    pool's section, which only tier mode writes)."""
    return "-" if v is None else f"{v / 2**20:.0f} MiB"


def _median_known(values):
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtkit.cluster.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("merge", help="merge time for N synthetic task directories")
    m.add_argument("--tasks", type=int, default=3000)
    m.add_argument("--ps", type=int, default=100)
    m.add_argument("--rounds", type=int, default=3)
    la = sub.add_parser("launch", help="rtkit launch against the same bare cluster, interleaved")
    la.add_argument("--ps", type=int, default=2)
    la.add_argument("--workers", type=int, default=2)
    la.add_argument("--rounds", type=int, default=3)
    la.add_argument("--set", action="append", default=[], help="rtkit setting for the rtkit rounds")
    la.add_argument("--modes", default="bare,rtkit",
                    help="interleaved per round, from bare, rtkit, rtkit-tier (PS tier pools in /dev/shm)")
    la.add_argument("workload", nargs=argparse.REMAINDER, help="after --: MODEL [workload options]")
    args = p.parse_args(argv)
    if args.what == "merge":
        bench_merge(args.tasks, args.ps, args.rounds)
    else:
        args.workload = [a for a in args.workload if a != "--"] or ["wdl"]
        bench_launch(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
