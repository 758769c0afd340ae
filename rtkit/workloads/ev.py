# ev.py -- an EmbeddingVariable analogue on stock TensorFlow: MutableHashTable id->row plus fixed-capacity variables.
"""Dynamic-vocabulary embeddings in graph mode, after DeepRec's EmbeddingVariable, on stock TF ops.

Per categorical feature, an :class:`IdRowMap` holds a ``tf.lookup.experimental.MutableHashTable``
(int64 id -> int64 row) and a row counter (an int64 resource variable). For each batch the graph

1. takes the unique ids of the batch (``tf.unique``: first-occurrence order, deterministic),
2. looks them up with default -1,
3. gives the ids not seen before the next rows: ``counter.assign_add(n_new) - n_new + [0..n_new)``,
4. inserts (new id -> row) into the table,
5. gives the physical rows used for the first time their initial values (below), and only then
6. gathers the rows ``row % capacity`` of the embedding variables of that feature.

The embedding variables (``[capacity, dim]``) are ordinary trainable variables read with
``tf.gather``, so their gradients are ``IndexedSlices`` over the batch's unique rows and Adagrad
applies sparse updates. Several variables may share one map (Wide&Deep's wide weights and deep
embeddings use the same rows).

Two ways to fill the tables (``set_table_fill``, the workload's ``--table-fill``):

- ``eager`` (default): a table is filled at initialisation (truncated normal), as a script with ordinary
  ``tf.Variable`` tables does, and Adagrad makes its own constant-filled accumulator. Every page of the
  tables is touched before the first step, so steps touch no new table pages: the allocator benchmarks
  see the runtime's own page faults, not the tables filling up.
- ``lazy`` (the capacity benchmark's): steps 5 above, as DeepRec's EmbeddingVariable.

Lazy initialisation: a table and its Adagrad accumulator are allocated
without being filled (``Empty(init=False)`` assigned to the resource variable, which takes the buffer as
it is), so initialising a 36 GiB table costs neither time nor memory nor, in tier mode, disk writes.
A row gets its value in the step that first uses it, before it is read: approximately normal, clipped at
2 stddev, the sum of a row of each of two blocks of precomputed values picked by a hash of (seed, row), as
DeepRec's EmbeddingVariable takes new rows from a block of default values (:func:`row_values`), so it depends
on the row only, not on the table size or on which step came first; the accumulator row gets the constant
``ACCUMULATOR_INIT``. Rows no id has used are never read (their bytes are whatever the allocator gave: zero
pages). The accumulator is the slot
:class:`AdagradOptimizer` uses; stock ``tf.compat.v1.train.AdagradOptimizer`` would make (and fill) its
own, which trains the same.

Capacity: rows are assigned without bound, but the variables have ``capacity`` rows; row ``r`` lives
at ``r % capacity``. Once a feature has seen more than ``capacity`` distinct ids, later ids share
(wrap onto) rows of earlier ones, like hash-bucket collisions, and keep the trained values they find.
``rows_used`` tells how far a feature got.

Row heat: rows are handed out in first-seen order, so the ids a run meets (frequent ids early) sit packed
at the front of each table and share pages; the rest of a large table is never touched.
``set_row_assign("hashed")`` is the counterfactual (a hash bucket per id, as stock TF's hashing does):
the same ids scattered over the whole table, one page each (the map then remembers which physical
rows have been initialised). ``set_row_assign("frequency", rank_of)`` puts each id at its frequency rank's
row (the most frequent id at row 0), what a vocabulary adapted on the data gives (Keras' ``StringLookup``
and ``IntegerLookup`` sort by frequency): ``rank_of`` knows the ranks (``rtkit.workloads.zipf.rank_of``). ``--table-gb`` sizes the tables from a byte budget (``python -m rtkit.workloads``).
:class:`Compactor` (``--compact-steps``) also moves the most used rows to the front at step boundaries, by
access counts, loss-neutrally; on power-law ids (``--ids zipf``) first-seen order already gets most of what
it gets (docs/pmem.md). Promotion (``set_promotion``, ``--promote-hot-rows N``) keeps the first N rows of each
first-seen lazily filled table for ids met a second time, moved there in the step that meets them again, and
gives new ids rows from N on: under a power law most rows are used once, so the rows used again then share
pages apart from them (docs/pmem.md, "Promotion").
"""
import weakref

import numpy as np
import tensorflow as tf

ROW_ASSIGNS = ("first-seen", "frequency", "hashed")
TABLE_FILLS = ("eager", "lazy")
ACCUMULATOR_INIT = 0.1          # tf.compat.v1.train.AdagradOptimizer's initial_accumulator_value
_row_assign = "first-seen"
_rank_of = None                 # frequency rows: (ids, feature) -> ranks from 1 (the most frequent id), 0 if unknown
_table_fill = "eager"
_compaction = False
_promote_rows = 0               # first-seen lazy maps: rows per feature kept for rows used again (0: off)
_MAPS = "rtkit_ev_compacted_maps"   # graph collection of the IdRowMaps that keep access counts
_ALL_MAPS = "rtkit_ev_maps"             # graph collection of every IdRowMap (the row layout report)
PAGE_BYTES = 4096
_GAMMA = 0x9E3779B97F4A7C15             # splitmix64 constants
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def set_row_assign(mode, rank_of=None):
    """Row assignment of the IdRowMaps built from now on: first-seen (packed), frequency (row = the id's
    frequency rank - 1, from rank_of(ids, feature)) or hashed (scattered)."""
    global _row_assign, _rank_of
    if mode not in ROW_ASSIGNS:
        raise ValueError(f"unknown row assignment {mode!r}; expected one of {', '.join(ROW_ASSIGNS)}")
    if (mode == "frequency") != (rank_of is not None):
        raise ValueError("frequency rows need rank_of (the ids' frequency ranks), and only they take it")
    _row_assign, _rank_of = mode, rank_of


def set_table_fill(mode):
    """How the tables built from now on are filled: eager (at initialisation) or lazy (a row at first use)."""
    global _table_fill
    if mode not in TABLE_FILLS:
        raise ValueError(f"unknown table fill {mode!r}; expected one of {', '.join(TABLE_FILLS)}")
    _table_fill = mode


def set_compaction(on):
    """Whether the first-seen IdRowMaps built from now on keep access counts for a Compactor."""
    global _compaction
    _compaction = bool(on)


def set_promotion(hot_rows):
    """Rows per feature the first-seen lazily filled IdRowMaps built from now on keep for rows used a second
    time (0: off; see IdRowMap.rows)."""
    global _promote_rows
    if int(hot_rows) < 0:
        raise ValueError(f"hot rows for promotion: a count >= 0 expected, got {hot_rows!r}")
    _promote_rows = int(hot_rows)


def _unfilled(shape, dtype=tf.float32, partition_info=None):
    """Initializer that allocates and does not write: no page of the buffer is touched."""
    return tf.raw_ops.Empty(shape=tf.constant(tf.TensorShape(shape).as_list(), tf.int32), dtype=dtype, init=False)


def _mix(z):
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    u = lambda x: tf.constant(x, tf.uint64)  # noqa: E731
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, u(30))) * u(_MIX1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, u(27))) * u(_MIX2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, u(31)))


INIT_BLOCK_ROWS = 4096          # rows of each block of initial values (DeepRec's default_value_dim default)
_init_blocks = weakref.WeakKeyDictionary()   # graph -> {(dim, device): (block A, block B) constants}
_eager_blocks = {}


def _mix_np(z):
    """_mix on a numpy uint64 array (array arithmetic wraps, as the graph's, and never warns)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def _unit_block(dim, salt):
    """[INIT_BLOCK_ROWS, dim] float32 of sd ~0.973 (clipped at 2): per value, the sum of the four 16-bit fields of
    one hashed word (Irwin-Hall), centred and clipped in integers; a function of (salt, row, column) only."""
    rows = np.arange(INIT_BLOCK_ROWS, dtype=np.uint64).reshape(-1, 1)
    cols = np.arange(int(dim), dtype=np.uint64).reshape(1, -1)
    z = _mix_np((rows + np.uint64(1)) * np.uint64(_GAMMA) + (cols + np.uint64(1)) * np.uint64(_MIX2) + np.uint64(salt))
    pairs = np.uint64(0x0000FFFF0000FFFF)
    s = (z & pairs) + ((z >> np.uint64(16)) & pairs)
    s = (s & np.uint64(0xFFFFFFFF)) + (s >> np.uint64(32))
    limit = int(round(2 * (1 << 16) / 3 ** 0.5))                   # 2 sd of the sum of 4 U[0, 2^16)
    centred = np.clip(s.astype(np.int64) - (1 << 17), -limit, limit)
    return (centred * (3 ** 0.5 / (1 << 16))).astype(np.float32)


def _blocks(dim, device):
    """The two blocks of initial values for tables of `dim` columns on `device`: graph constants made once per graph
    and device (so a parameter server's tables read their own, never another task's), or eager tensors."""
    key = (int(dim), device or "")
    if tf.executing_eagerly():
        cache = _eager_blocks
    else:
        cache = _init_blocks.setdefault(tf.compat.v1.get_default_graph(), {})
    if key not in cache:
        # outside any control dependency or loop of the first caller's: every later table's step reads them
        with tf.control_dependencies(None), tf.name_scope("rtkit_ev_init_blocks/"):
            cache[key] = tuple(tf.constant(_unit_block(dim, salt)) for salt in (1, 2))
    return cache[key]


def row_values(rows, dim, seed, stddev, device=""):
    """[len(rows), dim] float32 initial values, a function of (seed, row, column) only: approximately
    normal(0, stddev), clipped at 2 stddev as a truncated normal is. As DeepRec's EmbeddingVariable takes a new
    row's values from a block of default values (default_value_dim rows), a row here is the sum of a row of each of
    two blocks of INIT_BLOCK_ROWS precomputed values (_unit_block), both picked by one hash of (seed, row): 2^24
    combinations for a table's rows, at the cost of two gathers. Hashing every value (one word each) took 11 ms of a
    full-scale step's ~27k new rows on 2 cores (four words each: 33 ms). A gather, an add, a multiply and a clip
    are exact or correctly rounded element by element, so no vectorisation, thread split or Grappler rewrite can
    change a bit (float formulas such as `ndtri` came out different in the last bit in the scheduler's staged
    graph). `device`: the table's (where the blocks are made)."""
    first, second = _blocks(dim, device)
    u64 = lambda x: tf.constant(x, tf.uint64)  # noqa: E731
    r = tf.cast(tf.reshape(rows, [-1]), tf.uint64)
    h = _mix((r + 1) * u64(_GAMMA) + u64((int(seed) * _MIX2 + _GAMMA) & (2**64 - 1)))
    mask = u64(INIT_BLOCK_ROWS - 1)
    i = tf.cast(tf.bitwise.bitwise_and(h, mask), tf.int32)
    j = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(h, u64(32)), mask), tf.int32)
    both = tf.gather(first, i) + tf.gather(second, j)             # sd ~0.973 * sqrt(2)
    return tf.clip_by_value(both * tf.constant(stddev / 2 ** 0.5, tf.float32), -2 * stddev, 2 * stddev)


class RowBatch:
    """What IdRowMap.rows gives its variables: `phys` (unique rows of the batch), `idx` (position of each
    element of the flattened ids in phys), `fresh` (physical rows used for the first time: to initialise) and,
    with promotion, `fresh_numbers` (the row numbers their initial values follow) and the rows to copy before
    the gather (`moved_from` -> `moved_to`)."""

    def __init__(self, phys, idx, fresh, fresh_numbers=None, moved_from=None, moved_to=None):
        self.phys, self.idx, self.fresh = phys, idx, fresh
        self.fresh_numbers = fresh if fresh_numbers is None else fresh_numbers
        self.moved_from, self.moved_to = moved_from, moved_to


class IdRowMap:
    """id -> row assignment for one feature (hash table + counter)."""

    def __init__(self, name, capacity, feature=None):
        """feature: the categorical feature's index (frequency rows: which feature's ranks)."""
        self.name = name
        self.capacity = int(capacity)
        self.assign = _row_assign
        self.rank_of = _rank_of
        self.feature = feature
        if self.assign == "frequency" and feature is None:
            raise ValueError("frequency rows need the map's feature index")
        self.lazy = _table_fill == "lazy"
        self.compact = _compaction and self.assign == "first-seen"
        self.promote = _promote_rows if self.assign == "first-seen" and self.lazy and not self.compact else 0
        if self.promote and self.promote >= self.capacity:
            raise ValueError(f"promotion keeps {self.promote} rows for rows used again, which leaves no row of "
                             f"{name}'s {self.capacity} for new ids: fewer hot rows, or larger tables")
        self.variables = []      # the EmbeddingVariables' tables addressed by these rows
        self.batch_phys = []     # each rows() call's unique physical rows (the Compactor counts them)
        tf.compat.v1.add_to_collection(_ALL_MAPS, self)
        with tf.compat.v1.variable_scope(name):
            # first-seen: id -> row; hashed, frequency: physical row -> itself (which rows have been initialised).
            # Checkpointed under its full name: TF's own saveable takes the bare `name`, so every feature's
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
            if self.promote:   # rows of the hot region [0, promote) given to ids met again
                self.promoted = tf.compat.v1.get_variable(
                    "rows_promoted", shape=[], dtype=tf.int64, initializer=tf.compat.v1.zeros_initializer(),
                    trainable=False, use_resource=True)
            if self.compact:
                # per position: batches that used it (cumulative), its id and the row number it was given
                # (`orig`); per row number: where its row is now (`home`: ids past capacity wrap onto the row
                # number, so they follow it wherever compaction moved it, as without compaction)
                self.heat = tf.compat.v1.get_variable(
                    "heat", shape=[self.capacity], dtype=tf.int32, initializer=tf.compat.v1.zeros_initializer(),
                    trainable=False, use_resource=True)
                self.row_id, self.orig, self.home = (tf.compat.v1.get_variable(
                    n, shape=[self.capacity], dtype=tf.int64, initializer=_unfilled, trainable=False,
                    use_resource=True) for n in ("row_id", "orig", "home"))
                tf.compat.v1.add_to_collection(_MAPS, self)

    @property
    def rows_used(self):
        return self.counter.read_value()

    def rows(self, ids):
        """A RowBatch for `ids`: new ids get new rows (inserted in-graph); `phys` and `fresh` are ready
        only once the insert ran (control dependency)."""
        with tf.name_scope(self.name + "/assign_rows"):
            flat = tf.reshape(ids, [-1])
            uniq, idx = tf.unique(flat, out_idx=tf.int64)
            if self.assign != "first-seen":
                hashed = tf.math.floormod(uniq * 2654435761, self.capacity)   # Fibonacci hashing: neighbours land far apart
                if self.assign == "hashed":
                    phys = hashed
                else:   # the rank's row; an id of unknown rank (none from the generator) gets its hashed row
                    rank = self.rank_of(uniq, self.feature)
                    phys = tf.where(rank > 0, tf.math.floormod(rank - 1, self.capacity), hashed)
                if not self.lazy:         # filled tables: nothing to remember
                    return RowBatch(phys, idx, None)
                fresh = tf.boolean_mask(phys, self.table.lookup(phys) < 0)   # may repeat: same row, same values
                insert = self.table.insert(fresh, fresh)
                with tf.control_dependencies([insert]):
                    return RowBatch(tf.identity(phys), idx, tf.identity(fresh))
            found = self.table.lookup(uniq)
            is_new = found < 0
            if self.promote:
                return self._rows_promoting(uniq, idx, found, is_new)
            n_new = tf.reduce_sum(tf.cast(is_new, tf.int64))
            start = self.counter.assign_add(n_new, read_value=True) - n_new
            offsets = tf.cumsum(tf.cast(is_new, tf.int64), exclusive=True)
            rows = tf.where(is_new, start + offsets, found)
            deps = [self.table.insert(tf.boolean_mask(uniq, is_new), tf.boolean_mask(rows, is_new))]
            if self.compact:   # a new row (not wrapped): its id; it is where its number says
                own = tf.logical_and(is_new, rows < self.capacity)
                own_rows = tf.boolean_mask(rows, own)
                deps += [tf.raw_ops.ResourceScatterUpdate(resource=self.row_id.handle, indices=own_rows,
                                                          updates=tf.boolean_mask(uniq, own)),
                         tf.raw_ops.ResourceScatterUpdate(resource=self.orig.handle, indices=own_rows, updates=own_rows),
                         tf.raw_ops.ResourceScatterUpdate(resource=self.home.handle, indices=own_rows, updates=own_rows)]
            with tf.control_dependencies(deps):
                phys = tf.math.floormod(rows, self.capacity)
                if self.compact:   # rows below capacity are positions (rewritten by compaction); wrapped: via home
                    over = rows >= self.capacity   # only they read `home` (others read entry 0: one page)
                    wrapped = tf.raw_ops.ResourceGather(resource=self.home.handle, dtype=tf.int64,
                                                        indices=tf.where(over, phys, tf.zeros_like(phys)))
                    phys = tf.where(over, wrapped, phys)
                    self.batch_phys.append(phys)
                # a new id past capacity wraps onto a row an earlier id initialised and trained: keep it
                fresh = tf.boolean_mask(rows, tf.logical_and(is_new, rows < self.capacity)) if self.lazy else None
            return RowBatch(phys, idx, fresh)

    def _rows_promoting(self, uniq, idx, found, is_new):
        """First-seen rows with promotion: a new id's row number n lives at H + n (H = self.promote), in the back
        region, among rows that may never be used again (under a power law most are used once); an id met again
        whose row is still there moves to the next free row of the hot region [0, H) (its values and optimizer
        state copied before the step reads them: EmbeddingVariable.lookup), while the hot region has room. So the
        rows used more than once share pages, and a tier that keeps pages in DRAM by their use (tier_pager) keeps
        them, where first-seen pages mix them with rows used once (docs/pmem.md, "Promotion"). Loss-neutral: a
        row's initial values follow its number n, not where it lives, and a move copies whole rows. Past the back
        region's capacity - H rows, new ids wrap onto its rows (as past capacity without promotion; an id promoted
        from a row that several ids share takes that row's values with it, the others keep the row)."""
        hot, back = self.promote, self.capacity - self.promote
        n_new = tf.reduce_sum(tf.cast(is_new, tf.int64))
        start = self.counter.assign_add(n_new, read_value=True) - n_new
        numbers = start + tf.cumsum(tf.cast(is_new, tf.int64), exclusive=True)
        new_at = hot + tf.math.floormod(numbers, back)
        # ids met again whose row is in the back region, in the batch's order, as many as the hot region has room for
        again = tf.logical_and(tf.logical_not(is_new), found >= hot)
        order = tf.cumsum(tf.cast(again, tf.int64), exclusive=True)
        room = hot - self.promoted.read_value()
        move = tf.logical_and(again, order < room)
        n_move = tf.reduce_sum(tf.cast(move, tf.int64))
        first_free = self.promoted.assign_add(n_move, read_value=True) - n_move
        moved_to = tf.boolean_mask(first_free + order, move)
        rows = tf.where(is_new, new_at, tf.where(move, first_free + order, found))
        deps = [self.table.insert(tf.boolean_mask(uniq, is_new), tf.boolean_mask(new_at, is_new)),
                self.table.insert(tf.boolean_mask(uniq, move), moved_to)]
        with tf.control_dependencies(deps):
            phys = tf.identity(rows)
            own = tf.logical_and(is_new, numbers < back)   # a wrapped id finds its row initialised and trained
            fresh = tf.boolean_mask(new_at, own)
            return RowBatch(phys, idx, fresh, fresh_numbers=tf.boolean_mask(numbers, own),
                            moved_from=tf.boolean_mask(found, move), moved_to=moved_to)


class EmbeddingVariable:
    """A [capacity, dim] trainable variable addressed through an IdRowMap; with lazy fill, also its Adagrad
    accumulator, both filled row by row as rows are first used."""

    def __init__(self, name, id_map, dim, stddev=0.05, seed=None):
        self.id_map = id_map
        self.dim = int(dim)
        self.stddev = float(stddev)
        self.seed = int(seed or 0)
        shape = [id_map.capacity, self.dim]
        if not id_map.lazy:   # filled at initialisation; Adagrad makes (and fills) its own accumulator
            self.var = tf.compat.v1.get_variable(
                name, shape=shape, dtype=tf.float32, use_resource=True,
                initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev, seed=seed))
            self.accumulator = None
            id_map.variables.append(self.var)
            return
        self.var = tf.compat.v1.get_variable(name, shape=shape, dtype=tf.float32, use_resource=True,
                                             initializer=_unfilled)
        # named as the optimizer names its slot (<var>/Adagrad); beside the variable on a cluster
        with tf.compat.v1.colocate_with(self.var):
            self.accumulator = tf.compat.v1.get_variable(name + "/Adagrad", shape=shape, dtype=tf.float32,
                                                         use_resource=True, trainable=False, initializer=_unfilled)
        self.var._rtkit_ev_accumulator = self.accumulator
        id_map.variables.append(self.var)

    def lookup(self, batch_rows, ids_shape):
        """Embeddings of the ids (shape ids_shape + [dim]) from the RowBatch given by IdRowMap.rows."""
        # Colocated with the variable, as tf.nn.embedding_lookup does: on a parameter-server cluster the
        # rows are read where the table lives and only they cross the network (no effect in one process).
        with tf.compat.v1.colocate_with(self.var):
            fresh, init = batch_rows.fresh, []
            if self.accumulator is not None:   # lazy: the batch's first-used rows get their values first
                init = [tf.raw_ops.ResourceScatterUpdate(
                            resource=self.var.handle, indices=fresh,
                            updates=row_values(batch_rows.fresh_numbers, self.dim, self.seed, self.stddev,
                                               self.var.device)),
                        tf.raw_ops.ResourceScatterUpdate(
                            resource=self.accumulator.handle, indices=fresh,
                            updates=tf.fill(tf.stack([tf.size(fresh), self.dim]), ACCUMULATOR_INIT))]
            if batch_rows.moved_from is not None:   # promoted rows: values and accumulator, before the gather
                init += [tf.raw_ops.ResourceScatterUpdate(
                             resource=t.handle, indices=batch_rows.moved_to,
                             updates=tf.raw_ops.ResourceGather(resource=t.handle, indices=batch_rows.moved_from,
                                                               dtype=tf.float32))
                         for t in (self.var, self.accumulator)]
            with tf.control_dependencies(init):
                uniq_emb = tf.gather(self.var, batch_rows.phys)   # gradient: IndexedSlices on `phys` only
        emb = tf.gather(uniq_emb, batch_rows.idx)
        return tf.reshape(emb, tf.concat([ids_shape, [self.dim]], axis=0))


class AdagradOptimizer(tf.compat.v1.train.AdagradOptimizer):
    """tf.compat.v1 Adagrad whose accumulator for an EmbeddingVariable is the one the variable made (and
    fills row by row); other variables get the usual constant-filled slot."""

    def __init__(self, learning_rate, **kwargs):
        super().__init__(learning_rate, **kwargs)
        if self._initial_accumulator_value != ACCUMULATOR_INIT:
            raise ValueError(f"initial_accumulator_value must be {ACCUMULATOR_INIT} (the EmbeddingVariable rows' init)")

    def _create_slots(self, var_list):
        from tensorflow.python.training import optimizer as tf_optimizer   # _var_key: how slots are keyed

        slots = self._slot_dict("accumulator")
        for v in var_list:
            acc = getattr(v, "_rtkit_ev_accumulator", None)
            if acc is not None:
                slots.setdefault(tf_optimizer._var_key(v), acc)
        super()._create_slots(var_list)


class Compactor:
    """Hot-row compaction between steps (``--compact-steps``): keeps the most used rows of each first-seen
    IdRowMap in its first ``hot_rows`` rows, so that they share pages and a page cache (or tier mode's
    resident budget) holding those pages holds the hot rows.

    Each step adds 1 to the access count (``heat``) of the batch's unique rows (part of the step's run).
    Every ``every`` steps, ``after_step`` runs one pass: per map, the up to ``max_swaps`` most used rows past
    the hot region are swapped with the least used rows inside it, pair by pair while the row coming in was
    used at least twice more than the one going out (a margin: no churn between rows seen once or twice),
    in every table and optimizer slot of the map, the counts and the row -> id list; the id -> row table is
    rewritten for the moved ids. A pass touches the moved rows only, never the whole table. The counts are
    cumulative: the bundled data's popularity does not drift, and halving them at each pass (tried) moved 50x
    more rows for the same hot-region share. The step also counts the rows it looked up that fell in the hot
    region; ``report`` prints that share since the first pass (``max_swaps=0``: the share without moving
    anything, the first-seen baseline).

    Loss-neutral: a swap moves whole rows (values and accumulator alike) with their ids, so every lookup
    reads the same values as without compaction and Adagrad's per-row update is the same; a new id still
    gets the next row number (positions past the rows in use are never moved), so lazily filled rows get
    the same initial values; an id past capacity wraps onto its row number's row wherever that row now is
    (`home`). A map whose ids have wrapped past its capacity is no longer compacted (several ids share a row
    there)."""

    def __init__(self, opt, every, hot_rows, max_swaps=65536):
        """max_swaps=0: no rows move, only the counts (a baseline for the hot region's share)."""
        maps = tf.compat.v1.get_collection(_MAPS)
        if not maps:
            raise ValueError("compaction needs first-seen rows (set_compaction before the model is built)")
        self.every, self.passes, self.moved, self.seconds = int(every), 0, 0, 0.0
        self.hot_rows, self.base = int(hot_rows), None
        counts = [tf.raw_ops.ResourceScatterAdd(resource=m.heat.handle, indices=p, updates=tf.ones_like(p, dtype=tf.int32))
                  for m in maps for p in m.batch_phys]
        # how well the layout serves a cache of the hot region: the batches' rows that fell in it, of all
        with tf.compat.v1.variable_scope("rtkit_compaction"):
            self.lookups = tf.compat.v1.get_variable("lookups", shape=[2], dtype=tf.int64, trainable=False,
                                                     initializer=tf.compat.v1.zeros_initializer(), use_resource=True)
        phys = tf.concat([p for m in maps for p in m.batch_phys], axis=0)
        counts.append(self.lookups.assign_add(tf.stack([tf.reduce_sum(tf.cast(phys < self.hot_rows, tf.int64)),
                                                        tf.size(phys, out_type=tf.int64)])))
        self.count_op = tf.group(counts)
        moved = []
        for m in maps:
            tables = []
            for v in m.variables:
                tables.append(v)
                tables += [opt.get_slot(v, n) for n in opt.get_slot_names() if opt.get_slot(v, n) is not None]
            seen, unique = set(), []
            for t in tables:                       # lazy tables: the slot is the variable's own accumulator
                if t.handle.name not in seen:
                    seen.add(t.handle.name)
                    unique.append(t)
            moved.append(_compaction_pass(m, unique, int(hot_rows), int(max_swaps)))
        self.compact_op = tf.add_n(moved)

    def after_step(self, sess, step):
        if self.every > 0 and step % self.every == 0:
            import time

            t0 = time.perf_counter()
            if self.base is None:   # the share counts from the first pass: before it, every row is in the region
                self.base = sess.run(self.lookups.read_value())
            self.moved += int(sess.run(self.compact_op))
            self.seconds += time.perf_counter() - t0
            self.passes += 1

    def report(self, sess):
        import sys

        share = ""
        if self.base is not None:
            hits, total = sess.run(self.lookups.read_value()) - self.base
            share = f", hot region ({self.hot_rows} rows a feature) held {hits / max(total, 1):.1%} of the rows looked up since the first pass"
        sys.stderr.write(f"rtkit-workload: compaction: {self.passes} passes, {self.moved} rows moved, "
                         f"{self.seconds:.2f}s{share}\n")


def _compaction_pass(m, tables, hot, max_swaps):
    """The op of one pass over IdRowMap `m` (see Compactor); its value is the number of rows moved."""
    cap = m.capacity
    k = min(hot, cap - hot, max_swaps)
    if k <= 0:
        return tf.constant(0, tf.int64)
    with tf.name_scope(m.name + "/compact"):
        used = m.counter.read_value()
        heat = m.heat.read_value()
        back = heat[hot:]
        back = tf.where(tf.range(cap - hot, dtype=tf.int64) < used - hot, back, -tf.ones_like(back))
        out_heat, out_pos = tf.math.top_k(back, k=k, sorted=True)         # most used past the hot region
        neg_in, in_pos = tf.math.top_k(-heat[:hot], k=k, sorted=True)      # least used inside it
        # descending against ascending: the pairs worth swapping are a prefix
        n = tf.reduce_sum(tf.cast(out_heat > -neg_in + 1, tf.int64))
        n = tf.where(tf.logical_and(used <= cap, used > hot), n, tf.constant(0, tf.int64))
        pin = tf.cast(in_pos[:n], tf.int64)
        pout = tf.cast(out_pos[:n], tf.int64) + hot
        state = [t.handle for t in tables] + [m.heat.handle, m.orig.handle, m.row_id.handle]
        dtypes = [t.dtype for t in tables] + [tf.int32, tf.int64, tf.int64]
        got_in = [tf.raw_ops.ResourceGather(resource=h, indices=pin, dtype=d) for h, d in zip(state, dtypes)]
        got_out = [tf.raw_ops.ResourceGather(resource=h, indices=pout, dtype=d) for h, d in zip(state, dtypes)]
        with tf.control_dependencies(got_in + got_out):
            writes = [tf.raw_ops.ResourceScatterUpdate(resource=h, indices=pin, updates=b)
                      for h, b in zip(state, got_out)]
            writes += [tf.raw_ops.ResourceScatterUpdate(resource=h, indices=pout, updates=a)
                       for h, a in zip(state, got_in)]
            ids_in, ids_out = got_in[-1], got_out[-1]
            writes += [m.table.insert(ids_out, pin), m.table.insert(ids_in, pout)]
            orig_in, orig_out = got_in[-2], got_out[-2]
            writes += [tf.raw_ops.ResourceScatterUpdate(resource=m.home.handle, indices=orig_out, updates=pin),
                       tf.raw_ops.ResourceScatterUpdate(resource=m.home.handle, indices=orig_in, updates=pout)]
        with tf.control_dependencies(writes):
            return tf.identity(n)


def _pages(rows, row_bytes):
    """Distinct pages (PAGE_BYTES, counted from the table's first byte) holding the given rows."""
    import numpy as np

    rows = np.asarray(rows, dtype=np.int64)
    first = rows * row_bytes // PAGE_BYTES
    last = (rows * row_bytes + row_bytes - 1) // PAGE_BYTES
    return int(np.unique(np.concatenate([first, last])).size) if rows.size else 0


class RowLayout:
    """How the rows the run used lie in its tables: per table (each variable of an IdRowMap and its Adagrad
    accumulator, same rows), the distinct rows used, the pages holding them, and the pages the same rows would
    fill packed from the table's start. Read from the maps themselves: first-seen rows are 0..used-1 (packed
    by construction); hashed rows are the map's record of the rows it initialised (lazy fill only: a filled
    table with hashed rows keeps no record, so it is not measured). Built with the graph (its read ops must
    exist before a MonitoredTrainingSession finalizes the graph); read() runs them once, after training."""

    def __init__(self, graph=None):
        self.maps = (graph or tf.compat.v1.get_default_graph()).get_collection(_ALL_MAPS)
        self.counted = [m for m in self.maps if m.assign == "first-seen"]
        self.hashed = [m for m in self.maps if m.assign != "first-seen" and m.lazy]   # hashed and frequency rows
        self.fetches = ([m.counter.read_value() for m in self.counted], [m.table.export()[0] for m in self.hashed],
                        [m.promoted.read_value() if m.promote else tf.constant(0, tf.int64) for m in self.counted])

    def read(self, sess):
        import numpy as np

        out = {"source": "rtkit.workloads (the script's own id -> row maps)", "row_assign": _row_assign,
               "table_fill": _table_fill, "page_bytes": PAGE_BYTES, "tables": 0, "table_bytes": 0, "rows_used": None,
               "row_pages": None, "packed_pages": None, "not_measured": None}
        if not self.maps:
            out["not_measured"] = "no id -> row map in the graph"
            return out
        if any(m.assign != "first-seen" and not m.lazy for m in self.maps):
            out["not_measured"] = (f"{_row_assign} rows in tables filled at initialisation: the map keeps no record of the "
                                   "rows used (--table-fill lazy keeps one)")
        used, keys, promoted = sess.run(self.fetches)
        rows_of = {m: np.arange(min(int(n), m.capacity)) for m, n in zip(self.counted, used)}
        rows_of.update({m: np.unique(k) for m, k in zip(self.hashed, keys)})
        # promotion: rows live in the hot region's first `promoted` rows and in the back region from H (the rows
        # promoted out of it are counted there too: their pages held them)
        where = {m: np.concatenate([np.arange(int(p)), m.promote + np.arange(min(int(n), m.capacity - m.promote))])
                 for m, n, p in zip(self.counted, used, promoted) if m.promote}
        rows_used = row_pages = packed = 0
        for m in self.maps:
            for v in m.variables:
                row_bytes = int(v.shape[1]) * 4   # float32 rows
                out["tables"] += 2                # the variable and its accumulator
                out["table_bytes"] += 2 * m.capacity * row_bytes
                rows = rows_of.get(m)
                if rows is None:
                    continue
                rows_used += 2 * rows.size
                row_pages += 2 * _pages(where.get(m, rows), row_bytes)
                packed += 2 * _pages(np.arange(rows.size), row_bytes)
        if out["not_measured"] is None:
            out.update(rows_used=int(rows_used), row_pages=int(row_pages), packed_pages=int(packed))
        return out

    def report_promotion(self, sess):
        """One stderr line with the rows promotion moved (nothing where no map promotes)."""
        import sys

        maps = [(k, m) for k, m in enumerate(self.counted) if m.promote]
        if not maps:
            return
        promoted = sess.run(self.fetches[2])
        moved = sum(int(promoted[k]) for k, _ in maps)
        full = sum(int(promoted[k]) >= m.promote for k, m in maps)
        sys.stderr.write(f"rtkit-workload: promotion: {moved} rows moved to the hot regions ({maps[0][1].promote} rows "
                         f"a feature), {full} of {len(maps)} regions full\n")

    def write(self, sess):
        """read() into RTKIT_RUN_DIR/rows-<pid>.json under `rtkit run` (the report's rows section)."""
        import json
        import os

        run_dir = os.environ.get("RTKIT_RUN_DIR")
        if not run_dir or not self.maps:
            return
        path = os.path.join(run_dir, f"rows-{os.getpid()}.json")
        try:
            with open(path + ".tmp", "w") as fh:
                json.dump(self.read(sess), fh)
            os.replace(path + ".tmp", path)
        except OSError:
            pass   # the run directory went away: the report says the layout was not measured
