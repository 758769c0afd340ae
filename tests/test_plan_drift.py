# test_plan_drift.py -- a real Keras job whose sizes change under the allocator's plan: re-planned, and said so.
import sys
import textwrap

import pytest

from conftest import load_report, requires_tf, run_rtkit

pytestmark = [requires_tf, pytest.mark.timeout(900)]

# Two fits one after the other, the second of a wider model on larger batches (tensorflow/recommenders' DCN example
# fits 17 models so: its plan, profiled on the first, served 1.7% of the later models' blocks)
TWO_MODELS = """
import numpy as np
import keras
rng = np.random.default_rng(0)
for width, batch, cols in ((192, 48, 48), (1024, 512, 96)):
    x = rng.random((batch * 4, cols)).astype("float32")
    model = keras.Sequential([keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, x.sum(axis=1, keepdims=True), batch_size=batch, epochs=15, verbose=0)
print("fits-done")
"""


def _run(tmp_path, name, *sets):
    script = tmp_path / "two_models.py"
    script.write_text(textwrap.dedent(TWO_MODELS))
    extra = [a for s in sets for a in ("--set", s)]
    proc = run_rtkit(["run", *extra, "--run-dir", str(tmp_path / name), "--", sys.executable, str(script)], timeout=600)
    assert proc.returncode == 0 and "fits-done" in proc.stdout, proc.stderr[-3000:]
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: allocator:"))
    return load_report(tmp_path / name), line


def test_a_second_model_is_planned_for_and_the_summary_says_re_planned(tmp_path):
    report, line = _run(tmp_path, "r")
    a = report["allocator"]
    assert a["replans"]["count"] >= 1 and a["replans"]["held_at_limit"] == 0, a["replans"]
    assert "re-planned" in line and "sizes drifted at step" in line and "allocations had a class" in line, line
    # the plan in use is the second model's: it is made after the first fit's 60 steps and serves nearly all
    assert a["plan"]["made_at_step"] > 60
    assert a["hit_rate_after_plan"] > 0.95, line
    # without the drift check (the old behaviour) the first model's plan stays and the second's blocks fall back
    old, old_line = _run(tmp_path, "old", "malloc_drift_steps=0")
    assert old["allocator"]["replans"]["count"] == 0 and "re-planned" not in old_line
    assert old["allocator"]["hit_rate_after_plan"] < 0.8, old_line
