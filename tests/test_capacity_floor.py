# test_capacity_floor.py -- the capacity bench's hindsight floor (`python -m rtkit.bench.capacity_floor`) against a plain recount.
import subprocess
import sys
from argparse import Namespace
from collections import defaultdict

import pytest

from rtkit.bench import capacity_floor
from rtkit.workloads.data import NUM_CAT

SMALL = Namespace(steps=40, batch=256, emb_dim=16, distinct=50_000, zipf_exponent=0.9, seed=7)


def recount(args, share):
    """The same floor by a slow, separate route: dicts over the draws, ties between equally used pages broken by
    page number as the module's stable sort does."""
    rows = capacity_floor.first_seen_rows(args.steps, args.batch, args.distinct, args.zipf_exponent, args.seed)
    per_page = 4096 // (args.emb_dim * 4)
    steps_of = defaultdict(set)
    for i, row in enumerate(rows.tolist()):
        steps_of[row // per_page].add(i // args.batch)
    order = sorted(steps_of, key=lambda p: (-len(steps_of[p]), p))
    kept = set(order[: int(len(order) * share)])
    reads = writes = q4_reads = 0
    for page, steps in steps_of.items():
        if page in kept:
            continue
        for s in steps:
            writes += 1
            again = s != min(steps)
            reads += again
            q4_reads += again and s >= args.steps - args.steps // 4
    scale = 2 * NUM_CAT
    return reads * scale * 4096, writes * scale * 4096, q4_reads * scale / (args.steps // 4)


def test_first_seen_rows_number_new_ids_in_order():
    rows = capacity_floor.first_seen_rows(30, 128, 10_000, 0.9, 3).tolist()
    seen = 0
    for r in rows:  # each draw is a row met before or exactly the next new one
        assert r <= seen
        seen += r == seen
    assert seen == len(set(rows)) > 128


@pytest.mark.parametrize("share", [0.0, 0.5, 0.8, 1.0])
def test_floor_matches_a_plain_recount(share):
    (got,) = capacity_floor.floor(SMALL, [share])
    reads, writes, q4_reads = recount(SMALL, share)
    assert (got["read_bytes"], got["written_bytes"]) == (reads, writes)
    assert got["last_quarter_reads_per_step"] == pytest.approx(q4_reads)
    if share == 1.0:
        assert reads == writes == 0
    if share == 0.0:
        assert writes > reads > 0   # every touch of a page but its first is a read


def test_keeping_more_never_costs_more():
    figures = capacity_floor.floor(SMALL, [0.0, 0.3, 0.6, 0.9, 1.0])
    for more, less in zip(figures[1:], figures):
        assert more["read_bytes"] <= less["read_bytes"]
        assert more["written_bytes"] <= less["written_bytes"]
    assert figures[0]["written_bytes"] > figures[-2]["written_bytes"] > 0


def test_bad_shares_get_one_line_and_exit_2():
    p = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity_floor", "--keep", "0.8,1.5"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "--keep '0.8,1.5'" in p.stderr and "between 0 and 1" in p.stderr


def test_the_command_prints_a_line_per_share():
    p = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity_floor", "--steps", "20", "--batch", "64",
                        "--distinct", "5000", "--keep", "1,0"], capture_output=True, text=True, check=True)
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("keep 100% of ") and "0.0 GiB read, 0.0 GiB written" in lines[0]
    assert lines[1].startswith("keep 0% of ") and "0.0 GiB written" not in lines[1]
