# test_lookahead_backoff.py -- the lookahead of fed ids backs off while the steps' pages are in DRAM (no TensorFlow).
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
    _steps(fed, reads, lf.QUIET_STEPS, 0)                  # 16 steps, every one looked at, nothing read ahead
    assert la.counts["looked"] == lf.QUIET_STEPS and la.counts["skipped_steps"] == 0
    _steps(fed, reads, 2 * lf.QUIET_STEPS, 1)              # every second step now: 16 looked at, then every fourth
    assert la.counts["looked"] == 2 * lf.QUIET_STEPS and la.counts["skipped_steps"] == lf.QUIET_STEPS
    _steps(fed, reads, 8, 0)                               # every fourth: two of these eight looked at
    assert la.counts["looked"] == 2 * lf.QUIET_STEPS + 2, la.counts
    _steps(fed, reads, 4, 50)                              # a looked-at step that reads: every step again
    before = dict(la.counts)
    _steps(fed, reads, 5, 50)
    assert la.counts["looked"] == before["looked"] + 5 and la.counts["skipped_steps"] == before["skipped_steps"]


def test_reading_again_over_a_window_looks_twice_as_often():
    fed, la, reads = _fed()
    _steps(fed, reads, 3 * lf.QUIET_STEPS, 0)            # 16 at every step, 16 of 32 at every 2nd: now every 4th
    looked = la.counts["looked"]
    _steps(fed, reads, 4 * lf.QUIET_STEPS, 2 * lf.QUIET_PAGES)   # 16 looked at, each under RESUME_PAGES: every 2nd
    assert la.counts["looked"] == looked + lf.QUIET_STEPS, la.counts
    looked = la.counts["looked"]
    _steps(fed, reads, 2 * lf.QUIET_STEPS, 2 * lf.QUIET_PAGES)   # every 2nd: 16 looked at, then every step
    _steps(fed, reads, 5, 2 * lf.QUIET_PAGES)
    assert la.counts["looked"] == looked + lf.QUIET_STEPS + 5, la.counts


def test_steps_that_read_their_pages_ahead_are_all_looked_at():
    fed, la, reads = _fed()
    _steps(fed, reads, 10 * lf.QUIET_STEPS, lf.QUIET_PAGES)
    assert la.counts["looked"] == 10 * lf.QUIET_STEPS and la.counts["skipped_steps"] == 0


def test_measuring_looks_at_every_step():
    fed, la, reads = _fed("measure")
    _steps(fed, reads, 10 * lf.QUIET_STEPS, 0)
    assert la.counts["looked"] == 10 * lf.QUIET_STEPS and la.counts["skipped_steps"] == 0
