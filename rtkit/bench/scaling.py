# scaling.py -- `python -m rtkit.bench.scaling`: the thread-scaling bench: the wdl census replayed by 1..N threads under every peer allocator, then wdl itself at 1..N inter/intra-op threads.
"""Part 1 (replay): allocators/bench/scaling_replay.c runs THREADS threads; each does one thread's share of a
wdl training step every step: the sizes and lifetimes of rtkit/bench/census.py's pattern, every page written once,
a share of the blocks freed by the next thread in the next step, rtkit_step_mark() at the end of each step (so
rtkit profiles and plans as it does under TensorFlow). Every (threads, peer) pair is one process; the rounds
interleave them (per thread count, the peers rotated every round: A B C, B C A, ...). Per run, over the steps
after --warmup (by default past rtkit's longest profiling): the median step time, minor faults a step (getrusage
of the process) and voluntary context switches a step inside the threads' allocation phases (getrusage(RUSAGE_THREAD) around them, summed over the threads: the times a
thread blocked in the kernel while allocating or freeing, i.e. futex waits on allocator locks and mmap/fault waits
on the address-space lock; the step barriers are outside it). The table shows the medians over rounds and the
ratio of the step time to glibc's at the same thread count.

Part 2 (workload): the bundled wdl workload under `rtkit run` (rtkit/bench/runner.py) with
--threads-inter N --threads-intra N for every N, each configuration interleaved as in `rtkit bench`.

Output: the tables on stdout, and <out>/scaling.json, <out>/scaling.md; part 2's runs under <out>/workload/."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from rtkit import atomic
from rtkit import config as _config
from rtkit.bench import census, output, peers, runner, stats
from rtkit.report import alloc_steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLAY_SOURCE = os.path.join(REPO, "allocators", "bench", "scaling_replay.c")
DEFAULT_PEERS = ("glibc", "rtkit", "jemalloc", "tcmalloc", "mimalloc")
WORKLOAD_CONFIGS = ("glibc", "rtkit")
BASELINE = "glibc"
PROG = "python -m rtkit.bench.scaling"
STATE_NAMES = {0: "disabled", 1: "passthrough", 2: "profiling", 3: "planned"}


class BenchError(ValueError):
    """Bad input: the message is the one line shown to the user (exit 2)."""


def default_threads(cores: Optional[int] = None) -> List[int]:
    """1, 2, 4, ... below the core count, then the core count itself."""
    cores = max(1, cores or os.cpu_count() or 1)
    got, n = [], 1
    while n < cores:
        got.append(n)
        n *= 2
    return got + [cores]


def parse_threads(text: str) -> List[int]:
    try:
        got = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        got = []
    if not got or any(n < 1 or n > 1024 for n in got) or len(set(got)) != len(got):
        raise BenchError(f"--threads {text!r}: expected distinct whole numbers 1..1024, e.g. 1,2,4,8,16")
    return got


def _settings_env(items: Sequence[str]) -> Dict[str, str]:
    """--set key=value (rtkit settings for the rtkit peer) -> RTKIT_* variables."""
    env = {}
    for item in items:
        key, eq, value = item.partition("=")
        try:
            setting = _config.lookup(key.strip())
            setting.parse(value.strip())
        except (_config.ConfigError, ValueError) as exc:
            raise BenchError(f"--set {item!r}: {exc} (expected KEY=VALUE with a key of `rtkit config --list`)") \
                from None
        if not eq:
            raise BenchError(f"--set {item!r}: expected KEY=VALUE")
        env[setting.env] = value.strip()
    return env


def build_replay(out_dir: str) -> str:
    """Compile scaling_replay.c with the project's native build (allocators/build.py) into out_dir."""
    build_py = os.path.join(REPO, "allocators", "build.py")
    if not os.path.exists(REPLAY_SOURCE) or not os.path.exists(build_py):
        raise BenchError(f"the replay program's source {REPLAY_SOURCE} is not here: run the bench from a checkout")
    spec = importlib.util.spec_from_file_location("_rtkit_native_build", build_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_bench_program(REPLAY_SOURCE, out_dir)


def replay_env(peer: peers.Peer, library: Optional[str], run_dir: str, rtkit_env: Dict[str, str],
               base: Dict[str, str]) -> Dict[str, str]:
    """The replay process's environment: the peer's (its library preloaded, its variables), and for rtkit its
    settings as RTKIT_* variables with a run directory for its stats file."""
    env = {k: v for k, v in base.items() if k not in peers.CONTROLLED_ENV}
    env.update(peer.env)
    if peer.library == peers.RTKIT_MALLOC_LIBRARY:
        for key, value in peer.settings.items():
            setting = _config.lookup(key)
            if setting.c:
                env[setting.env] = value
        env.update(rtkit_env)
        env["RTKIT_RUN_DIR"] = run_dir
    if library:
        env["LD_PRELOAD"] = library
    return env


def _allocator_stats(run_dir: str) -> Dict[str, Any]:
    """rtkit's own stats file of the run (allocator-<pid>.json), or {} when it left none."""
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
        if name.startswith("allocator-") and name.endswith(".json"):
            try:
                return alloc_steps.load_file(os.path.join(run_dir, name))
            except (OSError, ValueError):
                return {}
    return {}


def default_warmup(rtkit_env: Dict[str, str]) -> int:
    """Steps before the figures: rtkit's warm-up and its longest profiling (malloc_profile_start +
    malloc_profile_max, as set for its runs), so every peer is measured over steps where rtkit has its plan."""
    total = 1
    for key in ("malloc_profile_start", "malloc_profile_max"):
        setting = _config.lookup(key)
        text = rtkit_env.get(setting.env, os.environ.get(setting.env))
        total += int(setting.parse(text)) if text is not None else int(setting.default)
    return total


def run_metrics(result: Dict[str, Any], warmup: int) -> Dict[str, Optional[float]]:
    """The figures of one replay run over its steps after `warmup` (all steps when there are no more)."""
    steps = len(result.get("step_ms") or [])
    start = warmup if warmup < steps else 0

    def tail(key):
        return [float(v) for v in (result.get(key) or [])[start:]]

    def mean(values):
        return sum(values) / len(values) if values else None

    ms = tail("step_ms")
    return {"step_ms_median": statistics.median(ms) if ms else None,
            "minor_faults_per_step": mean(tail("minor_faults")),
            "voluntary_switches_per_step": mean(tail("voluntary_switches")),
            "involuntary_switches_per_step": mean(tail("involuntary_switches"))}


def run_replay(program: str, pattern_path: str, peer: peers.Peer, library: Optional[str], threads: int,
               round_no: int, a: argparse.Namespace, out: str, rtkit_env: Dict[str, str]) -> Dict[str, Any]:
    tag = f"{peer.name}-t{threads}-r{round_no}"
    run_dir = os.path.join(out, "replay", tag)
    os.makedirs(run_dir, mode=0o700)
    rec: Dict[str, Any] = {"peer": peer.name, "threads": threads, "round": round_no, "run_dir": run_dir,
                           "status": "failed", "exit_code": None, "error": None, "allocator_state": None}
    argv = [program, pattern_path, str(threads), str(a.steps), str(a.hold_steps), str(a.cross_percent)]
    env = replay_env(peer, library, run_dir, rtkit_env, dict(os.environ))
    try:
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        rec.update(status="timeout", error=f"ran past --timeout {a.timeout:g} s")
        return rec
    rec["exit_code"] = proc.returncode
    err = proc.stderr.decode(errors="replace").strip()
    try:
        result = json.loads(proc.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = None
    if proc.returncode != 0 or not isinstance(result, dict):
        rec["error"] = err.splitlines()[-1] if err else f"exit code {proc.returncode}, no result line"
        return rec
    rec.update(status="ok", result=result, **run_metrics(result, a.warmup))
    if peer.library == peers.RTKIT_MALLOC_LIBRARY:
        own = _allocator_stats(run_dir)
        rec["allocator_state"] = own.get("state") or STATE_NAMES.get(result.get("rtkit_state"))
        rec["plan_step"] = (own.get("plan") or {}).get("made_at_step")
    return rec


def replay_order(names: Sequence[str], threads: Sequence[int], rounds: int) -> List[tuple]:
    """(round, threads, peer): per round every thread count, and within it the peers rotated by the round."""
    order = []
    for k, rotated in enumerate(stats.rotation(list(names), rounds), start=1):
        for n in threads:
            order += [(k, n, name) for name in rotated]
    return order


def summarize_replay(runs: Sequence[Dict[str, Any]], names: Sequence[str], threads: Sequence[int]) -> List[Dict]:
    """One row per (threads, peer): medians over the rounds that ran, the step ratio to glibc's median."""
    rows = []
    keys = ("step_ms_median", "minor_faults_per_step", "voluntary_switches_per_step", "involuntary_switches_per_step")
    for n in threads:
        group = {}
        for name in names:
            ok = [r for r in runs if r["threads"] == n and r["peer"] == name and r["status"] == "ok"]
            row = {"threads": n, "peer": name, "runs_ok": len(ok),
                   "runs": len([r for r in runs if r["threads"] == n and r["peer"] == name])}
            for key in keys:
                row[key] = stats.median([r.get(key) for r in ok])
            states = sorted({r["allocator_state"] for r in ok if r.get("allocator_state")})
            row["allocator_state"] = "/".join(states) if states else None
            row["plan_step_max"] = max((r["plan_step"] for r in ok if r.get("plan_step") is not None), default=None)
            group[name] = row
        base = group.get(BASELINE, {}).get("step_ms_median")
        for name in names:
            group[name]["step_ratio_to_glibc"] = stats.ratio(group[name]["step_ms_median"], base)
            rows.append(group[name])
    return rows


def _ratio(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def window_notes(runs: Sequence[Dict[str, Any]], warmup: int, steps: int) -> List[str]:
    """Say when the figures' window is not the planned steady state it is meant to be."""
    notes = []
    if warmup >= steps:
        notes.append(f"--warmup {warmup} >= --steps {steps}: the figures cover every step, warm-up included")
    late = sorted({(r["threads"], r["round"]) for r in runs if r.get("allocator_state") is not None and
                   (r.get("plan_step") is None or r["plan_step"] >= warmup)})
    if late:
        notes.append("rtkit had not planned before the figures' window in runs (threads, round) "
                     f"{', '.join(map(str, late))}: their figures include its profiling (raise --warmup)")
    return notes


def _num(v: Optional[float], digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _state(row: Dict[str, Any]) -> str:
    if not row["allocator_state"]:
        return "-"
    plan = row.get("plan_step_max")
    return row["allocator_state"] + (f" ({plan})" if plan is not None else "")


def replay_table(rows: Sequence[Dict[str, Any]]) -> str:
    lines = ["| threads | allocator | step ms (median) | vs glibc | minor faults/step | lock waits/step "
             "(voluntary cs) | preemptions/step (involuntary cs) | rtkit state (plan at step) | runs ok |",
             "|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['peer']} | {_num(r['step_ms_median'])} | "
                     f"{_ratio(r['step_ratio_to_glibc'])} | {_num(r['minor_faults_per_step'], 1)} | "
                     f"{_num(r['voluntary_switches_per_step'], 1)} | {_num(r['involuntary_switches_per_step'], 1)} | "
                     f"{_state(r)} | {r['runs_ok']}/{r['runs']} |")
    return "\n".join(lines)


# ---- part 2: the bundled workload at 1..N inter/intra-op threads

def workload_peers(chosen: Sequence[peers.Peer], threads: Sequence[int]) -> List[peers.Peer]:
    """One configuration per (peer, N): the peer with --threads-inter N --threads-intra N on the workload."""
    return [dataclasses.replace(p, name=f"{p.name}@{n}", args=[*p.args, "--threads-inter", str(n),
                                                                  "--threads-intra", str(n)])
            for n in threads for p in chosen]


def summarize_workload(bench: Dict[str, Any], names: Sequence[str], threads: Sequence[int]) -> List[Dict]:
    med = bench.get("medians") or {}
    rows = []
    for n in threads:
        base = (med.get(f"{BASELINE}@{n}") or {}).get("step_ms_median")
        for name in names:
            m = med.get(f"{name}@{n}") or {}
            counts = (bench.get("counts") or {}).get(f"{name}@{n}") or {}
            rows.append({"threads": n, "config": name, "step_ms_median": m.get("step_ms_median"),
                         "step_ratio_to_glibc": stats.ratio(m.get("step_ms_median"), base),
                         "minor_faults_per_step": m.get("minor_faults_per_step"),
                         "peak_rss_bytes": m.get("peak_rss_bytes"), "runs_ok": counts.get("ok", 0)})
    return rows


def workload_table(rows: Sequence[Dict[str, Any]]) -> str:
    lines = ["| inter = intra threads | configuration | step ms (median) | vs glibc | minor faults/step | peak RSS MiB "
             "| runs ok |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        rss = r["peak_rss_bytes"]
        lines.append(f"| {r['threads']} | {r['config']} | {_num(r['step_ms_median'])} | "
                     f"{_ratio(r['step_ratio_to_glibc'])} | {_num(r['minor_faults_per_step'], 1)} | "
                     f"{'-' if rss is None else f'{rss / (1 << 20):.0f}'} | {r['runs_ok']} |")
    return "\n".join(lines)


def _args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description="Thread-scaling bench: the wdl workload's allocation census replayed by 1..N threads "
                               "under every peer allocator (interleaved rounds), then wdl at 1..N inter/intra-op "
                               "threads. Writes scaling.md and scaling.json.")
    p.add_argument("--threads", default=None, help="thread counts, e.g. 1,2,4,8,16 (default 1, 2, 4, ... up to "
                                                   "os.cpu_count())")
    p.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                   help=f"allocators of the replay; those whose library is missing are skipped with a note "
                        f"(default {','.join(DEFAULT_PEERS)}; glibc is the ratios' baseline)")
    p.add_argument("--rounds", type=int, default=5, help="replay rounds (default 5)")
    p.add_argument("--steps", type=int, default=40, help="replay steps per run (default 40)")
    p.add_argument("--warmup", type=int, default=None,
                   help="replay steps left out of the figures, for every peer (default rtkit's malloc_profile_start + "
                        "malloc_profile_max + 1 = 23: rtkit has planned before the figures start)")
    p.add_argument("--scale", type=float, default=1.0, help="share of the census's blocks per thread and step "
                                                            "(default 1: one whole wdl step per thread)")
    p.add_argument("--hold-steps", type=int, default=8, help="steps a long-lived block stays live (default 8)")
    p.add_argument("--cross-percent", type=int, default=25,
                   help="share of the step's blocks freed by another thread in the next step (default 25)")
    p.add_argument("--census", default=None, help="census record (default the bundled rtkit/bench/wdl_census.json)")
    p.add_argument("--record-census", default=None, metavar="PATH",
                   help="record a new census from two real wdl runs under `rtkit run`, write it to PATH and exit")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an rtkit setting for the rtkit peer of the replay (repeatable), e.g. malloc_profile_start=0")
    p.add_argument("--no-workload", action="store_true", help="replay only: skip part 2 (wdl at 1..N threads)")
    p.add_argument("--workload-configs", default=",".join(WORKLOAD_CONFIGS),
                   help=f"configurations of part 2, as `rtkit bench --configs` (default {','.join(WORKLOAD_CONFIGS)})")
    p.add_argument("--workload-rounds", type=int, default=2, help="rounds of part 2 (default 2)")
    p.add_argument("--workload-steps", type=int, default=20, help="wdl steps per run in part 2 (default 20)")
    p.add_argument("--batch", type=int, default=2048, help="wdl batch in part 2 (default 2048)")
    p.add_argument("--out", default=None, help="output folder (default rtkit-bench/scaling-<time>; must be new)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take (default 300)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    a = p.parse_args(argv)
    for name in ("rounds", "steps", "workload_rounds", "workload_steps", "batch", "hold_steps"):
        if getattr(a, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} {getattr(a, name)}: expected a whole number >= 1")
    if a.warmup is not None and a.warmup < 0:
        raise BenchError(f"--warmup {a.warmup}: expected a whole number >= 0")
    if not 0 <= a.cross_percent <= 100:
        raise BenchError(f"--cross-percent {a.cross_percent}: expected 0..100")
    if not 0 < a.scale <= 16:
        raise BenchError(f"--scale {a.scale}: expected a share > 0 and <= 16")
    if a.timeout <= 0:
        raise BenchError(f"--timeout {a.timeout}: expected seconds > 0")
    return a


def _available(names: Sequence[str], what: str) -> tuple:
    try:
        chosen = peers.select(names)
    except peers.PeerError as exc:
        raise BenchError(f"{what}: {exc}") from None
    lib_dirs = list(peers.DEFAULT_LIB_DIRS)
    got, libraries, notes = [], {}, []
    for p in chosen:
        path = p.resolve_library(lib_dirs) if p.library else None
        if p.library and not path:
            notes.append(p.missing_note(lib_dirs))
            continue
        got.append(p)
        libraries[p.name] = path
    return got, libraries, notes


def _say(a: argparse.Namespace, text: str) -> None:
    if not a.no_progress:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def render(bench: Dict[str, Any]) -> str:
    s = bench["settings"]
    parts = [f"# Thread scaling ({bench['machine'].get('cpus')} cores)", "",
             f"`{bench['command_line']}`", "",
             f"## Replay of the wdl census ({s['blocks_per_thread_step']:.0f} blocks, "
             f"{s['bytes_per_thread_step'] / (1 << 20):.1f} MiB a thread a step, "
             f"{s['long_lived_blocks']:.0f} long-lived for {s['hold_steps']} steps, {s['cross_percent']}% freed by "
             f"another thread; {s['steps']} steps, figures after {s['warmup']}; {s['rounds']} interleaved rounds)", "",
             replay_table(bench["replay"]["rows"]), "",
             "lock waits: voluntary context switches inside the threads' allocation phases (getrusage(RUSAGE_THREAD)"
             " around them, summed over threads): blocking in futex waits on allocator locks or on the "
             "address-space lock (mmap, munmap, page faults); barriers between steps excluded."]
    if bench.get("workload"):
        w = bench["workload"]
        parts += ["", f"## wdl at inter = intra-op threads ({w['steps']} steps, batch {w['batch']}, "
                      f"{w['rounds']} interleaved rounds)", "", workload_table(w["rows"])]
    if bench.get("notes"):
        parts += ["", "Notes:"] + [f"- {n}" for n in bench["notes"]]
    return "\n".join(parts) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return _main(argv)
    except (BenchError, census.CensusError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2


def _main(argv: Optional[Sequence[str]]) -> int:
    a = _args(argv)
    if a.record_census:
        work = a.record_census + ".runs"
        try:
            os.makedirs(work, mode=0o700)
        except OSError as exc:
            raise BenchError(f"--record-census {a.record_census}: cannot make {work} for its runs "
                             f"({exc.strerror}): choose a new path") from None
        atomic.write_json(a.record_census, census.record(work, runner.rtkit_command()))
        print(f"census recorded: {a.record_census} (runs in {work})")
        return 0
    threads = parse_threads(a.threads) if a.threads else default_threads()
    rtkit_env = _settings_env(a.set)
    if a.warmup is None:
        a.warmup = default_warmup(rtkit_env)
    chosen, libraries, notes = _available([n.strip() for n in a.peers.split(",")], "--peers")
    names = [p.name for p in chosen]
    if BASELINE not in names:
        raise BenchError(f"--peers must include {BASELINE} (the ratios' baseline)")
    wchosen, wlibs, wnotes = [], {}, []
    if not a.no_workload:
        wchosen, wlibs, wnotes = _available([n.strip() for n in a.workload_configs.split(",")], "--workload-configs")
        if BASELINE not in [p.name for p in wchosen]:
            raise BenchError(f"--workload-configs must include {BASELINE} (the ratios' baseline)")
    for note in notes + wnotes:
        _say(a, f"{PROG}: {note}")
    rows = census.pattern(census.load(a.census))
    whole = census.scaled(rows, a.scale)
    out = a.out or os.path.join("rtkit-bench", "scaling-" + time.strftime("%Y%m%d-%H%M%S"))
    if os.path.isdir(out) and os.listdir(out):
        raise BenchError(f"--out {out} is not empty: choose a new folder")
    os.makedirs(os.path.join(out, "replay"), exist_ok=True)
    program = build_replay(os.path.join(out, "bin"))
    pattern_path = os.path.join(out, "pattern.txt")
    census.write_pattern(pattern_path, whole, a.census or "rtkit/bench/wdl_census.json")
    shape = census.summary(whole)
    machine = output.machine_info()
    bench: Dict[str, Any] = {
        "schema_version": 1, "command_line": " ".join([PROG, *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine, "start_time": runner._now_iso(),
        "settings": {"threads": threads, "peers": names, "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
                     "scale": a.scale, "hold_steps": a.hold_steps, "cross_percent": a.cross_percent,
                     "rtkit_settings": rtkit_env, "blocks_per_thread_step": shape["blocks"],
                     "bytes_per_thread_step": shape["bytes"], "long_lived_blocks": shape["long_lived_blocks"]},
        "notes": notes + wnotes, "replay": {"runs": [], "rows": []}, "workload": None}
    t0 = time.monotonic()
    order = replay_order(names, threads, a.rounds)
    by_name = {p.name: p for p in chosen}
    failed = 0
    for i, (k, n, name) in enumerate(order, start=1):
        rec = run_replay(program, pattern_path, by_name[name], libraries[name], n, k, a, out, rtkit_env)
        bench["replay"]["runs"].append(rec)
        failed += rec["status"] != "ok"
        _say(a, f"replay {i}/{len(order)} r{k} {name} threads={n}: {rec['status']} "
                f"{_num(rec.get('step_ms_median'))} ms/step {rec.get('error') or ''}".rstrip())
    bench["replay"]["rows"] = summarize_replay(bench["replay"]["runs"], names, threads)
    bench["notes"] += window_notes(bench["replay"]["runs"], a.warmup, a.steps)
    if not a.no_workload:
        wnames = [p.name for p in wchosen]
        from rtkit.workloads import data
        data.ensure_dataset(progress=False)
        wpeers = workload_peers(wchosen, threads)
        spec = runner.BenchSpec(
            peers=wpeers, skipped=[], libraries={p.name: wlibs[p.name.split("@")[0]] for p in wpeers},
            command=runner.workload_command("wdl", a.workload_steps, a.batch, None, None, ["--no-progress"]),
            rounds=a.workload_rounds, out=os.path.join(out, "workload"), baseline=f"{BASELINE}@{threads[0]}",
            timeout_s=a.timeout, title="wdl at inter = intra-op threads", argv=[PROG], progress=not a.no_progress)
        wbench = runner.run_bench(spec)
        failed += sum(1 for r in wbench["runs"] if r["status"] != "ok")
        bench["workload"] = {"steps": a.workload_steps, "batch": a.batch, "rounds": a.workload_rounds,
                             "configs": wnames, "bench_json": os.path.join(out, "workload", "bench.json"),
                             "rows": summarize_workload(wbench, wnames, threads)}
    bench["duration_s"] = round(time.monotonic() - t0, 1)
    text = render(bench)
    atomic.write_json(os.path.join(out, "scaling.json"), bench)
    atomic.write_text(os.path.join(out, "scaling.md"), text)
    sys.stdout.write(text)
    _say(a, f"{PROG}: {bench['duration_s']:.0f} s; output {out}/scaling.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
