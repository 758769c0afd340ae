# test_lookahead_backoff.py -- the lookahead backs off while the steps' pages are in DRAM: fed ids and staged batches (no TensorFlow).
from rtkit.scheduler import lookahead as la_mod
from rtkit.scheduler import lookahead_feeds as lf


class _Lookahead:
    """What FedLookahead asks of a Lookahead: its counts, its mode, and the two ways a step is counted."""

    def __init__(self, mode="on"):
        self.mode = mode
        self.counts = {"pages_read_ahead": 0, "skipped_steps": 0, "looked": 0}

    def add_skipped(self):
        self.counts["skipped_steps"] += 1

    def add_before(self, seconds):
        self.counts["looked"] += 1


def _fed(mode="on"):
    la = _Lookahead(mode)
    fed = lf.FedLookahead(plan=None, lookahead=la, run_feed=None)
    reads = []
    fed._before_step = lambda which, values: la.counts.__setitem__(
        "pages_read_ahead", la.counts["pages_read_ahead"] + reads.pop(0))
    return fed, la, reads


def _steps(fed, reads, n, pages):
    for _ in range(n):
        reads.append(pages)
        fed.before_step([0], {})
        if reads:        # a skipped step read nothing: its planned pages go unused
            reads.pop()


def test_the_lookahead_looks_at_fewer_steps_while_their_pages_are_in_dram_and_at_every_one_again_after():
    fed, la, reads = _fed()
    _steps(fed, reads, la_mod.QUIET_STEPS, 0)                  # 16 steps, every one looked at, nothing read ahead
    assert la.counts["looked"] == la_mod.QUIET_STEPS and la.counts["skipped_steps"] == 0
    _steps(fed, reads, 2 * la_mod.QUIET_STEPS, 1)              # every second step now: 16 looked at, then every fourth
    assert la.counts["looked"] == 2 * la_mod.QUIET_STEPS and la.counts["skipped_steps"] == la_mod.QUIET_STEPS
    _steps(fed, reads, 8, 0)                               # every fourth: two of these eight looked at
    assert la.counts["looked"] == 2 * la_mod.QUIET_STEPS + 2, la.counts
    _steps(fed, reads, 4, 50)                              # a looked-at step that reads: every step again
    before = dict(la.counts)
    _steps(fed, reads, 5, 50)
    assert la.counts["looked"] == before["looked"] + 5 and la.counts["skipped_steps"] == before["skipped_steps"]


def test_reading_again_over_a_window_looks_twice_as_often():
    fed, la, reads = _fed()
    _steps(fed, reads, 3 * la_mod.QUIET_STEPS, 0)            # 16 at every step, 16 of 32 at every 2nd: now every 4th
    looked = la.counts["looked"]
    _steps(fed, reads, 4 * la_mod.QUIET_STEPS, 2 * la_mod.QUIET_PAGES)   # 16 looked at, each under RESUME_PAGES: every 2nd
    assert la.counts["looked"] == looked + la_mod.QUIET_STEPS, la.counts
    looked = la.counts["looked"]
    _steps(fed, reads, 2 * la_mod.QUIET_STEPS, 2 * la_mod.QUIET_PAGES)   # every 2nd: 16 looked at, then every step
    _steps(fed, reads, 5, 2 * la_mod.QUIET_PAGES)
    assert la.counts["looked"] == looked + la_mod.QUIET_STEPS + 5, la.counts


def test_steps_that_read_their_pages_ahead_are_all_looked_at():
    fed, la, reads = _fed()
    _steps(fed, reads, 10 * la_mod.QUIET_STEPS, la_mod.QUIET_PAGES)
    assert la.counts["looked"] == 10 * la_mod.QUIET_STEPS and la.counts["skipped_steps"] == 0


def test_measuring_looks_at_every_step():
    fed, la, reads = _fed("measure")
    _steps(fed, reads, 10 * la_mod.QUIET_STEPS, 0)
    assert la.counts["looked"] == 10 * la_mod.QUIET_STEPS and la.counts["skipped_steps"] == 0


def _staged_lookahead(region, rows_per_table=64):
    """A Lookahead over one table found at the start of `region` (an anonymous mapping, 64-byte rows), its worker
    running; the plan holds what the worker reads of it."""
    import ctypes
    import types

    import numpy as np

    table = types.SimpleNamespace(rows=len(region) // 64, row_bytes=64, slots=[], dtype=np.dtype(np.float32))
    plan = types.SimpleNamespace(tables={"t": table}, table_of_index=["t"])
    la = la_mod.Lookahead(plan, "on", max_rows=1 << 20, pool_path="", run_touch=lambda *a: [],
                          thread_name="test-lookahead")
    la.bases = {"t": [ctypes.addressof(ctypes.c_char.from_buffer(region))]}
    la._find_tries = la_mod.FIND_TRIES      # found: no search
    return la


def _batches(la, n, rows):
    """n staged batches of the given rows, each taken by its step once the worker is done with it (or skipped it).
    As the staging put does: the back-off decides before the put whether its rows are fetched at all."""
    import numpy as np

    for _ in range(n):
        if la.wants_rows():
            la.on_put([np.asarray(rows, dtype=np.int64)])
        else:
            la.on_put_unlooked()
        with la.cond:
            la.cond.wait_for(lambda: la.items and la.items[0].done, timeout=60)
        la.on_take()


def test_a_staged_lookahead_skips_batches_whose_pages_are_in_dram_and_looks_at_all_once_pages_are_out():
    """The staged worker backs off as the fed lookahead does: batches whose rows' pages are all in DRAM read nothing
    ahead, so it looks at fewer of them (counted as skipped, not measured); once the rows' pages are out of DRAM
    (given back to the kernel), the next batch looked at reads them ahead and every batch is looked at again."""
    import mmap

    region = mmap.mmap(-1, 256 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"\1" * len(region))                      # every page in DRAM
    la = _staged_lookahead(region)
    rows = list(range(0, 256 * mmap.PAGESIZE // 64, 64))   # a row on every page
    try:
        _batches(la, 3 * la_mod.QUIET_STEPS, rows)
        c = dict(la.counts)
        assert c["batches"] == 3 * la_mod.QUIET_STEPS and c["pages_read_ahead"] == 0, c
        # 16 looked at, then every second: 16 of the next 32 looked at, 16 skipped
        assert c["skipped_steps"] == la_mod.QUIET_STEPS and c["errors"] == 0, c
        assert c["batches_measured"] == c["batches"] - c["skipped_steps"], c
        region.madvise(mmap.MADV_DONTNEED)                  # the pages leave DRAM
        _batches(la, 2 * la_mod.MAX_EVERY, rows)
        assert la.counts["pages_read_ahead"] >= la_mod.RESUME_PAGES and la.back_off.every == 1, la.counts
    finally:
        la.stop()
        region.close()
