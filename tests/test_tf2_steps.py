# test_tf2_steps.py -- TF2 scripts under `rtkit run`: tf.function steps, retracing storms, eager loops, Keras 2 fit.
import importlib.util
import re
import sys
import textwrap

import pytest

from conftest import load_report, requires_tf, run_rtkit

pytestmark = [requires_tf, pytest.mark.timeout(900)]

# A custom loop as TensorFlow's guide writes one: a tf.Variable embedding read with tf.gather, Adagrad, one
# @tf.function step called per batch of a prefetching tf.data pipeline; it prints each loss and the calls made.
CUSTOM_LOOP = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf

    steps = int(sys.argv[1])
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 20000, size=(steps * 128, 12))
    labels = rng.integers(0, 2, size=(steps * 128, 1)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(128).prefetch(tf.data.AUTOTUNE)

    embedding = tf.Variable(tf.random.stateless_normal([20000, 16], seed=[1, 2]) * 0.05, name="embedding")
    kernel = tf.Variable(tf.random.stateless_normal([16, 1], seed=[3, 4]) * 0.1, name="kernel")
    optimizer = tf.keras.optimizers.Adagrad(learning_rate=0.1)

    @tf.function
    def train_step(batch_ids, batch_labels):
        with tf.GradientTape() as tape:
            features = tf.reduce_mean(tf.gather(embedding, batch_ids), axis=1)
            logits = tf.matmul(features, kernel)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch_labels, logits=logits))
        grads = tape.gradient(loss, [embedding, kernel])
        optimizer.apply_gradients(zip(grads, [embedding, kernel]))
        return loss

    calls = 0
    for batch_ids, batch_labels in dataset:
        loss = train_step(batch_ids, batch_labels)
        calls += 1
        print(f"loss {calls} {float(loss)!r}")
    print(f"calls {calls}")
""")


def _script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _rtkit(tmp_path, run, script, *args, extra=(), env=None):
    proc = run_rtkit(["run", *extra, "--run-dir", str(tmp_path / run), "--", sys.executable, script, *args],
                     env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_report(tmp_path / run), proc


def _losses(stdout):
    return [float(v) for v in re.findall(r"^loss \d+ (\S+)$", stdout, re.M)]


def test_custom_loop_steps_are_the_calls_made_with_a_plan_and_its_reuse(tmp_path):
    import subprocess

    script = _script(tmp_path, "tf2_loop.py", CUSTOM_LOOP)
    n = 80
    report, proc = _rtkit(tmp_path, "first", script, str(n))
    assert f"calls {n}" in proc.stdout
    steps = report["steps"]
    assert steps["count"] == n and steps["source"] == "function", steps
    assert steps["signature"] == "tf.function __main__.train_step"
    assert "from tf.function calls" in proc.stderr
    alloc = report["allocator"]
    assert alloc["state"] == "planned", alloc.get("state")
    assert alloc["plan"]["source"] == "profiled"
    assert alloc["minor_faults_per_step_after_plan"] <= 1.0, alloc["minor_faults_per_step_after_plan"]

    # the plan of the first run, reused: loaded, no profiling steps
    again, again_proc = _rtkit(tmp_path, "second", script, str(n), extra=["--plan", str(tmp_path / "first" / "malloc-plan.txt")])
    assert again["steps"]["count"] == n
    plan = again["allocator"]["plan"]
    assert plan["source"] == "loaded" and plan["made_at_step"] == 0, plan
    assert again["allocator"]["minor_faults_per_step_before_plan"] is None

    # nothing rtkit does changes a loss: the same script without rtkit, step for step (same thread configuration:
    # the scheduler is off by default, so TensorFlow's own pools run in both)
    plain = subprocess.run([sys.executable, script, str(n)], capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert len(_losses(proc.stdout)) == n
    assert _losses(plain.stdout) == _losses(proc.stdout) == _losses(again_proc.stdout)


def test_nested_and_concrete_functions_and_eager_input(tmp_path):
    """Only the outermost eager call counts (an inner tf.function is part of its caller's step); a concrete
    function called directly is a step too; with the scheduler on, the loop's tf.data input gets its options."""
    script = _script(tmp_path, "nested.py", """
        import tensorflow as tf
        v = tf.Variable(tf.zeros([4]))

        @tf.function
        def inner(x):
            return x * 2.0

        @tf.function
        def step(x):
            v.assign_add(inner(x))
            return tf.reduce_sum(v)

        for x in tf.data.Dataset.from_tensors(tf.ones([4])).repeat(17):
            step(x)
        print("done", float(step(tf.ones([4]))))
    """)
    report, _ = _rtkit(tmp_path, "r", script, extra=["--set", "sched=1"])
    steps = report["steps"]
    assert steps["count"] == 18 and steps["signature"] == "tf.function __main__.step", steps
    assert not any("inner" in o["signature"] for o in steps["other_signatures"]), steps["other_signatures"]
    datasets = report["scheduler"]["keras"].get("datasets") or []
    assert len(datasets) == 1 and datasets[0]["private_threadpool_size"], report["scheduler"]["keras"]

    concrete = _script(tmp_path, "concrete.py", """
        import tensorflow as tf
        v = tf.Variable(0.0)
        step = tf.function(lambda x: v.assign_add(x)).get_concrete_function(tf.TensorSpec([], tf.float32))
        for i in range(9):
            step(tf.constant(1.0))
        print("done", float(v))
    """)
    report, _ = _rtkit(tmp_path, "c", concrete)
    assert report["steps"]["count"] == 9 and report["steps"]["signature"].startswith("concrete function ")


def test_the_step_that_computes_gradients_is_the_step_not_a_more_frequent_evaluation(tmp_path):
    """keras-io's custom-loop guide evaluates a test_step over a validation set five times the size of its training
    set after every epoch: the training step (its graph has the GradientTape's ops) is the step, not test_step,
    though test_step recurs five times as often. The allocator's marks follow the training step as well."""
    script = _script(tmp_path, "evaluated.py", """
        import tensorflow as tf
        w = tf.Variable(tf.ones([8, 1]))
        opt = tf.keras.optimizers.SGD(0.01)

        @tf.function
        def train_step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(x, w))
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        @tf.function
        def test_step(x):
            return tf.reduce_sum(tf.matmul(x, w))

        x = tf.ones([4, 8])
        for epoch in range(3):
            for _ in range(6):
                train_step(x)
            for _ in range(30):
                test_step(x)
        print("done")
    """)
    report, proc = _rtkit(tmp_path, "r", script)
    steps = report["steps"]
    assert steps["signature"] == "tf.function __main__.train_step" and steps["count"] == 18, steps
    assert [(o["signature"], o["count"]) for o in steps["other_signatures"]] == \
        [("tf.function __main__.test_step", 90)], steps["other_signatures"]
    assert "steps: 18 counted from tf.function calls" in proc.stderr, proc.stderr[-2000:]


def test_gradients_are_found_in_the_functions_a_step_calls():
    """A step that calls a tf.function computing the gradients (or a strategy's replica function) has only a call
    op in its own graph: the gradient ops are in its function library."""
    import tensorflow as tf
    from rtkit.hooks.gradient_ops import graph_computes_gradients

    w = tf.Variable(tf.ones([3, 1]))

    @tf.function
    def update(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    outer = tf.function(lambda x: update(x))
    evaluate = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, w)))
    graph = outer.get_concrete_function(tf.TensorSpec([2, 3])).graph
    assert not any("gradient_tape/" in op.name for op in graph.get_operations())   # only the call is here
    assert graph_computes_gradients(graph)
    assert not graph_computes_gradients(evaluate.get_concrete_function(tf.TensorSpec([2, 3])).graph)


def test_a_retracing_function_is_reported_not_counted(tmp_path):
    script = _script(tmp_path, "storm.py", """
        import tensorflow as tf
        v = tf.Variable(1.0)

        @tf.function
        def step(i):
            v.assign_add(float(i))
            return v

        for i in range(12):
            step(i)   # a Python number: a new trace on every call
        print("done")
    """)
    report, proc = _rtkit(tmp_path, "r", script)
    assert "done" in proc.stdout
    assert report["steps"]["count"] == 0
    assert "retraced on every call (12 traces in 12 calls" in proc.stderr, proc.stderr[-2000:]
    assert report["steps"]["other_signatures"][0]["traces"] == 12


def test_an_eager_loop_has_no_step_signature_and_the_summary_says_how_to_mark_steps(tmp_path):
    script = _script(tmp_path, "eager.py", """
        import tensorflow as tf
        w = tf.Variable(tf.ones([8, 1]))
        for i in range(20):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(tf.ones([4, 8]), w))
            w.assign_sub(0.01 * tape.gradient(loss, w))
        print("done")
    """)
    report, proc = _rtkit(tmp_path, "r", script)
    assert report["steps"]["count"] == 0
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: steps:"))
    assert "no step signature" in line and "rtkit.step()" in line, line


def test_a_script_that_fails_before_training_is_not_sent_to_mark_an_eager_loop(tmp_path):
    """keras-io's collaborative_filtering_movielens.py under Keras 3 fails at `Adam(lr=0.001)`, before any step: the
    summary said "an eager loop of ops has none; mark each step with rtkit.step()", advice for a loop it never had."""
    script = _script(tmp_path, "early.py", """
        import tensorflow as tf
        w = tf.Variable(tf.ones([8, 1]))
        print(float(tf.reduce_sum(w)))
        raise ValueError("Argument(s) not recognized: {'lr': 0.001}")
    """)
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, script], timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "8.0" in proc.stdout and "not recognized" in proc.stderr
    report = load_report(tmp_path / "r")
    assert report["steps"]["count"] == 0
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: steps:"))
    assert line == ("rtkit: steps: none counted (the command ended (exit 1) before any tf.function, Session.run or "
                    "Keras fit call recurred)"), line


def test_a_keras_fit_that_fails_in_its_first_batch_is_said_so_not_called_an_eager_loop(tmp_path):
    """keras-io's deep_neural_decision_forests.py under Keras 3.15 sends a numeric column into an Embedding and fails
    in fit's first batch: no step ended. The summary says the fit's batches never ended; it does not say that no
    Keras fit recurred nor send the user to mark an eager loop with rtkit.step() (the fit's batches are the steps)."""
    script = _script(tmp_path, "fails.py", """
        import numpy as np
        import keras
        model = keras.Sequential([keras.layers.Embedding(4, 2), keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(np.full((8, 3), 9000), np.zeros((8, 1)), batch_size=4, epochs=1, verbose=0)
    """)
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, script], timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]   # the script's own failure, passed on
    assert "9000 is not in [0, 4)" in proc.stderr   # it failed in the batch (an out-of-range id), as the script did
    report = load_report(tmp_path / "r")
    assert report["steps"]["count"] == 0
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: steps:"))
    assert "Keras Model.fit was called once and none of its train batches ended" in line, line
    assert "rtkit.step()" not in line and "eager loop" not in line, line


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="tf_keras (Keras 2) is not installed")
def test_keras_2_fit_is_hooked(tmp_path):
    script = _script(tmp_path, "k2.py", """
        import numpy as np
        import tensorflow as tf
        x = np.random.default_rng(0).random((640, 8)).astype("float32")
        y = (x.sum(axis=1) > 4).astype("float32")
        model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=32, epochs=2, verbose=0)
        print("keras", type(model).__module__.split(".")[0])
    """)
    report, proc = _rtkit(tmp_path, "r", script, env={"TF_USE_LEGACY_KERAS": "1"})
    assert "keras tf_keras" in proc.stdout   # the script really ran Keras 2
    steps = report["steps"]
    assert steps["count"] == 40 and steps["source"] == "keras", steps
    assert "Keras fit (tf_keras 2." in steps["hook"]["detail"], steps["hook"]


@pytest.mark.parametrize("keras_env", [{}, {"TF_USE_LEGACY_KERAS": "1"}], ids=["keras3", "tf_keras"])
def test_the_scheduler_line_says_which_tf_data_input_was_fits(tmp_path, keras_env):
    """DeepCTR's examples fit on arrays, then predict: Keras builds fit's tf.data input inside fit (which the
    scheduler leaves alone) and predict's outside it, where the eager hook gives it the stage options. The summary
    said "fit's tf.data input: private threadpool size 1, prefetch the script's own" of predict's input, a prefetch
    Keras made. It names fit's input only when fit was given one, and says what the options went to."""
    if keras_env and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras (Keras 2) is not installed")
    sched = ["--set", "sched=1", "--set", "sched_stage=1"]
    arrays = _script(tmp_path, "arrays.py", """
        import numpy as np
        import tensorflow as tf
        x = np.random.default_rng(0).random((320, 8)).astype("float32")
        y = (x.sum(axis=1) > 4).astype("float32")
        model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, batch_size=32, epochs=2, verbose=0)
        print("predicted", model.predict(x, batch_size=64, verbose=0).shape)
    """)
    report, proc = _rtkit(tmp_path, "arrays", arrays, extra=sched, env=keras_env)
    assert "predicted (320, 1)" in proc.stdout and report["steps"]["count"] == 20, report["steps"]
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: scheduler:"))
    assert re.match(r"rtkit: scheduler: applied to Keras: inter_op_threads=\d+, intra_op_threads=\d+, fit's input ", line), line
    assert "fit's tf.data input" not in line and "the script's own" not in line, line
    assert "fit's input is not a tf.data dataset (Keras makes its own, left as it is)" in line, line
    assert "1 tf.data input outside fit (predict, evaluate or an eager loop): private threadpool size 1, " \
           "prefetch the dataset's own" in line, line
    assert "no step pipelined (fit's input is not a tf.data dataset)" in line, line
    datasets = report["scheduler"]["keras"]["datasets"]
    assert [d["input"] for d in datasets] == ["outside fit"], datasets

    given = _script(tmp_path, "dataset.py", """
        import numpy as np
        import tensorflow as tf
        x = np.random.default_rng(0).random((320, 8)).astype("float32")
        y = (x.sum(axis=1) > 4).astype("float32")
        model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=2, verbose=0)
        print("fitted")
    """)
    report, proc = _rtkit(tmp_path, "dataset", given, extra=sched, env=keras_env)
    assert report["steps"]["count"] == 20, report["steps"]
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: scheduler:"))
    assert "fit's tf.data input: private threadpool size 1, prefetch 2" in line, line
    assert "outside fit" not in line and "not a tf.data dataset" not in line, line
    assert "no session step staged (fit's tf.data input prefetches instead)" in line, line


def test_a_tensorflow_without_the_expected_call_path_is_left_unpatched(monkeypatch):
    """An unknown TensorFlow: the hook says what it lacks and patches nothing (the script runs as it is)."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    from rtkit.hooks import tf_function

    before = polymorphic_function.Function.__call__
    monkeypatch.delattr(polymorphic_function.Function, "experimental_get_tracing_count")
    with pytest.raises(AttributeError, match="experimental_get_tracing_count"):
        tf_function.install()
    assert polymorphic_function.Function.__call__ is before


def test_several_fits_are_said_to_share_the_step_and_epoch_medians(tmp_path):
    """tensorflow/recommenders' DCN example fits 17 models of five kinds one after another (7.0 ms steps for the
    first two's 1,800 batches, 59.8 ms for the other fifteen's 1,200), and the summary's "median step time 13.6 ms" and
    "140 epoch(s), median epoch time 0.648 s" gave no hint that they pooled them. The Keras line now says how many fit
    calls the medians pool."""
    script = _script(tmp_path, "two_models.py", """
        import numpy as np
        import keras
        x = np.random.default_rng(0).random((256, 8)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        for width in (4, 64):
            model = keras.Sequential([keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
            model.fit(x, y, batch_size=32, epochs=2, verbose=0)
        print("fits-done")
    """)
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, script], timeout=600)
    assert proc.returncode == 0 and "fits-done" in proc.stdout, proc.stderr[-3000:]
    report = load_report(tmp_path / "r")
    assert report["steps"]["count"] == 2 * 2 * 8 and report["steps"]["keras"]["fit_calls"] == 2, report["steps"]["keras"]
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: keras:"))
    assert line.startswith("rtkit: keras: 4 epoch(s) over 2 fit calls (the medians pool them), median epoch time"), line


def test_one_fit_keeps_the_keras_line_as_it_was(tmp_path):
    script = _script(tmp_path, "one_model.py", """
        import numpy as np
        import keras
        x = np.random.default_rng(0).random((256, 8)).astype("float32")
        model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, x.sum(axis=1, keepdims=True), batch_size=32, epochs=2, verbose=0)
    """)
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, script], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_report(tmp_path / "r")["steps"]["keras"]["fit_calls"] == 1
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: keras:"))
    assert line.startswith("rtkit: keras: 2 epoch(s), median epoch time"), line
