# compare.py -- `rtkit compare RUN_A RUN_B [--json]`: two runs side by side with B/A ratios.
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare", help="compare two runs side by side with ratios (B/A)",
        description="Put the headline figures of two runs side by side with the ratio B/A "
                    "(below 1.0 is smaller in B: better for times, memory and faults). Settings, profile and components that differ come first; ratios inside the runs' own per-step spread are marked 'within noise'.")
    p.add_argument("run_a", metavar="RUN_A", help="run directory (or report.json) of the baseline")
    p.add_argument("run_b", metavar="RUN_B", help="run directory (or report.json) to compare with it")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--width", type=int, default=None,
                   help="columns to fit the text in (default: the terminal's width; COLUMNS is honoured)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from rtkit.report.load import load
    from rtkit.report import compare
    from rtkit.cluster import merge
    clusters = [merge.is_cluster_dir(args.run_a), merge.is_cluster_dir(args.run_b)]
    if all(clusters):   # two cluster folders
        from rtkit.cluster import show
        return show.compare(args)
    if any(clusters):
        from rtkit.errors import UserError
        folder, other = (args.run_a, args.run_b) if clusters[0] else (args.run_b, args.run_a)
        raise UserError(f"rtkit compare: '{folder}' is a cluster folder and '{other}' is not: compare two cluster "
                        f"folders or two run directories (a task's own run is '{folder}/<role>-<index>')")
    a, _ = load(args.run_a)
    b, _ = load(args.run_b)
    if args.json:
        json.dump(compare.compare(a, b, args.run_a, args.run_b), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(compare.render(a, b, args.run_a, args.run_b, width=args.width))
    return 0
