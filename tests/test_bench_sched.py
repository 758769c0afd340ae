# test_bench_sched.py -- the scheduler bench's arithmetic and table (python -m rtkit.bench.sched), on plain records.
from rtkit.bench import sched


def _cells():
    return [{"name": "legacy-session", "input": "legacy", "api": "session", "command": []},
            {"name": "legacy-keras", "input": "legacy", "api": "keras", "command": []}]


def test_order_interleaves_cells_and_rotates_configurations():
    order = [(k, c["name"], n) for k, c, n in sched._order(_cells(), ["tf-default", "profile:throughput"], 2)]
    assert order == [(1, "legacy-session", "tf-default"), (1, "legacy-session", "profile:throughput"),
                     (1, "legacy-keras", "tf-default"), (1, "legacy-keras", "profile:throughput"),
                     (2, "legacy-keras", "profile:throughput"), (2, "legacy-keras", "tf-default"),
                     (2, "legacy-session", "profile:throughput"), (2, "legacy-session", "tf-default")]


def _run(cell, config, k, wall, **sf):
    return {"cell": cell, "config": config, "round": k, "status": "ok", "wall_ms": wall, "sched": sf, "log": "x"}


def test_ratios_are_per_round_and_the_verdict_needs_every_round():
    runs = []
    for k, (base, thr) in enumerate([(100.0, 70.0), (120.0, 80.0), (90.0, 72.0)], start=1):
        runs.append(_run("legacy-session", "tf-default", k, base))
        runs.append(_run("legacy-session", "profile:throughput", k, thr, tuned=True, kept_script=False,
                         chose_staged=True, chose_read_ahead=k == 2, staged_steps=150, tuning_cost_pct_1000=2.5,
                         bound_x=[0.65, 0.6, 0.7][k - 1], input_ms=39.0, compute_ms=21.0, x_of_bound=1.02))
    for k, (base, thr) in enumerate([(50.0, 45.0), (50.0, 55.0), (50.0, 50.0)], start=1):
        runs.append(_run("legacy-keras", "tf-default", k, base))
        runs.append(_run("legacy-keras", "profile:throughput", k, thr, keras_datasets=1))
    rows = {(r["cell"], r["config"]): r for r in sched.summarize(_cells(), ["tf-default", "profile:throughput"], runs)}
    thr = rows[("legacy-session", "profile:throughput")]
    assert thr["wall_ms_median"] == 72.0
    assert abs(thr["ratio_median"] - 0.7) < 1e-9 and abs(thr["ratio_min"] - 2 / 3) < 1e-9  # 70/100, 80/120, 72/90
    assert thr["verdict"] == "faster" and thr["tuning"] == "kept script 0/3, chose staging 3/3 (read-ahead 1/3)"
    assert thr["tuning_cost_pct_1000"] == 2.5
    assert rows[("legacy-keras", "profile:throughput")]["verdict"] == "same (noise)"
    bench = {"settings": {"batch": 2048, "steps": 200, "rows": 200000, "rounds": 3, "latency_ms": 30.0},
             "command_line": "python -m rtkit.bench.sched", "start_time": "t", "duration_s": 60.0, "machine": {},
             "rows": list(rows.values()), "runs": runs}
    md = sched.render(bench)
    # the bound beside the figure: the rounds' median bound, and the median ratio over it
    assert thr["bound_x"] == 0.65 and abs(thr["x_of_bound"] - 0.7 / 0.65) < 1e-9 and thr["x_of_bound_sched"] == 1.02
    assert rows[("legacy-keras", "profile:throughput")]["x_of_bound"] is None
    assert "| legacy | session | profile:throughput | 3/3 | 72.0 | 0.70x (0.67-0.80) | 0.65x (39.0 / 21.0) | 1.08x | faster |" in md
    assert "Keras: dataset options (no tuner: fit runs no session step to switch)" in md and "30 ms read latency" in md
