# ev.py -- an EmbeddingVariable analogue on stock TensorFlow: MutableHashTable id->row plus fixed-capacity variables.
"""Dynamic-vocabulary embeddings in graph mode, after DeepRec's EmbeddingVariable, on stock TF ops.

Per categorical feature, an :class:`IdRowMap` holds a ``tf.lookup.experimental.MutableHashTable``
(int64 id -> int64 row) and a row counter (an int64 resource variable). For each batch the graph

1. takes the unique ids of the batch (``tf.unique``: first-occurrence order, deterministic),
2. looks them up with default -1,
3. gives the ids not seen before the next rows: ``counter.assign_add(n_new) - n_new + [0..n_new)``,
4. inserts (new id -> row) into the table, and only then
5. gathers the rows ``row % capacity`` of the embedding variables of that feature.

The embedding variables (``[capacity, dim]``) are ordinary trainable variables read with
``tf.gather``, so their gradients are ``IndexedSlices`` over the batch's unique rows and
``tf.compat.v1.train.AdagradOptimizer`` applies sparse updates (its ``accumulator`` slot has the same
``[capacity, dim]`` shape). Several variables may share one map (Wide&Deep's wide weights and deep
embeddings use the same rows).

Capacity: rows are assigned without bound, but the variables have ``capacity`` rows; row ``r`` lives
at ``r % capacity``. Once a feature has seen more than ``capacity`` distinct ids, later ids share
(wrap onto) rows of earlier ones, like hash-bucket collisions. ``rows_used`` tells how far a feature got.

Row heat: rows are handed out in first-seen order, so the ids a run meets (frequent ids early) sit packed
at the front of each table and share pages; the rest of a large table is touched once, by its
initializer. ``set_row_assign("hashed")`` is the counterfactual (a hash bucket per id, as stock TF's
hashing does): the same ids scattered over the whole table, one page each. ``--table-gb`` sizes
the tables from a byte budget (``python -m rtkit.workloads``).
"""
import tensorflow as tf

ROW_ASSIGNS = ("first-seen", "hashed")
_row_assign = "first-seen"


def set_row_assign(mode):
    """Row assignment of the IdRowMaps built from now on: first-seen (packed) or hashed (scattered)."""
    global _row_assign
    if mode not in ROW_ASSIGNS:
        raise ValueError(f"unknown row assignment {mode!r}; expected one of {', '.join(ROW_ASSIGNS)}")
    _row_assign = mode


class IdRowMap:
    """id -> row assignment for one feature (hash table + counter)."""

    def __init__(self, name, capacity):
        self.name = name
        self.capacity = int(capacity)
        with tf.compat.v1.variable_scope(name):
            # checkpointed under its full name: TF's own saveable takes the bare `name`, so every feature's
            # table would be saved as one "id_to_row" and a restored job would lose its id -> row maps
            self.table = tf.lookup.experimental.MutableHashTable(
                key_dtype=tf.int64, value_dtype=tf.int64, default_value=-1, name="id_to_row", checkpoint=False)
            if not tf.executing_eagerly():
                full = self.table.resource_handle.op.name
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                               type(self.table)._Saveable(self.table, full))
            self.counter = tf.compat.v1.get_variable(
                "rows_used", shape=[], dtype=tf.int64, initializer=tf.compat.v1.zeros_initializer(),
                trainable=False, use_resource=True)

    @property
    def rows_used(self):
        return self.counter.read_value()

    def rows(self, ids):
        """(unique_rows, index): physical rows of the unique ids of `ids` and, for each element of the
        flattened `ids`, its position in unique_rows. New ids get new rows (inserted in-graph)."""
        with tf.name_scope(self.name + "/assign_rows"):
            flat = tf.reshape(ids, [-1])
            uniq, idx = tf.unique(flat, out_idx=tf.int64)
            if _row_assign == "hashed":   # Fibonacci hashing of the id: neighbours in id space land far apart
                return tf.math.floormod(uniq * 2654435761, self.capacity), idx
            found = self.table.lookup(uniq)
            is_new = found < 0
            n_new = tf.reduce_sum(tf.cast(is_new, tf.int64))
            start = self.counter.assign_add(n_new, read_value=True) - n_new
            offsets = tf.cumsum(tf.cast(is_new, tf.int64), exclusive=True)
            rows = tf.where(is_new, start + offsets, found)
            insert = self.table.insert(tf.boolean_mask(uniq, is_new), tf.boolean_mask(rows, is_new))
            with tf.control_dependencies([insert]):
                phys = tf.math.floormod(rows, self.capacity)
            return phys, idx


class EmbeddingVariable:
    """A [capacity, dim] trainable variable addressed through an IdRowMap."""

    def __init__(self, name, id_map, dim, stddev=0.05, seed=None):
        self.id_map = id_map
        self.dim = int(dim)
        self.var = tf.compat.v1.get_variable(
            name, shape=[id_map.capacity, self.dim], dtype=tf.float32, use_resource=True,
            initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev, seed=seed))

    def lookup(self, rows_and_idx, ids_shape):
        """Embeddings of the ids (shape ids_shape + [dim]) from the rows given by IdRowMap.rows."""
        phys, idx = rows_and_idx
        # Colocated with the variable, as tf.nn.embedding_lookup does: on a parameter-server cluster the
        # rows are read where the table lives and only they cross the network (no effect in one process).
        with tf.compat.v1.colocate_with(self.var):
            uniq_emb = tf.gather(self.var, phys)              # gradient: IndexedSlices on `phys` only
        emb = tf.gather(uniq_emb, idx)
        return tf.reshape(emb, tf.concat([ids_shape, [self.dim]], axis=0))
