# user_table.py -- a TF1 training script of the ordinary kind: one randomly initialised embedding table, Adagrad, fed ids.
"""What a user's own script builds, for measuring tier mode on it (not rtkit's workload, no rtkit import in
the graph): ``tf.compat.v1.get_variable`` of [rows, dim] with a ``truncated_normal_initializer``, Adagrad
(its slot filled with a constant at initialisation), and per step a batch of power-law ids fed through a
placeholder; rows are the ids' frequency ranks (``--rows-from frequency``, a vocabulary sorted by frequency)
or a hash of them (``hashed``). A step is ``Session.run`` with a feed_dict (``--api run``), a callable of
``Session.make_callable`` with a feed list (``callable``: the ids are its positional arguments), or a
``MonitoredTrainingSession`` run with a feed_dict (``monitored``); the table is a resource variable, or a TF1
reference variable (``--variables reference``). Prints the seconds initialisation took and a
loss line per step. ``--floor BYTES`` trains nothing: it prints how many of a step's table and slot pages lie past
the hottest BYTES of them, chosen in hindsight over the whole run (what no resident budget of that size can keep
off the disk), to set a tier run's step time against the disk's random reads:

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
    p.add_argument("--api", choices=("run", "callable", "monitored"), default="run",
                   help="how a step is run: Session.run, a make_callable callable, MonitoredTrainingSession")
    p.add_argument("--variables", choices=("resource", "reference"), default="resource",
                   help="the table's kind: TF2's resource variables, or TF1's reference variables (what "
                        "tf.compat.v1.disable_v2_behavior() makes)")
    p.add_argument("--floor", metavar="BYTES", help="print the pages a step needs past a resident budget of BYTES "
                   "(e.g. 256M) at best, and train nothing")
    args = p.parse_args(argv)
    if args.rows < 1 or args.dim < 1 or args.steps < 1 or args.batch < 1 or not 0 < args.exponent < 4:
        sys.stderr.write("user_table: --rows, --dim, --steps and --batch must be positive, --exponent in (0, 4)\n")
        return 2
    import numpy as np

    if args.floor is not None:
        return print_floor(args, np)
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
    table = tf.compat.v1.get_variable("embedding", [args.rows, args.dim],
                                      initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=1),
                                      use_resource=args.variables == "resource")
    logit = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
    train = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss)
    draw = id_stream(args, np)
    t0 = time.perf_counter()
    if args.api == "monitored":   # it runs the initializer itself, at creation
        sess = tf.compat.v1.train.MonitoredTrainingSession()
    else:
        sess = tf.compat.v1.Session()
        sess.run(tf.compat.v1.global_variables_initializer())
    sys.stderr.write(f"user_table: initialisation {time.perf_counter() - t0:.2f}s for "
                     f"{2 * args.rows * args.dim * 4 / (1 << 30):.2f} GiB of table and slot\n")
    call = sess.make_callable([loss, train], feed_list=[ids, labels]) if args.api == "callable" else None
    with sess:
        for step in range(args.steps):
            rows, label = draw()
            value, _ = call(rows, label) if call is not None else sess.run([loss, train], {ids: rows, labels: label})
            print(f"loss {step + 1} {value:.6f}", flush=True)
    return 0


def id_stream(args, np):
    """A callable giving each step's (rows, labels): the same stream for every run of the same arguments."""
    rng = np.random.default_rng(0)
    hi = (args.rows + 1.0) ** (1.0 - args.exponent)

    def draw():
        rank = np.clip(np.floor((1.0 + rng.random(args.batch) * (hi - 1.0)) ** (1.0 / (1.0 - args.exponent))),
                       1, args.rows).astype(np.int64)
        rows = rank - 1 if args.rows_from == "frequency" else (rank * 2654435761) % args.rows
        return rows, (rank % 3 == 0).astype(np.float32)
    return draw


def floor_pages(args, budget_bytes, np):
    """(pages a step touches, pages a step needs past the budget), medians over the run, table and slot together.
    The budget holds the same pages of table and slot (a row's slot lies at its row): the most used ones over the
    whole run, a fixed choice in hindsight; under independent draws no policy keeps much more of a step's pages."""
    rows_per_page = max(1, 4096 // (args.dim * 4))
    draw = id_stream(args, np)
    steps = [np.unique(draw()[0] // rows_per_page) for _ in range(args.steps)]
    pages, uses = np.unique(np.concatenate(steps), return_counts=True)
    kept = pages[np.argsort(-uses, kind="stable")[: budget_bytes // 4096 // 2]]
    past = [2 * int(np.count_nonzero(~np.isin(s, kept, assume_unique=True))) for s in steps]
    return float(np.median([2 * len(s) for s in steps])), float(np.median(past))


def print_floor(args, np):
    from rtkit.config import parse_size

    try:
        budget = parse_size(args.floor)
    except ValueError as e:
        sys.stderr.write(f"user_table: --floor {args.floor!r}: {e}\n")
        return 2
    touched, past = floor_pages(args, budget, np)
    print(f"floor: a step touches {touched:.0f} pages of table and slot (median of {args.steps} steps); at best "
          f"{past:.0f} of them lie past the hottest {args.floor} (the most used pages over the run, in hindsight): "
          f"random reads no resident budget of {args.floor} saves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
