# test_capacity_sweep.py -- the capacity curve (`rtkit.bench.capacity --sweep`) and the frequency-ordered row layout.
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import requires_tf

pytestmark = pytest.mark.timeout(900)

# a scale at which the bench's memory checks pass on a small machine: 0.375 GiB of tables and slots
_TINY = ["--dram-gb", "0.25", "--steps", "20", "--batch", "256", "--distinct", "200000", "--emb-dim", "8",
         "--max-anon-gb", "2", "--min-available-gb", "0.5"]


@requires_tf
def test_frequency_rows_are_the_generators_ranks():
    """The zipf ids' frequency ranks are recovered from the ids themselves (the same ranks the input graph drew
    from its stateless uniforms, recomputed here with numpy), and frequency rows put rank r at row r - 1: the
    batch's most drawn id at the lowest row. An id the generator never draws has rank 0 (its hashed row)."""
    code = r"""
import json, numpy as np, tensorflow as tf
from rtkit.workloads import ev, zipf
b, seed, distinct, capacity = 2048, 3, 200000, 50000
batch = next(iter(zipf.make_dataset(b, seed, distinct, 0.9)))
u = tf.random.stateless_uniform([b, 26], seed=tf.constant([seed, 0], tf.int64), dtype=tf.float64).numpy()
want = zipf._ranks_np(u, distinct, 0.9)
got = np.stack([zipf.rank_of(batch["cat"][:, f], f, seed, distinct).numpy() for f in range(26)], axis=1)
ev.set_row_assign("frequency", lambda ids, f: zipf.rank_of(ids, f, seed, distinct))
ev.set_table_fill("lazy")
m = ev.IdRowMap("ev_f5", capacity, feature=5)
ids = batch["cat"][:, 5]
rb = m.rows(ids)
uniq = np.unique(ids.numpy(), return_counts=True)
top = uniq[0][np.argmax(uniq[1])]
rows = rb.phys.numpy()[rb.idx.numpy()]
print(json.dumps({"same": bool((got == want).all()), "rows_are_ranks": bool((rows == (want[:, 5] - 1) % capacity).all()),
                  "top_row": int(rows[ids.numpy() == top][0]), "min_row": int(rows.min()),
                  "fresh": sorted(set(rb.fresh.numpy().tolist())) == sorted(set(rows.tolist())),
                  "unknown": zipf.rank_of(tf.constant([5, 123456789], tf.int64), 0, seed, distinct).numpy().tolist(),
                  "other_feature": float(np.mean(zipf.rank_of(batch["cat"][:, 5], 6, seed, distinct).numpy() > 0))}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["same"] and r["rows_are_ranks"] and r["fresh"], r
    assert r["top_row"] == r["min_row"] == 0, r          # the most drawn id is rank 1, at row 0
    assert r["unknown"] == [0, 0] and r["other_feature"] == 0.0, r   # another feature's salt: no rank


def test_workload_refuses_frequency_rows_without_zipf_ids():
    proc = subprocess.run([sys.executable, "-m", "rtkit.workloads", "wdl", "--steps", "2", "--row-assign", "frequency"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--row-assign frequency needs --ids zipf" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("extra,word", [
    (["--sweep", "2,x"], "--sweep '2,x'"),
    (["--sweep", "1,0"], "--sweep '1,0'"),
    (["--sweep", "1,1"], "--sweep '1,1'"),
    (["--sweep", "1", "--sweep-rows", "first-seen,sorted"], "--sweep-rows 'first-seen,sorted'"),
    (["--sweep", "1", "--ids", "file"], "--sweep needs --ids zipf"),
    (["--sweep", "1", "--resident-gb", "0.1"], "drop --resident-gb"),
    (["--sweep", "1,0.001"], "under 1 MiB"),
])
def test_capacity_sweep_refuses_bad_arguments(tmp_path, extra, word):
    """One line naming the setting, exit 2, nothing written."""
    proc = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity", *_TINY, "--pool-dir", str(tmp_path),
                           "--out", str(tmp_path / "o"), *extra], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and word in lines[0], (extra, proc.stderr)
    assert not (tmp_path / "o").exists()


def _point(rows, share, ratio):
    run = {"step_ms_median": 10.0 * ratio, "step_ms_last_quarter": 12.0 * ratio, "major_faults_per_step": 5.0,
           "pool_written_bytes": 1 << 20, "disk_written_bytes": None, "pages_per_packed_page": 1.5}
    return {"rows": rows, "share": share, "budget_bytes": int(share * (64 << 20)), "tier": run,
            "dram": {"step_ms_median": 10.0, "step_ms_last_quarter": 12.0}, "ratio": ratio, "ratio_last_quarter": ratio}


def test_capacity_sweep_plot_draws_each_layout():
    """The hand-written SVG parses, has a line per layout and figure (whole run, last quarter), a tick per share."""
    from rtkit.bench import capacity_sweep

    sweep = {"steps": 20, "batch": 256, "layouts": ["first-seen", "hashed"], "shares": [2.0, 0.5],
             "points": [_point("first-seen", 2.0, 1.1), _point("first-seen", 0.5, 2.0),
                        _point("hashed", 2.0, 8.0), _point("hashed", 0.5, 30.0)]}
    root = ET.fromstring(capacity_sweep.svg(sweep))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 4 and len(root.findall(f"{ns}circle")) == 8
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert {"2x", "0.5x", "first-seen", "hashed", "last quarter"} <= set(texts), texts
    table = capacity_sweep.table(sweep).splitlines()
    assert len(table) == 5 and "30.00x" in table[-1] and "1.5x" in table[-1]


@requires_tf
def test_capacity_sweep_runs_end_to_end(tmp_path):
    """Two points (one layout, two shares) from the one command: each a tier run under its budget and an
    all-in-DRAM run, their figures in capacity-sweep.json, the plot and the table written."""
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "rtkit.bench.capacity", *_TINY, "--sweep", "1,0.5",
                           "--sweep-rows", "frequency", "--pool-dir", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "capacity-sweep.json").read_text())
    assert data["layouts"] == ["frequency"] and data["shares"] == [1.0, 0.5] and data["dram_head_bytes"] == 0
    pts = data["points"]
    assert [(p["rows"], p["share"]) for p in pts] == [("frequency", 1.0), ("frequency", 0.5)]
    for p in pts:
        assert p["budget_bytes"] == int(p["share"] * data["touched_bytes_expected"])
        assert f"tier_resident_max={p['budget_bytes']}" in p["tier"]["settings"] and "tier_dram_head=0" in p["tier"]["settings"]
        assert p["dram"]["settings"] == []
        for run in (p["tier"], p["dram"]):
            assert run["step_ms_median"] > 0 and run["step_ms_last_quarter"] > 0
        assert p["ratio"] > 0 and p["tier"]["major_faults_per_step"] is not None
        assert p["tier"]["pool_written_bytes"] is not None and p["tier"]["row_pages_bytes"] > 0
        # the same model and ids in both runs: tier mode changes where the rows live, not what they hold
        assert p["tier"]["loss_last20_mean"] == p["dram"]["loss_last20_mean"]
    root = ET.fromstring((out / "capacity-sweep.svg").read_text())
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 2
    assert "frequency" in proc.stdout and "capacity-sweep.svg" in proc.stdout
    assert not (tmp_path / "rtkit-capacity.pool").exists()


@requires_tf
def test_user_table_script_trains_and_refuses_bad_sizes():
    """The user-style script (one randomly initialised table, Adagrad, fed ids) trains and says what its
    initialisation took; a bad size is one line and exit 2."""
    cmd = [sys.executable, "-m", "rtkit.bench.user_table", "--rows", "5000", "--dim", "4", "--batch", "64"]
    proc = subprocess.run(cmd + ["--steps", "3", "--rows-from", "hashed"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("loss ")] == ["1", "2", "3"]
    assert "user_table: initialisation " in proc.stderr
    proc = subprocess.run(cmd + ["--steps", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "user_table: --rows, --dim, --steps and --batch must be positive, --exponent in (0, 4)"]


def test_user_table_floor_counts_the_pages_no_budget_keeps():
    """--floor: a budget that holds every page leaves none to read, none holds all of a step's pages, and between
    them a larger budget never leaves more; a bad size is one line and exit 2 (no TensorFlow needed)."""
    import argparse

    import numpy as np

    from rtkit.bench import user_table

    args = argparse.Namespace(rows=20_000, dim=64, steps=30, batch=512, exponent=0.9, rows_from="frequency")
    all_pages = 2 * 20_000 // 16 * 4096
    touched, past = user_table.floor_pages(args, all_pages, np)
    assert touched > 0 and past == 0
    assert user_table.floor_pages(args, 0, np) == (touched, touched)
    pasts = [user_table.floor_pages(args, all_pages * k // 8, np)[1] for k in range(1, 8)]
    assert pasts == sorted(pasts, reverse=True) and touched > pasts[0] > pasts[-1] > 0
    hashed = argparse.Namespace(**{**vars(args), "rows_from": "hashed"})
    assert user_table.floor_pages(hashed, all_pages // 8, np)[1] > pasts[0]  # the hot rows spread over more pages
    cmd = [sys.executable, "-m", "rtkit.bench.user_table", "--rows", "20000", "--steps", "30", "--floor"]
    proc = subprocess.run(cmd + ["512K"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("floor: a step touches "), proc.stderr
    proc = subprocess.run(cmd + ["2x"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "user_table: --floor '2x': a size such as 4096, 64K, 1M or 2G"]
