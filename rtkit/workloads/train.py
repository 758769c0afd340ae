# train.py -- training loops of the bundled workloads: tf.compat.v1 Session, MonitoredTrainingSession, Keras fit, TF2 loop.
"""Runs one workload and returns its figures.

Every training step of the graph APIs is exactly one ``run`` of the same fetch list ``[train_op,
loss]``; variable, table and iterator initialisation run before the first step, so the training step
is the run signature that recurs. Nothing here knows about rtkit's hooks: rtkit must find the steps
from outside, as it does for a user's script.
"""
import sys
import time

import tensorflow as tf

from rtkit.workloads import data as data_mod
from rtkit.workloads import ev, inputs, models, zipf

APIS = ("session", "monitored", "keras", "tf2")
GRAPH_CAPACITY = 1 << 17    # embedding rows per feature (hash-table workloads)
KERAS_CAPACITY = 1 << 14    # Keras variant: Hashing(num_bins) per feature
TF2_CAPACITY = 1 << 15      # TF2 loop: dense tf.Variable rows per feature (allocated whole, unlike a hash table)


def _session_config(threads_inter, threads_intra, grappler_arithmetic=True):
    """The session's ConfigProto, or None for TF's defaults. grappler_arithmetic=False turns Grappler's arithmetic
    optimizer off: its rewrites that reorder float sums (one AddN of the 26 wide weights and the linear part) need
    the shapes of their inputs, which a staged step's executor does not know (its input-stage tensors are connected,
    i.e. fed), so staged and unstaged steps round differently with it on (docs/scheduler.md, Known limits)."""
    if threads_inter is None and threads_intra is None and grappler_arithmetic:
        return None
    cfg = tf.compat.v1.ConfigProto()
    if threads_inter is not None:
        cfg.inter_op_parallelism_threads = int(threads_inter)
    if threads_intra is not None:
        cfg.intra_op_parallelism_threads = int(threads_intra)
    if not grappler_arithmetic:
        from tensorflow.core.protobuf import rewriter_config_pb2

        cfg.graph_options.rewrite_options.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
    return cfg


def params_digest(names, values):
    """sha256 over every variable's name, dtype, shape and bytes (sorted by name): equal digests mean bit-identical
    parameters, optimizer slots included."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for name, value in sorted(zip(names, values), key=lambda nv: nv[0]):
        arr = np.ascontiguousarray(value)
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class _LossLog:
    """Collects per-step losses; prints `loss <step> <value>` as each step ends when asked to, and writes it as
    the TensorBoard scalar `loss` at its step (1 = the first) into summary_dir when given, as a script's
    FileWriter does (outside the step's fetches: the step stays one run of the same signature)."""

    SUMMARY_FLUSH_S = 10

    def __init__(self, print_losses, summary_dir=None):
        self.losses, self.step_s, self.print_losses = [], [], print_losses
        self.t_last = None
        self.summary_dir, self.writer = summary_dir, None

    def start(self):
        if self.summary_dir and self.writer is None:   # in the graph's context: FileWriter refuses eager mode
            self.writer = tf.compat.v1.summary.FileWriter(self.summary_dir, flush_secs=self.SUMMARY_FLUSH_S)
        self.t0 = self.t_last = time.perf_counter()

    def close(self):
        if self.writer is not None:
            self.writer.close()

    def add(self, value):
        now = time.perf_counter()
        self.step_s.append(now - self.t_last)
        self.t_last = now
        self.losses.append(float(value))
        if self.writer is not None:
            summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="loss", simple_value=float(value))])
            self.writer.add_summary(summary, len(self.losses))
        if self.print_losses:
            sys.stdout.write(f"loss {len(self.losses)} {float(value)!r}\n")
            sys.stdout.flush()

    def elapsed(self):
        return (self.t_last or self.t0) - self.t0


def _graph_train(model, api, path, steps, batch, epochs, seed, emb_dim, capacity, learning_rate,
                 config, log, input_mode="prefetch", latency_ms=0.0, zipf_ids=None, compact=None, print_params=False):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        if zipf_ids is not None:   # (distinct, exponent): generated in the input graph, no file
            ds = zipf.make_dataset(batch, seed, *zipf_ids)
        elif input_mode == "legacy":
            ds = inputs.make_legacy_dataset(path, batch, epochs, latency_ms)
        else:
            ds = inputs.make_dataset(path, batch, epochs)
        if api == "session":
            iterator = tf.compat.v1.data.make_initializable_iterator(ds)
        else:
            iterator = tf.compat.v1.data.make_one_shot_iterator(ds)
        batch_t = iterator.get_next()
        if input_mode == "legacy":  # decode and hash in the training graph, after get_next
            batch_t = inputs.parse(batch_t)
        logits = models.build_graph_model(model, batch_t, emb_dim=emb_dim, capacity=capacity, seed=seed)
        per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=batch_t["label"], logits=logits)
        # Mean in float64, then back to float32: the result no longer depends on how the reduction
        # is split over threads, so the reported loss is the same whatever pools rtkit configures
        # (a float32 mean differed in the last bit under rtkit's stage scheduler).
        loss = tf.cast(tf.reduce_mean(tf.cast(per_example, tf.float64)), tf.float32)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = ev.AdagradOptimizer(learning_rate)   # uses the tables' lazily filled accumulators
        train_op = opt.minimize(loss, global_step=global_step)
        fetches = [train_op, loss]
        compactor = ev.Compactor(opt, **compact) if compact else None
        layout = ev.RowLayout(graph)
        # read ops built with the graph, outside the step's fetches: the step's graph is the same with or without them
        params = [(v.op.name, v.read_value()) for v in tf.compat.v1.global_variables()] if print_params else None
        if compactor is not None:   # the access counts are part of the step (so the step is one run)
            fetches = [tf.group(train_op, compactor.count_op), loss]

        if api == "session":
            with tf.compat.v1.Session(graph=graph, config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(tf.compat.v1.tables_initializer())
                sess.run(iterator.initializer)
                log.start()
                for _ in range(steps):
                    try:
                        _, value = sess.run(fetches)
                    except tf.errors.OutOfRangeError:
                        break
                    log.add(value)
                    if compactor is not None:
                        compactor.after_step(sess, len(log.losses))
                if compactor is not None:
                    compactor.report(sess)
                layout.write(sess)
                layout.report_promotion(sess)
                if params is not None:   # after the last step: one run of rtkit-free reads, not a step
                    digest = params_digest([n for n, _ in params], sess.run([t for _, t in params]))
                    sys.stdout.write(f"params {digest}\n")
                    sys.stdout.flush()
        else:
            # No hooks, summaries, checkpoints or step-count logging: nothing adds fetches to the step.
            with tf.compat.v1.train.MonitoredTrainingSession(
                    config=config, checkpoint_dir=None, save_checkpoint_secs=None,
                    save_checkpoint_steps=None, save_summaries_steps=None, save_summaries_secs=None,
                    log_step_count_steps=None) as sess:
                log.start()   # after the session's own set-up runs
                while len(log.losses) < steps and not sess.should_stop():
                    _, value = sess.run(fetches)   # OutOfRangeError ends the `with` quietly
                    log.add(value)
                    if compactor is not None:
                        compactor.after_step(sess, len(log.losses))
                if compactor is not None:
                    compactor.report(sess)
                layout.write(sess)
                layout.report_promotion(sess)


def _eager_threads(threads_inter, threads_intra, api):
    try:
        if threads_inter is not None:
            tf.config.threading.set_inter_op_parallelism_threads(int(threads_inter))
        if threads_intra is not None:
            tf.config.threading.set_intra_op_parallelism_threads(int(threads_intra))
    except RuntimeError as exc:   # the eager runtime was already started in this process
        sys.stderr.write(f"rtkit.workloads: thread settings ignored for {api}: {exc}\n")


def _tf2_train(model, path, steps, batch, epochs, seed, emb_dim, capacity, learning_rate,
               threads_inter, threads_intra, log, input_mode="prefetch", latency_ms=0.0):
    from rtkit.workloads import tf2

    _eager_threads(threads_inter, threads_intra, "tf2")
    ds = inputs.keras_dataset(path, batch, epochs, input_mode, latency_ms)
    tf2.train(model, ds, steps, emb_dim, capacity, seed, learning_rate, log)


def _keras_train(model, path, steps, batch, epochs, seed, emb_dim, capacity, learning_rate,
                 threads_inter, threads_intra, log, input_mode="prefetch", latency_ms=0.0):
    import keras

    _eager_threads(threads_inter, threads_intra, "keras")
    keras.utils.set_random_seed(seed)
    net = models.build_keras_model(model, emb_dim=emb_dim, capacity=capacity, seed=seed)
    net.compile(optimizer=keras.optimizers.Adagrad(learning_rate),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=False)

    class Losses(keras.callbacks.Callback):
        # Keras reports the epoch's running mean; undo the mean to get each batch's own loss
        # (exact while batches are equal-sized, i.e. all but a short final batch).
        def on_train_begin(self, logs=None):
            self.prev_mean = 0.0
            log.start()

        def on_train_batch_end(self, batch_index, logs=None):
            mean = float(logs["loss"])
            k = batch_index + 1
            log.add(k * mean - (k - 1) * self.prev_mean)
            self.prev_mean = mean

    ds = inputs.keras_dataset(path, batch, epochs, input_mode, latency_ms)
    net.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False, callbacks=[Losses()])


def run(model="wdl", api="session", steps=200, batch=2048, rows=200_000, data_dir=None, seed=0,
        emb_dim=16, capacity=None, epochs=None, learning_rate=0.05, threads_inter=None,
        threads_intra=None, print_losses=False, progress=True, input_mode="prefetch", input_latency_ms=0.0,
        zipf_ids=None, compact=None, summary_dir=None, grappler_arithmetic=True, print_params=False):
    """Train `model` with `api` for up to `steps` steps; returns a dict of figures (see keys below).

    epochs=None repeats the data forever; with a number the run may end early (OutOfRange), and
    `steps` in the result is the number of steps that actually ran. capacity=None: 131072 rows
    per feature for the graph APIs, 32768 for tf2 (dense tables), 16384 for Keras (whose Adagrad does work
    proportional to the table size each step). input_mode: "prefetch" (parsing in Dataset.map, prefetch) or "legacy" (CSV
    lines parsed in the graph after get_next, no prefetch, input_latency_ms per batch). zipf_ids=(distinct,
    exponent): batches generated in the input graph (rtkit.workloads.zipf), no file; graph APIs only.
    compact: ev.Compactor's arguments (hot-row compaction at step boundaries), graph APIs only. summary_dir: each
    step's loss as a TensorBoard scalar there (graph APIs). grappler_arithmetic=False: Grappler's arithmetic optimizer
    off in the session (graph APIs). print_params: print `params <sha256>` of every variable after the last step
    (session API)."""
    if model not in models.MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {', '.join(models.MODELS)}")
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; expected one of {', '.join(APIS)}")
    if input_mode not in inputs.INPUTS:
        raise ValueError(f"unknown input mode {input_mode!r}; expected one of {', '.join(inputs.INPUTS)}")
    if capacity is None:
        capacity = {"keras": KERAS_CAPACITY, "tf2": TF2_CAPACITY}.get(api, GRAPH_CAPACITY)
    if (zipf_ids is not None or compact) and api in ("keras", "tf2"):
        raise ValueError("zipf ids and compaction need a graph API (session, monitored)")
    path = None if zipf_ids is not None else data_mod.ensure_dataset(data_dir, rows, seed, progress=progress)
    if summary_dir and api in ("keras", "tf2"):
        raise ValueError("a summary folder needs a graph API (session, monitored)")
    if not grappler_arithmetic and api in ("keras", "tf2"):
        raise ValueError("the Grappler setting needs a graph API (session, monitored)")
    if print_params and api != "session":
        raise ValueError("the parameters' digest needs the session API")
    log = _LossLog(print_losses, summary_dir)
    t_start = time.perf_counter()
    if api == "keras":
        _keras_train(model, path, steps, batch, epochs, seed, emb_dim, capacity, learning_rate,
                     threads_inter, threads_intra, log, input_mode, input_latency_ms)
    elif api == "tf2":
        _tf2_train(model, path, steps, batch, epochs, seed, emb_dim, capacity, learning_rate,
                   threads_inter, threads_intra, log, input_mode, input_latency_ms)
    else:
        _graph_train(model, api, path, steps, batch, epochs, seed, emb_dim, capacity, learning_rate,
                     _session_config(threads_inter, threads_intra, grappler_arithmetic), log, input_mode,
                     input_latency_ms, zipf_ids, compact, print_params)
    log.close()
    n = len(log.losses)
    examples = n * batch if epochs is None or zipf_ids is not None else min(n * batch, rows * epochs)
    elapsed = log.elapsed()
    return {
        "model": model, "api": api, "steps": n, "batch": batch, "rows": rows, "seed": seed,
        "capacity": capacity, "emb_dim": emb_dim, "input": input_mode,
        "data_path": path, "losses": log.losses, "step_s": log.step_s,
        "loss_first": log.losses[0] if n else float("nan"),
        "loss_last": log.losses[-1] if n else float("nan"),
        "examples": examples, "train_s": elapsed, "total_s": time.perf_counter() - t_start,
        "examples_per_s": examples / elapsed if elapsed > 0 else 0.0,
        "wall_step_ms_median": _wall_step_ms_median(log.step_s),
    }


WALL_WARMUP_STEPS = 3   # as the report's step figures: the first steps (graph optimisation, caches) are left out


def _wall_step_ms_median(step_s):
    """Median time between the ends of consecutive steps, as the script sees it (everything between them: a
    wait for input, rtkit's own work), after the warm-up steps; a figure rtkit's hooks do not produce."""
    tail = sorted(step_s[WALL_WARMUP_STEPS:] or step_s)
    if not tail:
        return float("nan")
    mid = len(tail) // 2
    return 1000.0 * (tail[mid] if len(tail) % 2 else (tail[mid - 1] + tail[mid]) / 2.0)


def summary_line(result):
    """The one line the CLI prints when a run ends."""
    return (f"rtkit-workload: model={result['model']} api={result['api']} steps={result['steps']} "
            f"loss_first={result['loss_first']:.6f} loss_last={result['loss_last']:.6f} "
            f"examples_per_s={result['examples_per_s']:.1f} wall_step_ms_median={result['wall_step_ms_median']:.2f}")
