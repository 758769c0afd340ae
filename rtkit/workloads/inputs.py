# inputs.py -- tf.data input of the Criteo-format TSV: TextLineDataset, batch, decode_csv, string hashing.
"""The input stage, built the way DeepRec's modelzoo builds it.

``TextLineDataset -> repeat -> batch -> map(decode_csv + to_hash_bucket_fast) -> prefetch``. Parsing and
hashing run inside the dataset's map function, so in the training graph the whole input stage is one
``IteratorGetNext`` node (plus the iterator) that depends on nothing else -- the clear input subgraph
that rtkit's stage analysis looks for. The order of examples is the file's order (no shuffle), so a
run is a deterministic function of the seed.

The batch is a dict: ``dense`` float32 [B, 13] (log1p of the counts, 0 where missing), ``cat`` int64
[B, 26] (hashed ids, one column per categorical feature) and ``label`` float32 [B, 1].
"""
import tensorflow as tf

from rtkit.workloads.data import NUM_CAT, NUM_INT

HASH_BUCKETS = 2 ** 62      # ids are hashed into a huge space: the hash table, not the hash, bounds rows


def _parse(lines):
    defaults = [[0.0]] + [[0.0]] * NUM_INT + [[""]] * NUM_CAT
    cols = tf.io.decode_csv(lines, record_defaults=defaults, field_delim="\t")
    label = tf.reshape(cols[0], [-1, 1])
    dense = tf.math.log1p(tf.maximum(tf.stack(cols[1:1 + NUM_INT], axis=1), 0.0))
    cat = tf.stack([tf.strings.to_hash_bucket_fast(c, HASH_BUCKETS) for c in cols[1 + NUM_INT:]], axis=1)
    return {"dense": dense, "cat": cat, "label": label}


def make_dataset(path, batch_size, epochs=None, parallel_calls=None):
    """tf.data.Dataset of parsed batches; epochs=None repeats forever, else stops after `epochs` passes.

    The repeat comes before the batch, so every batch but the very last of a finite run is full."""
    ds = tf.data.TextLineDataset(path)
    ds = ds.repeat(epochs) if epochs else ds.repeat()
    ds = ds.batch(batch_size)
    # num_parallel_calls keeps the output order (deterministic=True is tf.data's default).
    ds = ds.map(_parse, num_parallel_calls=parallel_calls or tf.data.AUTOTUNE)
    return ds.prefetch(1)


def keras_dataset(path, batch_size, epochs=None):
    """(features, label) pairs for Keras' fit: features = {'dense', 'cat'}."""
    ds = make_dataset(path, batch_size, epochs)
    return ds.map(lambda b: ({"dense": b["dense"], "cat": b["cat"]}, b["label"]))
