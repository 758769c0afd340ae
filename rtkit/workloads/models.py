# models.py -- Wide&Deep and DLRM: graph-mode builders (EmbeddingVariable analogue) and Keras variants.
"""Model definitions.

Graph mode (``build_graph_model``): the batch dict from :mod:`rtkit.workloads.inputs` goes through one
:class:`~rtkit.workloads.ev.IdRowMap` per categorical feature and returns the logits; the caller adds
the loss and an :class:`~rtkit.workloads.ev.AdagradOptimizer` (Adagrad using the tables' lazily
filled accumulators).

- ``wdl`` (Wide&Deep): wide = per-feature 1-wide weights (sharing the deep part's id->row maps) plus
  a linear layer on the 13 dense features; deep = concat(26 embeddings, dense) -> MLP 256-128-64 -> 1.
- ``dlrm``: bottom MLP 64-dim on the dense features -> emb_dim; pairwise dot products of the 27 vectors
  (bottom output + 26 embeddings); top MLP 256-128 -> 1 on [bottom output, interactions].

Keras (``build_keras_model``): the same shapes with ``keras.layers.Hashing`` (id mod capacity) and
``keras.layers.Embedding`` in place of the hash-table embeddings.
"""
import tensorflow as tf

from rtkit.workloads.data import NUM_CAT, NUM_INT
from rtkit.workloads.ev import EmbeddingVariable, IdRowMap

MODELS = ("wdl", "dlrm")
WDL_DNN = (256, 128, 64)
DLRM_BOTTOM = (64,)
DLRM_TOP = (256, 128)


def _dense_layer(x, units, name, seed, activation=tf.nn.relu, stddev=None):
    """x @ W + b; glorot-uniform W, or truncated normal with `stddev` (small for output layers, so
    the first loss is near log 2 instead of a few nats)."""
    fan_in = int(x.shape[-1])
    init = (tf.compat.v1.glorot_uniform_initializer(seed=seed) if stddev is None
            else tf.compat.v1.truncated_normal_initializer(stddev=stddev, seed=seed))
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable("kernel", [fan_in, units], use_resource=True, initializer=init)
        b = tf.compat.v1.get_variable("bias", [units], use_resource=True,
                                      initializer=tf.compat.v1.zeros_initializer())
        y = tf.matmul(x, w) + b
        return activation(y) if activation is not None else y


def _mlp(x, units, name, seed):
    for i, u in enumerate(units):
        x = _dense_layer(x, u, f"{name}_{i}", seed + i)
    return x


def _embed(batch, capacity, emb_dim, seed, extra_wide):
    """Per feature: id->row map, embeddings [B, dim] (and [B, 1] wide weights when extra_wide)."""
    cat = batch["cat"]
    batch_shape = tf.shape(cat)[:1]
    deep, wide = [], []
    for f in range(NUM_CAT):
        with tf.compat.v1.variable_scope(f"C{f + 1}"):
            id_map = IdRowMap("ev", capacity, feature=f)
            rows = id_map.rows(cat[:, f])
            deep.append(EmbeddingVariable("embedding", id_map, emb_dim, seed=seed + 1000 + f)
                        .lookup(rows, batch_shape))
            if extra_wide:
                wide.append(EmbeddingVariable("wide_weight", id_map, 1, stddev=0.01, seed=seed + 2000 + f)
                            .lookup(rows, batch_shape))
    return deep, wide


def build_graph_model(name, batch, emb_dim=16, capacity=1 << 17, seed=0):
    """Logits [B, 1] of model `name` for the parsed `batch` (graph mode)."""
    dense = batch["dense"]
    if name == "wdl":
        deep, wide = _embed(batch, capacity, emb_dim, seed, extra_wide=True)
        with tf.compat.v1.variable_scope("wide"):
            wide_logit = tf.add_n(wide) + _dense_layer(dense, 1, "linear", seed + 1, activation=None,
                                                     stddev=0.01)
        with tf.compat.v1.variable_scope("deep"):
            h = _mlp(tf.concat(deep + [dense], axis=1), WDL_DNN, "dnn", seed + 10)
            deep_logit = _dense_layer(h, 1, "logit", seed + 20, activation=None, stddev=0.01)
        return wide_logit + deep_logit
    if name == "dlrm":
        embs, _ = _embed(batch, capacity, emb_dim, seed, extra_wide=False)
        with tf.compat.v1.variable_scope("bottom"):
            bottom = _mlp(dense, DLRM_BOTTOM, "mlp", seed + 10)
            bottom = _dense_layer(bottom, emb_dim, "out", seed + 15)
        with tf.compat.v1.variable_scope("interaction"):
            inter = _dot_interaction(bottom, embs)
        with tf.compat.v1.variable_scope("top"):
            h = _mlp(tf.concat([bottom, inter], axis=1), DLRM_TOP, "mlp", seed + 20)
            return _dense_layer(h, 1, "logit", seed + 30, activation=None, stddev=0.01)
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")


def _dot_interaction(bottom, embs):
    """Strictly-lower-triangle pairwise dot products of [bottom] + embs: [B, n*(n-1)/2]."""
    t = tf.stack([bottom] + embs, axis=1)                      # [B, n, d]
    z = tf.matmul(t, t, transpose_b=True)                      # [B, n, n]
    n = 1 + len(embs)
    ii = [i for i in range(n) for j in range(i)]
    jj = [j for i in range(n) for j in range(i)]
    flat_idx = tf.constant([i * n + j for i, j in zip(ii, jj)], dtype=tf.int32)
    return tf.gather(tf.reshape(z, [-1, n * n]), flat_idx, axis=1)


def build_keras_model(name, emb_dim=16, capacity=1 << 17, seed=0):
    """A Keras functional model taking {'dense': [B,13] float, 'cat': [B,26] int64} -> logits [B,1]."""
    import keras
    from keras import layers, ops

    dense_in = keras.Input(shape=(NUM_INT,), dtype="float32", name="dense")
    cat_in = keras.Input(shape=(NUM_CAT,), dtype="int64", name="cat")
    init = lambda i, std=0.05: keras.initializers.TruncatedNormal(stddev=std, seed=seed + i)  # noqa: E731

    def dense(units, i, activation="relu", stddev=None):
        kinit = (keras.initializers.GlorotUniform(seed=seed + i) if stddev is None
                 else keras.initializers.TruncatedNormal(stddev=stddev, seed=seed + i))
        return layers.Dense(units, activation=activation, kernel_initializer=kinit, name=f"fc_{i}")

    # All 26 features share one Hashing layer and one Embedding per width (feature f owns rows
    # [f*capacity, (f+1)*capacity)): 26 separate layers make Keras' first step trace for tens of seconds.
    rows = layers.Hashing(num_bins=capacity, name="hash_ids")(cat_in)
    offsets = ops.arange(NUM_CAT, dtype="int64") * capacity
    rows = layers.Lambda(lambda r: ops.cast(r, "int64") + offsets, name="feature_rows")(rows)

    def embed(dim, std, offset):
        table = layers.Embedding(NUM_CAT * capacity, dim, name=f"embedding_{dim}",
                                 embeddings_initializer=init(offset, std))(rows)     # [B, 26, dim]
        return [layers.Lambda(lambda t, f=f: t[:, f, :])(table) for f in range(NUM_CAT)]

    if name == "wdl":
        deep = embed(emb_dim, 0.05, 1000)
        wide = embed(1, 0.01, 2000)
        wide_logit = layers.Add()(wide + [dense(1, 1, None, 0.01)(dense_in)])
        h = layers.Concatenate()(deep + [dense_in])
        for i, u in enumerate(WDL_DNN):
            h = dense(u, 10 + i)(h)
        logits = layers.Add()([wide_logit, dense(1, 20, None, 0.01)(h)])
    elif name == "dlrm":
        embs = embed(emb_dim, 0.05, 1000)
        bottom = dense_in
        for i, u in enumerate(DLRM_BOTTOM):
            bottom = dense(u, 10 + i)(bottom)
        bottom = dense(emb_dim, 15)(bottom)
        n = 1 + NUM_CAT
        flat_idx = [i * n + j for i in range(n) for j in range(i)]

        def interact(vectors):
            t = ops.stack(vectors, axis=1)
            z = ops.matmul(t, ops.transpose(t, (0, 2, 1)))
            return ops.take(ops.reshape(z, (-1, n * n)), flat_idx, axis=1)

        inter = layers.Lambda(interact, output_shape=(n * (n - 1) // 2,))([bottom] + embs)
        h = layers.Concatenate()([bottom, inter])
        for i, u in enumerate(DLRM_TOP):
            h = dense(u, 20 + i)(h)
        logits = dense(1, 30, None, 0.01)(h)
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    return keras.Model({"dense": dense_in, "cat": cat_in}, logits, name=f"{name}_keras")
