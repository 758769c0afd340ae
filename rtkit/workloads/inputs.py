# inputs.py -- tf.data input of the Criteo-format TSV: TextLineDataset, batch, decode_csv, string hashing.
"""The input stage, built the way DeepRec's modelzoo builds it.

``TextLineDataset -> repeat -> batch -> map(decode_csv + to_hash_bucket_fast) -> prefetch``. Parsing and
hashing run inside the dataset's map function, so in the training graph the whole input stage is one
``IteratorGetNext`` node (plus the iterator) that depends on nothing else -- the clear input subgraph
that rtkit's stage analysis looks for. The order of examples is the file's order (no shuffle), so a
run is a deterministic function of the seed.

``--input legacy`` (make_legacy_dataset + parse) is the TF1 script many DeepRec users still run: the
dataset yields raw CSV lines (``TextLineDataset -> repeat -> batch``, no prefetch, optionally a
per-batch read latency standing in for remote storage; tf.data's injected prefetch turned off), and decode_csv and the string hashing run in
the training graph after ``get_next``, so they sit on the step's critical path unless something
stages them.

The batch is a dict: ``dense`` float32 [B, 13] (log1p of the counts, 0 where missing), ``cat`` int64
[B, 26] (hashed ids, one column per categorical feature) and ``label`` float32 [B, 1].
"""
import tensorflow as tf

from rtkit.workloads.data import NUM_CAT, NUM_INT

HASH_BUCKETS = 2 ** 62      # ids are hashed into a huge space: the hash table, not the hash, bounds rows


INPUTS = ("prefetch", "legacy")


def parse(lines):
    """The parsed batch dict of a [B] string tensor of CSV lines (also used in-graph by legacy input)."""
    defaults = [[0.0]] + [[0.0]] * NUM_INT + [[""]] * NUM_CAT
    cols = tf.io.decode_csv(lines, record_defaults=defaults, field_delim="\t")
    label = tf.reshape(cols[0], [-1, 1])
    dense = tf.math.log1p(tf.maximum(tf.stack(cols[1:1 + NUM_INT], axis=1), 0.0))
    cat = tf.stack([tf.strings.to_hash_bucket_fast(c, HASH_BUCKETS) for c in cols[1 + NUM_INT:]], axis=1)
    return {"dense": dense, "cat": cat, "label": label}


def make_dataset(path, batch_size, epochs=None, parallel_calls=None, shard=None):
    """tf.data.Dataset of parsed batches; epochs=None repeats forever, else stops after `epochs` passes.

    The repeat comes before the batch, so every batch but the very last of a finite run is full.
    shard=(count, index): every count-th line from line `index` (a cluster worker's own part)."""
    ds = tf.data.TextLineDataset(path)
    if shard:
        ds = ds.shard(*shard)
    ds = ds.repeat(epochs) if epochs else ds.repeat()
    ds = ds.batch(batch_size)
    # num_parallel_calls keeps the output order (deterministic=True is tf.data's default).
    ds = ds.map(parse, num_parallel_calls=parallel_calls or tf.data.AUTOTUNE)
    return ds.prefetch(1)


def make_legacy_dataset(path, batch_size, epochs=None, latency_ms=0.0):
    """Raw CSV line batches ([B] strings): no parsing, no prefetch; each batch is delayed by latency_ms
    (a tf.data sleep inside the iterator, like a read from remote storage)."""
    ds = tf.data.TextLineDataset(path)
    ds = ds.repeat(epochs) if epochs else ds.repeat()
    ds = ds.batch(batch_size)
    if latency_ms and latency_ms > 0:
        from tensorflow.python.data.experimental.ops import testing

        ds = ds.apply(testing.sleep(int(latency_ms * 1000)))
    return without_injected_prefetch(ds)


def without_injected_prefetch(ds):
    """TF 2.x injects a prefetch after a synchronous last transformation (tf.data's inject_prefetch, on by
    default), which runs the read ahead on its own and hides a per-batch latency: a TF1 runtime, which
    DeepRec's legacy scripts were written for, had no such thing. Off, so that legacy input really has no
    prefetch and the read sits on the step's critical path (the case staging is for)."""
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    return ds.with_options(opts)


def keras_dataset(path, batch_size, epochs=None, input_mode="prefetch", latency_ms=0.0):
    """(features, label) pairs for Keras' fit: features = {'dense', 'cat'}. Legacy input parses in a
    sequential map with no prefetch (Keras has no graph to parse in after get_next)."""
    if input_mode == "legacy":
        ds = without_injected_prefetch(make_legacy_dataset(path, batch_size, epochs, latency_ms).map(parse))
    else:
        ds = make_dataset(path, batch_size, epochs)
    return ds.map(lambda b: ({"dense": b["dense"], "cat": b["cat"]}, b["label"]))
