# tf2.py -- the workloads as TensorFlow 2 teaches custom training: one @tf.function step with GradientTape, called per batch.
"""Wide&Deep and DLRM with the graph builders' shapes (models.py), written as eager TF2 code: tf.Variable
embedding tables (one row block per categorical feature, ids mapped into it by modulo), tf.gather lookups,
dense layers as variables, and Adagrad applied by TensorFlow's own kernels (sparse rows for the tables:
only the rows a batch touched are updated, as an EmbeddingVariable's optimizer does). The Python loop
iterates a prefetching tf.data pipeline and calls ``train_step`` once per batch; nothing here knows rtkit.
"""
import tensorflow as tf

from rtkit.workloads.data import NUM_CAT, NUM_INT
from rtkit.workloads.models import DLRM_BOTTOM, DLRM_TOP, WDL_DNN


class _Dense:
    def __init__(self, fan_in, units, seed, stddev=None, activation=tf.nn.relu):
        if stddev is None:   # glorot uniform
            limit = (6.0 / (fan_in + units)) ** 0.5
            w = tf.random.stateless_uniform([fan_in, units], [seed, 1], -limit, limit)
        else:
            w = tf.random.stateless_truncated_normal([fan_in, units], [seed, 2], stddev=stddev)
        self.w, self.b = tf.Variable(w), tf.Variable(tf.zeros([units]))
        self.activation = activation

    def __call__(self, x):
        y = tf.matmul(x, self.w) + self.b
        return self.activation(y) if self.activation is not None else y

    def variables(self):
        return [self.w, self.b]


def _mlp(fan_in, units, seed):
    layers = []
    for i, u in enumerate(units):
        layers.append(_Dense(fan_in, u, seed + i))
        fan_in = u
    return layers


class Model:
    """Logits [B, 1] of `name` for a batch {'dense': [B,13], 'cat': [B,26] int64}; tables [26*capacity, dim]."""

    def __init__(self, name, emb_dim, capacity, seed):
        self.name, self.capacity = name, capacity
        self.offsets = tf.range(NUM_CAT, dtype=tf.int64) * capacity
        rows = NUM_CAT * capacity
        self.deep = tf.Variable(tf.random.stateless_truncated_normal([rows, emb_dim], [seed, 1000], stddev=0.05))
        self.tables = [self.deep]
        if name == "wdl":
            self.wide = tf.Variable(tf.random.stateless_truncated_normal([rows, 1], [seed, 2000], stddev=0.01))
            self.tables.append(self.wide)
            self.linear = _Dense(NUM_INT, 1, seed + 1, stddev=0.01, activation=None)
            self.dnn = _mlp(NUM_CAT * emb_dim + NUM_INT, WDL_DNN, seed + 10)
            self.head = _Dense(WDL_DNN[-1], 1, seed + 20, stddev=0.01, activation=None)
            self.layers = [self.linear] + self.dnn + [self.head]
        elif name == "dlrm":
            self.bottom = _mlp(NUM_INT, DLRM_BOTTOM, seed + 10) + [_Dense(DLRM_BOTTOM[-1], emb_dim, seed + 15)]
            n = 1 + NUM_CAT
            self.pairs = tf.constant([i * n + j for i in range(n) for j in range(i)], dtype=tf.int32)
            self.top = _mlp(emb_dim + n * (n - 1) // 2, DLRM_TOP, seed + 20)
            self.head = _Dense(DLRM_TOP[-1], 1, seed + 30, stddev=0.01, activation=None)
            self.layers = self.bottom + self.top + [self.head]
        else:
            raise ValueError(f"unknown model {name!r}")
        self.dense_vars = [v for layer in self.layers for v in layer.variables()]

    def rows(self, cat):
        return tf.math.floormod(cat, self.capacity) + self.offsets     # [B, 26]: each feature in its own block

    def logits(self, batch, rows):
        dense = batch["dense"]
        b = tf.shape(rows)[0]
        deep = tf.gather(self.deep, rows)                              # [B, 26, dim]
        if self.name == "wdl":
            wide = tf.reduce_sum(tf.gather(self.wide, rows), axis=1)   # [B, 1]
            h = tf.concat([tf.reshape(deep, [b, -1]), dense], axis=1)
            for layer in self.dnn:
                h = layer(h)
            return wide + self.linear(dense) + self.head(h)
        bottom = dense
        for layer in self.bottom:
            bottom = layer(bottom)
        t = tf.concat([bottom[:, None, :], deep], axis=1)              # [B, 27, dim]
        z = tf.matmul(t, t, transpose_b=True)
        inter = tf.gather(tf.reshape(z, [b, -1]), self.pairs, axis=1)
        h = tf.concat([bottom, inter], axis=1)
        for layer in self.top:
            h = layer(h)
        return self.head(h)


class Adagrad:
    """TensorFlow's Adagrad kernels: dense for the layers, the touched rows only (duplicates summed) for tables."""

    def __init__(self, lr, variables, initial=0.1):
        self.lr = tf.constant(lr, tf.float32)
        self.eps = tf.constant(1e-7, tf.float32)
        self.slots = {v.ref(): tf.Variable(tf.fill(v.shape, initial)) for v in variables}

    def apply(self, var, grad):
        acc = self.slots[var.ref()]
        if isinstance(grad, tf.IndexedSlices):
            ids, pos = tf.unique(grad.indices)
            values = tf.math.unsorted_segment_sum(grad.values, pos, tf.shape(ids)[0])
            tf.raw_ops.ResourceSparseApplyAdagradV2(var=var.handle, accum=acc.handle, lr=self.lr, epsilon=self.eps,
                                                    grad=values, indices=ids, use_locking=False)
        else:
            tf.raw_ops.ResourceApplyAdagradV2(var=var.handle, accum=acc.handle, lr=self.lr, epsilon=self.eps,
                                              grad=grad, use_locking=False)


def train(model_name, dataset, steps, emb_dim, capacity, seed, learning_rate, log):
    """Up to `steps` calls of one @tf.function step over `dataset` ((features, label) batches); losses to log."""
    model = Model(model_name, emb_dim, capacity, seed)
    variables = model.tables + model.dense_vars
    opt = Adagrad(learning_rate, variables)

    @tf.function
    def train_step(features, label):
        rows = model.rows(features["cat"])
        with tf.GradientTape() as tape:
            logits = model.logits(features, rows)
            per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            # mean in float64: the loss does not depend on how the reduction is split over threads
            loss = tf.cast(tf.reduce_mean(tf.cast(per_example, tf.float64)), tf.float32)
        for var, grad in zip(variables, tape.gradient(loss, variables)):
            opt.apply(var, grad)
        return loss

    log.start()
    for features, label in dataset.take(steps):
        log.add(train_step(features, label))
