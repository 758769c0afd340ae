# run.py -- `rtkit run [options] -- CMD ...`: parse the options and hand them to the run pipeline (rtkit/runner.py).
from __future__ import annotations

import argparse
import os
from typing import List

from rtkit.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run a command (a training script) under rtkit",
                              description="Run CMD with rtkit's allocator, hooks and scheduler, then write a report.",
                              usage="rtkit run [options] -- CMD [ARGS...]")
    p.add_argument("--profile", help="named tuning profile (see `rtkit config --profiles`) or a .toml path")
    p.add_argument("--out", help="folder for run directories (default: rtkit-runs)")
    p.add_argument("--name", help="name of this run (default: the command's name)")
    p.add_argument("--run-dir", help="exact run directory to use instead of OUT/<time>-<name>")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set any rtkit setting for this run (repeatable), e.g. --set malloc_min_size=64K")
    p.add_argument("--plan", help="allocator plan from an earlier run (RUN_DIR/malloc-plan.txt) to start with")
    p.add_argument("--html", action="store_true", help="also write report.html into the run directory")
    p.add_argument("--tensorboard", metavar="DIR", help="write the per-step figures as TensorBoard scalars into DIR "
                   "(setting tensorboard_dir)")
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve the live figures as OpenMetrics (Prometheus) "
                   "on port N while the job runs (setting metrics_port)")
    p.add_argument("--metrics-host", metavar="ADDR", help="address for --metrics-port (default 127.0.0.1)")
    p.add_argument("--quiet", action="store_true", help="print nothing at the end when the command succeeds (the report is still written; problems are still said)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(func=main)


def main(args) -> int:
    from rtkit import runner, tree_guard

    tree_guard.die_with_launcher()

    command: List[str] = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("rtkit run: error: no command given: use `rtkit run [options] -- CMD [ARGS...]`")
    resolved = runner.resolve(args.set, profile=args.profile, plan=args.plan,
                              options={"out": args.out, "name": args.name, "tensorboard_dir": args.tensorboard,
                                       "metrics_port": args.metrics_port, "metrics_host": args.metrics_host})
    from rtkit.cluster import spec   # a task of a TF parameter-server cluster? (bad spec: UserError, exit 2)

    task = spec.detect_checked(os.environ, command)
    return runner.execute(command, resolved, run_dir=args.run_dir, html=args.html, quiet=args.quiet, task=task)[0]
