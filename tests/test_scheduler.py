# test_scheduler.py -- the scheduler in-process with real tf.compat.v1 sessions: stages, pools, SmartStage semantics, tuning.
"""The Scheduler's hook methods are driven directly here (filter_config at session creation, wrap_run
around every run, on_close before close), exactly as rtkit's session hooks call them, so these tests
do not patch TensorFlow for the rest of the pytest process. tests/test_scheduler_run.py covers the
same through `rtkit run`."""
import os
import threading

import numpy as np
import pytest

from conftest import requires_tf
from rtkit import config as rconfig
from rtkit.hooks import session as session_hooks
from rtkit.hooks.steps import StepRecorder
from rtkit.scheduler import pools
from rtkit.scheduler.core import Scheduler
from rtkit.scheduler.pipeline import _leaves
from rtkit.scheduler.staging import RUNNER_PREFIX as THREAD_PREFIX
from rtkit.scheduler.stages import analyze

pytestmark = [requires_tf, pytest.mark.timeout(300)]

tf = tf1 = None  # imported by the fixture below, so that collecting this module (`make test-fast`) stays light


@pytest.fixture(autouse=True, scope="module")
def _tensorflow():
    global tf, tf1
    import tensorflow
    tf, tf1 = tensorflow, tensorflow.compat.v1


def write_data(path, rows=320, bad_row=None):
    rng = np.random.RandomState(0)
    with open(path, "w") as fh:
        for i in range(rows):
            ids = " ".join(str(x) for x in rng.randint(0, 500, size=4))
            dense = "oops" if i == bad_row else f"{rng.rand():.4f}"
            fh.write(f"{i % 2},{ids},{dense}\n")
    return path


class Model:
    """A small sparse model whose parsing happens in-graph after get_next (the input stage)."""

    def __init__(self, path, batch=32, probe=None, scaled=False, read_sleep_ms=0):
        self.graph = tf.Graph()
        with self.graph.as_default():
            ds = tf.data.TextLineDataset(path).batch(batch)
            if read_sleep_ms:  # a read's latency inside the iterator (get_next waits for it), as a remote store's
                from tensorflow.python.data.experimental.ops import testing

                opts = tf.data.Options()  # no prefetch injected after it: the read stays in get_next
                opts.experimental_optimization.inject_prefetch = False
                ds = ds.apply(testing.sleep(int(read_sleep_ms * 1000))).with_options(opts)
            self.iterator = tf1.data.make_initializable_iterator(ds)
            line = self.iterator.get_next()
            cols = tf.strings.split(line, ",").to_tensor()
            label = tf.strings.to_number(cols[:, 0])
            ids = tf.strings.to_hash_bucket_fast(tf.strings.split(cols[:, 1], " ").to_tensor(), 500)
            dense = tf.strings.to_number(cols[:, 2])
            if probe is not None:  # a stateless py_func in the input stage records its thread
                dense = tf.numpy_function(probe, [dense], tf.float32, stateful=False)
                dense.set_shape([None])
            if scaled:  # a feed in the step (a script's knob): the step's own ops read it, the cut does not
                self.scale = tf1.placeholder_with_default(1.0, [], name="scale")
                dense = dense * self.scale
            emb = tf1.get_variable("emb", [500, 8], initializer=tf1.constant_initializer(0.01))
            e = tf.reduce_mean(tf.gather(emb, ids), axis=1)
            w = tf1.get_variable("w", [9, 1], initializer=tf1.constant_initializer(0.1))
            logit = tf.squeeze(tf.matmul(tf.concat([e, dense[:, None]], 1), w), 1)
            self.loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
            self.train = tf1.train.AdagradOptimizer(0.1).minimize(self.loss)
            self.init = tf1.global_variables_initializer()
            self.emb = emb


def step_owner(sched):
    """The hooks' step owner for this scheduler (a private StepRecorder it subscribes to), and the staged step's
    timing through it, as rtkit.hooks.install wires them; once per scheduler."""
    rec = getattr(sched, "_test_steps", None)
    if rec is None:
        rec = sched._test_steps = StepRecorder()
        rec.step_mark = None
        rec.subscribers = []
        rec.subscribe(sched.on_step)
        sched._timed_run = lambda session, fetch_names, target_names, call: session_hooks.timed(
            lambda: session_hooks.signature_of_names(fetch_names, target_names), call, rec)
    return rec


def run_signature(graph, fetches):
    """The session hooks' signature of a run of `fetches` (operations are targets, tensors fetches)."""
    elements = [graph.as_graph_element(e, allow_tensor=True, allow_operation=True) for e in _leaves(fetches, [])]
    ops = [e.name for e in elements if isinstance(e, tf.Operation)]
    return session_hooks.signature_of_names([e.name for e in elements if not isinstance(e, tf.Operation)], ops)


class Hooked:
    """What rtkit's session hooks do, for one session: config filter, run wrapper, step timing, close callback."""

    def __init__(self, sched, graph, config=None):
        self.sched = sched
        self.steps = step_owner(sched)
        self.sess = tf1.Session(graph=graph, config=sched.filter_config(config))

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        s, rec = self.sess, self.steps

        def run_next(f, fd=None, o=None, m=None):
            return session_hooks.timed(lambda: run_signature(s.graph, f), lambda: s.run(f, fd, o, m), rec)

        return self.sched.wrap_run(s, run_next, fetches, feed_dict, options, run_metadata)

    def make_callable(self, fetches, feed_list=None):
        s, rec = self.sess, self.steps

        def make_next(f, fl=None, a=False):
            fn = s.make_callable(f, fl, a)
            return lambda *args, **kw: session_hooks.timed(lambda: run_signature(s.graph, f), lambda: fn(*args, **kw),
                                                           rec)

        return self.sched.wrap_callable(s, make_next, fetches, feed_list)

    def close(self):
        self.sched.on_close(self.sess)
        self.sess.close()


def settings(**kw):
    out = {s.key: s.default for s in rconfig.SETTINGS}
    out.update(sched=True)
    out.update(kw)
    return out


def train(tmp_path, stage, rows=320, bad_row=None, probe=None, steps=None, read_sleep_ms=0, **kw):
    """Train to the end of the data; returns (losses, error or None, scheduler, hooked session)."""
    path = write_data(str(tmp_path / "data.csv"), rows, bad_row)
    m = Model(path, probe=probe, read_sleep_ms=read_sleep_ms)
    sched = Scheduler(tf, settings(sched_stage=stage, **kw), str(tmp_path))
    h = Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    losses, err = [], None
    try:
        while steps is None or len(losses) < steps:
            _, value = h.run([m.train, m.loss])
            losses.append(float(value))
    except tf.errors.OutOfRangeError:
        pass
    except tf.errors.OpError as exc:
        err = exc
    h.model = m
    return losses, err, sched, h


def test_probe_steps_measure_the_overlap_bound_and_keep_the_batch_order(tmp_path):
    """After the traced steps, probe steps run the put alone, then the staged compute alone (serially, as an
    unstaged step runs them): the overlap bound is max(input, compute) / (input + compute) of their medians. The
    probes' puts take the iterator's next batches in the steps' order (the runner is halted and drained for them,
    then restarted): the losses stay the unstaged ones."""
    import statistics
    import time as _time

    def slow(x):
        _time.sleep(0.03)  # a put that waits (a read's latency)
        return x

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base, err0, _, h0 = train(tmp_path / "a", stage=False, rows=32 * 20, probe=slow)
    staged, err1, s1, h1 = train(tmp_path / "b", stage=True, rows=32 * 20, probe=slow)
    h0.close()
    h1.close()
    assert err0 is None and err1 is None and len(base) == 20
    assert staged == base
    p = s1.report()["pipeline"]
    b = p["overlap_bound"]
    assert p["probe_steps"] == 4 and b["probe_steps"] == 3, p  # the first probe makes the callable: not kept
    assert p["staged_steps"] == 20 and p["pipelines_started"] >= 2  # the runner restarted after the probes
    samples = b["samples"]
    assert len(samples) == 3 and all(x[1] >= 30.0 for x in samples)  # each probe's put slept its 30 ms
    put = statistics.median(x[1] for x in samples)
    comp = statistics.median(x[3] for x in samples)
    assert (b["input_ms"], b["compute_ms"]) == (round(put, 3), round(comp, 3))
    assert b["input_plus_compute_ms"] == round(put + comp, 3)
    assert b["bound_x"] == round(max(put, comp) / (put + comp), 4) and 0.5 <= b["bound_x"] < 1.0
    assert b["input_cpu_pct"] < 100.0  # the put mostly sleeps: less CPU than wall time
    assert b["staged_steps_measured"] >= 1
    assert b["x_of_bound"] == round(b["staged_step_ms_median"] / max(put, comp), 4)


def test_read_ahead_when_the_put_waits_keeps_the_batch_order(tmp_path):
    """A put that mostly waits (the probes' CPU time under half their wall time), on a read (get_next waits 30 ms)
    and a decode (30 ms more) that a reader overlaps: a reader takes the iterator's
    batches ahead of the cut's decode, so a read and a decode are in flight at once; one reader and one decoder,
    with the plain put and a read never at once, keep the order: the losses are the unstaged ones, bit for bit,
    through the end of the data (delivered at its step) and through the tuner's switches between read-ahead,
    plain staging and unstaged blocks (the batches read ahead are staged and served first)."""
    import time as _time

    def slow(x):
        _time.sleep(0.03)
        return x

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    (tmp_path / "d").mkdir()
    rows = 32 * 90
    base, _, _, h0 = train(tmp_path / "a", stage=False, rows=rows, probe=slow, read_sleep_ms=30)
    staged, err, s1, h1 = train(tmp_path / "b", stage=True, rows=rows, probe=slow, read_sleep_ms=30)
    off, _, s2, h2 = train(tmp_path / "c", stage=True, rows=rows, probe=slow, read_sleep_ms=30, sched_stage_read_ahead=0)
    tuned, err3, s3, h3 = train(tmp_path / "d", stage=True, rows=rows, probe=slow, read_sleep_ms=30, sched_tune=True)
    for h in (h0, h1, h2, h3):
        h.close()
    assert err is None and err3 is None and len(base) == 90
    assert staged == base and off == base and tuned == base
    t = s3.report()["tuning"]
    assert t["done"] and any(tr["stage_read_ahead"] and tr["steps"] for tr in t["trials"]), t
    assert s3.report()["pipeline"]["read_ahead_batches"] >= 5
    # staging switched off while the reader is ahead: the batches it read are staged and served before the
    # script's own graph reads the iterator again
    (tmp_path / "e").mkdir()
    part, _, s4, h4 = train(tmp_path / "e", stage=True, rows=rows, probe=slow, read_sleep_ms=30, steps=30)
    ra = s4._states[h4.sess].runner.read_ahead
    for _ in range(200):  # the reader is ahead of the slow decode within a few ms; waits for it, not timed
        if ra.pending() >= 1:
            break
        _time.sleep(0.05)
    assert s4.active["read_ahead"] and ra.pending() >= 1
    s4.active["stage"] = False
    try:
        while True:
            part.append(float(h4.run([h4.model.train, h4.model.loss])[1]))
    except tf.errors.OutOfRangeError:
        pass
    h4.close()
    assert part == base
    rep = s1.report()
    p = rep["pipeline"]
    assert p["overlap_bound"]["input_cpu_pct"] < 50 and p["read_ahead_available"]
    assert rep["chosen"]["stage_read_ahead_batches"] == 2 and p["read_ahead_batches"] >= 5, p
    assert p["staged_steps"] == 90 and p["errors_delivered"] == 1  # the end of the data, at its step
    assert s2.report()["pipeline"]["read_ahead_batches"] == 0  # sched_stage_read_ahead=0: never


def test_read_ahead_stays_off_when_it_cannot_shorten_the_staged_step(tmp_path):
    """A put that mostly waits in its decode (the in-graph part after get_next), not in its read: a reader ahead
    would overlap the read with the decode, and the read is a small part of the put, so the staged step would not
    be shorter. Read-ahead is then not applied (without a tuner) nor a tuner candidate, and the report says why."""
    import time as _time

    def slow(x):
        _time.sleep(0.2)  # the decode waits; the read (a text batch from a local file) is a small part of the put
        return x

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rows = 32 * 16
    plain, err, s1, h1 = train(tmp_path / "a", stage=True, rows=rows, probe=slow)
    tuned, err2, s2, h2 = train(tmp_path / "b", stage=True, rows=rows, probe=slow, sched_tune=True,
                                sched_tune_steps=20)
    h1.close()
    h2.close()
    assert err is None and err2 is None and len(plain) == 16 and tuned == plain
    p = s1.report()["pipeline"]
    b = p["overlap_bound"]
    assert p["read_ahead_available"] and b["input_cpu_pct"] < 50, b  # the put waits
    assert b["read_ms"] is not None and b["decode_ms"] > b["read_ms"], b
    assert b["read_ahead_decision"].startswith("off: the staged step would not be shorter"), b
    assert not s1.active["read_ahead"] and p["read_ahead_batches"] == 0, p
    assert s1.report()["chosen"]["stage_read_ahead_batches"] == 0
    t = s2.report()["tuning"]
    assert not any(tr["stage_read_ahead"] for tr in t["trials"]), t
    assert s2.report()["pipeline"]["read_ahead_batches"] == 0


def h1_callables(sched, h):
    """The staged step's callables the scheduler made for this session: [(key, callable)]."""
    return list(sched._states[h.sess].callables.items())


def rtkit_threads():
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def test_stage_analysis_classifies_ops_and_cuts_at_get_next(tmp_path):
    m = Model(write_data(str(tmp_path / "d.csv"), 64))
    sm = analyze(m.graph)
    assert sm.cuttable, sm.notes
    by_type = {}
    for op in m.graph.get_operations():
        by_type.setdefault(op.type, set()).add(sm.stage[op.name])
    assert by_type["IteratorGetNext"] == {"input"}
    assert by_type["StringToHashBucketFast"] == {"input"}
    assert by_type["StringSplitV2"] == {"input"}
    assert by_type["GatherV2"] == {"embedding"}
    assert by_type["ResourceSparseApplyAdagrad"] == {"embedding"}
    assert by_type["ResourceApplyAdagrad"] == {"apply"}
    assert "dense" in by_type["MatMul"]
    # the boundary is what the rest consumes from the input stage: hashed ids, parsed floats, labels
    ops_of_boundary = {m.graph.get_tensor_by_name(n).op.type for n in sm.boundary}
    assert "StringToHashBucketFast" in ops_of_boundary and "StringToNumber" in ops_of_boundary
    assert not any(m.graph.get_operation_by_name(n).op_def.is_stateful
                   for n in sm.pipelined if m.graph.get_operation_by_name(n).type != "IteratorGetNext")


def test_shape_and_gradient_plumbing_stay_out_of_the_cut(tmp_path):
    """Shapes of input tensors (and what only they read) and the gradient's index plumbing run in the step, which
    computes them from the staged tensors: staged, they reached the model as opaque tensors and made most of the
    boundary. (Not the cause of the lazy-table last-bit loss difference: docs/scheduler.md measured it unchanged.)"""
    m = Model(write_data(str(tmp_path / "d.csv"), 64))
    g = m.graph
    with g.as_default():  # a shape-only consumer: a reshape to the ids' own shape, read only by tf.shape
        ids = [op for op in g.get_operations() if op.type == "StringToHashBucketFast"][0].outputs[0]
        only_for_shape = tf.identity(ids, name="only_for_shape")
        tf.reduce_sum(tf.cast(tf.shape(only_for_shape), tf.float32) * m.emb[0, 0], name="uses_the_shape")
    sm = analyze(g)
    assert sm.cuttable, sm.notes
    for name in sm.pipelined:
        op = g.get_operation_by_name(name)
        assert op.type not in ("Shape", "ShapeN", "Size", "Rank"), name
        assert not any(p == "gradients" or p.startswith("gradients_") for p in name.split("/")), name
    assert "only_for_shape" not in sm.pipelined and ids.name in sm.boundary
    # the model graph has gradient ops that read only the ids (the gather's gradient indices): none is staged
    assert any(op.name.startswith("gradients/") and any(t.op.name in sm.pipelined for t in op.inputs)
               for op in g.get_operations())


def test_staged_callables_are_evicted_safely_by_concurrent_steps():
    """Steps of several threads on one session, every run shape new, past MAX_CALLABLES: two threads evicting the
    oldest callable at once picked the same key and one got a KeyError (inside the user's Session.run). The
    threads switch every microsecond here so that the evictions interleave."""
    import sys

    from rtkit.scheduler import pipeline

    st = pipeline._SessionState(routed=False)
    errors = []

    def steps(thread):
        try:
            for i in range(20000):
                pipeline._keep_callable(st, (thread, i), object())
        except Exception as exc:
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=steps, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(st.callables) == pipeline.MAX_CALLABLES


def test_only_input_errors_of_unstaged_steps_count_as_delivered(tmp_path):
    """Unstaged steps (staging off on a staged graph): the end of the data is an input error delivered at its
    step; a feed of the wrong shape (the script's mistake, a ValueError before TF runs) is not, nor a step."""
    m = Model(write_data(str(tmp_path / "data.csv"), 320), scaled=True)
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    sched.active["stage"] = False  # the tuner's choice: the graph is staged, its steps run unstaged
    h = Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    steps = 0
    for _ in range(4):
        h.run([m.train, m.loss])
        steps += 1
    with pytest.raises(ValueError):
        h.run([m.train, m.loss], feed_dict={m.scale: [1.0, 2.0]})
    p = sched.report()["pipeline"]
    assert (p["errors_delivered"], p["unstaged_steps"], p["input_runs"]) == (0, 4, 4), p
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            h.run([m.train, m.loss])
            steps += 1
    h.close()
    p = sched.report()["pipeline"]
    assert steps == 10     # 320 rows of 32: the bad feed read no batch
    assert (p["errors_delivered"], p["unstaged_steps"], p["input_runs"]) == (1, 10, 10), p


def test_staged_and_unstaged_give_same_losses_and_steps(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base, err0, s0, h0 = train(tmp_path / "a", stage=False)
    staged, err1, s1, h1 = train(tmp_path / "b", stage=True)
    h0.close()
    h1.close()
    assert err0 is None and err1 is None
    assert len(base) == len(staged) == 10  # 320 rows / batch 32, then OutOfRange ends the loop
    assert staged == base  # bit-identical: the same ops on the same batches
    rep = s1.report()
    assert rep["pipeline"]["staged"] and rep["pipeline"]["staged_steps"] == 10
    assert rep["pipeline"]["errors_delivered"] == 1  # the end of the data, at the 11th step
    # no boundary tensor is fed from Python: the staged step connects its consumers to the staging area's get op
    # (CallableOptions.tensor_connection), and no op of the script's graph is rewired
    g = h1.sess.graph
    assert any(op.type == "Unstage" for op in g.get_operations())
    made = h1_callables(s1, h1)
    assert made and all(key[3] and set(key[3]) <= set(rep["pipeline"]["boundary_tensors"]) for key, _ in made)
    assert not [op.name for op in g.get_operations() if any(t.op.type == "Unstage" for t in op.inputs)]
    assert rep["pipeline"]["pipelines_started"] >= 1
    assert rep["pipeline"]["occupancy_samples_batches"], rep["pipeline"]
    assert s0.report()["pipeline"]["pipelines_started"] == 0
    assert not rtkit_threads()


def test_input_stage_ops_run_on_the_input_pool_threads(tmp_path):
    """Staged, the input stage's ops run on the input pool, but for the probe steps' puts, which run where the
    unstaged step runs them (the compute pool): the bound's input + compute is then the unstaged step's parts.
    One call of the input stage's py_func per batch: the calls on the compute pool are the probes' puts (and any
    step that ran the script's own graph), whatever the number of probe steps."""
    seen = set()
    calls = []

    def probe(x):
        seen.add(threading.get_native_id())
        calls.append(threading.get_native_id())
        return x

    losses, err, sched, h = train(tmp_path, stage=True, probe=probe, rows=32 * 20)  # probe steps from step 7 on
    try:
        assert err is None and len(losses) == 20
        input_idx = sched.plan.index("input", sched.active["input"])
        compute_idx = sched.plan.index("compute", sched.active["compute"])
        input_tids = set(pools.pool_threads(input_idx))
        compute_tids = set(pools.pool_threads(compute_idx))
        assert input_tids and compute_tids and not input_tids & compute_tids, pools.thread_names()
        p = sched.report()["pipeline"]
        assert p["probe_steps"] >= 1 and p["overlap_bound"]["probe_steps"] >= 1, p
        on_compute = sum(1 for t in calls if t in compute_tids)
        assert on_compute == p["probe_steps"] + p["inline_steps"], (calls, p, pools.thread_names())
        assert seen <= input_tids | compute_tids, (seen, pools.thread_names())
        assert len(calls) - on_compute >= 1  # the staged puts ahead: the input pool
    finally:
        h.close()
    # unstaged, the same op runs on the compute pool
    seen.clear()
    (tmp_path / "u").mkdir()
    losses, err, sched, h = train(tmp_path / "u", stage=False, probe=probe)
    h.close()
    compute_tids = set(pools.pool_threads(sched.plan.index("compute", sched.active["compute"])))
    assert seen and seen <= compute_tids, (seen, pools.thread_names())


def test_input_stage_error_reaches_the_caller_at_its_step(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base, err0, _, h0 = train(tmp_path / "a", stage=False, bad_row=100)
    staged, err1, _, h1 = train(tmp_path / "b", stage=True, bad_row=100)
    h0.close()
    h1.close()
    assert isinstance(err0, tf.errors.InvalidArgumentError)
    assert type(err1) is type(err0)
    assert len(staged) == len(base) == 3  # rows 96..127 hold the bad row: the 4th step fails
    np.testing.assert_allclose(staged, base, rtol=1e-5, atol=1e-6)
    assert not rtkit_threads()


def test_close_mid_run_stops_the_pipeline(tmp_path):
    losses, err, sched, h = train(tmp_path, stage=True, rows=3200, steps=5)
    assert len(losses) == 5
    assert rtkit_threads(), "the pipeline should be running ahead"
    h.close()
    assert not rtkit_threads()


def test_reinitialising_the_iterator_restarts_the_pipeline(tmp_path):
    path = write_data(str(tmp_path / "d.csv"), 320)
    m = Model(path)
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    h = Hooked(sched, m.graph)
    h.run(m.init)
    epochs = []
    for _ in range(2):
        h.run(m.iterator.initializer)
        n = 0
        try:
            while True:
                h.run([m.train, m.loss])
                n += 1
        except tf.errors.OutOfRangeError:
            epochs.append(n)
    # a run that reads other things (no input) is not pipelined and does not consume a batch
    h.run(m.emb)
    h.close()
    assert epochs == [10, 10]
    assert not rtkit_threads()


def test_feeds_only_graph_runs_unstaged_with_a_note(tmp_path):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None])
        v = tf1.get_variable("v", [], initializer=tf1.zeros_initializer())
        step = tf1.assign_add(v, tf.reduce_sum(x))
        init = tf1.global_variables_initializer()
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    h = Hooked(sched, g)
    h.run(init)
    for i in range(6):
        h.run(step, {x: [1.0, float(i)]})
    assert h.run(v) == pytest.approx(6 + 15)
    h.close()
    rep = sched.report()
    assert not rep["pipeline"]["cuttable"]
    assert any("cannot be cut (feeds only)" in n for n in rep["notes"]), rep["notes"]


def test_queue_input_is_named_as_a_queue_not_as_feeds():
    """A TF1 queue input (shuffle_batch, as tensorflow/models' cifar10_train.py) is neither a tf.data iterator nor
    feeds: the note says which it is, so the summary does not call it "feeds only"."""
    g = tf.Graph()
    with g.as_default():
        q = tf1.FIFOQueue(32, [tf.float32], shapes=[[2]])
        enqueue = q.enqueue_many([tf.ones([8, 2])])
        batch = q.dequeue_many(4)
        v = tf1.get_variable("v", [], initializer=tf1.zeros_initializer())
        tf1.assign_add(v, tf.reduce_sum(batch))
        tf1.train.add_queue_runner(tf1.train.QueueRunner(q, [enqueue]))
    sm = analyze(g)
    assert not sm.cuttable
    assert any("the input is a queue (QueueDequeueManyV2)" in n and "cannot be cut" in n for n in sm.notes), sm.notes
    assert not any("feeds only" in n for n in sm.notes), sm.notes


def test_user_thread_settings_win_unless_override(tmp_path):
    user = tf1.ConfigProto(inter_op_parallelism_threads=1)
    kept = Scheduler(tf, settings(), None).filter_config(user)
    assert kept is user and not len(kept.session_inter_op_thread_pool)
    over = Scheduler(tf, settings(sched_override_user=True), None)
    cfg = over.filter_config(user)
    assert len(cfg.session_inter_op_thread_pool) >= 2
    assert over.sessions_info[0]["applied"].startswith("rtkit")


def test_tuning_picks_a_config_writes_profile_report_and_trace(tmp_path):
    out = tmp_path / "tuned.toml"
    (tmp_path / "base").mkdir()
    # 80 steps: the traced steps (3) and the probe steps (at most 8) come before the tuner's 60
    base, _, _, h0 = train(tmp_path / "base", stage=False, rows=32 * 80)
    h0.close()
    losses, err, sched, h = train(tmp_path, stage=True, rows=32 * 80,
                                  sched_tune=True, sched_tune_steps=60, sched_save_profile=str(out))
    h.close()
    assert err is None and len(losses) == 80
    # trials switch pools and staging on and off (serving what was staged first): same batches, same order
    assert losses == base
    rep = sched.report()
    assert rep["tuning"]["done"], rep["tuning"]
    trials = rep["tuning"]["trials"]
    assert len(trials) >= 3
    assert {t["stage_pipelined"] for t in trials} == {True, False}
    assert rep["pipeline"]["dropped_batches"] == 0
    assert rep["tuning"]["steps_used"] <= 60
    assert rep["tuning"]["verdict"] and rep["tuning"]["confidence"]
    assert rep["speedup_over_first_x"] and rep["speedup_over_first_x"] >= 1.0
    prof = rconfig.load_profile(str(out))
    assert prof.values["sched_inter_op"] == rep["chosen"]["compute_threads"]
    assert prof.values["sched_tune"] is False
    assert os.path.isfile(tmp_path / "scheduler-profile.toml")
    assert rep["stages"]["input"]["op_time_ms_per_step"] > 0
    assert rep["stages"]["embedding"]["op_time_ms_per_step"] > 0
    sched.at_exit()
    import json
    with open(tmp_path / f"scheduler-{os.getpid()}.json") as fh:
        assert json.load(fh)["chosen"]["compute_threads"] == rep["chosen"]["compute_threads"]
    with open(tmp_path / f"trace-{os.getpid()}.json") as fh:
        trace = json.load(fh)
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"input", "embedding", "dense", "apply"} <= tracks
    cats = {e.get("cat") for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"input", "embedding", "dense", "steps", "stage-put"} <= cats


def test_forward_only_runs_and_shared_constants_keep_the_order(tmp_path):
    """Loss-only runs (they consume a batch, as without rtkit) between train steps, and a constant shared by
    the dataset and the model, give the same values staged and unstaged."""
    path = write_data(str(tmp_path / "d.csv"), 320)

    def go(stage):
        g = tf.Graph()
        with g.as_default():
            bs = tf.constant(32, tf.int64)  # used by the dataset and by the model
            it = tf1.data.make_initializable_iterator(tf.data.TextLineDataset(path).batch(bs))
            cols = tf.strings.split(it.get_next(), ",").to_tensor()
            x = tf.strings.to_number(cols[:, 2]) + tf.cast(bs, tf.float32) * 0.0
            v = tf1.get_variable("v", [], initializer=tf1.zeros_initializer())
            loss = tf.reduce_mean(tf.square(x - v))
            train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
            init = tf1.global_variables_initializer()
        sched = Scheduler(tf, settings(sched_stage=stage), str(tmp_path))
        h = Hooked(sched, g)
        h.run(init)
        h.run(it.initializer)
        out = []
        try:
            for i in range(100):
                out.append(float(h.run(loss) if i % 3 == 2 else h.run([train, loss])[1]))
        except tf.errors.OutOfRangeError:
            pass
        h.close()
        return out, sched.report()

    base, _ = go(False)
    staged, rep = go(True)
    assert len(base) == len(staged) == 10
    np.testing.assert_allclose(staged, base, rtol=1e-5, atol=1e-6)
    assert rep["pipeline"]["dropped_batches"] == 0
    assert rep["pipeline"]["pipelines_started"] == 1  # never reset by the shared constant


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 CPUs")
def test_pinning_puts_each_pool_on_its_own_cpus(tmp_path):
    losses, err, sched, h = train(tmp_path, stage=True, rows=32 * 20, sched_pin=True)
    try:
        assert err is None and len(losses) == 20
        pin = sched.report()["pinning"]
        assert pin and pin["pinned"], pin
        cpus = pin["cpus"]
        assert not set(cpus["input"]["cpus"]) & set(cpus["compute"]["cpus"])
        for stage in ("input", "compute"):
            idx = sched.plan.index(stage, sched.active[stage])
            tids = pools.pool_threads(idx)
            assert tids and cpus[stage]["threads"] == len(tids)
            for tid in tids:
                assert sorted(os.sched_getaffinity(tid)) == cpus[stage]["cpus"]
    finally:
        h.close()


def test_tuner_interleaves_blocks_and_keeps_the_fastest():
    from rtkit.scheduler.tuner import Tuner

    t = Tuner([2, 1, 4], [1, 2], 60, stage_options=(False, True), block_steps=4, drain_steps=2)
    assert t.candidates == [(2, 1, False), (1, 1, False), (2, 1, True), (2, 2, True)] and t.rounds == 3
    assert t.candidates[0] == (2, 1, False)  # the script's own configuration comes first
    order = []
    drift = 100.0
    while not t.done:
        cfg = t.current()
        order.append(cfg)
        drift -= 0.5  # steps get faster over time: a sequential schedule would favour the last candidate
        t.record(drift * (0.8 if cfg == (2, 2, True) else 1.0))
    # 4 candidates, blocks of 4; the drift makes the two middle ones slower than the script's in round 2 (they ran
    # before it there), so round 3 runs only the script's configuration and the winner
    assert t.steps_used == 4 * 4 * 2 + 2 * 4
    assert order[:4] == [t.candidates[0]] * 4 and order[4] == t.candidates[1]  # blocks, interleaved
    assert order[16:20] == [t.candidates[-1]] * 4  # the second round runs in reverse order
    assert t.chosen == (2, 2, True)
    rep = t.report()
    assert rep["speedup_over_first_x"] > 1.0 and 15 < rep["gain_pct"] < 30
    assert "3 of 3 rounds" in rep["confidence"]
    # after switching staging off, the drained steps are not measured: 4 - 1 - 2 in that block
    assert rep["trials"][1]["steps"] == 3 + 1 and rep["trials"][1]["dropped_after_round"] == 2
    assert rep["rounds_run"] == 3 and rep["trials"][3]["dropped_after_round"] is None


def test_tuner_stops_when_no_candidate_can_win_every_round():
    """A candidate slower than the script's configuration in one round can no longer be chosen: with every
    candidate slower in round 1, tuning ends there (a third of the trials), with the same verdict."""
    from rtkit.scheduler.tuner import Tuner

    t = Tuner([2, 1], [1, 2], 60, stage_options=(False, True), block_steps=4, drain_steps=2)
    assert len(t.candidates) == 4 and t.rounds == 3
    while not t.done:
        t.record(10.0 if t.current() == t.candidates[0] else 12.0)
    assert t.steps_used == 4 * 4 and t.chosen == t.candidates[0]
    rep = t.report()
    assert rep["rounds_run"] == 1 and all(x["dropped_after_round"] == 1 for x in rep["trials"][1:])
    assert "stopped after round 1 of 3" in rep["verdict"]


def test_tuner_keeps_the_script_configuration_within_noise():
    """A candidate that is faster on median but not in every round, or by less than the noise, loses."""
    import random

    from rtkit.scheduler.tuner import Tuner

    rng = random.Random(1)
    t = Tuner([2, 1, 4], [1, 2], 60, stage_options=(False, True), block_steps=4, drain_steps=2)
    while not t.done:
        cfg = t.current()
        base = 20.0 * (1.0 + 0.15 * rng.random())  # 15% noise on every step
        t.record(base * (0.98 if cfg == (1, 1, False) else 1.0))
    assert t.chosen == t.candidates[0]
    rep = t.report()
    assert rep["gain_pct"] == 0.0 and rep["verdict"].startswith("kept the script")


def test_make_callable_steps_are_staged(tmp_path):
    (tmp_path / "a").mkdir()
    base, _, _, h0 = train(tmp_path / "a", stage=False)
    h0.close()
    m = Model(write_data(str(tmp_path / "data.csv"), 320))
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    h = Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    step = h.make_callable([m.train, m.loss])
    losses = []
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            losses.append(float(step()[1]))
    h.close()
    assert losses == base
    assert sched.report()["pipeline"]["staged_steps"] == 10
    assert not rtkit_threads()


def _graph_with(kind, path):
    """A trainable graph the rewrite must leave alone: its own StagingArea, control flow at the cut, or a
    second (eval) iterator."""
    g = tf.Graph()
    with g.as_default():
        it = tf1.data.make_initializable_iterator(tf.data.TextLineDataset(path).batch(32))
        cols = tf.strings.split(it.get_next(), ",").to_tensor()
        x = tf.strings.to_number(cols[:, 2])
        if kind == "two_iterators":  # a train and an eval input in one graph
            it2 = tf1.data.make_initializable_iterator(tf.data.TextLineDataset(path).batch(32))
            ev = tf.strings.to_number(tf.strings.split(it2.get_next(), ",").to_tensor()[:, 2])
            tf.reduce_mean(ev, name="eval_metric")  # never run here: its iterator is not even initialised
            put = None
        elif kind == "user_stage":
            from tensorflow.python.ops import data_flow_ops
            area = data_flow_ops.StagingArea([tf.float32])
            put = area.put([x])
            x = area.get()
            x = x[0] if isinstance(x, (list, tuple)) else x
        if kind == "cond":
            put = None
            x = tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0, lambda: x)
        v = tf1.get_variable("v", [], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(x - v))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    return g, it, put, train, loss, init


@pytest.mark.parametrize("kind,reason", [("user_stage", "already has a staging op"), ("cond", "control flow"),
                                         ("two_iterators", "2 iterator get_next ops")])
def test_graphs_the_rewrite_cannot_handle_are_left_as_they_are(tmp_path, kind, reason):
    path = write_data(str(tmp_path / "d.csv"), 320)
    g, it, put, train, loss, init = _graph_with(kind, path)
    n_ops = len(g.get_operations())
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    h = Hooked(sched, g)
    h.run(init)
    h.run(it.initializer)
    losses = []
    for _ in range(5):
        if put is not None:
            h.run(put)
        losses.append(float(h.run([train, loss])[1]))
    h.close()
    assert len(g.get_operations()) == n_ops  # nothing added, nothing rewired
    rep = sched.report()
    assert not rep["pipeline"]["staged"] and reason in rep["pipeline"]["not_staged_reason"]
    assert rep["state"].startswith("on, not staged") and reason in rep["state"]
    assert len(losses) == 5


def test_exit_does_not_wait_for_a_slow_input_run(tmp_path):
    """The runner is a daemon: at exit rtkit gives it a deadline, not the input run's latency. The runner's input
    run in flight at exit is held until the test lets it go: at_exit must return while it still runs, leaving the
    runner behind, and the session's close then waits for the run and stops the runner."""
    entered, release, done, calls = threading.Event(), threading.Event(), [], []

    def gate(x):  # the input stage of the first 3 batches passes; the 4th is held until released
        calls.append(1)
        if len(calls) > 3:
            entered.set()
            release.wait(120)   # a guard against a hang, never the pass condition
            done.append(1)
        return x

    losses, err, sched, h = train(tmp_path, stage=True, steps=3, probe=gate)
    try:
        assert len(losses) == 3 and err is None
        assert entered.wait(120), "the runner never started the 4th batch's input run"
        (st,) = sched._states.values()
        sched.at_exit()
        assert not done, "at_exit waited for the input run in flight"
        assert st.runner.alive and rtkit_threads(), "at_exit returned, the runner is left to finish its run"
    finally:
        release.set()
    h.close()  # close waits for the in-flight input run, then the runner is gone
    assert done and not rtkit_threads()


def test_keras_dataset_gets_stage_options_unless_the_script_set_them():
    sched = Scheduler(tf, settings(sched_stage=True, sched_input_threads=1), None)
    ds = tf.data.Dataset.range(10).map(lambda x: x * 2)
    out = sched.filter_dataset(ds)
    assert out.options().threading.private_threadpool_size == 1
    assert "Prefetch" in type(out).__name__ or "Prefetch" in type(out._input_dataset).__name__
    assert list(out.as_numpy_iterator()) == list(ds.as_numpy_iterator())
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 3
    mine = tf.data.Dataset.range(10).prefetch(1).with_options(opts)
    kept = sched.filter_dataset(mine)
    assert kept.options().threading.private_threadpool_size == 3
    assert sched.keras["datasets"][-1] == {"input": "outside fit", "private_threadpool_size": "the script's own",
                                           "prefetch": "the dataset's own"}
    assert sched.filter_dataset([1, 2]) == [1, 2]  # not a dataset: untouched
    assert "fit_inputs_not_datasets" not in sched.keras   # ...and not counted as fit's input unless fit gave it
    assert sched.filter_dataset([1, 2], origin="fit") == [1, 2] and sched.keras["fit_inputs_not_datasets"] == 1
    assert sched.filter_dataset(ds, origin="fit") is not ds and sched.keras["datasets"][-1]["input"] == "fit"


def test_tuning_cost_counts_every_trial_step_against_the_chosen_median():
    """The cost is every step run under a trial (unmeasured block starts and drained steps too) over the
    chosen configuration's median, stated for a 1000-step job; never negative."""
    from rtkit.scheduler.tuner import JOB_STEPS, Tuner

    t = Tuner([2, 1, 4], [1, 2], 60, stage_options=(False, True), block_steps=4, drain_steps=2)
    times = {(2, 1, False): 30.0, (1, 1, False): 40.0, (2, 1, True): 20.0, (2, 2, True): 25.0}
    seen = []
    while not t.done:
        ms = times[t.current()]
        seen.append(ms)
        t.record(ms)
    rep = t.report()
    assert t.chosen == (2, 1, True) and rep["chosen_step_ms_median"] == 20.0
    extra = sum(seen) - len(seen) * 20.0
    assert rep["trial_steps_ms"] == pytest.approx(sum(seen))
    assert rep["overhead_vs_chosen_ms"] == pytest.approx(extra)
    assert rep["cost_pct_of_1000_step_job"] == pytest.approx(100.0 * extra / (JOB_STEPS * 20.0), abs=1e-3)
    # trials no slower than the chosen configuration cost nothing (not a negative cost)
    flat = Tuner([2, 1], [1], 20, block_steps=2)
    while not flat.done:
        flat.record(10.0)
    assert flat.report()["overhead_vs_chosen_ms"] == 0.0 and flat.report()["cost_pct_of_1000_step_job"] == 0.0


def test_a_staged_step_counts_its_wait_for_the_batch(tmp_path):
    """The scheduler's work before a run (here: waiting for a put slower than the step) is reported to the hooks'
    step timing through before_run, once per staged-mode run, and is part of the step times the tuner sees."""
    import time as _time

    def slow(x):
        _time.sleep(0.03)  # a put slower than the step: every staged step waits for its batch
        return x

    calls = []
    path = write_data(str(tmp_path / "data.csv"), 32 * 12)
    m = Model(path, probe=slow)
    def before_run(ms):  # as rtkit.hooks.install passes it: told to the step timing, kept here to compare
        calls.append(ms)
        session_hooks.before_run(ms)

    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path), before_run=before_run)
    h = Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    losses = []
    try:
        while True:
            losses.append(float(h.run([m.train, m.loss])[1]))
    except tf.errors.OutOfRangeError:
        pass
    h.close()
    rep = sched.report()
    assert len(losses) == 12 and rep["pipeline"]["staged_steps"] == 12
    assert len(calls) == 12, calls  # one per staged run; the run that raised the end of data reported nothing
    waits = [o[2] for o in rep["pipeline"]["overlap_samples"]]
    assert len(waits) == 12
    for told, waited in zip(calls, waits):
        assert told >= waited  # the wait is inside what the hooks were told
    assert sum(waits) > 30 * 6  # the put (30 ms sleep) was slower than the step: steps waited
    # the step times the scheduler keeps (the tuner's and the report's) include the wait
    import statistics
    assert statistics.median(sched.step_ms) >= 20, sched.step_ms  # (a step after a slow traced one finds one ready)


def _count_tf_calls(monkeypatch):
    """TF calls (Session.run's and callables') made on this thread, rtkit's own included."""
    from tensorflow.python.client import pywrap_tf_session as pywrap

    me, calls = threading.get_ident(), [0]
    for name in ("TF_SessionRun_wrapper", "TF_SessionRunCallable"):
        orig = getattr(pywrap, name)

        def wrapped(*a, _orig=orig, **k):
            if threading.get_ident() == me:
                calls[0] += 1
            return _orig(*a, **k)

        monkeypatch.setattr(pywrap, name, wrapped)
    return calls


@pytest.mark.parametrize("stage_on", [False, True])
def test_a_step_is_one_tf_call_with_staging_off_or_on(tmp_path, monkeypatch, stage_on):
    """With staging off on a staged graph (what the tuner leaves when it keeps the script's configuration)
    a step is the script's own run, one TF call and no put; staged, it is one call too (the put runs on the runner),
    but for the probe steps, which run the put alone and then the staged compute: two calls, the unstaged step's
    two parts."""
    (tmp_path / "a").mkdir()
    base, _, _, h0 = train(tmp_path / "a", stage=False)
    h0.close()
    m = Model(write_data(str(tmp_path / "data.csv"), 320))
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    sched.active["stage"] = stage_on  # the tuner's choice
    h = Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    calls = _count_tf_calls(monkeypatch)
    losses, per_step = [], []
    try:
        while True:
            before = calls[0]
            losses.append(float(h.run([m.train, m.loss])[1]))
            per_step.append(calls[0] - before)
    except tf.errors.OutOfRangeError:
        pass
    h.close()
    assert losses == base
    p = sched.report()["pipeline"]
    probes = p["probe_steps"] if stage_on else 0
    assert sorted(per_step) == [1] * (10 - probes) + [2] * probes, (per_step, probes)
    assert p["staged"] and (p["staged_steps"], p["unstaged_steps"]) == ((10, 0) if stage_on else (0, 10)), p
    if not stage_on:
        assert p["pipelines_started"] == 0 and not sched._states[h.sess].callables
        assert "staging off: the script's own graph ran (10 steps), 0 extra runs per step" in sched.state_line()


def test_make_callable_with_a_feed_list_is_staged(tmp_path, monkeypatch):
    """A callable with feeds: the staged step feeds them to the staged callable (x * 1.0 keeps the losses exact)."""
    (tmp_path / "a").mkdir()
    base, _, _, h0 = train(tmp_path / "a", stage=False)
    h0.close()
    m = Model(write_data(str(tmp_path / "data.csv"), 320), scaled=True)
    sched = Scheduler(tf, settings(sched_stage=True), str(tmp_path))
    h = Hooked(sched, m.graph)
    h.run(m.init)
    h.run(m.iterator.initializer)
    step = h.make_callable([m.train, m.loss], feed_list=[m.scale])
    calls = _count_tf_calls(monkeypatch)
    losses, per_step = [], []
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            before = calls[0]
            losses.append(float(step(np.float32(1.0))[1]))
            per_step.append(calls[0] - before)
    h.close()
    assert losses == base and per_step == [1] * 10
    assert sched.report()["pipeline"]["staged_steps"] == 10
    (key, _), = h1_callables(sched, h)
    assert key[2] == ("scale:0",) and key[3]  # fed, and connected to the get
    assert not rtkit_threads()


def test_the_step_is_the_step_owners_not_the_first_run_to_recur(tmp_path):
    """The hooks' step owner alone decides what a step is: a run repeated 3 times before training (the initialiser,
    run again by a script) does not become the scheduler's step because it recurred first; the train op's run, which
    recurs most, is the step for both, and the scheduler's step figures are its steps."""
    path = write_data(str(tmp_path / "data.csv"), 32 * 10)
    m = Model(path)
    sched = Scheduler(tf, settings(), str(tmp_path))
    h = Hooked(sched, m.graph)
    for _ in range(3):
        h.run(m.init)
    h.run(m.iterator.initializer)
    for _ in range(10):
        h.run([m.train, m.loss])
    h.close()
    source, step = h.steps.chosen()
    assert source == "session" and "Adagrad" in step.name and step.count == 10
    assert sched.step_signature == step.name
    # the owner named the train run the step at its 4th run (it then recurred more than the initialiser's 3)
    assert sched.report()["steps_seen"] == 7
