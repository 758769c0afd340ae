# pss.py -- Wide&Deep and DLRM as a TF2 ParameterServerStrategy job: workers and PS serve, the chief coordinates.
"""Ordinary TF2 parameter-server training, as TensorFlow's "Parameter server training" tutorial writes it;
it never imports rtkit (rtkit must find its steps from outside, as for a user's script):

- ``ps`` and ``worker`` tasks start a ``tf.distribute.Server`` and block in ``join()``;
- the ``chief`` builds ``ParameterServerStrategy`` + ``ClusterCoordinator``; variables live on the
  parameter servers (embedding tables split across them by ``MinSizePartitioner``), each worker reads its
  own shard of the data set (``create_per_worker_dataset``), and every step is one
  ``coordinator.schedule(train_step)`` of a ``tf.function`` holding a ``GradientTape`` and Adagrad.

The embeddings are hashed rows of plain ``tf.Variable`` tables (id mod capacity per feature), as the Keras
variant of the bundled models, since ``MutableHashTable`` lookups have no place in a PS-strategy step.
"""
import math
import sys
import time

import tensorflow as tf

from rtkit.workloads import data as data_mod
from rtkit.workloads import inputs
from rtkit.workloads.data import NUM_CAT, NUM_INT
from rtkit.workloads.models import DLRM_BOTTOM, DLRM_TOP, MODELS, WDL_DNN

DEFAULT_CAPACITY = 1 << 14   # rows per feature: ids are hashed into them (the Keras variant's default is larger)
SHARD_BYTES = 4 << 20   # a table larger than this is split across the parameter servers


class _Model(tf.Module):
    """The same shapes as models.build_graph_model; every variable is created here, under the strategy's scope."""

    def __init__(self, name, emb_dim, capacity, seed):
        super().__init__(name=f"{name}_pss")
        self.kind, self.capacity = name, capacity

        def table(dim, std, s):
            init = tf.keras.initializers.TruncatedNormal(stddev=std, seed=seed + s)
            return tf.Variable(init([NUM_CAT * capacity, dim]), name=f"embedding_{dim}")

        def dense(fan_in, units, s, std=None):
            init = (tf.keras.initializers.GlorotUniform(seed=seed + s) if std is None
                    else tf.keras.initializers.TruncatedNormal(stddev=std, seed=seed + s))
            return (tf.Variable(init([fan_in, units]), name=f"kernel_{s}"),
                    tf.Variable(tf.zeros([units]), name=f"bias_{s}"))

        self.deep = table(emb_dim, 0.05, 1000)
        if name == "wdl":
            self.wide = table(1, 0.01, 2000)
            self.linear = dense(NUM_INT, 1, 1, 0.01)
            sizes = [NUM_CAT * emb_dim + NUM_INT, *WDL_DNN]
            self.mlp = [dense(a, b, 10 + i) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
            self.out = dense(WDL_DNN[-1], 1, 20, 0.01)
        elif name == "dlrm":
            sizes = [NUM_INT, *DLRM_BOTTOM]
            self.bottom = [dense(a, b, 10 + i) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
            self.bottom_out = dense(DLRM_BOTTOM[-1], emb_dim, 15)
            n = 1 + NUM_CAT
            self.flat_idx = tf.constant([i * n + j for i in range(n) for j in range(i)], dtype=tf.int32)
            sizes = [emb_dim + n * (n - 1) // 2, *DLRM_TOP]
            self.top = [dense(a, b, 20 + i) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
            self.out = dense(DLRM_TOP[-1], 1, 30, 0.01)
        else:
            raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")

    @staticmethod
    def _apply(layers, x, last_linear=False):
        for i, (w, b) in enumerate(layers):
            x = tf.matmul(x, w) + b
            if not (last_linear and i == len(layers) - 1):
                x = tf.nn.relu(x)
        return x

    def __call__(self, batch):
        rows = batch["cat"] % self.capacity + tf.range(NUM_CAT, dtype=tf.int64) * self.capacity   # [B, 26]
        deep = tf.nn.embedding_lookup(self.deep, rows)   # [B, 26, d]; a table split over the PS tasks too
        dense = batch["dense"]
        if self.kind == "wdl":
            wide = tf.reduce_sum(tf.nn.embedding_lookup(self.wide, rows), axis=1) + self._apply([self.linear], dense, True)
            flat = tf.reshape(deep, [-1, deep.shape[1] * deep.shape[2]])
            h = self._apply(self.mlp, tf.concat([flat, dense], axis=1))
            return wide + self._apply([self.out], h, True)
        bottom = self._apply(self.bottom + [self.bottom_out], dense)
        t = tf.concat([bottom[:, None, :], deep], axis=1)
        n = t.shape[1]
        z = tf.reshape(tf.matmul(t, t, transpose_b=True), [-1, n * n])
        h = self._apply(self.top, tf.concat([bottom, tf.gather(z, self.flat_idx, axis=1)], axis=1))
        return self._apply([self.out], h, True)


def serve(resolver):
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    sys.stdout.write(f"rtkit-workload: {resolver.task_type} {resolver.task_id} serving\n")
    sys.stdout.flush()
    server.join()


def coordinate(resolver, model="wdl", steps=200, batch=2048, rows=200_000, data_dir=None, seed=0, emb_dim=16,
               capacity=DEFAULT_CAPACITY, learning_rate=0.05, steps_per_join=50, print_losses=False, progress=True):
    path = data_mod.ensure_dataset(data_dir, rows, seed, progress=progress)
    ps_count = len(resolver.cluster_spec().as_dict().get("ps", []))
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=SHARD_BYTES, max_shards=max(1, ps_count))
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        net = _Model(model, emb_dim, capacity, seed)
        opt = tf.keras.optimizers.Adagrad(learning_rate)
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))

    def dataset_fn(context):
        shard = (context.num_input_pipelines, context.input_pipeline_id) if context else None
        return inputs.make_dataset(path, batch, shard=shard)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    it = iter(per_worker)

    @tf.function
    def train_step(iterator):
        def replica_fn(b):
            with tf.GradientTape() as tape:
                logits = net(b)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=b["label"], logits=logits))
            variables = net.trainable_variables
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        return strategy.run(replica_fn, args=(next(iterator),))

    losses, t0, cpu0 = [], time.perf_counter(), time.process_time()
    done = 0
    while done < steps:
        chunk = min(steps_per_join, steps - done)
        values = [coordinator.schedule(train_step, args=(it,)) for _ in range(chunk)]
        coordinator.join()
        for i, v in enumerate(values):
            loss = float(v.fetch())
            losses.append(loss)
            if print_losses:
                sys.stdout.write(f"loss {done + i + 1} {loss:.6f}\n")
        done += chunk
    seconds = time.perf_counter() - t0
    first, last = losses[0], losses[-1]
    if not (math.isfinite(first) and math.isfinite(last)):
        raise FloatingPointError(f"loss is not finite: first {first}, last {last}")
    return {"model": model, "role": "chief", "steps": done, "workers": workers, "loss_first": first,
            "loss_last": last, "examples_per_s": done * batch / seconds, "train_cpu_s": time.process_time() - cpu0}


def run(model="wdl", **kwargs):
    """A task of the job, from TF_CONFIG: ps and worker tasks never return; the chief returns its summary."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        serve(resolver)
        return None
    if resolver.task_type != "chief":
        raise ValueError(f"a ParameterServerStrategy job has ps, worker and chief tasks, not {resolver.task_type!r}")
    return coordinate(resolver, model=model, **kwargs)


def summary_line(result):
    return (f"rtkit-workload: model={result['model']} api=pss role=chief workers={result['workers']} "
            f"steps={result['steps']} loss_first={result['loss_first']:.6f} loss_last={result['loss_last']:.6f} "
            f"examples_per_s={result['examples_per_s']:.1f} train_cpu_s={result['train_cpu_s']:.3f}")
