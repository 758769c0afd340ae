# distributed.py -- the bundled workloads on TF's gRPC parameter-server runtime (between-graph replication, async).
"""One task of a parameter-server cluster, as a TF 1.x-style distributed script would run it.

- ``ps`` tasks start a ``tf.distribute.Server`` and block in ``join()`` (TF gives them no way to end:
  the launcher stops them once the workers are done).
- ``chief``/``worker`` tasks build the whole graph under ``replica_device_setter``: the variables,
  the ``MutableHashTable`` id->row maps and their row counters land on the parameter servers (round
  robin), the input pipeline and the dense maths stay on the worker. Each worker applies its own
  Adagrad updates (asynchronous; no SyncReplicasOptimizer).
- Data: every training task reads the same seeded file, sharded by line (``shard(n, rank)``), so the
  same seed gives every worker the same part on every run.
- The chief (the ``chief`` task, else worker 0) initialises the variables and writes checkpoints when
  a checkpoint folder is given; a restarted chief resumes from the last one.
- ``device_filters`` limit each worker's session to the PS tasks and itself: without them a
  non-chief worker's session waits for every other worker to be up, forever if one has finished.
"""
import sys
import time

import tensorflow as tf

from rtkit.workloads import data as data_mod
from rtkit.workloads import ev, inputs, models
from rtkit.workloads.train import GRAPH_CAPACITY, _LossLog


def _worker_rank(task):
    """0 for the chief task, then the workers; the rank is also the data shard."""
    chiefs = len(task.cluster.get("chief", []))
    return task.index if task.role == "chief" else chiefs + task.index


def _training_tasks(task):
    return len(task.cluster.get("chief", [])) + len(task.cluster.get("worker", []))


class _PromptWorkerSession(tf.compat.v1.train.WorkerSessionCreator):
    """A non-chief worker polls for the chief's initialisation every second instead of TF's fixed 30 s
    (SessionManager's recovery_wait_secs, which MonitoredTrainingSession does not expose)."""

    def _get_session_manager(self):
        manager = super()._get_session_manager()
        manager._recovery_wait_secs = 1
        return manager


def _server_config(threads_inter, threads_intra, device_filters=None):
    cfg = tf.compat.v1.ConfigProto()
    if threads_inter is not None:
        cfg.inter_op_parallelism_threads = int(threads_inter)
    if threads_intra is not None:
        cfg.intra_op_parallelism_threads = int(threads_intra)
    for f in device_filters or ():
        cfg.device_filters.append(f)
    return cfg


def serve_ps(task, threads_inter=None, threads_intra=None):
    server = tf.distribute.Server(tf.train.ClusterSpec(task.cluster), job_name=task.role, task_index=task.index,
                                  config=_server_config(threads_inter, threads_intra))
    sys.stdout.write(f"rtkit-workload: ps {task.index} serving at {task.address}\n")
    sys.stdout.flush()
    server.join()


def run(task, model="wdl", steps=200, batch=2048, rows=200_000, data_dir=None, seed=0, emb_dim=16,
        capacity=None, learning_rate=0.05, threads_inter=None, threads_intra=None, print_losses=False,
        checkpoint_dir=None, checkpoint_secs=600, checkpoint_steps=None, progress=True):
    """Run `task` (an rtkit.cluster.spec.Task); a ps task never returns. Returns train.run's dict."""
    if task.role == "ps":
        serve_ps(task, threads_inter, threads_intra)
        return None
    if task.role == "evaluator":
        raise ValueError("the bundled workloads have no evaluator task")
    capacity = capacity or GRAPH_CAPACITY
    path = data_mod.ensure_dataset(data_dir, rows, seed, progress=progress)
    me = f"/job:{task.role}/task:{task.index}"
    config = _server_config(threads_inter, threads_intra, ["/job:ps", me])
    spec = tf.train.ClusterSpec(task.cluster)
    server = tf.distribute.Server(spec, job_name=task.role, task_index=task.index, config=config)
    log = _LossLog(print_losses)
    t_start = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(worker_device=me, cluster=spec)):
            ds = inputs.make_dataset(path, batch, shard=(_training_tasks(task), _worker_rank(task)))
            batch_t = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
            logits = models.build_graph_model(model, batch_t, emb_dim=emb_dim, capacity=capacity, seed=seed)
            per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=batch_t["label"], logits=logits)
            loss = tf.cast(tf.reduce_mean(tf.cast(per_example, tf.float64)), tf.float32)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train_op = ev.AdagradOptimizer(learning_rate).minimize(loss, global_step=global_step)
        fetches = [train_op, loss]
        if task.is_chief:
            sess = tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=True, config=config, checkpoint_dir=checkpoint_dir,
                # by time unless steps are asked for; the hook always saves once more when the session ends
                save_checkpoint_secs=checkpoint_secs if checkpoint_dir and not checkpoint_steps else None,
                save_checkpoint_steps=checkpoint_steps if checkpoint_dir else None,
                save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None)
        else:
            sess = tf.compat.v1.train.MonitoredSession(
                session_creator=_PromptWorkerSession(master=server.target, config=config))
        with sess:
            log.start()
            # the loop's own CPU (all threads of this process) and wall window: the cluster bench's CPU per step
            cpu0, start_unix = time.process_time(), time.time()
            while len(log.losses) < steps and not sess.should_stop():
                _, value = sess.run(fetches)
                log.add(value)
            train_cpu_s, end_unix = time.process_time() - cpu0, time.time()
            final_step = None
            try:
                final_step = int(sess.run(global_step)) if not sess.should_stop() else None
            except Exception:   # the session may already be closing; the global step is a nicety
                pass
    n = len(log.losses)
    elapsed = log.elapsed()
    return {
        "model": model, "api": "monitored", "role": task.role, "index": task.index, "steps": n, "batch": batch,
        "rows": rows, "seed": seed, "capacity": capacity, "emb_dim": emb_dim, "data_path": path,
        "losses": log.losses, "step_s": log.step_s, "global_step": final_step,
        "loss_first": log.losses[0] if n else float("nan"), "loss_last": log.losses[-1] if n else float("nan"),
        "examples": n * batch, "train_s": elapsed, "total_s": time.perf_counter() - t_start,
        "examples_per_s": n * batch / elapsed if elapsed > 0 else 0.0,
        "train_cpu_s": train_cpu_s, "train_start_unix": start_unix, "train_end_unix": end_unix,
    }


def summary_line(result):
    return (f"rtkit-workload: model={result['model']} role={result['role']} index={result['index']} "
            f"steps={result['steps']} global_step={result['global_step']} "
            f"loss_first={result['loss_first']:.6f} loss_last={result['loss_last']:.6f} "
            f"examples_per_s={result['examples_per_s']:.1f} train_cpu_s={result['train_cpu_s']:.3f} "
            f"train_start_unix={result['train_start_unix']:.3f} train_end_unix={result['train_end_unix']:.3f}")
