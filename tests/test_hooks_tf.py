# test_hooks_tf.py -- real TensorFlow under `rtkit run`: the steps in the report equal the steps the script ran.
import json
import sys
import textwrap

import pytest

from conftest import WDL_STEPS, load_report, requires_tf, run_rtkit
from rtkit.report import model

pytestmark = requires_tf

GRAPH = textwrap.dedent("""
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.get_variable("x", initializer=tf.ones([64, 64]))
    loss = tf.reduce_sum(tf.matmul(x, x))
    train = tf.compat.v1.train.GradientDescentOptimizer(1e-6).minimize(loss)
    STEPS = 23
""")


def _run_script(tmp_path, body, *extra):
    script = tmp_path / "train.py"
    script.write_text(GRAPH + textwrap.dedent(body))
    proc = run_rtkit(["run", *extra, "--run-dir", str(tmp_path / "r"), "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    return load_report(tmp_path / "r"), proc


@pytest.fixture(scope="module")
def session_run(tmp_path_factory):
    """One Session.run training loop, then an evaluation run: the steps and the allocator's step marks of it."""
    report, _ = _run_script(tmp_path_factory.mktemp("session"), """
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for i in range(STEPS):
                s.run([train, loss])
            s.run(loss)  # an evaluation run after training: not a step
    """)
    return report


def test_session_run_steps_counted(session_run):
    steps = session_run["steps"]
    assert steps["count"] == 23
    assert steps["source"] == "session"
    assert "GradientDescent" in steps["signature"]
    assert steps["hook"]["status"] == "ok" and steps["hook"]["tensorflow_version"].startswith("2.")
    assert len(steps["per_step"]) == 23
    assert steps["summary"]["measured_steps"] == 23 - steps["warmup_steps"]
    assert steps["summary"]["step_ms_median"] > 0


def test_make_callable_steps_counted(tmp_path):
    report, _ = _run_script(tmp_path, """
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            step = s.make_callable([train, loss])
            for i in range(STEPS):
                step()
    """)
    assert report["steps"]["count"] == 23


def test_monitored_session_hooks_own_runs_are_not_steps(tmp_path):
    """A step-based CheckpointSaverHook reads the global step and saves with runs of its own, StopAtStepHook
    reads it too, and a user hook runs an op twice per step: none of them outvotes the train op, and the step
    is named by the API it came through."""
    report, proc = _run_script(tmp_path, f"""
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(1e-6).minimize(loss, global_step=gs)
        ctr = tf.compat.v1.get_variable("ctr", [], tf.int64, initializer=tf.compat.v1.zeros_initializer(),
                                        trainable=False)
        bump = tf.compat.v1.assign_add(ctr, 1).op

        class OwnRuns(tf.compat.v1.train.SessionRunHook):
            def after_run(self, run_context, run_values):
                run_context.session.run(bump)
                run_context.session.run(bump)

        trained = 0
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir={str(tmp_path / "ckpt")!r}, save_checkpoint_steps=5, save_checkpoint_secs=None,
                save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
                hooks=[OwnRuns(), tf.compat.v1.train.StopAtStepHook(last_step=STEPS)]) as s:
            while not s.should_stop():
                s.run(train)
                trained += 1
        last = tf.train.latest_checkpoint({str(tmp_path / "ckpt")!r})
        print("trained", trained, "global_step", tf.train.load_variable(last, "global_step"))
    """)
    assert "trained 23 global_step 23" in proc.stdout
    steps = report["steps"]
    assert steps["count"] == 23, steps["signature"]
    assert "GradientDescent" in steps["signature"]
    assert steps["api"] == "tf.compat.v1 MonitoredTrainingSession"
    assert "steps: 23 counted from tf.compat.v1 MonitoredTrainingSession" in proc.stderr
    reads = [o for o in steps["other_signatures"] if "global_step" in o["signature"]]
    assert reads and reads[0]["count"] > 23            # the hooks' reads did recur more often than the step
    others = {o["signature"]: o["count"] for o in steps["other_signatures"]}
    assert others["hook run: targets=AssignAddVariableOp"] == 46   # recorded, named as the hook's, not counted
    assert any(n.startswith("hook run: fetches=save/") for n in others)


def test_keras_fit_steps_counted(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, keras
        x = np.random.rand(512, 8).astype("float32"); y = x.sum(axis=1, keepdims=True)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        m.fit(x, y, batch_size=64, epochs=2, verbose=0)
    """))
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    steps = load_report(tmp_path / "r")["steps"]
    assert steps["source"] == "keras"
    assert steps["count"] == 16  # 512 / 64 batches x 2 epochs


def test_step_mark_reaches_preloaded_allocator(session_run):
    alloc = session_run.get("allocator")
    if alloc is None:
        pytest.skip("the allocator library wrote no statistics in this build")
    # the first training step is recognised as dominant from its second occurrence on
    assert alloc["steps"] >= 23 - 2


@pytest.mark.parametrize("model,api", [("wdl", "session"), ("dlrm", "monitored"), ("wdl", "keras")])
def test_bundled_workload_steps_equal_steps_run(tmp_path, data_dir, wdl_default_runs, model, api):
    """The bundled workloads never call rtkit: the hooks must find exactly the steps they ran."""
    if model == "wdl":   # the default run that test_report_agree.py reads too (tests/conftest.py)
        run = wdl_default_runs(api)
        stdout, report, asked = run["stdout"], run["report"], WDL_STEPS
    else:
        proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, "-m", "rtkit.workloads",
                          model, "--api", api, "--steps", "14", "--batch", "256", "--rows", "20000", "--no-progress",
                          "--data-dir", data_dir])
        assert proc.returncode == 0, proc.stderr
        stdout, report, asked = proc.stdout, load_report(tmp_path / "r"), 14
    line = [l for l in stdout.splitlines() if l.startswith("rtkit-workload:")]
    assert len(line) == 1
    ran = int(dict(kv.split("=", 1) for kv in line[0].split()[1:])["steps"])
    assert ran == asked
    steps = report["steps"]
    assert steps["count"] == ran
    assert steps["source"] == ("keras" if api == "keras" else "session")


def test_keras_fit_with_positional_callbacks_keeps_user_callback(tmp_path):
    script = tmp_path / "fit_pos.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, keras
        seen = []
        class Mine(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                seen.append(batch)
        x = np.random.rand(256, 4).astype("float32"); y = x.sum(axis=1, keepdims=True)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        m.fit(x, y, 64, 1, 0, [Mine()])
        print("user-callback-batches", len(seen))
    """))
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    assert "user-callback-batches 4" in proc.stdout
    steps = load_report(tmp_path / "r")["steps"]
    assert steps["source"] == "keras" and steps["count"] == 4


def test_a_predict_loop_that_outnumbers_the_train_op_is_not_the_step(tmp_path):
    """ChenglongChen/tensorflow-DeepFM trains with sess.run((loss, optimizer)) and, after each epoch, predicts over
    its training and validation sets (and over the test set after fit) with sess.run(out), batch by batch: more
    than twice as many forward-only runs as train runs. The train op computes gradients: it is the step."""
    report, proc = _run_script(tmp_path, """
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for i in range(STEPS):
                s.run((loss, train))
                for j in range(3):
                    s.run(loss)
    """)
    steps = report["steps"]
    assert "GradientDescent" in steps["signature"] and steps["count"] == 23, steps["other_signatures"][:3]
    others = {o["signature"]: o["count"] for o in steps["other_signatures"]}
    assert others.get("fetches=Sum:0") == 69, others   # the forward-only runs, three times the train op's
    assert "steps: 23 counted from tf.compat.v1 Session.run" in proc.stderr


def test_gradient_ops_are_found_behind_a_train_op_and_not_behind_its_loss():
    """What tells the train run: its target's update ops read tf.gradients' ops (gradients/, and gradients_1/ for a
    second optimizer of the same graph); the loss a predict run fetches depends on none."""
    import tensorflow as tf
    from rtkit.hooks import gradient_ops

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.get_variable("x", initializer=tf.ones([4, 4]))
        loss = tf.reduce_sum(tf.matmul(x, x))
        first = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        second = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
    assert any(op.name.startswith("gradients_1/") for op in graph.get_operations())
    assert gradient_ops.ops_reach_gradients(graph, [first.name])
    assert gradient_ops.ops_reach_gradients(graph, [second.name])
    assert not gradient_ops.ops_reach_gradients(graph, [loss.op.name, "no_such_op"])
    assert gradient_ops.run_computes_gradients(graph, "targets=t", [first.name])
    assert gradient_ops.run_computes_gradients(graph, "targets=t", [])   # decided once per signature: kept


def test_a_session_step_starts_before_its_feeds_are_converted(tmp_path):
    """ChenglongChen/tensorflow-DeepFM feeds each batch as Python lists (1024 x 39 ids and values): Session.run
    converts them to arrays before TF's call, 3 of the 16 ms the script waited for a step. The step starts where
    Session.run's own part begins: each step's recorded start comes before its feed's conversion (a feed object
    whose __array__ notes when numpy converted it) and the conversion lies inside the step; the start came after."""
    report, proc = _run_script(tmp_path, """
        import time
        import numpy as np
        fed = tf.compat.v1.placeholder(tf.float32, [4])
        step = tf.compat.v1.train.GradientDescentOptimizer(1e-6).minimize(loss + tf.reduce_sum(fed))

        class Batch:
            at = None

            def __array__(self, dtype=None, copy=None):
                self.at = self.at or time.time()   # the first conversion's start
                return np.ones(4, dtype=dtype or np.float32)

        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for i in range(STEPS):
                batch = Batch()
                s.run(step, {fed: batch})
                print("converted", repr(batch.at))
    """)
    steps = report["steps"]
    assert steps["count"] == 23 and "GradientDescent" in steps["signature"], steps["other_signatures"][:3]
    converted = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("converted ")]
    # the child's own records: starts in unix seconds, to 1 us
    ((_, child),) = model.read_child_files(str(tmp_path / "r"), "steps")
    per_step = child["per_step"]
    assert len(converted) == 23 == len(per_step)
    us = 1e-6
    for at, rec in zip(converted, per_step):
        assert rec["t_unix"] <= at + us, (rec, at)   # the step began before its feed was converted
        assert at <= rec["t_unix"] + rec["step_ms"] / 1000.0 + us, (rec, at)   # and the conversion is inside it


def test_queue_runner_enqueues_are_not_steps(tmp_path):
    """A tf.train.shuffle_batch input (QueueRunner threads, one enqueue run per example) makes far more runs
    than the training loop: they are counted as the queue runner's, and the train op stays the step, under
    MonitoredTrainingSession (which starts the runners) as under a plain Session with start_queue_runners."""
    report, proc = _run_script(tmp_path, """
        example = tf.random.uniform([64])
        batch = tf.compat.v1.train.shuffle_batch([example], batch_size=4, capacity=400, min_after_dequeue=200,
                                                 num_threads=2)
        train = tf.compat.v1.train.GradientDescentOptimizer(1e-6).minimize(loss + tf.reduce_sum(batch))
        with tf.compat.v1.train.MonitoredTrainingSession() as s:
            for i in range(STEPS):
                s.run(train)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            coord = tf.compat.v1.train.Coordinator()
            threads = tf.compat.v1.train.start_queue_runners(s, coord)
            for i in range(STEPS):
                s.run(train)
            coord.request_stop()
            coord.join(threads)
    """)
    steps = report["steps"]
    assert "GradientDescent" in steps["signature"], steps["other_signatures"][:3]
    assert steps["count"] == 2 * 23   # GRAPH's STEPS, in each session
    others = {o["signature"]: o["count"] for o in steps["other_signatures"]}
    enqueues = [n for n in others if n.startswith("queue runner: ") and "enqueue" in n]
    assert enqueues and others[enqueues[0]] >= 200 > steps["count"]   # they did outnumber the steps
    assert not any("enqueue" in n for n in others if not n.startswith("queue runner: "))
    assert "steps: 46 counted from tf.compat.v1" in proc.stderr

