# data.py -- seeded synthetic Criteo-format TSV data set, generated once (vectorised) into a cache directory.
"""Synthetic Criteo-format data.

Each line: ``label \\t I1..I13 \\t C1..C26`` -- the label (0/1), 13 non-negative integer counts
(sometimes empty, as in Criteo) and 26 categorical features written as 8-char lowercase hex strings
(sometimes empty). Categorical ids follow a bounded Zipf law over a per-feature vocabulary whose
sizes mimic Criteo's (a few features with millions of ids, others with a handful). The label is a
Bernoulli draw from a logistic model of a few integer and categorical features, so a model can learn it.

Everything is a pure function of (rows, seed): chunk ``k`` is drawn from ``numpy.random.default_rng
([seed, k])`` with a fixed chunk size, so the file is byte-identical on every machine and every run.
The file is written to a temporary name in the cache folder and renamed into place, so an interrupted
generation never leaves a truncated file under the final name.

This module needs numpy only (never TensorFlow).
"""
import os
import sys
import time

import numpy as np

from rtkit import atomic

FORMAT_VERSION = 1          # part of the file name: bump when the generator's output changes
CHUNK_ROWS = 65536          # fixed: the chunk size is part of the seeding scheme
NUM_INT = 13
NUM_CAT = 26
INT_DIGITS = 6              # integer features are clipped to 0..999999 (Criteo's are heavy-tailed counts)

# Per-feature vocabulary sizes, after Criteo's (the largest are capped at 10M ids).
VOCAB_SIZES = (1460, 583, 10_000_000, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593,
               3_194, 27, 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105,
               142_572)
# Zipf exponents: the large vocabularies get a flatter law (many rare ids), small ones a steeper one.
ZIPF_EXPONENTS = tuple(1.05 if v > 1_000_000 else (1.15 if v > 10_000 else 1.3) for v in VOCAB_SIZES)
INT_MISSING = (0.0, 0.0, 0.2, 0.2, 0.02, 0.2, 0.04, 0.0, 0.04, 0.45, 0.04, 0.75, 0.2)
CAT_MISSING = tuple(0.3 if f in (18, 19, 21, 24, 25) else (0.03 if f in (2, 3, 11, 15) else 0.0)
                    for f in range(NUM_CAT))
# Features that drive the label (a learnable signal for the models).
LABEL_CATS = (0, 1, 4, 6, 13, 16)
LABEL_INTS = (0, 4, 7)
LABEL_BIAS = -1.3           # about 25% positives, like Criteo

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_ROW_WIDTH = 2 + NUM_INT * (INT_DIGITS + 1) + NUM_CAT * 9


def default_data_dir():
    """$XDG_CACHE_HOME/rtkit/criteo, else ~/.cache/rtkit/criteo."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rtkit", "criteo")


def dataset_name(rows, seed):
    return f"criteo-synth-v{FORMAT_VERSION}-r{int(rows)}-s{int(seed)}.tsv"


def _cat_ids(rng, n):
    """uint32 [n, 26] categorical ids (0 means missing) and the Zipf ranks (1 = most frequent)."""
    u = rng.random((n, NUM_CAT))
    vocab = np.asarray(VOCAB_SIZES, dtype=np.float64)
    a = np.asarray(ZIPF_EXPONENTS, dtype=np.float64)
    # Inverse CDF of a continuous power law on [1, V+1): cheap, vectorised, bounded by the vocabulary.
    hi = (vocab + 1.0) ** (1.0 - a)
    rank = np.floor((1.0 + u * (hi - 1.0)) ** (1.0 / (1.0 - a))).astype(np.uint64)
    rank = np.minimum(rank, vocab.astype(np.uint64))
    # Rank -> 32-bit id through a bijection (odd multiplier mod 2^32), salted per feature, so ids look
    # random but distinct ranks never collide within a feature.
    salt = (np.arange(NUM_CAT, dtype=np.uint64) * np.uint64(0x632BE5AB) + np.uint64(0x7F4A7C15))
    ids = (rank * np.uint64(2654435761) + salt) & np.uint64(0xFFFFFFFF)
    ids = np.where(ids == 0, np.uint64(1), ids)   # 0 is reserved for "missing"
    missing = rng.random((n, NUM_CAT)) < np.asarray(CAT_MISSING)
    ids[missing] = 0
    return ids.astype(np.uint32), rank


def _int_features(rng, n):
    """int64 [n, 13] heavy-tailed counts in 0..999999, -1 meaning missing."""
    mu = np.linspace(0.5, 4.0, NUM_INT)
    sigma = np.linspace(1.8, 1.0, NUM_INT)
    vals = np.floor(np.expm1(np.abs(rng.normal(mu, sigma, size=(n, NUM_INT)))))
    vals = np.clip(vals, 0, 10 ** INT_DIGITS - 1).astype(np.int64)
    missing = rng.random((n, NUM_INT)) < np.asarray(INT_MISSING)
    vals[missing] = -1
    return vals


def _labels(rng, ints, cats):
    """0/1 labels from a logistic model of a few features (per-id effects from a hash of the id)."""
    logit = np.full(ints.shape[0], LABEL_BIAS)
    for f in LABEL_CATS:
        h = (cats[:, f].astype(np.uint64) * np.uint64(0x2545F491)) >> np.uint64(7)
        effect = (h % np.uint64(9)).astype(np.float64) / 4.0 - 1.0          # in [-1, 1]
        logit += np.where(cats[:, f] == 0, 0.0, 0.9 * effect)
    for f in LABEL_INTS:
        x = np.log1p(np.maximum(ints[:, f], 0).astype(np.float64))
        logit += 0.35 * (x - 2.0) * (1 if f != 4 else -1)
    p = 1.0 / (1.0 + np.exp(-logit))
    return (rng.random(ints.shape[0]) < p).astype(np.uint8)


def _format_chunk(labels, ints, cats):
    """Lines of the chunk as bytes: one fixed-width byte matrix plus a mask of the bytes to keep."""
    n = labels.shape[0]
    mat = np.empty((n, _ROW_WIDTH), dtype=np.uint8)
    keep = np.ones((n, _ROW_WIDTH), dtype=bool)
    mat[:, 0] = labels + ord("0")
    mat[:, 1] = ord("\t")
    col = 2
    pow10 = 10 ** np.arange(INT_DIGITS - 1, -1, -1, dtype=np.int64)           # 100000 .. 1
    for f in range(NUM_INT):
        v = ints[:, f]
        vv = np.maximum(v, 0)
        digits = (vv[:, None] // pow10[None, :]) % 10
        ndig = np.where(vv > 0, np.floor(np.log10(np.maximum(vv, 1))).astype(np.int64) + 1, 1)
        ndig = np.where(v < 0, 0, ndig)                                         # missing: empty field
        mat[:, col:col + INT_DIGITS] = digits + ord("0")
        keep[:, col:col + INT_DIGITS] = np.arange(INT_DIGITS)[None, :] >= (INT_DIGITS - ndig)[:, None]
        mat[:, col + INT_DIGITS] = ord("\t")
        col += INT_DIGITS + 1
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    for f in range(NUM_CAT):
        c = cats[:, f]
        mat[:, col:col + 8] = _HEX[(c[:, None] >> shifts[None, :]) & 0xF]
        keep[:, col:col + 8] = (c != 0)[:, None]
        mat[:, col + 8] = ord("\t") if f < NUM_CAT - 1 else ord("\n")
        col += 9
    assert col == _ROW_WIDTH
    return mat[keep].tobytes()


def generate_chunk(seed, index, n):
    """Bytes of chunk `index` (n rows) of the data set for `seed`."""
    rng = np.random.default_rng([int(seed), int(index)])
    cats, _ = _cat_ids(rng, n)
    ints = _int_features(rng, n)
    labels = _labels(rng, ints, cats)
    return _format_chunk(labels, ints, cats)


class _Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a few lines otherwise)."""

    def __init__(self, total, label, enabled=True):
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.last_quarter = -1

    def update(self, done):
        if not self.enabled:
            return
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        text = f"{self.label} [{bar:<30}] {frac * 100:5.1f}% {time.monotonic() - self.t0:5.1f}s"
        if self.tty:
            sys.stderr.write("\r" + text)
            sys.stderr.flush()
        elif int(frac * 4) > self.last_quarter:
            self.last_quarter = int(frac * 4)
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def ensure_dataset(data_dir=None, rows=200_000, seed=0, progress=True):
    """Path of the data set for (rows, seed) under data_dir, generating it first if it is not there."""
    rows, seed = int(rows), int(seed)
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    data_dir = data_dir or default_data_dir()
    path = os.path.join(data_dir, dataset_name(rows, seed))
    if os.path.isfile(path):
        return path
    os.makedirs(data_dir, exist_ok=True)
    bar = _Progress(rows, f"rtkit-workloads: generating {rows} rows (seed {seed})", progress)
    try:
        with atomic.replacing(path, binary=True, fsync=True) as fh:  # readers see no file or the whole file
            done = 0
            for index in range((rows + CHUNK_ROWS - 1) // CHUNK_ROWS):
                n = min(CHUNK_ROWS, rows - done)
                fh.write(generate_chunk(seed, index, n))
                done += n
                bar.update(done)
    finally:
        bar.close()
    return path
