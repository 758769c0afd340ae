# user_table.py -- a TF1 training script of the ordinary kind: one randomly initialised embedding table, Adagrad, fed ids.
"""What a user's own script builds, for measuring tier mode on it (not rtkit's workload, no rtkit import in
the graph): ``tf.compat.v1.get_variable`` of [rows, dim] with a ``truncated_normal_initializer``, Adagrad
(its slot filled with a constant at initialisation), and per step a batch of power-law ids fed through a
placeholder; rows are the ids' frequency ranks (``--rows-from frequency``, a vocabulary sorted by frequency)
or a hash of them (``hashed``). Prints the seconds initialisation took and a loss line per step:

    rtkit run --profile capacity --set tier_pool_path=/tmp/p --set tier_resident_max=256M \\
        --set tier_dram_head=0 -- python -m rtkit.bench.user_table --rows 4000000 --dim 64
"""
import argparse
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.user_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=4096, help="ids a step (one per example)")
    p.add_argument("--exponent", type=float, default=0.9, help="the ids' power law")
    p.add_argument("--rows-from", choices=("frequency", "hashed"), default="frequency")
    args = p.parse_args(argv)
    if args.rows < 1 or args.dim < 1 or args.steps < 1 or args.batch < 1 or not 0 < args.exponent < 4:
        sys.stderr.write("user_table: --rows, --dim, --steps and --batch must be positive, --exponent in (0, 4)\n")
        return 2
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
    table = tf.compat.v1.get_variable("embedding", [args.rows, args.dim],
                                      initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=1))
    logit = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
    train = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss)
    rng = np.random.default_rng(0)
    hi = (args.rows + 1.0) ** (1.0 - args.exponent)
    with tf.compat.v1.Session() as sess:
        t0 = time.perf_counter()
        sess.run(tf.compat.v1.global_variables_initializer())
        sys.stderr.write(f"user_table: initialisation {time.perf_counter() - t0:.2f}s for "
                         f"{2 * args.rows * args.dim * 4 / (1 << 30):.2f} GiB of table and slot\n")
        for step in range(args.steps):
            rank = np.clip(np.floor((1.0 + rng.random(args.batch) * (hi - 1.0)) ** (1.0 / (1.0 - args.exponent))),
                           1, args.rows).astype(np.int64)
            rows = rank - 1 if args.rows_from == "frequency" else (rank * 2654435761) % args.rows
            value, _ = sess.run([loss, train], {ids: rows, labels: (rank % 3 == 0).astype(np.float32)})
            print(f"loss {step + 1} {value:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
