# zipf.py -- a data set generated on the fly in the input graph: power-law ids over tens of millions of distinct ids.
"""``--ids zipf``: batches made by the input pipeline itself, no file, for the capacity benchmark.

The file data set (:mod:`rtkit.workloads.data`) has at most ``--rows`` lines, so a run meets at most that
many distinct ids per feature, however long it trains. Here batch ``k`` is a pure function of (seed, k):
``Dataset.range(...).map`` draws it with stateless random ops, so any number of steps costs no disk and no
generation time up front, and a run is the same on every start.

Per example and per categorical feature, the id's popularity rank follows a bounded continuous power law
on ``[1, distinct]`` with exponent ``exponent`` (inverse CDF of one uniform, as data.py's ``_cat_ids``);
the rank becomes an id through splitmix64's finaliser (a bijection on 64 bits) salted per feature and
masked to 62 bits, so ids look random, the features' ids differ, and distinct ranks practically never
collide. All 26 features use the same law, so the distinct ids a run meets grow with the draws
(``expected_distinct``): with exponent 0.9 over 50M ids, 4M draws meet about 2M distinct ids, and the
1% most used of them take about a third of the draws. The 13 dense features are log-normal counts and
the label a Bernoulli draw from a logistic model of a few ids and dense features (learnable, as data.py's).

Tables of unequal use (``--feature-distinct-skew K``, :func:`feature_distinct`): feature ``f`` draws from
``distinct / K ** (f / 25)`` distinct ids (rounded, at least 1), so feature 0 draws from ``distinct`` and the
last feature from ``distinct / K``, geometrically in between; every feature still draws one id per example and
every table keeps its size, so the tables of the last features are hot on few rows and cold on the rest.
K = 1 (the default) is the law above, bit for bit.

The batch has the shape of :func:`rtkit.workloads.inputs.parse`'s: ``dense`` float32 [B, 13],
``cat`` int64 [B, 26], ``label`` float32 [B, 1].
"""
import numpy as np

from rtkit.workloads.data import LABEL_BIAS, LABEL_CATS, LABEL_INTS, NUM_CAT, NUM_INT

DEFAULT_DISTINCT = 50_000_000
DEFAULT_EXPONENT = 0.9
_MASK62 = (1 << 62) - 1


def feature_distinct(distinct, skew=1.0):
    """Distinct ids per feature: `distinct` (an int, every feature alike) where skew == 1, else a tuple of
    NUM_CAT ints, feature f's round(distinct / skew ** (f / (NUM_CAT - 1))), at least 1."""
    distinct, skew = int(distinct), float(skew)
    if not skew >= 1.0:
        raise ValueError(f"zipf ids: the feature skew must be >= 1, got {skew}")
    if skew == 1.0:
        return distinct
    return tuple(max(1, int(round(distinct / skew ** (f / (NUM_CAT - 1))))) for f in range(NUM_CAT))


def per_feature(distinct):
    """`distinct` (an int or NUM_CAT ints, as feature_distinct gives) as a tuple of NUM_CAT ints."""
    if isinstance(distinct, (tuple, list)):
        if len(distinct) != NUM_CAT:
            raise ValueError(f"zipf ids: {NUM_CAT} distinct counts expected, got {len(distinct)}")
        return tuple(int(d) for d in distinct)
    return (int(distinct),) * NUM_CAT


def expected_distinct_all(draws, distinct=DEFAULT_DISTINCT, exponent=DEFAULT_EXPONENT):
    """Expected distinct ids over all NUM_CAT features after `draws` draws each (distinct: an int or per feature)."""
    return sum(expected_distinct(draws, d, exponent) for d in per_feature(distinct))


def _ranks_np(u, distinct, exponent):
    """Ranks in [1, distinct] of uniforms u (numpy; the same formula as the graph's)."""
    if abs(exponent - 1.0) < 1e-9:
        r = np.floor(np.exp(u * np.log(distinct + 1.0)))
    else:
        hi = (distinct + 1.0) ** (1.0 - exponent)
        r = np.floor((1.0 + u * (hi - 1.0)) ** (1.0 / (1.0 - exponent)))
    return np.clip(r, 1, distinct).astype(np.int64)


def _bands(distinct, exponent):
    """The law over log-spaced rank bands: each band's width and the mass of each of its ranks (the band's mass
    spread evenly), so that sums over ranks cost 4000 terms for any size."""
    edges = np.unique(np.geomspace(1, distinct + 1, 4000).astype(np.int64))
    lo, hi = edges[:-1].astype(np.float64), edges[1:].astype(np.float64)

    def cdf(x):   # P(rank < x) of the continuous law, x in [1, distinct + 1]
        if abs(exponent - 1.0) < 1e-9:
            return np.log(x) / np.log(distinct + 1.0)
        return (x ** (1.0 - exponent) - 1.0) / ((distinct + 1.0) ** (1.0 - exponent) - 1.0)

    width = hi - lo
    return width, np.minimum((cdf(hi) - cdf(lo)) / width, 1 - 1e-15)


def expected_distinct(draws, distinct=DEFAULT_DISTINCT, exponent=DEFAULT_EXPONENT):
    """Expected distinct ids per feature after `draws` draws: sum over ranks of 1 - (1 - p_r)^draws, with
    p_r the law's mass on rank r."""
    width, p = _bands(distinct, exponent)
    return float(np.sum(width * -np.expm1(draws * np.log1p(-p))))


def expected_repeated(draws, distinct=DEFAULT_DISTINCT, exponent=DEFAULT_EXPONENT):
    """Expected ids per feature drawn at least twice in `draws` draws (an upper bound of the rows a promoting
    IdRowMap moves: two draws in one batch are one use): sum over ranks of 1 - (1 - p)^n - n p (1 - p)^(n - 1)."""
    width, p = _bands(distinct, exponent)
    none = np.exp(draws * np.log1p(-p))
    once = draws * p * np.exp((draws - 1) * np.log1p(-p))
    return float(np.sum(width * np.clip(1.0 - none - once, 0.0, 1.0)))


def expected_repeated_all(draws, distinct=DEFAULT_DISTINCT, exponent=DEFAULT_EXPONENT, at_most=None):
    """expected_repeated over all NUM_CAT features (distinct: an int or per feature), each at most `at_most` (the
    rows a promoting IdRowMap's hot region holds)."""
    return sum(min(expected_repeated(draws, d, exponent), float("inf") if at_most is None else at_most)
               for d in per_feature(distinct))


def _salt(feature, seed):
    """The 64-bit salt xored into feature `feature`'s ranks before mixing."""
    return (0x632BE5AB * (feature + 1) + 0x7F4A7C15 + int(seed) * 0x9E3779B97F4A7C15) & (2**64 - 1)


def _unmix(z):
    """The inverse of ev._mix (splitmix64's finaliser) on uint64: each xorshift undone by xoring in the
    value's shifts by s, 2s, ...; each multiply by the odd constant's inverse modulo 2^64."""
    import tensorflow as tf

    from rtkit.workloads.ev import _MIX1, _MIX2

    def unshift(y, s):
        x, t = y, tf.bitwise.right_shift(y, tf.constant(s, tf.uint64))
        for _ in range(1, 64 // s + 1):
            x = tf.bitwise.bitwise_xor(x, t)
            t = tf.bitwise.right_shift(t, tf.constant(s, tf.uint64))
        return x

    z = unshift(z, 31) * tf.constant(pow(_MIX2, -1, 2**64), tf.uint64)
    z = unshift(z, 27) * tf.constant(pow(_MIX1, -1, 2**64), tf.uint64)
    return unshift(z, 30)


def rank_of(ids, feature, seed=0, distinct=DEFAULT_DISTINCT):
    """int64 popularity ranks (1: the most frequent id) of feature `feature`'s ids as make_dataset(seed,
    distinct) draws them, 0 for an id it never draws: the id is the mixed (rank xor salt) with its top 2 bits
    cleared, so each of the 4 top-bit completions is unmixed and the one giving a rank in [1, distinct] kept
    (two that both do: odds of about distinct / 2^62)."""
    import tensorflow as tf

    low = tf.bitcast(tf.reshape(tf.cast(ids, tf.int64), [-1, 1]), tf.uint64)
    tops = tf.constant([[k << 62 for k in range(4)]], tf.uint64)
    cand = tf.bitwise.bitwise_xor(_unmix(tf.bitwise.bitwise_or(low, tops)), tf.constant(_salt(feature, seed), tf.uint64))
    ok = tf.logical_and(cand >= 1, cand <= tf.constant(int(distinct), tf.uint64))
    ranks = tf.reduce_max(tf.where(ok, cand, tf.zeros_like(cand)), axis=1)
    return tf.reshape(tf.cast(ranks, tf.int64), tf.shape(ids))


def make_dataset(batch_size, seed=0, distinct=DEFAULT_DISTINCT, exponent=DEFAULT_EXPONENT, shard=None):
    """tf.data.Dataset of parsed batches, endless; batch k depends on (seed, k) only. distinct: an int (every
    feature alike) or NUM_CAT ints, one per feature (feature_distinct).
    shard=(count, index): the batches index, index + count, ... (a cluster worker's own part)."""
    import tensorflow as tf

    from rtkit.workloads.ev import _mix   # splitmix64's finaliser on uint64

    exponent, b = float(exponent), int(batch_size)
    each = per_feature(distinct)
    if min(each) < 1 or not 0.0 < exponent < 4.0:
        raise ValueError(f"zipf ids: distinct must be >= 1 and 0 < exponent < 4, got {distinct}, {exponent}")
    if len(set(each)) == 1:
        distinct = float(each[0])   # a scalar: the graph of every feature alike, as before the skew
    else:
        distinct = tf.constant([[float(d) for d in each]], tf.float64)   # [1, NUM_CAT], broadcast over the batch
    n_plus_1 = distinct + 1.0
    salts = tf.constant([_salt(f, seed) for f in range(NUM_CAT)], tf.uint64)

    def batch(k):
        s = tf.stack([tf.constant(int(seed), tf.int64), k])
        u = tf.random.stateless_uniform([b, NUM_CAT], seed=s, dtype=tf.float64)
        if abs(exponent - 1.0) < 1e-9:
            r = tf.floor(tf.exp(u * (np.log(n_plus_1) if isinstance(n_plus_1, float) else tf.math.log(n_plus_1))))
        else:
            hi = n_plus_1 ** (1.0 - exponent)
            r = tf.floor(tf.pow(1.0 + u * (hi - 1.0), 1.0 / (1.0 - exponent)))
        rank = tf.cast(tf.clip_by_value(r, 1.0, distinct), tf.uint64)
        mixed = _mix(tf.bitwise.bitwise_xor(rank, tf.reshape(salts, [1, NUM_CAT])))
        cat = tf.bitwise.bitwise_and(tf.bitcast(mixed, tf.int64), tf.constant(_MASK62, tf.int64))
        mu = tf.constant(np.linspace(0.5, 4.0, NUM_INT), tf.float32)
        sigma = tf.constant(np.linspace(1.8, 1.0, NUM_INT), tf.float32)
        counts = tf.floor(tf.math.expm1(tf.abs(
            tf.random.stateless_normal([b, NUM_INT], seed=s + [0, 1 << 40]) * sigma + mu)))
        counts = tf.clip_by_value(counts, 0.0, 999999.0)
        dense = tf.math.log1p(counts)
        logit = tf.fill([b], tf.constant(LABEL_BIAS, tf.float64))
        for f in LABEL_CATS:   # a per-id effect in [-1, 1] from a hash of the id
            h = tf.bitwise.right_shift(tf.bitcast(_mix(tf.bitcast(cat[:, f], tf.uint64)), tf.int64),
                                       tf.constant(8, tf.int64))
            logit += 0.9 * (tf.cast(tf.math.floormod(h, 9), tf.float64) / 4.0 - 1.0)
        for f in LABEL_INTS:
            logit += 0.35 * (tf.cast(dense[:, f], tf.float64) - 2.0) * (1 if f != 4 else -1)
        p = tf.sigmoid(logit)
        label = tf.cast(tf.random.stateless_uniform([b], seed=s + [0, 2 << 40], dtype=tf.float64) < p, tf.float32)
        return {"dense": dense, "cat": cat, "label": tf.reshape(label, [-1, 1])}

    ds = tf.data.Dataset.range(1 << 62)
    if shard:
        ds = ds.shard(*shard)
    return ds.map(batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(1)   # map keeps the order
