#!/usr/bin/env python3
# run_micro.py -- PRMalloc micro-benchmarks against glibc, jemalloc, tcmalloc and mimalloc: interleaved rounds, medians, ratios, faults, callgrind instructions.
"""Usage: python allocators/bench/run_micro.py [--rounds N] [--no-callgrind] [--out DIR]
       python allocators/bench/run_micro.py --paths [--out DIR]

Each round runs every configuration once, in order (A B C D E, A B C D E, ...), so drift on a noisy machine
hits all of them alike. Reported: the median over rounds of each benchmark's own median step time, the
ratio to the fastest peer, and minor faults per step (getrusage inside the benchmark). Instructions per
malloc/free pair come from `valgrind --tool=callgrind`: two run lengths, differenced, so start-up cancels.
--paths prints only rtkit's instructions per pair on each path of pair_paths.c (the small fast path, a planned
1 MiB class, profiling, the large heap, glibc's small blocks beside a non-empty fallback stash).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PEERS = {
    "glibc": "",
    "jemalloc": os.path.join(LIBDIR, "libjemalloc.so.2"),
    "tcmalloc": os.path.join(LIBDIR, "libtcmalloc_minimal.so.4"),
    "mimalloc": os.path.join(LIBDIR, "libmimalloc.so.2"),
}
# peer name -> (library of PEERS it preloads, extra environment): jemalloc as Intel configures it for TF
# (decay off: freed pages stay mapped), the setting rtkit's whole-run target compares against
PEER_VARIANTS = {
    "jemalloc-nodecay": ("jemalloc", {"MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                                                      "dirty_decay_ms:-1,muzzy_decay_ms:-1"}),
}
# benchmark name -> (program, args, metric key, unit)
BENCHES = {
    "large-touch": ("malloc_large", ["40", "10", "1"], "step_us", "us/step"),
    "large-notouch": ("malloc_large", ["200", "20", "0"], "step_us", "us/step"),
    "small": ("small_objects", ["5000000"], "ns_per_pair", "ns/pair"),
    # whole runs, first step included: what a short job (or any job's profiling window) pays
    "large-random-whole": ("malloc_large", ["40", "0", "1", "1", "0"], "total_ms", "ms/run"),
    "recurring20-whole": ("malloc_large", ["100", "0", "1", "0", "1"], "total_ms", "ms/run"),
}
# more figures from the same runs: name -> (benchmark it reads, metric key, unit)
DERIVED = {
    "large-random-whole-cpu": ("large-random-whole", "cpu_ms", "cpu ms/run (user + system)"),
    "recurring20-whole-cpu": ("recurring20-whole", "cpu_ms", "cpu ms/run (user + system)"),
}


def build(out):
    subprocess.run([sys.executable, os.path.join(REPO, "allocators", "build.py"), "--bench", "--only", "prmalloc",
                    "--out", out], check=True, stdout=subprocess.DEVNULL)


def build_paths(out):
    """The preload library and the two programs --paths runs (not every bench: pmem_bench needs PMDK's headers)."""
    sys.path.insert(0, os.path.join(REPO, "allocators"))
    import build as native  # allocators/build.py
    native.build_libraries(out, only=["malloc"])
    for name in ("small_objects", "pair_paths"):
        native.build_bench_program(os.path.join(HERE, name + ".c"), os.path.join(out, "bench"))


def configs(out):
    """name -> (library or '', extra environment)"""
    cfg = {name: (lib, {}) for name, lib in PEERS.items() if not lib or os.path.exists(lib)}
    for name, (base, env) in PEER_VARIANTS.items():
        if base in cfg:
            cfg[name] = (cfg[base][0], env)
    cfg["rtkit"] = (os.path.join(out, "librtkit_malloc.so"), {})
    return cfg


def parse(line):
    return {k: v for k, v in re.findall(r"(\w+)=([^\s]+)", line)}


def run_once(out, prog, args, lib, run_dir):
    lib, extra = lib
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "_RTKIT_MALLOC_ROOT"}
    env.pop("LD_PRELOAD", None)
    env.pop("MALLOC_CONF", None)
    if lib:
        env["LD_PRELOAD"] = lib
    env.update(extra)
    env["RTKIT_RUN_DIR"] = run_dir
    proc = subprocess.run([os.path.join(out, "bench", prog), *args], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{prog} under {lib or 'glibc'} failed: {proc.stderr[-500:]}")
    return parse(proc.stdout.strip().splitlines()[-1])


# path name -> (pair_paths mode or None for small_objects, extra environment, the two run lengths)
PATHS = {
    "small fast path": (None, {}, (100000, 300000)),
    "planned 1 MiB class": ("planned", {}, (20000, 60000)),
    "profiling 1 MiB": ("profiling", {}, (20000, 60000)),
    "large heap 1 MiB": ("large", {}, (20000, 60000)),
    "small beside the stash": ("stash", {"RTKIT_MALLOC_LARGE": "0"}, (100000, 300000)),
}


def callgrind_instructions(out, lib, n1=100000, n2=300000, extra_env=None, mode=None):
    if not shutil.which("valgrind"):
        return None
    counts = []
    prog = [os.path.join(out, "bench", "small_objects")] if mode is None else [os.path.join(out, "bench", "pair_paths"), mode]
    for n in (n1, n2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "_RTKIT_MALLOC_ROOT"}
        env.pop("LD_PRELOAD", None)
        if lib:
            env["LD_PRELOAD"] = lib
        env.update(extra_env or {})
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
                                   *prog, str(n)],
                                  env=env, capture_output=True, text=True, timeout=600)
        m = re.search(r"Collected : (\d+)", proc.stderr)
        if not m or proc.returncode != 0:  # a path not reached (pair_paths says why on stderr) is no figure
            return None
        counts.append(int(m.group(1)))
    return (counts[1] - counts[0]) / (n2 - n1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(REPO, "build", "native"))
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--only", action="append", choices=sorted(BENCHES))
    ap.add_argument("--paths", action="store_true", help="only rtkit's callgrind instructions per pair on each path")
    args = ap.parse_args(argv)
    if args.paths:
        build_paths(args.out)
        lib = os.path.join(args.out, "librtkit_malloc.so")
        print("# rtkit instructions per malloc/free pair (callgrind, differenced run lengths, incl. the loop body)")
        for name, (mode, env, (n1, n2)) in PATHS.items():
            r = callgrind_instructions(args.out, lib, n1, n2, extra_env=env, mode=mode)
            print(f"{name:24} {'-' if r is None else '%.1f' % r}")
        return 0
    build(args.out)
    cfg = configs(args.out)
    benches = {k: v for k, v in BENCHES.items() if not args.only or k in args.only}
    results = {(b, c): [] for b in benches for c in cfg}
    faults = {(b, c): [] for b in benches for c in cfg}
    with tempfile.TemporaryDirectory() as run_dir:
        for r in range(args.rounds):
            for b, (prog, bargs, key, _unit) in benches.items():
                for c, lib in cfg.items():
                    res = run_once(args.out, prog, bargs, lib, run_dir)
                    results[(b, c)].append(float(res[key]))
                    for d, (src, dkey, _u) in DERIVED.items():
                        if src == b:
                            results.setdefault((d, c), []).append(float(res[dkey]))
                            faults.setdefault((d, c), []).append(float(res["faults_total"]))
                    fk = "faults_total" if key in ("total_ms", "cpu_ms") else "faults_per_step"
                    if fk in res:
                        faults[(b, c)].append(float(res[fk]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"# PRMalloc micro-benchmarks: {args.rounds} interleaved rounds, medians")
    shown = dict(benches)
    for d, (src, dkey, unit) in DERIVED.items():
        if src in benches:
            shown[d] = (benches[src][0], benches[src][1], dkey, unit)
    for b, (prog, bargs, key, unit) in shown.items():
        med = {c: statistics.median(results[(b, c)]) for c in cfg}
        best_peer = min((c for c in cfg if c != "rtkit"), key=lambda c: med[c])
        print(f"\n## {b} ({prog} {' '.join(bargs)}), {unit}; ratio = config / best peer ({best_peer})")
        fcol = "faults/run" if key in ("total_ms", "cpu_ms") else "faults/step"
        print(f"{'config':16} {'median':>12} {'ratio':>8} {fcol:>12}")
        for c in cfg:
            f = statistics.median(faults[(b, c)]) if faults[(b, c)] else None
            ratio = med[c] / med[best_peer] if med[best_peer] else float("nan")
            print(f"{c:16} {med[c]:12.4f} {ratio:8.3f} {('%.1f' % f) if f is not None else '-':>12}")
        if "rtkit" in cfg:
            print(f"rtkit speed-up over best peer: {med[best_peer] / med['rtkit']:.2f}x" if med["rtkit"] else "")
    if not args.no_callgrind:
        g = callgrind_instructions(args.out, "")
        r = callgrind_instructions(args.out, cfg["rtkit"][0])
        if g and r:
            print(f"\n## small_objects instructions per malloc/free pair (callgrind, incl. ~15 of loop body)")
            print(f"glibc {g:.1f}  rtkit {r:.1f}  ratio {r / g:.3f}")
        # the census's share: the same with RTKIT_MALLOC_CENSUS=0 (malloc a tail call; free still routes arenas)
        off = callgrind_instructions(args.out, cfg["rtkit"][0], extra_env={"RTKIT_MALLOC_CENSUS": "0"})
        if g and off:
            print(f"rtkit with RTKIT_MALLOC_CENSUS=0 {off:.1f}  ratio {off / g:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
