# test_capacity.py -- tier mode as a capacity feature, scaled down: a pool larger than the resident budget the test sets.
import json
import math
import os
import subprocess
import sys
import time

import pytest

from conftest import load_report, requires_tf, run_rtkit

pytestmark = pytest.mark.timeout(600)
MIB = 1 << 20


def _wdl(run_dir, data_dir, sets, table_gb="0.25", row_assign="first-seen"):
    args = ["run", "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    args += ["--", sys.executable, "-m", "rtkit.workloads", "wdl", "--table-gb", table_gb, "--steps", "25",
             "--batch", "256", "--rows", "4000", "--data-dir", str(data_dir), "--print-losses", "--no-progress",
             "--row-assign", row_assign, "--table-fill", "lazy"]
    proc = run_rtkit(args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, [line for line in proc.stdout.splitlines() if line.startswith("loss ")]


@requires_tf
def test_pool_larger_than_resident_budget_trains_like_dram(tmp_path):
    """256 MiB of tables and slots in a pool whose resident pages are held to 24 MiB: the pages past the
    budget are written out and dropped, training reads them back, the losses are DRAM's to the bit. Rows are
    hashed (scattered over the tables) so that the steps touch more pages than the budget holds (rows are
    filled on first use, so only touched pages count)."""
    data_dir = tmp_path / "data"
    _, dram_losses = _wdl(tmp_path / "dram", data_dir, [], row_assign="hashed")
    budget = 24 * MIB
    proc, tier_losses = _wdl(tmp_path / "tier", data_dir, [f"tier_pool_path={tmp_path / 'pool'}", "tier_pool_size=600M",
                                                           f"tier_resident_max={budget}"], row_assign="hashed")
    assert len(dram_losses) == 25 and tier_losses == dram_losses
    report = load_report(tmp_path / "tier")
    p = report["pmem"]
    assert p["state"] == "on" and p["tier_resident_max"] == budget
    assert p["tier_last_step_bytes"] >= 240 * MIB            # the tables and slots sat in the pool ...
    assert p["budget_passes"] >= 1 and p["budget_dropped_bytes"] >= 24 * MIB, (   # ... mostly out of DRAM
        p["budget_passes"], p["budget_dropped_bytes"], [x["resident_bytes"] for x in p["timeline"]])
    training = [x for x in p["timeline"] if x["tier_bytes"] >= p["tier_last_step_bytes"] // 2]
    if p["heat"]["mechanism"] == "pagemap_scan":
        # the heat passes run beside the steps: a mark's sample sees the pool before the pass it asked for, the
        # pass itself says where it left the pool
        assert p["heat"]["samples"] >= 1 and p["heat"]["resident_bytes"] <= budget, p["heat"]
    else:
        # each sample checks the budget, but pages still under writeback cannot drop yet, so a check can end above
        # it; the checks do get the pool under the budget (the first sample is taken before any had work to do)
        assert training and min(x["resident_bytes"] for x in training[1:] or training) <= budget, training
    assert p["records"] and all(r["resident_bytes"] <= r["bytes"] + 4096 for r in p["records"])
    assert not (tmp_path / "pool").exists()                   # unlinked at create: nothing left behind
    # the summary line says what the tier held and what it cost
    tier_lines = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_lines) == 1 and "tier bytes held" in tier_lines[0] and "major faults/step (mean)" in tier_lines[0]
    # tier mode saved DRAM here: at its highest RSS the pool held less in DRAM than lived in it, the peak is under
    # DRAM's, and the summary does not say it raised the peak
    at = p["at_rss_peak"]
    assert at["rss_bytes"] > 0 and at["pool_dram_bytes"] < at["tier_bytes"], at
    assert report["process"]["peak_rss_bytes"] < load_report(tmp_path / "dram")["process"]["peak_rss_bytes"]
    assert "raised peak RSS" not in tier_lines[0], tier_lines
    assert isinstance(report["process"].get("disk_written_bytes"), int)


@requires_tf
def test_tables_are_filled_row_by_row_not_at_init(tmp_path):
    """First-seen rows: 1 GiB of tables and slots in the pool, of which the run's ~4000 ids per feature touch a
    few MiB. Nothing fills the tables at initialisation, so the pool's resident pages and the disk writes
    stay a small fraction of the tables; a 4x smaller table trains to the same losses (a row's initial
    value depends on the row, not on the table size)."""
    data_dir = tmp_path / "data"
    _, small_losses = _wdl(tmp_path / "small", data_dir, [], table_gb="0.25")
    proc, tier_losses = _wdl(tmp_path / "tier", data_dir, [f"tier_pool_path={tmp_path / 'pool'}", "tier_pool_size=2G"],
                             table_gb="1")
    assert len(small_losses) == 25 and tier_losses == small_losses
    report = load_report(tmp_path / "tier")
    p = report["pmem"]
    assert p["state"] == "on" and p["tier_last_step_bytes"] >= 1000 * MIB
    # the ~100k rows in use (26 features x 4 variables) and the pages around them, not the 1 GiB
    assert p["timeline"] and max(x["resident_bytes"] for x in p["timeline"]) <= 128 * MIB, p["timeline"][:3]
    assert report["process"]["disk_written_bytes"] <= 128 * MIB


def test_pool_bigger_than_its_disk_is_refused_before_the_run(tmp_path):
    marker = tmp_path / "ran"
    proc = run_rtkit(["run", "--quiet", "--set", f"tier_pool_path={tmp_path / 'pool'}", "--set", "tier_pool_size=1000000G",
                      "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], timeout=60)
    assert proc.returncode == 2 and not marker.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "tier_pool_size" in lines[0] and "tier_pool_path" in lines[0], proc.stderr


# (a) of the refusal cases that must get past the memory checks: 0.1 GiB of tables, 20 steps (id -> row maps of
# ~40 MiB; at the default 2000 steps they take 2.4 GiB and the "(a) needs" line comes first on a small machine)
_SMALL_A = ["--dram-gb", "1", "--a", "0.1", "--steps", "20", "--min-available-gb", "0.5"]
_SMALL_A_NEEDS_GIB = 0.1 + 0.04 + 2 + 0.5 + 0.2   # the bench's own sum for (a), and a margin


@pytest.mark.parametrize("case", ["pool", "pool-dir", "a", "maps", "resident", "max-anon", "b-dram-steps", "promote"])
def test_capacity_bench_refuses_what_cannot_fit(tmp_path, case):
    """Each refusal is one line, exit 2, nothing written, and each case gets its own line (not an earlier one)."""
    from rtkit import pool_room

    avail_gib = (pool_room.mem_available() or 0) / (1 << 30)
    args, line = {
        "pool": (["--dram-gb", "100000", "--pool-dir", str(tmp_path)], "(b) needs a "),
        "pool-dir": (["--dram-gb", "1", "--pool-dir", str(tmp_path / "nope")], "--pool-dir"),
        "a": (["--dram-gb", "1", "--a", "100000", "--pool-dir", str(tmp_path)], "capacity: (a) needs "),
        # 1 GiB is less than TensorFlow's own 1.5 GiB, whatever the maps take
        "maps": (_SMALL_A + ["--pool-dir", str(tmp_path), "--max-anon-gb", "1"], "id -> row maps alone"),
        "resident": (_SMALL_A + ["--pool-dir", str(tmp_path), "--resident-gb", "100000"], "--resident-gb 100000"),
        # past what is available now (by 2 GiB: MemAvailable moves on a shared machine), not an absurd number
        "max-anon": (_SMALL_A + ["--pool-dir", str(tmp_path), "--max-anon-gb", f"{avail_gib + 2:.1f}"],
                     "must be positive and fit in"),
        "b-dram-steps": (_SMALL_A + ["--pool-dir", str(tmp_path), "--b-dram-steps", "21"], "--b-dram-steps must be"),
        "promote": (_SMALL_A + ["--pool-dir", str(tmp_path), "--promote-hot-rows", "5", "--row-assign", "hashed"],
                    "--promote-hot-rows moves first-seen rows"),
    }[case]
    if case in ("maps", "resident", "max-anon", "b-dram-steps", "promote") and avail_gib < _SMALL_A_NEEDS_GIB:
        pytest.skip(f"{avail_gib:.1f} GiB available: the bench refuses (a) before it gets to the {case} check")
    proc = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity", "--out", str(tmp_path / "o"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (args, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0], (args, proc.stderr)
    assert not (tmp_path / "o").exists()


def test_workload_refuses_tables_that_fit_neither_memory_nor_pool(tmp_path):
    """--table-gb past memory plus tier mode's pool: one line naming the knob, exit 2, before any data or TF work."""
    base = [sys.executable, "-m", "rtkit.workloads", "wdl", "--steps", "2", "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_PMEM")}
    proc = subprocess.run(base + ["--table-gb", "100000"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--table-gb 100000" in proc.stderr and "tier mode" in proc.stderr
    env.update(RTKIT_TIER_POOL_PATH=str(tmp_path / "pool"), RTKIT_TIER_POOL_SIZE="4G")
    proc = subprocess.run(base + ["--table-gb", "4000"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "4.0G pool (tier_pool_size)" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_lazy_first_seen_tables_need_only_the_rows_their_steps_use():
    """A lazily filled table of first-seen power-law ids past memory fits when the rows its steps use (expected) do:
    what lets the capacity bench run (b)'s size in DRAM for its first steps; filled eagerly, or for steps that use
    more rows than memory, it does not."""
    from rtkit import pool_room
    from rtkit.workloads import __main__ as workloads

    mem_gb = (pool_room.mem_total() or 0) / (1 << 30)
    if not mem_gb:
        pytest.skip("no MemTotal here")
    table_gb = 1.5 * mem_gb
    parser = workloads.build_parser()

    def problem(*extra):
        args = parser.parse_args(["wdl", "--table-gb", f"{table_gb:.3f}", "--emb-dim", "64", *extra])
        args.capacity = workloads._table_rows(table_gb, (64, 1), 26)
        return workloads._table_room_problem(table_gb, args, (64, 1))

    lazy = ["--table-fill", "lazy", "--ids", "zipf", "--batch", "2048"]
    assert problem(*lazy, "--steps", "10") is None
    assert "does not fit" in problem("--steps", "10")                      # eager: every page written
    assert "does not fit" in problem(*lazy, "--steps", "10", "--row-assign", "hashed")   # may touch every page
    assert "does not fit" in problem(*lazy, "--steps", "100000000")          # the steps use every row


@requires_tf
def test_lazy_rows_initial_values_depend_on_the_row_only_and_look_like_a_truncated_normal():
    """A lazily filled row's initial values (ev.row_values: two rows of precomputed blocks picked by a hash of the
    row) are a function of (seed, row, column): the same rows give the same bits alone or in another batch, another
    seed gives other values, and over many rows they have a truncated normal's moments (mean 0, sd 0.95 stddev,
    clipped at 2 stddev) with columns and neighbouring rows uncorrelated and few rows alike (2^24 combinations)."""
    import numpy as np
    import tensorflow as tf
    from rtkit.workloads import ev

    stddev = 0.05
    many = ev.row_values(tf.range(100_000, dtype=tf.int64), 32, 7, stddev).numpy()
    some = ev.row_values(tf.constant([99_999, 5, 4_242], tf.int64), 32, 7, stddev).numpy()
    assert np.array_equal(some, many[[99_999, 5, 4_242]])
    assert not np.allclose(ev.row_values(tf.constant([5], tf.int64), 32, 8, stddev).numpy(), many[5])
    assert abs(many.mean()) < 1e-3
    assert abs(many.std() / stddev - 0.95) < 0.01          # the sum of two blocks' rows, clipped at 2 sd
    assert np.abs(many).max() <= 2 * stddev + 1e-7 and np.abs(many).max() > 1.9 * stddev
    assert abs(np.corrcoef(many[:, 0], many[:, 1])[0, 1]) < 0.02
    assert abs(np.corrcoef(many[:-1, 3], many[1:, 3])[0, 1]) < 0.02
    assert len(np.unique(many, axis=0)) > 99_000              # ~300 pairs alike expected among 10^5 rows
    assert np.array_equal(ev.row_values(tf.constant([5], tf.int64), 1, 7, stddev).numpy().shape, [1, 1])


@requires_tf
def test_initial_value_blocks_made_under_a_callers_control_dependency_serve_every_table():
    """The blocks are made once per graph and device, by the first table's step: a control dependency around that
    first call (a promoting map's insert, say) must not become theirs, or every later table's step would wait on
    it (or fail to build)."""
    import numpy as np
    import tensorflow as tf
    from rtkit.workloads import ev

    with tf.Graph().as_default() as g:
        gate = tf.compat.v1.placeholder(tf.float32, [])
        with tf.control_dependencies([tf.compat.v1.assert_positive(gate)]):
            first = ev.row_values(tf.constant([1, 2], tf.int64), 4, 1, 0.05)
        later = ev.row_values(tf.constant([1, 2], tf.int64), 4, 1, 0.05)
        blocks = [n for n in g.as_graph_def().node if n.name.startswith("rtkit_ev_init_blocks/")]
        assert len(blocks) == 2 and all(not n.input for n in blocks), blocks
        with tf.compat.v1.Session() as sess:
            assert np.array_equal(sess.run(later), sess.run(first, {gate: 1.0}))


def test_expected_distinct_matches_draws():
    """The bench sizes its runs with zipf.expected_distinct: it must agree with counting real draws of the law
    (numpy, the same inverse CDF as the input graph's), and grow with the draws."""
    import numpy as np

    from rtkit.workloads import zipf

    rng = np.random.default_rng(1)
    for distinct, exponent, draws in ((2_000_000, 0.9, 400_000), (5_000_000, 1.0, 200_000), (50_000, 1.2, 100_000)):
        seen = len(np.unique(zipf._ranks_np(rng.random(draws), distinct, exponent)))
        want = zipf.expected_distinct(draws, distinct, exponent)
        assert abs(want - seen) <= 0.03 * seen, (distinct, exponent, draws, want, seen)
    assert zipf.expected_distinct(4_000_000) > 1.5e6   # the full-scale bench's 2000 x 2048 draws: ~2M per feature


@requires_tf
def test_zipf_batches_are_deterministic_with_many_distinct_ids():
    """Batch k is a function of (seed, k): two pipelines give the same batches, another seed others; over a
    few batches most ids are new (a flat law over 10M ids), as expected_distinct says, and the head repeats."""
    code = r"""
import json, numpy as np, tensorflow as tf
from rtkit.workloads import zipf
def take(seed, n):
    return [{k: v.numpy() for k, v in b.items()} for b in zipf.make_dataset(4096, seed, 10_000_000, 0.9).take(n)]
a, b, c = take(0, 4), take(0, 4), take(1, 1)
same = all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
ids = np.concatenate([x["cat"][:, 3] for x in a])
_, counts = np.unique(ids, return_counts=True)
print(json.dumps({"same": same, "other": bool(np.array_equal(a[0]["cat"], c[0]["cat"])),
                  "distinct": int(len(counts)), "top": int(counts.max()), "want": zipf.expected_distinct(len(ids), 10_000_000, 0.9),
                  "shapes": [list(a[0][k].shape) for k in ("dense", "cat", "label")], "pos": float(np.mean(np.concatenate([x["label"] for x in a]))),
                  "nonneg": bool((np.concatenate([x["cat"] for x in a]) >= 0).all())}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["same"] and not r["other"] and r["nonneg"]
    assert r["shapes"] == [[4096, 13], [4096, 26], [4096, 1]]
    assert abs(r["distinct"] - r["want"]) <= 0.05 * r["want"] and r["distinct"] > 0.5 * 4 * 4096, r
    assert r["top"] >= 20 and 0.05 < r["pos"] < 0.6, r


def test_feature_distinct_skew_spreads_the_features_geometrically_and_the_bench_passes_it_on():
    """--feature-distinct-skew K: feature 0 draws from --distinct ids, the last from --distinct / K, geometrically
    between (K = 1: one count for all, the law as before); the bench hands it to the workload and sizes its runs
    (the maps, the rows touched) with each feature's own count."""
    from rtkit.bench import capacity
    from rtkit.workloads import zipf

    assert zipf.feature_distinct(4_000_000) == 4_000_000 and zipf.feature_distinct(4_000_000, 1.0) == 4_000_000
    d = zipf.feature_distinct(4_000_000, 10_000)
    assert len(d) == 26 and d[0] == 4_000_000 and d[-1] == 400 and d[13] == round(4_000_000 / 10_000 ** (13 / 25))
    assert all(a > b for a, b in zip(d, d[1:]))
    assert zipf.feature_distinct(10, 1e9)[-1] == 1
    with pytest.raises(ValueError):
        zipf.feature_distinct(1000, 0.5)
    base = ["--steps", "100", "--batch", "1024", "--distinct", "4000000"]
    plain = capacity.build_parser().parse_args(base)
    skewed = capacity.build_parser().parse_args(base + ["--feature-distinct-skew", "10000"])
    assert "--feature-distinct-skew" not in capacity.workload_args(plain, 1.0, False)
    wargs = capacity.workload_args(skewed, 1.0, False)
    assert wargs[wargs.index("--feature-distinct-skew") + 1] == "10000"
    assert capacity.touched_bytes(skewed) < 0.6 * capacity.touched_bytes(plain)
    assert capacity.touched_bytes(plain) == pytest.approx(26 * zipf.expected_distinct(102_400, 4_000_000) * capacity.row_bytes(plain))
    bad = capacity.build_parser().parse_args(base + ["--feature-distinct-skew", "0.5"])
    assert "--feature-distinct-skew" in capacity.check(bad, 1 << 30)


@requires_tf
def test_skewed_features_draw_from_their_own_distinct_ids():
    """With a skew, each feature's ids are ranks in [1, its own count] (rank_of maps them back), the first
    feature's ids are exactly those of the unskewed law (same graph, per-feature counts), and the last feature
    meets few distinct ids."""
    code = r"""
import json, numpy as np, tensorflow as tf
from rtkit.workloads import zipf
d = zipf.feature_distinct(1_000_000, 10_000)
a = [b["cat"].numpy() for b in zipf.make_dataset(2048, 0, d, 0.9).take(2)]
s = [b["cat"].numpy() for b in zipf.make_dataset(2048, 0, 1_000_000, 0.9).take(2)]
ids = np.concatenate(a)
out = {"same0": all(np.array_equal(x[:, 0], y[:, 0]) for x, y in zip(a, s)),
       "other": not np.array_equal(a[0][:, 12], s[0][:, 12])}
for f in (0, 12, 25):
    r = zipf.rank_of(tf.constant(ids[:, f]), f, 0, d[f]).numpy()
    out[str(f)] = [int(r.min()), int(r.max()), int(len(np.unique(ids[:, f]))), d[f]]
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["same0"] and r["other"], r
    for f in ("0", "12", "25"):
        lo, hi, seen, count = r[f]
        assert lo >= 1 and hi <= count and seen <= count, (f, r[f])
    assert r["25"][2] <= 100 < 1000 < r["0"][2], r


def _zipf_wdl(extra, steps=12, capacity=60000):
    cmd = [sys.executable, "-m", "rtkit.workloads", "wdl", "--ids", "zipf", "--distinct", "1000000", "--steps", str(steps),
           "--batch", "256", "--capacity", str(capacity), "--print-losses", "--no-progress", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("loss ")], proc.stderr


@requires_tf
@pytest.mark.parametrize("fill,capacity,moved", [("lazy", 60000, 500), ("eager", 60000, 500), ("lazy", 1000, 10)])
def test_compaction_is_loss_neutral(fill, capacity, moved):
    """Hot-row compaction every 3 steps moves hundreds of rows (tables, Adagrad slots, the id -> row map) and
    the losses stay bit-identical to the run without it: a swap moves whole rows with their ids. With 1000 rows
    a feature the ids wrap past capacity after compaction moved rows: they must still land on their row
    number's row (without the `home` indirection this case differs from step 5 on)."""
    plain, _ = _zipf_wdl(["--table-fill", fill], capacity=capacity)
    compacted, err = _zipf_wdl(["--table-fill", fill, "--compact-steps", "3", "--compact-hot-rows", "200"],
                               capacity=capacity)
    assert len(plain) == 12 and compacted == plain
    line = [x for x in err.splitlines() if x.startswith("rtkit-workload: compaction: ")]
    assert len(line) == 1 and "4 passes" in line[0], err[-2000:]
    assert int(line[0].split(", ")[1].split()[0]) >= moved and "hot region (200 rows a feature) held" in line[0], line


@requires_tf
@pytest.mark.parametrize("hot,full", [(3000, "0 of 26"), (40, "26 of 26")])
def test_promotion_is_loss_neutral(hot, full):
    """Ids met a second time move to the hot region (values and Adagrad rows copied before the step reads them)
    and new ids' rows start past it: the losses stay bit-identical to first-seen rows without promotion, with the
    hot regions filling up (40 rows a feature) or not (3000). Without the copy (the moved rows read as zeros) or
    with initial values following the new row's place instead of its number, they differ from the first steps."""
    plain, _ = _zipf_wdl(["--table-fill", "lazy"])
    promoted, err = _zipf_wdl(["--table-fill", "lazy", "--promote-hot-rows", str(hot)])
    assert len(plain) == 12 and promoted == plain
    line = [x for x in err.splitlines() if x.startswith("rtkit-workload: promotion: ")]
    assert len(line) == 1 and f"({hot} rows a feature), {full} regions full" in line[0], err[-2000:]
    assert int(line[0].split("promotion: ")[1].split()[0]) >= (26 * 40 if hot == 40 else 1000), line


@requires_tf
def test_promotion_past_the_back_region_wraps_and_trains():
    """New ids past the rows left after the hot region wrap onto rows of the back region (as ids past capacity do
    without promotion): the run trains to the end with finite losses."""
    losses, err = _zipf_wdl(["--table-fill", "lazy", "--promote-hot-rows", "300"], capacity=1000)
    assert len(losses) == 12 and all(math.isfinite(float(x.split()[2])) for x in losses), losses
    assert "rtkit-workload: promotion: " in err


def test_expected_repeated_matches_draws():
    """The bench's room check counts promoted rows with zipf.expected_repeated: ids drawn at least twice."""
    import numpy as np

    from rtkit.workloads import zipf

    rng = np.random.default_rng(2)
    for distinct, exponent, draws in ((2_000_000, 0.9, 400_000), (50_000, 1.2, 100_000)):
        _, counts = np.unique(zipf._ranks_np(rng.random(draws), distinct, exponent), return_counts=True)
        seen = int(np.sum(counts >= 2))
        want = zipf.expected_repeated(draws, distinct, exponent)
        assert abs(want - seen) <= 0.03 * seen, (distinct, exponent, draws, want, seen)
    assert zipf.expected_repeated(10, 1_000_000) < 1 < zipf.expected_repeated(4_000_000, 50_000_000)


def test_workload_refuses_bad_zipf_and_compaction_flags():
    base = [sys.executable, "-m", "rtkit.workloads", "wdl", "--steps", "2"]
    for extra, word in ((["--distinct", "5"], "--ids zipf"),
                        (["--ids", "zipf", "--zipf-exponent", "7"], "--zipf-exponent"),
                        (["--feature-distinct-skew", "10"], "--ids zipf"),
                        (["--ids", "zipf", "--feature-distinct-skew", "0.5"], "--feature-distinct-skew"),
                        (["--compact-steps", "5", "--row-assign", "hashed"], "--compact-steps"),
                        (["--promote-hot-rows", "5"], "--table-fill lazy"),
                        (["--promote-hot-rows", "5", "--table-fill", "lazy", "--row-assign", "hashed"], "first-seen"),
                        (["--promote-hot-rows", "500", "--table-fill", "lazy", "--capacity", "500"], "leaves none"),
                        (["--ids", "zipf", "--api", "keras"], "graph API")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and word in proc.stderr.strip().splitlines()[-1], (extra, proc.stderr)


@requires_tf
def test_capacity_bench_runs_zipf_at_a_tiny_scale(tmp_path):
    """The bench end to end at a tiny scale: (a) and (b) train the Zipf data set, (b) in a pool under a resident
    budget with compaction; the bench's figures are in capacity.json and the table."""
    out = tmp_path / "o"
    # (a) small enough that its tables fill in the first steps; (b)'s size also in DRAM for its first 12 steps
    proc = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity", "--dram-gb", "0.25", "--resident-gb", "0.02",
                           "--a", "0.002", "--b-dram-steps", "12",
                           "--steps", "20", "--batch", "256", "--distinct", "2000000", "--emb-dim", "8",
                           "--compact-steps", "5", "--compact-hot-rows", "2000", "--pool-dir", str(tmp_path),
                           # the default 6 GiB cap (+1.5 GiB floor) must fit in MemAvailable: 2 GiB fits a small
                           # machine and is still past TensorFlow's own 1.5 GiB (the bench refuses less)
                           "--max-anon-gb", "2", "--min-available-gb", "0.5",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "capacity.json").read_text())
    a, b = data["results"]["a"], data["results"]["b"]
    assert data["touched_bytes_expected"] > 0
    for r in (a, b):
        assert len(r["losses"]) == 20 and r["step_ms_median"] > 0 and r["examples_per_s"] > 0
        assert r["peak_anon_rss_bytes"] and r["peak_anon_rss_bytes"] < 2 * (1 << 30)
    assert b["pool_resident_timeline"] and isinstance(b["disk_written_bytes"], int)
    assert b["major_faults_per_step"] is not None and b["compaction"] and "4 passes" in b["compaction"][0] and "hot region" in b["compaction"][0]
    assert "(b) step time" in proc.stdout and "pool resident over time" in proc.stdout
    # the pool's pages were dirtied (tables filled row by row, the optimizer's updates): machine-wide counters
    assert b["kernel"]["nr_dirtied"] > 0 and all(v >= 0 for r in (a, b) for v in r["kernel"].values())
    assert "(b) page cache, whole machine over the run: " in proc.stdout
    assert not (tmp_path / "rtkit-capacity.pool").exists()
    # the same work compared: (b)'s size in DRAM for 12 steps, each run's quarters, where (a)'s tables fill
    bd = data["results"]["b-dram"]
    assert len(bd["losses"]) == 12 and len(bd["step_ms_by_step"]) == 12 and len(b["step_ms_by_step"]) == 20
    assert bd["losses"] == b["losses"][:12]
    assert "(b) against (b)'s size in DRAM over steps 4-12 (the same work): " in proc.stdout
    assert "(b) losses vs the same model in DRAM (the first 12 printed): identical" in proc.stdout
    full = [x for x in proc.stdout.splitlines() if x.startswith("(a)'s tables have every row used by about step ")]
    assert len(full) == 1 and 1 <= int(full[0].split("about step ")[1].split()[0]) <= 5, proc.stdout
    assert "(b-dram) step ms by quarter: " in proc.stdout


def test_rows_full_step_is_where_the_expected_distinct_ids_reach_the_rows():
    from rtkit.bench import capacity
    from rtkit.workloads import zipf

    args = capacity.build_parser().parse_args(["--dram-gb", "4", "--a", "0.05", "--steps", "2000"])
    args.dram = 4 << 30
    rows = capacity.capacity_rows(args, 0.05 * 4)
    step = capacity.rows_full_step(args, 0.05 * 4)
    assert step is not None and 1 < step < 2000
    assert zipf.expected_distinct(step * args.batch, args.distinct, args.zipf_exponent) >= rows
    assert zipf.expected_distinct((step - 1) * args.batch, args.distinct, args.zipf_exponent) < rows
    assert capacity.rows_full_step(args, 1000.0) is None   # tables no run of 2000 steps fills
    args.row_assign = "hashed"
    assert capacity.rows_full_step(args, 0.05 * 4) is None   # hashed rows: no first-seen filling order


def test_capacity_bench_kill_tree_kills_children_of_a_root_that_exits_first(monkeypatch):
    """The run's root exits at SIGTERM, its child ignores SIGTERM: once the root is gone the child is reparented
    (here to init), where a second listing of the root's tree cannot find it; the SIGKILL round must still."""
    from rtkit.bench import capacity

    monkeypatch.setattr(capacity, "KILL_GRACE_S", 1.0)
    child_code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('ready', flush=True); time.sleep(120)")
    root_code = ("import subprocess, sys, time; "
                 f"p = subprocess.Popen([sys.executable, '-c', {child_code!r}], stdout=subprocess.PIPE); "
                 "p.stdout.readline(); print(p.pid, flush=True); time.sleep(120)")
    root = subprocess.Popen([sys.executable, "-c", root_code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(root.stdout.readline())
    try:
        assert capacity._alive(child) and child in capacity._tree(root.pid)
        capacity._kill_tree(root)
        assert root.poll() is not None
        deadline = time.monotonic() + 10   # a SIGKILLed process still takes a moment to exit
        while capacity._alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not capacity._alive(child), "the root's child outlived _kill_tree"
    finally:
        try:
            os.kill(child, 9)
        except OSError:
            pass
        root.kill()
        root.wait()
