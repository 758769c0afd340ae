# top.py -- `rtkit top RUN_DIR` (alias `rtkit watch`): a live terminal view of a running job or a cluster folder.
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "top", aliases=["watch"], help="watch a running job (or a cluster folder) in the terminal; q quits",
        description="A terminal view of a job under `rtkit run` that redraws every few seconds: steps/s, step "
                    "time over the last window, RSS, faults per step, the allocator's state, tier residency and "
                    "the scheduler's verdicts; one line per task on an `rtkit launch` folder. q quits.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (or cluster folder) of a running or finished job")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between redraws (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (also without a terminal)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from rtkit.errors import UserError
    from rtkit.live import top

    if not args.interval > 0:
        raise UserError(f"rtkit top: error: --interval {args.interval}: expected seconds > 0")
    return top.run(args.run_dir, args.interval, once=args.once)
