# capacity_floor.py -- `python -m rtkit.bench.capacity_floor`: what an ideal DRAM placement of the capacity bench's rows would read and write.
"""A hindsight floor for the capacity bench (not a test, nothing trained): the bench's id law (``rtkit.workloads.zipf``,
the same inverse CDF, drawn with numpy), rows handed out in first-seen order as the bundled EmbeddingVariable
analogue does, for one feature's whole run; each of the given shares of the pages ever touched is kept in DRAM,
the pages touched in the most steps (a fixed choice made knowing the whole run), the others live on disk.

A page kept on disk costs a read each step it is touched again after its first (its first touch is a new row:
nothing to read) and a write for each step that touches it (every touch is an Adagrad update: the page is
dirty, and leaves DRAM dirty at least once per touch). The figures are the embedding table's 4 KiB pages times
two (its slot has the same rows at the same offsets) and times the features (every feature draws alike); the
wide weights (4 bytes a row) are left out. Nothing here is what rtkit does: it is the least a placement that
keeps that much in DRAM must read and write, to set beside what the bench's (b) read and wrote (docs/results.md).
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List

from rtkit.workloads.data import NUM_CAT

PAGE = 4096
GIB = 1 << 30


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.capacity_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--emb-dim", type=int, default=64)
    p.add_argument("--distinct", type=int, default=50_000_000, help="distinct ids per feature")
    p.add_argument("--zipf-exponent", type=float, default=0.9)
    p.add_argument("--keep", default="0.8,0.7", help="shares of the touched pages kept in DRAM (comma-separated, "
                   "each in [0, 1]; default 0.8,0.7)")
    p.add_argument("--seed", type=int, default=1)
    return p


def parse_shares(text: str) -> List[float]:
    try:
        shares = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        shares = []
    if not shares or any(not 0.0 <= s <= 1.0 for s in shares):
        raise ValueError(f"--keep {text!r}: comma-separated shares between 0 and 1 expected, e.g. 0.8,0.7")
    return shares


def first_seen_rows(steps: int, batch: int, distinct: int, exponent: float, seed: int):
    """Row of every draw of the run (first-seen order: a new id takes the next row), in draw order."""
    import numpy as np

    from rtkit.workloads.zipf import _ranks_np

    ranks = _ranks_np(np.random.default_rng(seed).random(steps * batch), distinct, exponent)
    _, first, inverse = np.unique(ranks, return_index=True, return_inverse=True)
    row_of = np.empty(len(first), np.int64)
    row_of[np.argsort(first, kind="stable")] = np.arange(len(first))
    return row_of[inverse.reshape(-1)]


def floor(args, shares: List[float]) -> List[Dict[str, float]]:
    import numpy as np

    rows = first_seen_rows(args.steps, args.batch, args.distinct, args.zipf_exponent, args.seed)
    rows_per_page = max(1, PAGE // (args.emb_dim * 4))
    step = np.repeat(np.arange(args.steps, dtype=np.int64), args.batch)
    touch = np.unique(step * (1 << 32) + rows // rows_per_page)   # one touch per (step, page)
    t_step, t_page = touch >> 32, touch & ((1 << 32) - 1)
    steps_of = np.bincount(t_page)
    first_step = np.full(len(steps_of), args.steps, np.int64)
    np.minimum.at(first_step, t_page, t_step)
    touched = np.flatnonzero(steps_of)
    by_use = touched[np.argsort(-steps_of[touched], kind="stable")]
    scale = 2 * NUM_CAT                                 # the slot table, every feature
    last_quarter = t_step >= args.steps - args.steps // 4
    out = []
    for share in shares:
        kept = np.zeros(len(steps_of), bool)
        kept[by_use[: int(len(touched) * share)]] = True
        cold = ~kept[t_page]
        reads = cold & (t_step != first_step[t_page])
        quarter_steps = max(1, args.steps // 4)
        out.append({
            "keep": share,
            "pages_touched": int(len(touched)) * scale,
            "kept_bytes": float(int(len(touched) * share) * scale * PAGE),
            "last_quarter_reads_per_step": float(np.count_nonzero(reads & last_quarter)) * scale / quarter_steps,
            "last_quarter_writes_per_step": float(np.count_nonzero(cold & last_quarter)) * scale / quarter_steps,
            "read_bytes": float(np.count_nonzero(reads)) * scale * PAGE,
            "written_bytes": float(np.count_nonzero(cold)) * scale * PAGE,
        })
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        shares = parse_shares(args.keep)
    except ValueError as e:
        sys.stderr.write(f"capacity_floor: {e}\n")
        return 2
    for f in floor(args, shares):
        print(f"keep {f['keep']:.0%} of {f['pages_touched']:,} pages touched ({f['kept_bytes'] / GIB:.1f} GiB): "
              f"last quarter {f['last_quarter_reads_per_step']:.0f} reads and {f['last_quarter_writes_per_step']:.0f} "
              f"writes a step; the run {f['read_bytes'] / GIB:.1f} GiB read, {f['written_bytes'] / GIB:.1f} GiB written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
