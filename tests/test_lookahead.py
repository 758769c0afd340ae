# test_lookahead.py -- the scheduler's lookahead: the next staged batch's table rows made resident before its step.
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import load_report, requires_tf, run_rtkit
from rtkit.report import summary

pytestmark = pytest.mark.timeout(900)
MIB = 1 << 20


class _Dense:
    """The same input stage, no table: a dense model of the parsed columns."""

    def __init__(self, ts, path):
        tf, tf1 = ts.tf, ts.tf1
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.iterator = tf1.data.make_initializable_iterator(tf.data.TextLineDataset(path).batch(32))
            cols = tf.strings.split(self.iterator.get_next(), ",").to_tensor()
            label, x = tf.strings.to_number(cols[:, 0]), tf.strings.to_number(cols[:, 2])
            w = tf1.get_variable("w", [1], initializer=tf1.constant_initializer(0.1))
            self.loss = tf.reduce_mean(tf.square(x * w - label))
            self.train = tf1.train.GradientDescentOptimizer(0.1).minimize(self.loss)
            self.init = tf1.global_variables_initializer()


def _inprocess(tmp_path, gather=True, **kw):
    """The small sparse model of test_scheduler (a plain resource variable gathered at hashed ids parsed in the
    input stage), trained to the end of its data under a Scheduler with `kw` settings: (losses, lookahead report)."""
    import tensorflow

    import test_scheduler as ts

    ts.tf, ts.tf1 = tensorflow, tensorflow.compat.v1
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = ts.write_data(str(tmp_path / "data.csv"), 320)
    m = ts.Model(path) if gather else _Dense(ts, path)
    sched = ts.Scheduler(ts.tf, ts.settings(**kw), str(tmp_path))
    h = ts.Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    losses = []
    try:
        while True:
            _, value = h.run([m.train, m.loss])
            losses.append(float(value))
    except ts.tf.errors.OutOfRangeError:
        pass
    h.close()
    return losses, sched.report()["pipeline"]["lookahead"]


@requires_tf
def test_plain_variable_gather_is_looked_ahead_and_trains_the_same(tmp_path):
    """A tf.compat.v1 session script's plain variable, gathered at ids its input stage parses: the lookahead finds
    the gather, copies its index computation and touches each next batch's rows of the table and its Adagrad slot,
    and the losses are the same to the bit as without it."""
    off, rep_off = _inprocess(tmp_path / "off", sched_stage=True, sched_lookahead="off")
    on, rep = _inprocess(tmp_path / "on", sched_stage=True, sched_lookahead="on")
    assert rep_off["state"] == "off" and rep_off["off_reason"] == "sched_lookahead=off"
    assert len(on) == 10 and on == off
    assert rep["state"] == "on" and rep["gathers"] == 1 and rep["tables"] == 1, rep
    assert rep["batches"] == 10 and rep["errors"] == 0, rep
    # every batch's rows were computed (ids hashed into 500 buckets: a batch of 32 lines uses at most 500 rows)
    assert 0 < rep["rows_requested"] <= 10 * 500 and rep["batches_touched"] >= 1, rep
    assert rep["bytes_requested"] >= rep["rows_requested"] * 8 * 4 * 2   # the table's rows and its slot's
    # bounded: at most sched_lookahead_max_rows rows a batch, the rest counted as capped
    capped, rep_cap = _inprocess(tmp_path / "cap", sched_stage=True, sched_lookahead="on", sched_lookahead_max_rows=3)
    assert capped == off and rep_cap["rows_capped"] > 0, rep_cap
    assert rep_cap["rows_requested"] <= 3 * rep_cap["batches_touched"], rep_cap


@requires_tf
def test_lookahead_off_says_why_and_the_job_runs(tmp_path):
    """Staging off, no tier pool under auto, no table gather: the lookahead is off with its reason, the job trains."""
    losses, rep = _inprocess(tmp_path / "nostage", sched_stage=False, sched_lookahead="on")
    assert len(losses) == 10 and rep["state"] == "off" and "staging is off" in rep["off_reason"], rep
    losses, rep = _inprocess(tmp_path / "auto", sched_stage=True, sched_lookahead="auto", tier_pool_path="")
    assert len(losses) == 10 and rep["state"] == "off" and "not in tier mode" in rep["off_reason"], rep
    losses, rep = _inprocess(tmp_path / "dense", gather=False, sched_stage=True, sched_lookahead="on")
    assert len(losses) == 10 and rep["state"] == "off" and "no gather of a table variable" in rep["off_reason"], rep


def test_bad_lookahead_settings_say_one_line_and_the_job_runs(tmp_path):
    """A value out of the table's limits, or not one of the choices (from the environment), falls back to the
    default with one line naming it; the job runs."""
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "r"), "--set", "sched_lookahead_max_rows=0",
                      "--", sys.executable, "-c", "print('ran')"], env={"RTKIT_SCHED_LOOKAHEAD": "sometimes"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "LOOKAHEAD" in x.upper()]
    assert len(lines) == 2, proc.stderr
    assert any("sched_lookahead_max_rows" in x.lower() and "using the default '1048576'" in x for x in lines), lines
    assert any("RTKIT_SCHED_LOOKAHEAD='sometimes'" in x and "auto/on/off/measure" in x for x in lines), lines


def _tier_wdl(run_dir, pool, mode, api="session", sets=(), steps=30, rows=2000):
    """The bundled Wide&Deep (EmbeddingVariable analogue: hash-table ids -> rows, lazily filled tables and Adagrad
    slots, hashed rows so that a batch's rows are scattered over many pages) staged, in tier mode with the pool on
    disk held to 24 MiB resident, so that the rows a step gathers are often out of DRAM. The heat passes run in the
    step marks (tier_heat_worker=0): what is out of DRAM at a step does not depend on when a worker ran its pass."""
    args = ["run", "--quiet", "--run-dir", str(run_dir), "--set", "sched=1", "--set", "sched_stage=1",
            "--set", f"sched_lookahead={mode}", "--set", f"tier_pool_path={pool}", "--set", "tier_pool_size=600M",
            "--set", f"tier_resident_max={24 * MIB}", "--set", "tier_heat_worker=0"] + \
        [a for kv in sets for a in ("--set", kv)] + [
            "--", sys.executable, "-m", "rtkit.workloads", "wdl",
            "--api", api, "--table-gb", "0.25", "--steps", str(steps), "--batch", "128", "--rows", str(rows),
            "--print-losses", "--no-progress", "--table-fill", "lazy", "--row-assign", "hashed"]
    proc = run_rtkit(args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = re.findall(r"^loss \d+ \S+$", proc.stdout, re.M)
    report = load_report(str(run_dir))
    return losses, report["scheduler"]["pipeline"]["lookahead"], summary.scheduler_line(report)


def _heat_on(run_dir):
    """The tier's heat budget ran (Linux >= 6.7: PAGEMAP_SCAN): only then is the lookahead's word heard."""
    return load_report(str(run_dir))["pmem"]["heat"]["mechanism"] == "pagemap_scan"


@requires_tf
def test_tier_lookahead_makes_the_next_batch_resident_and_trains_the_same(tmp_path):
    """On the bundled workload in tier mode, the pages of each next batch's table rows are in DRAM before its step
    far more often with the lookahead than without it (mode measure: the same rows computed and checked, nothing
    touched), and the losses are the same to the bit with it on, measuring, and off."""
    pool = tmp_path / "pool"
    off, rep_off, _ = _tier_wdl(tmp_path / "off", pool, "off")
    base, rep_base, _ = _tier_wdl(tmp_path / "measure", pool, "measure")
    # each step waits for its batch's lookahead (sched_lookahead_wait_ms), so that what is measured is the lookahead's
    # effect, not a race between the worker and the step on a loaded machine
    on, rep, line = _tier_wdl(tmp_path / "on", pool, "on", sets=["sched_lookahead_wait_ms=600000"])
    assert len(off) == 30 and on == off and base == off
    assert rep_off["state"] == "off" and rep_off["off_reason"] == "sched_lookahead=off"
    assert rep["state"] == "on" and rep["gathers"] == 52 and rep["tables"] == 52 and rep["errors"] == 0, rep
    assert rep["tables_measured"] >= 4 and rep_base["tables_measured"] >= 4, (rep, rep_base)
    assert rep["batches_measured"] >= 10 and rep_base["batches_measured"] >= 10
    assert rep["pages_requested"] > 0 and rep["bytes_requested"] > 0 and rep["worker_cpu_s"] > 0
    assert rep_base["pages_requested"] == 0 and rep_base["bytes_requested"] == 0   # measuring touches nothing
    # only the pages out of DRAM when the worker looked are read (MADV_WILLNEED on a page in DRAM reads nothing, and on
    # a table's DRAM head would read the pool file's own pages): some of the batch's pages were resident already
    assert 0 < rep["pages_read_ahead"] < rep["pages_requested"] and rep_base["pages_read_ahead"] == 0, (rep, rep_base)
    # measured on a loaded 2-core machine: 0.88 with the lookahead and its wait against 0.61 measuring only; 0.78-0.82
    # without the wait (docs/scheduler.md)
    assert rep["resident_share"] >= rep_base["resident_share"] + 0.08, (rep_base, rep)
    assert rep["late_batches"] == 0 and rep["wait_s"] >= 0, rep   # every step waited for its batch (it may have been done)
    # the pages read ahead were told to the tier's heat budget, which kept them through the marks before their step
    # (unwritten, they read as the coldest): few are out again at the step (15% of those checked when the budget
    # did not know them)
    assert rep["budget_pages_told"] > 0 and rep_base["budget_pages_told"] == 0, (rep, rep_base)
    if _heat_on(tmp_path / "on"):
        assert rep["budget_pages_kept"] > 0 and rep["wasted_pages"] * 20 < rep["pages_checked"], rep
        assert "kept for it by the tier budget" in line, line
    # the summary's scheduler line says it
    assert re.search(r"; lookahead [\d,]+ pages \(.+\) requested ahead over 30 batches, [\d.]+% of the next step's pages "
                     r"resident before it \(mincore, 52 tables\), [\d,]+ not resident read ahead, \d+ late, [\d,]+ pages "
                     r"wasted, (\S+ kept for it by the "
                     r"tier budget, )?worker CPU", line), line


@requires_tf
def test_tier_lookahead_under_monitored_training_session(tmp_path):
    """The bundled workload's MonitoredTrainingSession loop (hooks, its own runs) in tier mode: the lookahead finds
    the tables' gathers in the staged graph and the tables in the pool, touches each next batch's rows, tells the
    tier budget their pages, and the losses are the same to the bit as without it (small: 8 steps)."""
    pool = tmp_path / "pool"
    off, rep_off, _ = _tier_wdl(tmp_path / "off", pool, "off", api="monitored", steps=8, rows=1024)
    on, rep, line = _tier_wdl(tmp_path / "on", pool, "on", api="monitored", steps=8, rows=1024,
                              sets=["sched_lookahead_wait_ms=600000"])
    assert len(off) == 8 and on == off
    assert rep_off["state"] == "off" and rep_off["off_reason"] == "sched_lookahead=off"
    assert rep["state"] == "on" and rep["gathers"] == 52 and rep["tables"] == 52 and rep["errors"] == 0, rep
    assert rep["batches"] >= 7 and rep["batches_touched"] >= 7 and rep["late_batches"] == 0, rep
    assert rep["rows_requested"] > 0 and rep["pages_requested"] > 0 and rep["bytes_requested"] > 0, rep
    assert rep["tables_measured"] >= 4 and rep["batches_measured"] >= 4 and rep["pages_checked"] > 0, rep
    assert rep["budget_pages_told"] > 0, rep
    assert "lookahead" in line and "of the next step's pages resident before it" in line, line


def _fed_script(tmp_path, hashed, ref=False, **kw):
    """A TF1 script of the ordinary kind: a plain variable (a resource variable, or with `ref` a TF1 reference
    variable, as tf.compat.v1.disable_v2_behavior() makes them) gathered at fed ids (as they are, or hashed in the
    graph by a modulo), Adagrad, 6 steps of fed batches, under a Scheduler with `kw` settings: (losses, lookahead
    report)."""
    import numpy as np
    import tensorflow

    import test_scheduler as ts

    ts.tf, ts.tf1 = tensorflow, tensorflow.compat.v1
    tf, tf1 = ts.tf, ts.tf1
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int64, [None], name="ids")
        table = tf1.get_variable("emb", [500, 8], initializer=tf1.truncated_normal_initializer(stddev=0.1, seed=3),
                                 use_resource=not ref)
        rows = tf.math.floormod(ids * 7919, 500) if hashed else ids
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(tf.nn.embedding_lookup(table, rows), axis=1) - 1.0))
        train = tf1.train.AdagradOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    sched = ts.Scheduler(ts.tf, ts.settings(**kw), str(tmp_path))
    h = ts.Hooked(sched, graph)
    h.run(init)
    rng = np.random.default_rng(1)
    losses = [float(h.run([train, loss], {ids: rng.integers(0, 500, 64)})[1]) for _ in range(6)]
    h.close()
    return losses, sched.report()["pipeline"]["lookahead"]


@requires_tf
@pytest.mark.parametrize("hashed,ref", [(False, False), (True, False), (False, True)],
                         ids=["fed-rows", "hashed-in-graph", "reference-variable"])
def test_fed_ids_are_looked_up_from_the_steps_own_feeds(tmp_path, hashed, ref):
    """A script that feeds its ids has no staged batch, yet the lookahead takes each step's rows from its own feeds
    (the fed tensor itself, or a read-only copy of the graph's hashing of it), for every step, trains the same to
    the bit, and says where its rows came from; with sched_lookahead=off it is off. A TF1 reference variable (no
    handle: gathered through its snapshot, updated by SparseApplyAdagrad) is a table as a resource variable is, its
    Adagrad accumulator its slot."""
    off, rep_off = _fed_script(tmp_path / "off", hashed, ref, sched_lookahead="off")
    on, rep = _fed_script(tmp_path / "on", hashed, ref, sched_lookahead="on")
    assert rep_off["state"] == "off" and len(off) == 6 and on == off
    assert rep["state"] == "on" and rep["rows_from"] == "feeds" and rep["gathers"] == 1 and rep["tables"] == 1, rep
    assert rep["regions"] == 2, rep   # the table and its Adagrad slot
    assert rep["batches"] == 6 and rep["errors"] == 0, rep   # the init run feeds nothing: it is not looked at
    # no tier pool in this process: no table is found, so nothing is asked for and nothing is claimed
    assert rep["pool_found"] is False and rep["pages_requested"] == 0 and rep["rows_requested"] == 0, rep


@requires_tf
def test_tier_fed_rows_are_asked_for_before_the_step(tmp_path):
    """The user-style script (a randomly initialised table past the placement size, Adagrad, fed power-law ids) in
    tier mode with a small resident budget: the lookahead finds the table in the pool, asks for each step's pages of
    it, and the losses are the same to the bit as measuring only; the summary line says so. (The pool's room: as in
    test_lookahead_alone's _capacity.)"""
    def run(mode):
        args = ["run", "--quiet", "--run-dir", str(tmp_path / mode), "--set", "sched=1", "--set",
                f"sched_lookahead={mode}", "--set", f"tier_pool_path={tmp_path / 'pool'}", "--set",
                "tier_pool_size=1G", "--set", f"tier_resident_max={16 * MIB}", "--set", "tier_dram_head=0", "--",
                sys.executable, "-m", "rtkit.bench.user_table", "--rows", "300000", "--dim", "64", "--steps", "6",
                "--batch", "1024"]
        proc = run_rtkit(args, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = load_report(str(tmp_path / mode))
        return (re.findall(r"^loss \d+ \S+$", proc.stdout, re.M), report["scheduler"]["pipeline"]["lookahead"],
                summary.scheduler_line(report))

    base, rep_base, _ = run("measure")
    on, rep, line = run("on")
    assert len(on) == 6 and on == base
    assert rep["rows_from"] == "feeds" and rep["errors"] == 0 and rep["tables_measured"] == 1, rep
    # the table and its Adagrad slot (a constant 0.1 at first) both found among the allocator's pool records
    assert rep["regions_found"] == rep["regions"] == 2 and rep_base["regions_found"] == 2, (rep, rep_base)
    assert rep["batches"] == 6 and rep["pages_requested"] > 0 and rep["bytes_requested"] >= rep["rows_requested"] * 256
    assert rep_base["pages_requested"] == 0 and rep_base["batches_measured"] >= 4, rep_base   # measuring asks nothing
    assert re.search(r"; lookahead [\d,]+ pages \(.+\) requested together just before their steps \(rows from the "
                     r"steps' feeds\) over 6 steps, [\d.]+% of the step's pages resident already \(mincore, 1 table\)",
                     line), line


def test_a_table_is_told_from_its_slot_among_records_of_its_size():
    """find_in_records on real memory: four records of one size (a table, its slot holding a constant but for the
    rows a step moved, two other slots still all constant): the table and the moved slot are found by their rows'
    values at their places; a name that two records fit equally (all-constant rows) stays unfound."""
    import ctypes
    import mmap

    import numpy as np

    from rtkit.scheduler import lookahead_pages as pages

    rows, dim = 1000, 8
    size = rows * dim * 4
    bufs = [mmap.mmap(-1, size) for _ in range(4)]
    arrs = [np.frombuffer(b, dtype=np.float32).reshape(rows, dim) for b in bufs]
    addrs = [ctypes.addressof(ctypes.c_char.from_buffer(b)) for b in bufs]
    arrs[0][:] = np.random.default_rng(0).normal(size=(rows, dim))
    arrs[1][:] = 0.1
    arrs[2][:] = 0.1
    arrs[3][:] = 0.1
    picked = np.array([3, 40, 500, 999])
    arrs[1][picked] += np.float32(1e-7) * np.arange(1, dim + 1, dtype=np.float32)   # the rows the step updated
    records = [(a, size) for a in addrs] + [(addrs[0], size + 64)]   # and one of another size
    wanted = {"t#0": (dim * 4, picked, arrs[0][picked].copy()), "t#1": (dim * 4, picked, arrs[1][picked].copy()),
              "u#1": (dim * 4, picked, np.full((4, dim), 0.1, dtype=np.float32))}
    found = pages.find_in_records(records, wanted, {k: size for k in wanted})
    assert found == {"t#0": addrs[0], "t#1": addrs[1]}, (found, addrs)
    del arrs
    for b in bufs:
        b.close()


_RESIDENT_CHECK = """
import ctypes, mmap, sys
import numpy as np
from rtkit.scheduler import lookahead_pages as pages
n = 4 * pages.GAP_PAGES * 8
m = mmap.mmap(-1, n * pages.PAGE)
first = ctypes.addressof(ctypes.c_char.from_buffer(m)) // pages.PAGE
for i in range(0, n, 3):
    m[i * pages.PAGE] = 1
rng = np.random.default_rng(0)
scattered = np.arange(0, n, pages.GAP_PAGES + 1)        # each page its own mincore call
clustered = np.unique(rng.integers(0, n, 200))          # runs of pages a call shares
unsorted = rng.permutation(np.arange(0, 300))           # any order: the allocator's call takes it (Python's: sorted)
for picked in (scattered, clustered, np.array([n - 1]), np.array([0, 1, 2, 3])) + \
        ((unsorted,) if pages._resident is not None else ()):
    got = pages.resident(picked + first)
    assert (got == (picked % 3 == 0)).all(), (picked, got)
assert pages.resident(np.zeros(0, dtype=np.int64)).size == 0
assert not pages.resident(np.array([0])).any()          # page 0: never mapped
print("in C" if pages._resident is not None else "in Python")
"""


@pytest.mark.parametrize("preloaded", [False, True], ids=["python", "allocator"])
def test_resident_pages_are_told_from_absent_ones_alone_and_in_clusters(prm, preloaded):
    """resident() on real memory (an anonymous mapping with every third page touched): isolated pages, pages in
    clusters (less than GAP_PAGES apart), pages in any order (the allocator's), a page at the mapping's end and an unmapped page each
    read as mincore says, in Python and through the preloaded allocator's rtkit_tier_resident."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("RTKIT_")}
    if preloaded:
        env["LD_PRELOAD"] = os.path.join(prm, "librtkit_malloc.so")
    proc = subprocess.run([sys.executable, "-c", _RESIDENT_CHECK], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == ("in C\n" if preloaded else "in Python\n"), proc.stderr


def test_row_pages_are_the_distinct_pages_of_each_rows_first_and_last_byte():
    """row_pages skips the sort for ascending rows (a batch's): the same pages as sorting every row's first and last
    page, for rows smaller than, equal to and larger than a page, from a base off a page boundary, in any order."""
    import numpy as np

    from rtkit.scheduler import lookahead_pages as lp

    rng = np.random.default_rng(7)
    base = 7 * lp.PAGE + 64
    for row_bytes in (4, 260, lp.PAGE, 5000, 3 * lp.PAGE + 8):
        for n in (1, 2, 3000):
            rows = np.unique(rng.integers(0, 1 << 20, n))
            want = np.unique(np.concatenate([(base + rows * row_bytes) // lp.PAGE,
                                             (base + rows * row_bytes + row_bytes - 1) // lp.PAGE]))
            assert np.array_equal(lp.row_pages(base, row_bytes, rows), want)
            shuffled = rng.permutation(rows)
            assert np.array_equal(lp.row_pages(base, row_bytes, shuffled), want)
    assert lp.row_pages(base, 64, np.zeros(0, dtype=np.int64)).size == 0


def test_distinct_is_np_unique_by_a_sort():
    """The batch's rows are made distinct by a sort (NumPy's np.unique hashes integers first: 7-11x slower on a
    batch's ids): the same values, order and dtype as np.unique, for empty, single, repeated and wide inputs."""
    import numpy as np

    from rtkit.scheduler import lookahead_pages as lp

    rng = np.random.default_rng(3)
    for x in (np.zeros(0, dtype=np.int64), np.array([5]), np.array([3, 1, 3, 2, 1, 3]),
              rng.integers(-(1 << 40), 1 << 40, 5000), rng.zipf(1.3, 20000) % 1000, rng.integers(0, 9, 100).astype(np.int32)):
        got, want = lp.distinct(x), np.unique(x)
        assert got.dtype == want.dtype and np.array_equal(got, want), x


def test_a_slots_pages_are_its_tables_shifted_only_where_laid_out_alike():
    """_found_pages computes a layout's pages once and shifts them for a slot of the same row bytes at the same offset
    in its page: every region's pages equal row_pages at its own base, for slots laid out alike, of other row bytes
    and at another offset in a page."""
    from types import SimpleNamespace

    import numpy as np

    from rtkit.scheduler import lookahead_pages as lp
    from rtkit.scheduler.lookahead import Lookahead

    page = lp.PAGE
    row_bytes = {0: 260, 1: 260, 2: 130, 3: 260}
    base = 7 * page + 64
    bases = [base, base + 900 * page, base + 40 * page, base - 3 * page + 8, None]
    host = SimpleNamespace(bases={"t": bases}, plan=SimpleNamespace(tables={"t": SimpleNamespace()}),
                           _row_bytes=lambda t, i: row_bytes[i])
    rows = {"t": np.unique(np.random.default_rng(5).integers(0, 1 << 20, 4000))}
    got = dict(Lookahead._found_pages(host, rows))
    assert sorted(got) == ["t#0", "t#1", "t#2", "t#3"]
    for i, b in enumerate(bases[:4]):
        assert np.array_equal(got[f"t#{i}"], lp.row_pages(b, row_bytes[i], rows["t"])), i


@requires_tf
def test_a_gathered_optimizer_slot_is_read_ahead_as_its_tables_slot():
    """A row copy that gathers a table's optimizer slot itself (the EmbeddingVariable analogue's promotion moves a
    row's values and its Adagrad row) adds no table of its own: the slot's gather is planned as its table's rows, so
    its region is looked for once, as that table's slot (planned as a second table, the same memory was looked for
    under two names and found under neither on the full-scale bench)."""
    import tensorflow as tf

    from rtkit.scheduler import lookahead_graph

    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        ids = tf1.placeholder(tf.int64, [None], name="ids")
        moved = tf1.placeholder(tf.int64, [None], name="moved")
        table = tf1.get_variable("table", [1000, 8], use_resource=True)
        opt = tf1.train.AdagradOptimizer(0.1)
        loss = tf.reduce_sum(tf.gather(table, ids))
        train = opt.minimize(loss)
        slot = opt.get_slot(table, "accumulator")
        copied = tf.raw_ops.ResourceGather(resource=slot.handle, indices=moved, dtype=tf.float32)
        plan, why = lookahead_graph.plan_feeds(g)
    assert plan is not None, why
    assert list(plan.tables) == [table.handle.op.name], list(plan.tables)
    assert [s.op.name for s in plan.tables[table.handle.op.name].slots] == [slot.handle.op.name]
    assert len(plan.index_tensors) == 2 and set(plan.table_of_index) == {table.handle.op.name}, plan.table_of_index
    assert train is not None and copied is not None
