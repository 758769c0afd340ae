# test_scheduler_run.py -- the scheduler through `rtkit run` on the bundled workloads: Session, MonitoredTrainingSession, Keras.
import json
import os
import re

import pytest

from conftest import load_report, requires_tf, run_rtkit

pytestmark = [requires_tf, pytest.mark.timeout(600)]

PY = os.path.join(os.path.dirname(os.sys.executable), "python")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("criteo"))


def workload(run_dir, data_dir, api, sets, steps=40, epochs="1", rows=4000, batch=256):
    args = ["run", "--run-dir", str(run_dir), "--quiet", "--set", "malloc=0"]
    for s in sets:
        args += ["--set", s]
    args += ["--", PY, "-m", "rtkit.workloads", "wdl", "--api", api, "--steps", str(steps),
             "--batch", str(batch), "--rows", str(rows), "--data-dir", data_dir, "--print-losses", "--no-progress"]
    if epochs:
        args += ["--epochs", epochs]
    proc = run_rtkit(args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"^loss \d+ (\S+)$", proc.stdout, re.M)]
    return losses, load_report(str(run_dir))


def test_session_staged_matches_unstaged_through_rtkit_run(tmp_path, data_dir):
    base, rep0 = workload(tmp_path / "off", data_dir, "session", ["sched=0"])
    staged, rep1 = workload(tmp_path / "on", data_dir, "session", ["sched=1", "sched_stage=1"])
    assert len(base) == len(staged) == 16  # 4000 rows / 256, the short last batch included; then OutOfRange
    for a, b in zip(base, staged):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5)
    sched = rep1["scheduler"]
    assert sched is not None and sched["pipeline"]["pipelines_started"] >= 1
    assert sched["sessions"][0]["applied"] == "rtkit"
    assert sched["stages"]["embedding"]["ops"] > 0 and sched["stages"]["dense"]["ops"] > 0
    # the background input runs are not steps: the step count is the user's
    assert rep1["steps"]["count"] == rep0["steps"]["count"]
    trace = [f for f in os.listdir(tmp_path / "on") if f.startswith("trace-")]
    assert trace
    with open(tmp_path / "on" / trace[0]) as fh:
        assert json.load(fh)["traceEvents"]


def test_monitored_training_session_with_pipeline_and_tuning(tmp_path, data_dir):
    prof = tmp_path / "tuned.toml"
    losses, rep = workload(tmp_path / "mon", data_dir, "monitored",
                           ["sched=1", "sched_stage=1", "sched_tune=1", "sched_tune_steps=20",
                            f"sched_save_profile={prof}"], steps=40, epochs=None)
    assert len(losses) == 40
    sched = rep["scheduler"]
    assert sched["tuning"]["done"], sched["tuning"]
    assert os.path.isfile(prof)
    assert sched["pipeline"]["pipelines_started"] >= 1
    # the saved profile is reusable as-is
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "again"), "--quiet", "--profile", str(prof),
                      "--set", "malloc=0", "--", PY, "-c", "print('ok')"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert load_report(str(tmp_path / "again"))["run"]["settings"]["sched_inter_op"]["value"] == \
        sched["chosen"]["compute_threads"]


def test_keras_fit_gets_thread_settings(tmp_path, data_dir):
    losses, rep = workload(tmp_path / "keras", data_dir, "keras", ["sched=1", "sched_intra_op=1"],
                           steps=8, epochs=None)
    assert len(losses) == 8
    sched = rep["scheduler"]
    assert sched["keras"]["applied"] is True, sched["keras"]
    assert sched["keras"]["intra_op_threads"] == 1
