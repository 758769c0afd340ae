# test_workloads.py -- the bundled workloads: synthetic Criteo data, each model x API, determinism, early end, learning.
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, requires_tf, unpreloaded_env
from rtkit.workloads import data

SUMMARY = re.compile(r"^rtkit-workload: model=(\w+) api=(\w+) steps=(\d+) loss_first=(\S+) "
                     r"loss_last=(\S+) examples_per_s=(\S+) wall_step_ms_median=(\S+)$")
HEX8 = re.compile(r"^[0-9a-f]{8}$")
DIGITS = re.compile(r"^[0-9]+$")


def _workload(args, timeout=240):
    proc = subprocess.run([sys.executable, "-m", "rtkit.workloads", *args], cwd=REPO,
                          env=unpreloaded_env({"TF_CPP_MIN_LOG_LEVEL": "2"}),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


# ---------------------------------------------------------------- data set (numpy only)

def test_dataset_is_well_formed(data_dir, capfd):
    path = data.ensure_dataset(data_dir, rows=3000, seed=7)
    err = capfd.readouterr().err
    assert "generating 3000 rows" in err and "100.0%" in err        # the progress bar, on stderr
    assert os.path.basename(path) == data.dataset_name(3000, 7)
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw.endswith(b"\n")
    lines = raw.decode("ascii").split("\n")[:-1]
    assert len(lines) == 3000
    labels, distinct = [], [set() for _ in range(data.NUM_CAT)]
    for line in lines:
        fields = line.split("\t")
        assert len(fields) == 1 + data.NUM_INT + data.NUM_CAT, line
        assert fields[0] in ("0", "1")
        labels.append(int(fields[0]))
        for v in fields[1:1 + data.NUM_INT]:
            assert v == "" or DIGITS.match(v), line
        for f, v in enumerate(fields[1 + data.NUM_INT:]):
            assert v == "" or HEX8.match(v), line
            distinct[f].add(v)
    rate = sum(labels) / len(labels)
    assert 0.1 < rate < 0.5                                            # Criteo-like, both classes
    # Zipf ids: a 3-id feature shows its vocabulary, a 10M-id feature shows many ids.
    assert len(distinct[8]) <= 3
    assert len(distinct[2]) > 500


def test_dataset_is_deterministic_and_cached(data_dir, tmp_path, capfd):
    path = data.ensure_dataset(data_dir, rows=3000, seed=7)
    mtime = os.stat(path).st_mtime_ns
    capfd.readouterr()
    assert data.ensure_dataset(data_dir, rows=3000, seed=7) == path     # cached: not regenerated
    assert "generating" not in capfd.readouterr().err
    assert os.stat(path).st_mtime_ns == mtime
    other = data.ensure_dataset(str(tmp_path / "again"), rows=3000, seed=7, progress=False)
    with open(path, "rb") as a, open(other, "rb") as b:
        assert a.read() == b.read()                                     # same (rows, seed): same bytes
    reseeded = data.ensure_dataset(str(tmp_path / "again"), rows=3000, seed=8, progress=False)
    with open(path, "rb") as a, open(reseeded, "rb") as b:
        assert a.read() != b.read()
    assert not [n for n in os.listdir(data_dir) if ".tmp-" in n]


def test_killed_generation_leaves_no_data_file(tmp_path):
    """SIGKILL during generation: the final name never holds a partial file; the next call completes."""
    rows = 2_000_000
    code = ("import sys; from rtkit.workloads import data; "
            f"data.ensure_dataset({str(tmp_path)!r}, rows={rows}, seed=3)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert "generating" in proc.stderr.readline()                # first progress line: writing
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    final = os.path.join(str(tmp_path), data.dataset_name(rows, 3))
    assert not os.path.exists(final)
    path = data.ensure_dataset(str(tmp_path), rows=5000, seed=3, progress=False)
    assert os.path.isfile(path) and not os.path.exists(final)


# ---------------------------------------------------------------- the workloads (real TensorFlow)

def _small_run(model, api, data_dir, *extra):
    return _workload([model, "--api", api, "--steps", "3", "--batch", "256", "--rows", "4096",
                      "--capacity", "4096", "--data-dir", data_dir, "--print-losses", *extra])


@pytest.fixture(scope="module")
def wdl_session_with_summaries(data_dir, tmp_path_factory):
    """The small wdl Session run with --summary-dir: one child for the two tests that check it (its summary line
    and printed losses, and the losses as TensorBoard scalars); TensorFlow's start-up is most of its cost."""
    tb = str(tmp_path_factory.mktemp("summaries") / "train")
    return _small_run("wdl", "session", data_dir, "--summary-dir", tb), tb


@requires_tf
@pytest.mark.parametrize("api", ["session", "monitored", "keras", "tf2"])
@pytest.mark.parametrize("model", ["wdl", "dlrm"])
def test_each_model_and_api_runs(model, api, data_dir, request):
    if (model, api) == ("wdl", "session"):
        proc = request.getfixturevalue("wdl_session_with_summaries")[0]
    else:
        proc = _small_run(model, api, data_dir)
    out = proc.stdout.splitlines()
    summaries = [m for m in map(SUMMARY.match, out) if m]
    assert len(summaries) == 1, proc.stdout
    m = summaries[0]
    assert (m.group(1), m.group(2), m.group(3)) == (model, api, "3")
    assert 0.3 < float(m.group(4)) < 1.0 and float(m.group(6)) > 0      # first loss near log 2
    losses = [line.split() for line in out if line.startswith("loss ")]
    assert [step for _, step, _ in losses] == ["1", "2", "3"]
    assert float(losses[0][2]) == pytest.approx(float(m.group(4)), abs=1e-6)


@requires_tf
def test_summary_dir_has_each_steps_loss_as_a_tensorboard_scalar(wdl_session_with_summaries):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc, tb = wdl_session_with_summaries
    printed = {int(step): float(v) for _, step, v in (line.split() for line in proc.stdout.splitlines()
                                                      if line.startswith("loss "))}
    acc = EventAccumulator(tb)
    acc.Reload()
    assert {e.step: e.value for e in acc.Scalars("loss")} == pytest.approx(printed, rel=1e-6)
    assert sorted(printed) == [1, 2, 3]


@requires_tf
def test_same_seed_gives_identical_losses(data_dir):
    """Per-step losses are a function of the seed (what rtkit's pipelining tests compare)."""
    from rtkit.workloads import run

    kw = dict(steps=6, batch=256, rows=4096, capacity=4096, data_dir=data_dir, progress=False)
    first = run("wdl", api="session", **kw)
    # a second run on one thread: equal losses prove both run-to-run determinism and that pools do not matter
    single = run("wdl", api="session", threads_inter=1, threads_intra=1, **kw)
    assert first["steps"] == single["steps"] == 6
    assert single["losses"] == first["losses"]
    third = run("wdl", api="session", seed=1, **kw)                     # another seed: another run
    assert third["losses"] != first["losses"]


@requires_tf
@pytest.mark.filterwarnings("ignore:Your input ran out of data")      # Keras says so; expected here
@pytest.mark.parametrize("api", ["session", "monitored", "keras", "tf2"])
def test_running_out_of_data_ends_the_run_normally(api, data_dir):
    from rtkit.workloads import run

    # 1000 rows, one epoch, batch 256: 3 full batches and a short one, then OutOfRange.
    result = run("dlrm", api=api, steps=10, batch=256, rows=1000, epochs=1, capacity=4096,
                 data_dir=data_dir, progress=False)
    assert result["steps"] == 4
    assert len(result["losses"]) == 4 and result["examples"] == 1000


@requires_tf
def test_wdl_loss_goes_down(data_dir):
    from rtkit.workloads import run

    result = run("wdl", api="session", steps=30, batch=512, rows=20000, data_dir=data_dir,
                 capacity=16384, progress=False)
    losses = result["losses"]
    assert len(losses) == 30
    head, tail = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert tail < head - 0.03, losses


@requires_tf
def test_cli_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, "-m", "rtkit.workloads", "nosuchmodel"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rtkit.workloads", "wdl", "--steps", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "positive integer" in proc.stderr


@requires_tf
def test_cli_grappler_and_params_digest_flags_need_their_api():
    """--grappler-arithmetic off goes into a graph API's ConfigProto, the digest is read from a Session: elsewhere
    they would be ignored silently, so they are usage errors."""
    for extra in (["--api", "keras", "--grappler-arithmetic", "off"], ["--api", "monitored", "--print-params-digest"]):
        proc = subprocess.run([sys.executable, "-m", "rtkit.workloads", "wdl", *extra], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        named = "--grappler-arithmetic" in proc.stderr or "--print-params-digest" in proc.stderr
        assert proc.returncode == 2 and named, (extra, proc.stderr)
    from tensorflow.core.protobuf import rewriter_config_pb2

    from rtkit.workloads import train
    assert train._session_config(None, None) is None
    cfg = train._session_config(None, None, grappler_arithmetic=False)
    assert cfg.graph_options.rewrite_options.arithmetic_optimization == rewriter_config_pb2.RewriterConfig.OFF
    assert not cfg.inter_op_parallelism_threads and not cfg.intra_op_parallelism_threads   # rtkit may size pools
    a = train.params_digest(["b", "a"], [[1.0], [2.0]])
    assert a == train.params_digest(["a", "b"], [[2.0], [1.0]]) != train.params_digest(["a", "b"], [[1.0], [2.0]])


def test_cli_unwritable_data_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run([sys.executable, "-m", "rtkit.workloads", "wdl", "--data-dir",
                           str(blocker / "sub")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "cannot create the data set" in proc.stderr and "Traceback" not in proc.stderr
