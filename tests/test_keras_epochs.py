# test_keras_epochs.py -- Keras epochs in the steps file: a bounded summary over every epoch, read back by the report.
import json

from rtkit.report import model
from rtkit.report.keras_epochs import EPOCH_S_KEPT, keras_summary


def epochs(n):
    # the first half slow, the second fast: a median over the kept (latest) epochs alone would be the fast one
    return [{"epoch_s": 9.0 if i < n // 2 + 1 else 1.0, "train_batches": 10, "validation": i == 3} for i in range(n)]


def test_the_summary_counts_every_epoch_and_lists_the_latest():
    n = 4 * EPOCH_S_KEPT
    s = keras_summary(epochs(n))
    assert s["epochs"] == n and s["train_batches"] == 10 * n and s["validation"] is True
    assert s["epoch_s_median"] == 9.0 and s["epoch_step_ms_median"] == 900.0   # over all, not over the list
    assert s["epoch_s"] == [1.0] * EPOCH_S_KEPT
    assert keras_summary([{"epoch_s": "x"}]) is None


def test_the_steps_file_grows_with_no_epoch(tmp_path):
    """What the process writes stays the same size however many epochs ran (it used to list each one)."""
    sizes = [len(json.dumps(keras_summary(epochs(n)))) for n in (EPOCH_S_KEPT, 10 * EPOCH_S_KEPT)]
    assert sizes[1] <= sizes[0] + 16


def test_the_report_reads_the_summary_and_an_older_files_list(tmp_path):
    base = {"count": 2, "source": "keras", "per_step": [{"t_unix": 1.0, "step_ms": 5.0}, {"t_unix": 2.0, "step_ms": 5.0}],
            "keras_fit_calls": 3}
    for name, extra in (("new", {"keras_summary": keras_summary(epochs(2000))}), ("old", {"keras_epochs": epochs(7)})):
        d = tmp_path / name
        d.mkdir()
        (d / "steps-123.json").write_text(json.dumps({**base, **extra}))
        section, _ = model.steps_section(str(d), 0.0, 0, 123)
        want = {"new": 2000, "old": 7}[name]
        assert section["keras"]["epochs"] == want and section["keras"]["fit_calls"] == 3
        assert len(section["keras"]["epoch_s"]) == min(want, EPOCH_S_KEPT)
