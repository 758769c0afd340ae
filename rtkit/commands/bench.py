# bench.py -- the `rtkit bench` sub-command: parse the options, pick the configurations, run the interleaved bench.
"""Only argparse and os at import time: the CLI imports this module for every `rtkit` command."""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time

from rtkit.errors import UserError


EPILOG = """\
configurations (--configs; default: tf-default,glibc,tcmalloc,jemalloc,mimalloc,tf-bfc,rtkit):
  tf-default   TensorFlow as shipped (oneDNN pool)    glibc      TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1
  jemalloc     libjemalloc.so.2 + Intel MALLOC_CONF   tcmalloc   libtcmalloc_minimal.so.4
  mimalloc     libmimalloc.so.2                       tf-bfc     TF's BFC allocator, oneDNN off
  rtkit        PRMalloc                               rtkit-sched, rtkit-stage, sched-only
  profile:NAME (or a bare profile name)  rtkit run --profile NAME
  user-defined: --config NAME:KEY=VAL,KEY=VAL (KEY: a setting key, an ENV var in upper case,
                base=PEER, profile=NAME, preload=/path/lib.so)
`rtkit bench --list` shows the catalogue and which libraries are present.
exit status: 0 every run succeeded, 1 some run failed, 2 usage error, 130 interrupted."""


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="run a workload under several allocator/scheduler configurations, interleaved",
        description="Run a workload (or any command after --) under each configuration, round by round "
                    "(A B C, B C A, ...), each run a separate `rtkit run`; print medians and ratios "
                    "against a baseline; write bench.json and bench.md.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="wdl", help="bundled workload: wdl or dlrm (default wdl)")
    p.add_argument("--api", default=None, help="workload API passed to the workload (e.g. session)")
    p.add_argument("--input", default=None, choices=("prefetch", "legacy"),
                   help="workload input mode (legacy: CSV parsed in the graph after get_next, no prefetch)")
    p.add_argument("--input-latency-ms", type=float, default=None, metavar="MS",
                   help="legacy input: read latency per batch")
    p.add_argument("--batch", type=int, default=2048, help="batch size (default 2048)")
    p.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    p.add_argument("--rows", type=int, default=None, help="rows of synthetic data (workload default if unset)")
    p.add_argument("--configs", default=None, help="comma-separated configuration names, in order")
    p.add_argument("--config", action="append", default=[], metavar="NAME:KEY=VAL,...",
                   help="define a configuration (repeatable); it is run when listed in --configs, "
                        "or appended to the default list")
    p.add_argument("--profile", action="append", default=[], metavar="NAME",
                   help="add a configuration `rtkit run --profile NAME` (repeatable)")
    p.add_argument("--baseline", default=None, help="configuration the ratios refer to (default tf-default, "
                                                     "else the first configuration)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every configuration once (default 3)")
    p.add_argument("--out", default=None, help="output folder (default rtkit-bench/<time>)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="stop a run that takes longer than S seconds (recorded as timeout)")
    p.add_argument("--lib-dir", action="append", default=[], metavar="DIR",
                   help="folder searched for peer libraries (repeatable; replaces the default folders)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--list", action="store_true", help="list the configurations and exit")
    p.add_argument("--dry-run", action="store_true", help="print the runs that would be made and exit")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...: run this instead of the workload")
    p.set_defaults(func=main)
    return p


def _err(msg: str) -> UserError:
    return UserError(f"rtkit bench: {msg}")


def _free_folder(out: str) -> str:
    """The first of OUT-2, OUT-3... that does not exist yet."""
    base, n = out.rstrip(os.sep) or out, 2
    while os.path.exists(f"{base}-{n}"):
        n += 1
    return f"{base}-{n}"


def _list(peers_mod, lib_dirs) -> int:
    from rtkit import config as cfg
    print(f"{'configuration':<19} {'library':<44} description")
    for peer in peers_mod.CATALOGUE.values():
        lib = ""
        if peer.library:
            path = peer.resolve_library(lib_dirs)
            lib = path or f"MISSING {peer.library}"
        print(f"{peer.name:<19} {lib or '-':<44} {peer.description}")
        extra = [f"{k}={v}" for k, v in peer.env.items()] + [f"--set {k}={v}" for k, v in peer.settings.items()]
        print(f"{'':<19} {' '.join(extra)}")
    for name in sorted(cfg.available_profiles()):
        print(f"{'profile:' + name:<19} {'-':<44} rtkit run --profile {name}")
    return 0


def _prepare_data(args) -> int:
    """Generate the workload's synthetic data set once, before the first measured run, so that
    no configuration pays for it (numpy only, no TensorFlow)."""
    import subprocess
    rows = f"rows={int(args.rows)}, " if args.rows else ""  # else the workload's own default
    code = ("import sys; from rtkit.workloads import data; "
            f"data.ensure_dataset({rows}progress=sys.stderr.isatty())")
    return subprocess.run([sys.executable, "-c", code]).returncode


def main(args) -> int:
    from rtkit.bench import peers as peers_mod
    from rtkit import rundir
    from rtkit.bench import runner

    lib_dirs = list(args.lib_dir) or list(peers_mod.DEFAULT_LIB_DIRS)
    if args.list:
        return _list(peers_mod, lib_dirs)
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    elif cmd:
        raise _err(f"unexpected argument(s) {' '.join(cmd)}: put the command after --")
    if args.rounds < 1:
        raise _err(f"--rounds {args.rounds}: expected a whole number >= 1")
    if args.steps is not None and args.steps < 1:
        raise _err(f"--steps {args.steps}: expected a whole number >= 1")
    if args.batch is not None and args.batch < 1:
        raise _err(f"--batch {args.batch}: expected a whole number >= 1")
    if args.timeout is not None and args.timeout <= 0:
        raise _err(f"--timeout {args.timeout}: expected seconds > 0")
    if not cmd and args.workload not in ("wdl", "dlrm"):
        raise _err(f"unknown workload '{args.workload}': expected wdl or dlrm")

    try:
        user = [peers_mod.parse_user_config(spec) for spec in args.config]
        names = [n.strip() for n in args.configs.split(",")] if args.configs else \
            list(peers_mod.DEFAULT_CONFIGS) + [p.name for p in user if p.name not in peers_mod.DEFAULT_CONFIGS]
        chosen = peers_mod.select(names, user, args.profile)
    except peers_mod.PeerError as exc:
        raise _err(str(exc))

    names = [p.name for p in chosen]
    if args.baseline and args.baseline not in names:
        raise _err(f"--baseline {args.baseline} is not one of the configurations run: {', '.join(names)}")
    baseline = args.baseline or (peers_mod.DEFAULT_BASELINE if peers_mod.DEFAULT_BASELINE in names else names[0])

    available, skipped, libraries = [], [], {}
    for peer in chosen:
        path = peer.resolve_library(lib_dirs) if peer.library else None
        if peer.library and not path:
            skipped.append({"config": peer.name, "note": peer.missing_note(lib_dirs)})
            continue
        libraries[peer.name] = path
        available.append(peer)
    for s in skipped:
        print(f"rtkit bench: {s['note']}", file=sys.stderr)
    if not available:
        raise _err("every configuration was skipped: nothing to run")
    notes = []
    if baseline not in [p.name for p in available]:
        notes.append(f"baseline {baseline} was skipped: ratios are empty")

    if cmd:
        if not (os.sep in cmd[0] and os.access(cmd[0], os.X_OK)) and shutil.which(cmd[0]) is None:
            raise _err(f"command not found: {cmd[0]}")
        command = cmd
        title = shlex.join(cmd)
    else:
        command = runner.workload_command(args.workload, args.steps, args.batch, args.rows, args.api,
                                          input_mode=args.input, input_latency_ms=args.input_latency_ms)
        title = f"{args.workload} batch {args.batch}, {args.steps} steps" + (f", api {args.api}" if args.api else "") \
            + (f", input {args.input}" if args.input else "")

    out = args.out or os.path.join("rtkit-bench", time.strftime("%Y%m%d-%H%M%S"))
    runs_dir = os.path.join(out, "runs")
    if os.path.isdir(runs_dir) and os.listdir(runs_dir):
        # new runs beside old ones would mix two benches in one bench.json: the old one is kept, a new folder named
        raise _err(f"--out {out} already holds a bench ({runs_dir} is not empty; it is kept): give a new folder, "
                   f"e.g. --out {_free_folder(out)}")

    spec = runner.BenchSpec(peers=available, skipped=skipped, libraries=libraries, command=command,
                            rounds=args.rounds, out=out, baseline=baseline, timeout_s=args.timeout, title=title,
                            argv=["rtkit", *sys.argv[1:]], notes=notes, progress=not args.no_progress)
    if args.dry_run:
        from rtkit.bench import stats
        for k, order in enumerate(stats.rotation([p.name for p in available], args.rounds), start=1):
            for name in order:
                peer = next(p for p in available if p.name == name)
                env = " ".join(f"{k2}={v}" for k2, v in peer.child_env({}, libraries.get(name)).items())
                print(f"r{k} {name}: {env + ' ' if env else ''}{' '.join(spec.rtkit)} run --run-dir "
                      f"{rundir.bench_run_dir(out, name, k)} "
                      f"{' '.join(peer.run_args())} -- {' '.join(command + peer.args)}")
        return 0
    try:
        rundir.make_writable(runs_dir)
    except OSError as exc:
        raise _err(f"--out {out} is not writable: {exc.strerror or exc}")

    if not cmd and _prepare_data(args) != 0:
        raise _err("could not generate the workload's data set (see above)")
    print(f"rtkit bench: {len(available)} configurations x {args.rounds} rounds: {', '.join(p.name for p in available)}; "
          f"baseline {baseline}; output {out}", file=sys.stderr)
    bench = runner.run_bench(spec)
    from rtkit.bench import output
    print(output.render_text(bench))
    for note in bench["notes"]:
        print(f"note: {note}")
    print(f"rtkit bench: wrote {os.path.join(out, 'bench.json')} and {os.path.join(out, 'bench.md')}", file=sys.stderr)
    if bench.get("interrupted"):
        return 130
    return 1 if any(r["status"] != "ok" for r in bench["runs"]) else 0
