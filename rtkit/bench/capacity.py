# capacity.py -- `python -m rtkit.bench.capacity`: train embeddings sized past DRAM with the tier pool on local disk.
"""The capacity benchmark (not a test): the bundled wdl with its tables plus Adagrad slots sized to

  (a) half of DRAM, all in DRAM, and
  (b) 1.5x DRAM, tier mode with the pool on local disk,

each one `rtkit run` (so each has a full report; (b) under `--profile capacity`), then a table: step time,
examples/s, major faults per step, pool bytes resident over time, disk read/write bytes, peak anonymous
RSS, the last losses.

The tables are allocated unfilled and each row is initialised when an id first uses it (as DeepRec's
EmbeddingVariable; `rtkit.workloads.ev`), so starting a run costs seconds whatever the table size, and DRAM
and disk follow the pages the steps touch: with first-seen rows (packed) that is the data set's distinct
ids; `--row-assign hashed` scatters the same ids over every table, one page each. The data set is
`--ids zipf` (`rtkit.workloads.zipf`): power-law ids over `--distinct` ids a feature, drawn on the fly, so
that at the defaults (2000 steps of 2048, dim 64) the rows used reach ~26 GiB, past this machine's DRAM
(`touched_bytes` says how much before the runs start). `--compact-steps` adds hot-row compaction to (b);
`--promote-hot-rows N` moves the rows of ids met again to the first N rows of (b)'s tables (and of its size in DRAM).

(a)'s tables are smaller than (b)'s (a third at the defaults), so with first-seen rows they have every row used
long before (b)'s (at the defaults by about step 800 of 2000): from there (a)'s later ids wrap onto trained rows, and it makes no new rows and
touches no new pages, while (b) does to the end: (a)'s step is cheaper from there for a reason that is not the tier.
`--b-dram-steps N` also runs (b)'s size all in DRAM for its first N steps (as many as DRAM holds: a lazily filled
table needs only the rows its steps use) and compares (b) with it over those steps: the same work with and without
the tier. The output gives each run's quarters and where (a)'s tables fill.

`--dram-gb` is the DRAM the sizes are relative to (default: this machine's MemTotal). A scaled run sets
it small and gives the pool the same budget for its resident pages (`--resident-gb`, tier mode's
`tier_resident_max`), so (b) really keeps 1.5x its budget while only the budget stays in DRAM.

`--sweep 2,1,0.5,0.25` runs the capacity curve instead (`rtkit.bench.capacity_sweep`): per row layout
(`--sweep-rows`: first-seen, frequency, hashed) and per share of the rows used that fits in DRAM, a run
with that resident budget and no DRAM head against an all-in-DRAM run, into capacity-sweep.json and .svg.

Safety (there is no swap): it refuses to start (one line, exit 2) when the pool does not fit on its disk, (a)
does not fit in the memory available now, or the id -> row maps alone would pass `--max-anon-gb`; while a
run trains, MemAvailable and the run's anonymous RSS are read twice a second and the run is stopped (one
line, exit 1) when MemAvailable drops below `--min-available-gb` or (b)'s anonymous RSS passes
`--max-anon-gb`, before the OOM killer; Ctrl-C or SIGTERM stops the run's whole process tree.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from rtkit import atomic, pool_room, tree_guard
from rtkit.bench import capacity_sweep

GIB = 1 << 30
POOL_SLACK = 1.10          # pool size over the table bytes: initializer temporaries, extents, the 4 KiB headers
POOL_EXTRA = 2 * GIB


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--dram-gb", type=float, default=None, help="DRAM the sizes are relative to (default MemTotal)")
    p.add_argument("--a", dest="scale_a", type=float, default=0.5, help="(a) tables+slots as a share of DRAM")
    p.add_argument("--b", dest="scale_b", type=float, default=1.5, help="(b) tables+slots as a share of DRAM")
    p.add_argument("--pool-dir", default="/tmp", help="folder on local disk for (b)'s pool (default /tmp)")
    p.add_argument("--resident-gb", type=float, default=0.0,
                   help="pool pages kept in DRAM at most in (b) (tier_resident_max); 0: the kernel decides")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--emb-dim", type=int, default=64, help="embedding dimension (default 64: 520 bytes a row with "
                   "the wide weight and both Adagrad slots)")
    p.add_argument("--ids", choices=("zipf", "file"), default="zipf",
                   help="zipf: power-law ids drawn on the fly (default); file: the 200k-line cached file (few ids)")
    p.add_argument("--distinct", type=int, default=50_000_000, help="--ids zipf: distinct ids per feature")
    p.add_argument("--zipf-exponent", type=float, default=0.9, help="--ids zipf: the power law's exponent")
    p.add_argument("--feature-distinct-skew", type=float, default=1.0, metavar="K",
                   help="--ids zipf: tables of unequal use, feature f drawing from --distinct / K^(f/25) distinct ids "
                        "(the workload's option; default 1: every feature alike)")
    p.add_argument("--row-assign", choices=("first-seen", "frequency", "hashed"), default="first-seen",
                   help="id -> row: first-seen (default), frequency (the most frequent id at row 0) or hashed")
    p.add_argument("--sweep", default=None, metavar="SHARES",
                   help="the capacity curve instead of (a)/(b): per share of the used rows that fits in DRAM "
                        "(comma-separated, e.g. 2,1,0.5,0.25), a tier run with that resident budget against an "
                        "all-in-DRAM run, tables of --b x --dram-gb (rtkit.bench.capacity_sweep)")
    p.add_argument("--sweep-rows", default="first-seen,frequency,hashed", metavar="LAYOUTS",
                   help="--sweep: the row layouts to run (default first-seen,frequency,hashed)")
    p.add_argument("--compact-steps", type=int, default=0,
                   help="(b): move the most used rows to the front of each table every N steps (0: off)")
    p.add_argument("--compact-hot-rows", type=int, default=0,
                   help="(b): rows per feature kept for hot rows when compacting (default: --resident-gb's worth, "
                        "else capacity / 8)")
    p.add_argument("--dram-head-gb", type=float, default=None,
                   help="(b): the leading rows of every pooled table kept in anonymous DRAM, never written to the "
                        "pool file (tier_dram_head; default: half of DRAM or of MemAvailable, whichever is less; 0 "
                        "with --resident-gb, whose runs act out a small DRAM)")
    p.add_argument("--max-anon-gb", type=float, default=6.0,
                   help="stop (b) when its anonymous RSS passes this plus --dram-head-gb (default 6): the tables "
                        "belong in the pool")
    p.add_argument("--promote-hot-rows", type=int, default=0, metavar="N",
                   help="(b) and its size in DRAM: the first N rows of each table kept for ids met a second time "
                        "(the workload's --promote-hot-rows: rows used again share pages; 0: off)")
    p.add_argument("--b-in-dram", action="store_true",
                   help="also run (b)'s size all in DRAM (scaled runs: the same model with and without the tier)")
    p.add_argument("--b-dram-steps", type=int, default=0, metavar="N",
                   help="also run (b)'s size all in DRAM for its first N steps (full scale: as many as DRAM holds), "
                        "and compare (b)'s first N steps with them: the same work, where (a)'s smaller tables stop "
                        "making rows once every row is used")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="an rtkit setting for (b) on top of the pool's (repeatable), e.g. tier_cold_hint=0")
    p.add_argument("--min-available-gb", type=float, default=1.5,
                   help="stop a run when MemAvailable drops below this (default 1.5)")
    p.add_argument("--out", default="rtkit-capacity", help="folder for the runs and capacity.json")
    return p


_last_line = [0.0, -1]


def _progress(label: str, step: int, steps: int, t0: float, note: str) -> None:
    """Redrawn in place on a terminal; elsewhere a line per quarter of the steps and every 30 s."""
    frac = min(step / max(steps, 1), 1.0)
    text = f"{label} [{'#' * int(frac * 30):<30}] {step}/{steps} {time.monotonic() - t0:6.1f}s {note}"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + text[:150].ljust(150))
    elif int(frac * 4) != _last_line[1] or time.monotonic() - _last_line[0] >= 30:
        _last_line[:] = [time.monotonic(), int(frac * 4)]
        sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _tree(root: int) -> Dict[int, int]:
    """RssAnon bytes of process `root` and of each of its descendants, by pid (`rtkit run` starts the job in a
    session of its own, so a process group would miss it), from /proc."""
    parent, anon = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("PPid:"):
                        parent[int(pid)] = int(line.split()[1])
                    elif line.startswith("RssAnon:"):
                        anon[int(pid)] = int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    out = {}
    for pid in parent:
        p, hops = pid, 0
        while p not in (root, 0, 1) and hops < 64:
            p, hops = parent.get(p, 0), hops + 1
        if p == root:
            out[pid] = anon.get(pid, 0)
    return out


def _anon_rss(root: int) -> int:
    return sum(_tree(root).values())


# the kernel's page-cache traffic, machine-wide (/proc/vmstat): what a tier run's "disk written" is made of
KERNEL_COUNTERS = ("nr_dirtied", "nr_written", "pgsteal_file", "pgsteal_direct", "workingset_refault_file",
                   "allocstall")


def _kernel_counters() -> Dict[str, int]:
    """KERNEL_COUNTERS now (allocstall: its zones summed); a counter this kernel lacks is left out."""
    out: Dict[str, int] = {}
    try:
        with open("/proc/vmstat") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                key = "allocstall" if key.startswith("allocstall_") else key
                if key in KERNEL_COUNTERS:
                    out[key] = out.get(key, 0) + int(value)
    except (OSError, ValueError):
        return {}
    return out


def kernel_line(name: str, k: Dict[str, int]) -> Optional[str]:
    """One line of a run's page-cache traffic (pages of 4 KiB, the whole machine over the run), or None."""
    if not k or "nr_dirtied" not in k:
        return None

    def m(key):
        return f"{k[key] / 1e6:.2f}M" if key in k else "-"
    return (f"({name}) page cache, whole machine over the run: {m('nr_dirtied')} pages dirtied, {m('nr_written')} "
            f"written back, {m('pgsteal_file')} file pages reclaimed ({m('pgsteal_direct')} of all pages by the "
            f"allocating threads' own reclaim, {k.get('allocstall', 0):,} stalls), {m('workingset_refault_file')} "
            f"file pages read again after reclaim")


KILL_GRACE_S = 10.0


def _kill_tree(proc) -> None:
    """SIGTERM the run and every process under it, SIGKILL what is left after KILL_GRACE_S. The tree is listed
    before the SIGTERM and kept: a root that exits during the grace period leaves its children to another
    parent, where a fresh listing of its tree no longer finds them. The SIGKILL round adds what a fresh listing
    finds (started meanwhile) and skips a listed pid whose start time changed (another process has it now)."""
    from rtkit.launch import start_ticks

    known = {pid: start_ticks(pid) for pid in _tree(proc.pid)}
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 0.0)):
        if sig == signal.SIGKILL:
            for pid in _tree(proc.pid):
                known.setdefault(pid, start_ticks(pid))
        pids = [pid for pid, started in known.items() if started is not None and start_ticks(pid) == started]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in pids)):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def workload_args(args, table_gb: float, compact: bool, promote: bool = False) -> List[str]:
    """The workload's command-line arguments for one run."""
    out = ["--table-gb", f"{table_gb:.3f}", "--steps", str(args.steps), "--batch", str(args.batch),
           "--emb-dim", str(args.emb_dim), "--row-assign", args.row_assign, "--table-fill", "lazy"]
    if args.ids == "zipf":
        out += ["--ids", "zipf", "--distinct", str(args.distinct), "--zipf-exponent", f"{args.zipf_exponent:g}"]
        if args.feature_distinct_skew != 1.0:
            out += ["--feature-distinct-skew", f"{args.feature_distinct_skew:g}"]
    if compact and args.compact_steps:
        out += ["--compact-steps", str(args.compact_steps), "--compact-hot-rows", str(hot_rows(args))]
    if promote and args.promote_hot_rows:
        out += ["--promote-hot-rows", str(args.promote_hot_rows)]
    return out + ["--no-progress", "--print-losses"]


def row_bytes(args) -> int:
    """Bytes of one id's row in all of wdl's tables: embedding and wide weight, each with its Adagrad slot."""
    return (args.emb_dim + 1) * 4 * 2


def capacity_rows(args, table_gb: float) -> int:
    from rtkit.workloads.data import NUM_CAT

    return max(1, int(table_gb * GIB // (row_bytes(args) * NUM_CAT)))


def hot_rows(args) -> int:
    """Rows per feature of the hot region compaction keeps: what the resident budget holds, else 1/8."""
    from rtkit.workloads.data import NUM_CAT

    if args.compact_hot_rows:
        return args.compact_hot_rows
    if args.resident_gb:
        return max(1, int(args.resident_gb * GIB // (row_bytes(args) * NUM_CAT)))
    return max(1, capacity_rows(args, args.scale_b * args.dram / GIB) // 8)


MAP_ENTRY_BYTES = 48   # MutableHashTable int64 -> int64: 47 bytes of RssAnon an entry, measured at 4M entries


def map_bytes(args, steps: Optional[int] = None) -> float:
    """Anonymous memory of the id -> row maps after a run's first `steps` steps (default: all; an entry per distinct
    id and feature)."""
    if args.ids != "zipf":
        return 0.0
    return _expected_distinct_all(args, steps) * MAP_ENTRY_BYTES


def touched_bytes(args, steps: Optional[int] = None) -> Optional[float]:
    """Expected bytes of the rows a run touches (first-seen rows: packed) in its first `steps` steps (default: all),
    or None for the file data set."""
    if args.ids != "zipf":
        return None
    return _expected_distinct_all(args, steps) * row_bytes(args)


def promoted_bytes(args, steps: Optional[int] = None) -> float:
    """Expected bytes of the second copies --promote-hot-rows makes in its first `steps` steps (at most the ids met
    twice, at most the hot region a feature), all features together."""
    if not args.promote_hot_rows or args.ids != "zipf":
        return 0.0
    from rtkit.workloads import zipf

    return zipf.expected_repeated_all((steps or args.steps) * args.batch,
                                      zipf.feature_distinct(args.distinct, args.feature_distinct_skew), args.zipf_exponent,
                                      at_most=args.promote_hot_rows) * row_bytes(args)


def _expected_distinct_all(args, steps: Optional[int] = None) -> float:
    """Expected distinct ids a run meets in its first `steps` steps (default: all), all features together (each with
    its own --feature-distinct-skew share)."""
    from rtkit.workloads import zipf

    return zipf.expected_distinct_all((steps or args.steps) * args.batch,
                                      zipf.feature_distinct(args.distinct, args.feature_distinct_skew), args.zipf_exponent)


def rows_full_step(args, table_gb: float) -> Optional[int]:
    """The step by which a run's tables of table_gb have every row used (first-seen rows, expected; the tables of
    the feature with the most distinct ids, the first to fill), or None when none fills within --steps: later ids
    wrap onto trained rows, so such a table makes no new rows and touches no new pages from there on."""
    from rtkit.workloads import zipf

    if args.ids != "zipf" or args.row_assign != "first-seen":
        return None
    rows = capacity_rows(args, table_gb)
    most = max(zipf.per_feature(zipf.feature_distinct(args.distinct, args.feature_distinct_skew)))
    lo, hi = 1, args.steps
    if zipf.expected_distinct(hi * args.batch, most, args.zipf_exponent) < rows:
        return None
    while lo < hi:   # the expected distinct ids grow with the steps
        mid = (lo + hi) // 2
        if zipf.expected_distinct(mid * args.batch, most, args.zipf_exponent) >= rows:
            hi = mid
        else:
            lo = mid + 1
    return lo


def pager_on(sets: List[str]) -> bool:
    """(b) runs the capacity profile, which turns tier_pager on, unless a --set turns it off."""
    pager = True
    for s in sets:
        key, _, value = s.partition("=")
        if key.strip() == "tier_pager":
            pager = value.strip().lower() not in ("0", "false", "no", "off")
    return pager


def _run(label: str, run_dir: str, table_gb: float, args, sets: List[str], profile: Optional[str] = None,
         max_anon: Optional[int] = None, compact: bool = False, promote: bool = False) -> Dict[str, Any]:
    """One `rtkit run` of wdl at table_gb, watched; returns its figures (or raises SystemExit on a stop)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "rtkit", "run", "--quiet", "--run-dir", run_dir]
    if profile:
        cmd += ["--profile", profile]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--", sys.executable, "-m", "rtkit.workloads", "wdl"] + workload_args(args, table_gb, compact, promote)
    log = open(os.path.join(os.path.dirname(run_dir), f"{os.path.basename(run_dir)}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                            env=tree_guard.env_dying_with_me(os.environ))
    losses: List[float] = []

    def read_losses():  # a thread: the loop below must keep watching memory while the child is silent
        for line in proc.stdout:
            if line.startswith("loss "):
                losses.append(float(line.split()[2]))

    reader = threading.Thread(target=read_losses, daemon=True)
    reader.start()
    kernel0 = _kernel_counters()
    t0, floor = time.monotonic(), args.min_available_gb * GIB
    low = anon_over = None
    peak_anon = 0
    try:
        while True:
            avail = pool_room.mem_available() or 0
            anon = _anon_rss(proc.pid)
            peak_anon = max(peak_anon, anon)
            _progress(label, len(losses), args.steps, t0,
                      f"MemAvailable {avail / GIB:5.1f}G anon {anon / GIB:4.1f}G" + ("" if losses else " (initialising)"))
            if max_anon and anon > max_anon and low is None and anon_over is None:
                anon_over = anon
            if ((avail and avail < floor) or anon_over) and low is None:
                low = avail
                _kill_tree(proc)
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    except BaseException:   # Ctrl-C or SIGTERM: the job is in a session of its own, it must not outlive us
        _kill_tree(proc)
        raise
    reader.join(timeout=10)
    kernel1 = _kernel_counters()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if anon_over is not None:
        sys.stderr.write(f"capacity: stopped {label} at step {len(losses)}: its anonymous RSS {anon_over / GIB:.1f}G "
                         f"passed --max-anon-gb {args.max_anon_gb:g}"
                         + (f" plus --dram-head-gb {args.dram_head / GIB:g}" if args.dram_head else "")
                         + f"; the tables should be in the pool (see {log.name})\n")
        raise SystemExit(1)
    if low is not None:
        sys.stderr.write(f"capacity: stopped {label} at step {len(losses)}: MemAvailable {low / GIB:.1f}G fell below "
                         f"--min-available-gb {args.min_available_gb:g}; use a smaller --dram-gb or --resident-gb\n")
        raise SystemExit(1)
    if proc.returncode != 0:
        sys.stderr.write(f"capacity: {label} failed (exit {proc.returncode}); see {log.name}\n")
        raise SystemExit(1)
    out = figures(run_dir, losses, args.batch)
    out["kernel"] = {k: kernel1[k] - kernel0[k] for k in kernel1 if k in kernel0}
    out["peak_anon_rss_watched_bytes"] = peak_anon   # /proc RssAnon of the whole process group, twice a second
    out["peak_anon_rss_bytes"] = max(out.get("peak_anon_rss_bytes") or 0, peak_anon) or None
    with open(log.name) as fh:
        out["compaction"] = [line.strip() for line in fh if "compaction:" in line or "promotion:" in line]
    return out


def _faults_per_step(report: Dict[str, Any]) -> Optional[float]:
    """Major faults per measured step: process samples interpolated at the first and last measured step."""
    per = report["steps"].get("per_step") or []
    samples = report["process"].get("samples") or []
    warm = report["steps"].get("warmup_steps") or 0
    per = per[warm:]
    if len(per) < 2 or len(samples) < 2:
        return None

    def at(t):
        best = samples[0]
        for s in samples:
            if s["t_s"] <= t:
                best = s
        return best["major_faults"]

    return (at(per[-1]["t_s"]) - at(per[0]["t_s"])) / (len(per) - 1)


def figures(run_dir: str, losses: List[float], batch: int) -> Dict[str, Any]:
    with open(os.path.join(run_dir, "report.json")) as fh:
        rep = json.load(fh)
    summ = rep["steps"]["summary"]
    pm = rep.get("pmem") or {}
    proc = rep["process"]
    timeline = [{"t_s": x["t_s"], "step": x["step"], "resident_bytes": x["resident_bytes"]}
                for x in pm.get("timeline") or []]
    return {
        "run_dir": run_dir, "step_ms_median": summ.get("step_ms_median"),
        "examples_per_s": batch * 1000.0 / summ["step_ms_median"] if summ.get("step_ms_median") else None,
        "major_faults_per_step": _faults_per_step(rep), "major_faults": proc.get("major_faults"),
        "disk_read_bytes": proc.get("disk_read_bytes"), "disk_written_bytes": proc.get("disk_written_bytes"),
        "peak_anon_rss_bytes": pm.get("process_rss_anon_peak_sampled_bytes"),
        "peak_rss_bytes": proc.get("peak_rss_bytes"), "wall_s": rep["run"]["duration_s"],
        "pool_bytes": pm.get("tier_last_step_bytes"), "pool_resident_timeline": timeline,
        "dram_head": pm.get("dram_head"),
        # after the warm-up (3 steps) and before the job's teardown, as the report's tier view counts it
        "pool_resident_max_bytes": max((x["resident_bytes"] for x in timeline if x["step"] > 3 and x["t_s"] <
                                        (timeline[-1]["t_s"] if len(timeline) > 1 else float("inf"))), default=None),
        "losses": losses, "loss_last20_mean": statistics.fmean(losses[-20:]) if losses else None,
        "step_ms_by_step": [round(x["step_ms"], 1) for x in rep["steps"].get("per_step") or [] if "step_ms" in x],
    }


def check(args, dram: int) -> Optional[str]:
    """The one line that stops the benchmark before it starts, or None."""
    if not 1.0 <= args.feature_distinct_skew < float("inf"):
        return "capacity: --feature-distinct-skew must be a number >= 1 (1: every feature alike), e.g. 1000"
    a_bytes, b_bytes = args.scale_a * dram, args.scale_b * dram
    who = "(a)"
    if args.sweep:   # no (a): each layout runs (b)'s tables in DRAM
        problem = capacity_sweep.parse_sweep(args)
        if problem:
            return problem
        a_bytes, who = b_bytes, "the sweep's runs in DRAM"
    pool = int(b_bytes * POOL_SLACK + POOL_EXTRA)
    if not os.path.isdir(args.pool_dir) or not os.access(args.pool_dir, os.W_OK):
        return f"capacity: --pool-dir {args.pool_dir} is not a writable folder"
    room = pool_room.pool_room_problem(os.path.join(args.pool_dir, "rtkit-capacity.pool"), pool)
    if room:
        return f"capacity: (b) needs a {pool / GIB:.1f}G pool: {room}"
    avail = pool_room.mem_available() or 0
    # the tables are filled row by row as ids arrive (rtkit.workloads.ev), so (a) holds what the steps touch;
    # hashed rows may touch every page, so the whole table must fit (no initializer temporaries any more)
    maps = map_bytes(args)
    need_a = a_bytes + maps + 2 * GIB + args.min_available_gb * GIB
    if need_a > avail:
        return (f"capacity: {who} needs {need_a / GIB:.1f}G of memory ({a_bytes / GIB:.1f}G of tables and slots, "
                f"{maps / GIB:.1f}G of id -> row maps, 2G for TensorFlow, --min-available-gb), {avail / GIB:.1f}G is "
                "available; lower --dram-gb, --a or --steps")
    if maps + 1.5 * GIB > args.max_anon_gb * GIB:
        return (f"capacity: (b)'s id -> row maps alone take about {maps / GIB:.1f}G of anonymous memory, past "
                f"--max-anon-gb {args.max_anon_gb:g} with TensorFlow's own; raise it or lower --steps")
    resident = args.resident_gb * GIB
    if resident and resident + 2 * GIB + args.min_available_gb * GIB > avail:
        return f"capacity: --resident-gb {args.resident_gb:g} does not fit in the {avail / GIB:.1f}G available"
    if args.b_in_dram and b_bytes + 2 * GIB + args.min_available_gb * GIB > avail:
        return (f"capacity: --b-in-dram needs {b_bytes / GIB:.1f}G of tables in DRAM, {avail / GIB:.1f}G is available; "
                "drop --b-in-dram or lower --dram-gb")
    if args.b_dram_steps:
        if args.b_in_dram or not 10 <= args.b_dram_steps <= args.steps:
            return ("capacity: --b-dram-steps must be from 10 to --steps, and not beside --b-in-dram (which runs "
                    "them all)")
        used = (touched_bytes(args, args.b_dram_steps) or 0.0) + promoted_bytes(args, args.b_dram_steps)
        maps_then = map_bytes(args, args.b_dram_steps)
        if used + maps_then + 2 * GIB + args.min_available_gb * GIB > avail:
            return (f"capacity: --b-dram-steps {args.b_dram_steps}: (b)'s rows used by then (about {used / GIB:.1f}G, "
                    f"with {maps_then / GIB:.1f}G of id -> row maps and 2G for TensorFlow) do not fit in the "
                    f"{avail / GIB:.1f}G available; fewer steps")
    bad = [x for x in args.sets if "=" not in x or not x.split("=", 1)[0].strip()]
    if bad:
        return f"capacity: --set {bad[0]!r}: expected KEY=VALUE (an rtkit setting, see `rtkit config`)"
    if args.steps < 10 or args.batch < 1 or args.emb_dim < 1:
        return "capacity: --steps must be at least 10, --batch and --emb-dim positive"
    if args.ids == "zipf" and (args.distinct < 1 or not 0 < args.zipf_exponent < 4):
        return "capacity: --distinct must be positive and --zipf-exponent in (0, 4), e.g. 0.9"
    if args.promote_hot_rows and (args.promote_hot_rows < 0 or args.row_assign != "first-seen" or args.compact_steps
                                  or args.sweep):
        return ("capacity: --promote-hot-rows moves first-seen rows (no --row-assign, --compact-steps or --sweep "
                "beside it) and takes a positive row count")
    b_rows = capacity_rows(args, args.scale_b * dram / GIB)
    if args.promote_hot_rows and args.promote_hot_rows >= b_rows:
        return (f"capacity: --promote-hot-rows {args.promote_hot_rows} leaves none of (b)'s {b_rows} rows a feature "
                "for new ids; fewer")
    if args.sweep:
        problem = capacity_sweep.budgets(args, touched_bytes(args))
        if problem:
            return problem
    if args.max_anon_gb <= 0 or args.max_anon_gb * GIB + args.min_available_gb * GIB > avail:
        return (f"capacity: --max-anon-gb {args.max_anon_gb:g} must be positive and fit in the {avail / GIB:.1f}G "
                "available with --min-available-gb")
    if args.dram_head < 0 or args.dram_head + args.max_anon_gb * GIB + args.min_available_gb * GIB > avail:
        return (f"capacity: --dram-head-gb {args.dram_head / GIB:g} must be zero or more and fit in the "
                f"{avail / GIB:.1f}G available with --max-anon-gb and --min-available-gb")
    return None


def _gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.2f}G"


def table(results: Dict[str, Dict[str, Any]]) -> str:
    base = results.get("a", {}).get("step_ms_median")
    lines = [f"{'run':<10}{'tables':>8}{'step ms':>9}{'vs (a)':>8}{'ex/s':>9}{'majflt/step':>12}{'pool res max':>13}"
             f"{'disk read':>10}{'disk write':>11}{'peak anon':>10}{'loss(last20)':>13}"]
    for name, r in results.items():
        ratio = r["step_ms_median"] / base if base and r.get("step_ms_median") else None
        fps = r.get("major_faults_per_step")
        lines.append(f"{name:<10}{r['table_gb']:>7.2f}G{r['step_ms_median']:>9.1f}{'' if ratio is None else f'{ratio:.2f}x':>8}"
                     f"{r['examples_per_s']:>9.0f}{'-' if fps is None else f'{fps:.0f}':>12}"
                     f"{_gib(r.get('pool_resident_max_bytes')):>13}{_gib(r.get('disk_read_bytes')):>10}"
                     f"{_gib(r.get('disk_written_bytes')):>11}{_gib(r.get('peak_anon_rss_bytes')):>10}"
                     f"{r['loss_last20_mean'] or float('nan'):>13.5f}")
    return "\n".join(lines)


def _median(xs: List[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def quarters(step_ms: List[float]) -> List[Optional[float]]:
    """Median step time of each quarter of a run's steps."""
    n = len(step_ms)
    return [_median(step_ms[i * n // 4:(i + 1) * n // 4]) for i in range(4)] if n >= 4 else []


def same_work_lines(args, results: Dict[str, Dict[str, Any]]) -> List[str]:
    """Each run's quarters; where (a)'s tables fill (its later ids wrap onto trained rows: no new rows, no new
    pages, a cheaper step than (b)'s, which makes rows to the end); and (b) against the same model in DRAM over the
    steps both ran (--b-dram-steps), the comparison of the same work."""
    out = []
    for name, r in results.items():
        q = quarters(r.get("step_ms_by_step") or [])
        if q:
            out.append(f"({name}) step ms by quarter: " + ", ".join(f"{x:.1f}" for x in q))
    full = rows_full_step(args, args.scale_a * args.dram / GIB)
    if full is not None and "a" in results:
        out.append(f"(a)'s tables have every row used by about step {full} (expected): from there its ids wrap onto "
                   "trained rows, so it makes no new rows and touches no new pages while (b) does to the end; "
                   "(b) against (a) after that compares different work"
                   + ("" if "b-dram" in results else " (--b-dram-steps N compares the same work)"))
    bd, b = results.get("b-dram"), results.get("b")
    if bd and b and bd.get("step_ms_by_step") and b.get("step_ms_by_step"):
        n = min(len(bd["step_ms_by_step"]), len(b["step_ms_by_step"]))
        warm = 3   # the report's warm-up steps
        mb, md = _median(b["step_ms_by_step"][warm:n]), _median(bd["step_ms_by_step"][warm:n])
        if mb and md:
            qb, qd = quarters(b["step_ms_by_step"][:n]), quarters(bd["step_ms_by_step"][:n])
            out.append(f"(b) against (b)'s size in DRAM over steps {warm + 1}-{n} (the same work): {mb:.1f} ms against "
                       f"{md:.1f}, {mb / md:.2f}x; by quarter of those steps "
                       + ", ".join(f"{x / y:.2f}x" for x, y in zip(qb, qd) if x and y))
    return out


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def _sweep(args, pool_path: str, pool_size: int) -> int:
    touched = touched_bytes(args)
    n = len(args.layouts) * len(args.shares)
    sys.stderr.write(
        f"capacity: sweep of {n} points ({', '.join(args.layouts)} rows x {', '.join(f'{s:g}x' for s in args.shares)} "
        f"of the {touched / GIB:.2f}G of rows used, expected), each a tier run with that resident budget and an "
        f"all-in-DRAM run; tables and slots {args.scale_b * args.dram / GIB:.2f}G, {args.steps} steps of {args.batch}"
        + (f", {args.dram_head / GIB:.2f}G of table heads in DRAM" if args.dram_head else "") + "\n")
    sweep = capacity_sweep.run(args, _run, touched, pool_path, pool_size)
    js, pic = capacity_sweep.write(args, sweep)
    print(capacity_sweep.table(sweep))
    print(f"figures: {js}; plot: {pic}")
    return 0


def main(argv=None) -> int:
    from rtkit.workloads.data import NUM_CAT

    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    dram = int(args.dram_gb * GIB) if args.dram_gb else (pool_room.mem_total() or 0)
    args.dram = dram
    if args.dram_head_gb is not None:
        args.dram_head = int(args.dram_head_gb * GIB)
    elif args.resident_gb or args.sweep:   # both act out a small DRAM: no head unless asked for
        args.dram_head = 0
    else:  # what tier mode itself allows at the first step (half of MemAvailable), measured best (docs/pmem.md),
        # within what the anonymous-RSS watchdog leaves
        avail = pool_room.mem_available() or 0
        room = avail - int((args.max_anon_gb + args.min_available_gb) * GIB)
        args.dram_head = max(0, min(min(dram, avail) // 2, room))
    problem = check(args, dram)
    if problem:
        sys.stderr.write(problem + "\n")
        return 2
    os.makedirs(args.out, exist_ok=True)
    pool_path = os.path.join(os.path.abspath(args.pool_dir), "rtkit-capacity.pool")
    pool_size = int(args.scale_b * dram * POOL_SLACK + POOL_EXTRA)
    plan = [("a", args.scale_a, [], None)]
    if args.b_in_dram or args.b_dram_steps:
        plan.append(("b-dram", args.scale_b, [], None))
    if args.sweep:
        return _sweep(args, pool_path, pool_size)
    tier = [f"tier_pool_path={pool_path}", f"tier_pool_size={pool_size}"]
    if args.resident_gb:
        # the page cache's budget acts out a small DRAM (what the scaled runs in docs/results.md measured); the
        # pager would refuse it (one budget over the pool's pages)
        tier += [f"tier_resident_max={int(args.resident_gb * GIB)}", "tier_pager=0"]
    tier.append(f"tier_dram_head={args.dram_head}")  # also 0: over the profile's
    tier += args.sets
    # (b) runs the `capacity` profile (what this benchmark shows to work), with this run's pool and budget
    plan.append(("b", args.scale_b, tier, "capacity"))
    touched = touched_bytes(args)
    b_rows = capacity_rows(args, args.scale_b * dram / GIB)
    sys.stderr.write(
        f"capacity: (a) {args.scale_a * dram / GIB:.1f}G in DRAM, (b) {args.scale_b * dram / GIB:.1f}G in a "
        f"{pool_size / GIB:.1f}G pool in {args.pool_dir}; {args.steps} steps of {args.batch}"
        + (f"; the rows used (first-seen, expected) {touched / GIB:.1f}G, "
           f"{touched / row_bytes(args) / NUM_CAT / b_rows:.0%} of (b)'s rows" if touched else "")
        + (f"; (b) compacts every {args.compact_steps} steps, {hot_rows(args)} hot rows per feature"
           if args.compact_steps else "")
        + (f"; (b) promotes ids met again to the first {args.promote_hot_rows} rows of each table"
           if args.promote_hot_rows else "")
        + (f"; (b) keeps {args.dram_head / GIB:.1f}G of table heads in DRAM" if args.dram_head and not pager_on(tier)
           else "")
        + ("; (b) paged by rtkit (tier_pager, the capacity profile's), its anonymous RSS under MemAvailable less "
           "tier_pager_reserve\n" if pager_on(tier) else
           f"; (b)'s anonymous RSS held under {(args.max_anon_gb * GIB + args.dram_head) / GIB:.1f}G\n"))
    results: Dict[str, Dict[str, Any]] = {}
    for name, scale, sets, profile in plan:
        gb = scale * dram / GIB
        # a paged (b) holds its tables in anonymous memory by design, under its own limit: no guard past it
        guard = None if name != "b" or pager_on(sets) else int(args.max_anon_gb * GIB + args.dram_head)
        run_args = argparse.Namespace(**{**vars(args), "steps": args.b_dram_steps}) \
            if name == "b-dram" and args.b_dram_steps else args
        r = _run(f"({name}) {gb:.1f}G", os.path.join(os.path.abspath(args.out), name), gb, run_args, sets, profile,
                 max_anon=guard, compact=name == "b", promote=name in ("b", "b-dram"))
        r["table_gb"], r["settings"], r["profile"] = gb, sets, profile
        results[name] = r
    atomic.write_json(os.path.join(args.out, "capacity.json"),
                      {"dram_bytes": dram, "args": vars(args), "touched_bytes_expected": touched, "results": results})
    print(table(results))
    a, b = results["a"], results["b"]
    if a.get("step_ms_median") and b.get("step_ms_median"):
        print(f"(b) step time {b['step_ms_median'] / a['step_ms_median']:.2f}x of (a) (targets: <= 1.25x over the run, "
              "<= 1.5x over its last quarter; but see below where (a)'s tables fill); "
              f"peak anonymous RSS {_gib(b.get('peak_anon_rss_bytes'))}; figures: {os.path.join(args.out, 'capacity.json')}")
    for name, r in results.items():
        line = kernel_line(name, r.get("kernel") or {})
        if line:
            print(line)
    for line in same_work_lines(args, results):
        print(line)
    tl = b.get("pool_resident_timeline") or []
    if tl:
        picks = [tl[min(len(tl) - 1, i * (len(tl) - 1) // 7)] for i in range(8)]
        print("(b) pool resident over time: " + ", ".join(f"step {x['step']} {_gib(x['resident_bytes'])}" for x in picks))
    for line in b.get("compaction") or []:
        print(f"(b) {line}")
    if "b-dram" in results and results["b-dram"]["losses"] and b["losses"]:
        n = min(len(results["b-dram"]["losses"]), len(b["losses"]))
        same = results["b-dram"]["losses"][:n] == b["losses"][:n]
        diff = max(abs(x - y) for x, y in zip(results["b-dram"]["losses"][:n], b["losses"][:n]))
        print(f"(b) losses vs the same model in DRAM{'' if n == len(b['losses']) else f' (the first {n} printed)'}: "
              f"{'identical' if same else f'max difference {diff:.3g}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
