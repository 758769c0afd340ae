# __main__.py -- `python -m rtkit.workloads MODEL [options]`: run one bundled workload and print its summary line.
import argparse
import sys

from rtkit.workloads import APIS, MODELS

DEFAULTS = dict(steps=200, batch=2048, rows=200_000, seed=0, emb_dim=16)


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _table_rows(table_gb, widths, features):
    """Rows per feature so that `features` tables of these row widths (floats), each with its Adagrad
    accumulator (2 copies in all), take `table_gb` GiB."""
    return max(1, int(float(table_gb) * (1 << 30) // (4 * sum(widths) * 2 * features)))


def _table_room_problem(table_gb, args=None, widths=()):
    """The one line saying tables of `table_gb` GiB cannot be held here (memory plus tier mode's pool, when
    `rtkit run` set one up), or None. Eager tables are filled whole; lazy ones as used, but hashed rows may touch
    every page: only lazy first-seen rows of power-law ids need no more than the rows the run's steps use
    (expected), which is what lets the capacity bench run a table past DRAM in DRAM for the steps that fit."""
    from rtkit import config, pool_room

    need = float(table_gb) * (1 << 30)
    if args is not None and args.table_fill == "lazy" and args.row_assign == "first-seen" and args.ids == "zipf":
        from rtkit.workloads import zipf

        distinct, exponent = _zipf_ids(args)
        draws, hot = args.steps * args.batch, getattr(args, "promote_hot_rows", None) or 0
        used = sum(min(zipf.expected_distinct(draws, d, exponent), args.capacity) for d in zipf.per_feature(distinct))
        used += zipf.expected_repeated_all(draws, distinct, exponent, at_most=hot)   # promoted rows: second copies
        need = min(need, used * 4 * sum(widths) * 2)
    mem = pool_room.mem_total() or 0
    pool = config.from_child_env("tier_pool_size") if config.from_child_env("tier_pool_path") else 0
    if not mem or need <= mem + pool:
        return None
    where = f"{mem / (1 << 30):.1f}G of memory" + (f" and a {pool / (1 << 30):.1f}G pool (tier_pool_size)" if pool else "")
    return (f"rtkit.workloads: --table-gb {table_gb:g} does not fit: this machine has {where}; lower --table-gb"
            + (" or raise tier_pool_size" if pool else " or train under tier mode (rtkit run --profile capacity)"))


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m rtkit.workloads",
        description="Train a bundled EmbeddingVariable-style workload on synthetic Criteo data.")
    p.add_argument("model", choices=MODELS)
    p.add_argument("--api", choices=APIS + ("pss",), default="session",
                   help="tf.compat.v1 Session, MonitoredTrainingSession, Keras fit or tf2 (a tf.function + "
                        "GradientTape custom loop) (default session); pss: a TF2 ParameterServerStrategy job "
                        "(cluster tasks from TF_CONFIG, e.g. under `rtkit launch --ps 1 --workers 2 --chief`)")
    p.add_argument("--input", choices=("prefetch", "legacy"), default="prefetch",
                   help="prefetch: parsing in Dataset.map with prefetch (default); legacy: CSV lines parsed "
                        "in the graph after get_next, no prefetch (a TF1-style script)")
    p.add_argument("--input-latency-ms", type=float, default=0.0, metavar="MS",
                   help="legacy input: extra read latency per batch, a stand-in for remote storage")
    p.add_argument("--steps", type=_positive, default=DEFAULTS["steps"])
    p.add_argument("--batch", type=_positive, default=DEFAULTS["batch"])
    p.add_argument("--rows", type=_positive, default=DEFAULTS["rows"], help="rows of the data set")
    p.add_argument("--epochs", type=_positive, default=None,
                   help="passes over the data (default: repeat forever; a run may then end early)")
    p.add_argument("--data-dir", default=None,
                   help="data cache folder (default $XDG_CACHE_HOME/rtkit/criteo or ~/.cache/rtkit/criteo)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--emb-dim", type=_positive, default=DEFAULTS["emb_dim"])
    p.add_argument("--capacity", type=_positive, default=None,
                   help="embedding rows per feature; more distinct ids wrap onto earlier rows "
                        "(default 131072, keras 16384)")
    p.add_argument("--table-gb", type=float, default=None,
                   help="size the embedding tables: GiB of tables plus their Adagrad slots in all "
                        "(sets --capacity; graph APIs)")
    p.add_argument("--row-assign", choices=("first-seen", "frequency", "hashed"), default="first-seen",
                   help="id -> row: first-seen order keeps the rows in use packed (default); frequency puts the "
                        "most frequent id at row 0, the next at row 1, ... (a vocabulary adapted on the data; "
                        "--ids zipf, whose ranks are known); hashed scatters them")
    p.add_argument("--table-fill", choices=("eager", "lazy"), default="eager",
                   help="eager: tables filled at initialisation, as tf.Variable tables are (default); lazy: a row "
                        "gets its value when first used, as DeepRec's EmbeddingVariable (the capacity benchmark's)")
    p.add_argument("--ids", choices=("file", "zipf"), default="file",
                   help="file: the cached synthetic Criteo file of --rows lines (default); zipf: batches drawn in the "
                        "input graph from a power law over --distinct ids per feature (no file; graph APIs)")
    p.add_argument("--distinct", type=_positive, default=None,
                   help="--ids zipf: distinct ids per feature (default 50000000)")
    p.add_argument("--zipf-exponent", type=float, default=None,
                   help="--ids zipf: the power law's exponent (default 0.9; larger: a smaller hot head)")
    p.add_argument("--feature-distinct-skew", type=float, default=None, metavar="K",
                   help="--ids zipf: tables of unequal use. Feature f draws from --distinct / K^(f/25) distinct ids: "
                        "the first feature from --distinct, the last from --distinct / K, geometrically between; "
                        "tables keep their size, so the last features' tables are used on few rows (default 1: "
                        "every feature alike)")
    p.add_argument("--compact-steps", type=_positive, default=None,
                   help="every N steps, move the most used rows to the front of each table (first-seen rows, "
                        "graph APIs; rtkit.workloads.ev.Compactor)")
    p.add_argument("--compact-hot-rows", type=_positive, default=None,
                   help="with --compact-steps: rows per feature kept for the hot rows (default capacity / 8)")
    p.add_argument("--compact-max-swaps", type=_non_negative, default=65536,
                   help="with --compact-steps: rows per feature moved in one pass at most (default 65536; 0: none, "
                        "only the access counts and the hot region's share, a baseline)")
    p.add_argument("--promote-hot-rows", type=_positive, default=None, metavar="N",
                   help="first-seen lazily filled tables: keep the first N rows of each for ids met a second time, "
                        "moved there at that step (new ids' rows start at N): rows used again share pages, apart "
                        "from the rows used once (rtkit.workloads.ev.IdRowMap; loss-neutral)")
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument("--print-losses", action="store_true", help="print `loss <step> <value>` per step")
    p.add_argument("--summary-dir", default=None, metavar="DIR",
                   help="write each step's loss as the TensorBoard scalar `loss` into DIR (graph APIs)")
    p.add_argument("--threads-inter", type=_positive, default=None, help="ConfigProto inter-op threads")
    p.add_argument("--threads-intra", type=_positive, default=None, help="ConfigProto intra-op threads")
    p.add_argument("--grappler-arithmetic", choices=("on", "off"), default="on",
                   help="Grappler's arithmetic optimizer in the session (graph APIs; default on). off: staged and "
                        "unstaged steps give bit-identical parameters (its float-sum rewrites need shapes a staged "
                        "step's executor does not have)")
    p.add_argument("--print-params-digest", action="store_true",
                   help="print `params <sha256>` of every variable (slots included) after the last step (--api session)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while generating data")
    g = p.add_argument_group("cluster mode", "a task of a TF parameter-server cluster, from TF_CONFIG or these "
                             "classic flags (see rtkit.workloads.distributed)")
    for flag in ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts", "--chief_hosts"):
        g.add_argument(flag, default=None)
    g.add_argument("--checkpoint-dir", default=None, help="the chief writes checkpoints here (and resumes from them)")
    g.add_argument("--checkpoint-secs", type=_positive, default=600,
                   help="the chief checkpoints every N seconds and when it ends (default 600)")
    g.add_argument("--checkpoint-steps", type=_positive, default=None,
                   help="the chief checkpoints every N global steps instead of by time")
    return p


def _cluster_task(argv):
    """The cluster task this process is (TF_CONFIG or the flags), None outside a cluster."""
    import os

    from rtkit.cluster import spec

    try:
        return spec.detect(os.environ, sys.argv[1:] if argv is None else argv)
    except spec.ClusterError as exc:
        sys.stderr.write(f"{exc}\n")
        raise SystemExit(2)


def _run_pss(args, task):
    if task is None or task.source != "TF_CONFIG" or task.role not in ("chief", "worker", "ps"):
        sys.stderr.write("rtkit.workloads: --api pss runs as a task of a ParameterServerStrategy cluster: set "
                         "TF_CONFIG with ps, worker and chief tasks (e.g. `rtkit launch --ps 1 --workers 2 --chief`)\n")
        return 2
    from rtkit.workloads import pss  # imports TensorFlow

    result = pss.run(model=args.model, steps=args.steps, batch=args.batch, rows=args.rows, data_dir=args.data_dir,
                     seed=args.seed, emb_dim=args.emb_dim, capacity=args.capacity or pss.DEFAULT_CAPACITY,
                     learning_rate=args.learning_rate, print_losses=args.print_losses, progress=not args.no_progress)
    if result is not None:
        sys.stdout.write(pss.summary_line(result) + "\n")
        sys.stdout.flush()
    return 0


def _zipf_ids(args):
    from rtkit.workloads import zipf

    if args.ids != "zipf":
        return None
    distinct = zipf.feature_distinct(args.distinct or zipf.DEFAULT_DISTINCT, args.feature_distinct_skew or 1.0)
    return distinct, zipf.DEFAULT_EXPONENT if args.zipf_exponent is None else args.zipf_exponent


def _rank_of(args):
    """frequency rows: (ids, feature) -> the ids' frequency ranks under the zipf law the run draws from."""
    if args.row_assign != "frequency":
        return None
    from rtkit.workloads import zipf

    distinct = zipf.per_feature(_zipf_ids(args)[0])
    return lambda ids, feature: zipf.rank_of(ids, feature, args.seed, distinct[feature])


def _compact(args):
    if not args.compact_steps:
        return None
    from rtkit.workloads import train

    capacity = args.capacity or train.GRAPH_CAPACITY
    hot = args.compact_hot_rows or max(1, capacity // 8)
    return {"every": args.compact_steps, "hot_rows": min(hot, capacity), "max_swaps": args.compact_max_swaps}


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.table_gb is not None:
        if args.capacity is not None or args.api in ("keras", "tf2") or args.table_gb <= 0:
            parser.error("--table-gb needs a graph API (session, monitored), a positive size and no --capacity")
        from rtkit.workloads.data import NUM_CAT
        widths = (args.emb_dim, 1) if args.model == "wdl" else (args.emb_dim,)
        args.capacity = _table_rows(args.table_gb, widths, NUM_CAT)
        problem = _table_room_problem(args.table_gb, args, widths)
        if problem:
            sys.stderr.write(problem + "\n")
            return 2
    if args.ids != "zipf" and (args.distinct is not None or args.zipf_exponent is not None
                               or args.feature_distinct_skew is not None):
        parser.error("--distinct, --zipf-exponent and --feature-distinct-skew go with --ids zipf")
    if args.feature_distinct_skew is not None and not 1.0 <= args.feature_distinct_skew < float("inf"):
        parser.error("--feature-distinct-skew: expected a number >= 1 (1: every feature alike), e.g. 1000")
    if args.zipf_exponent is not None and not 0.0 < args.zipf_exponent < 4.0:
        parser.error("--zipf-exponent: expected a number in (0, 4), e.g. 0.9")
    if (args.ids == "zipf" or args.compact_steps) and (args.api in ("keras", "tf2") or args.input != "prefetch"):
        parser.error("--ids zipf and --compact-steps need a graph API (session, monitored) and --input prefetch")
    if args.row_assign == "frequency" and args.ids != "zipf":
        parser.error("--row-assign frequency needs --ids zipf (the ids' frequency ranks come from its law)")
    if args.compact_steps and args.row_assign != "first-seen":
        parser.error("--compact-steps moves first-seen rows; drop it or use --row-assign first-seen")
    if args.compact_hot_rows is not None and not args.compact_steps:
        parser.error("--compact-hot-rows goes with --compact-steps")
    if args.promote_hot_rows and (args.row_assign != "first-seen" or args.table_fill != "lazy" or args.compact_steps
                                  or args.api not in ("session", "monitored")):
        parser.error("--promote-hot-rows moves first-seen rows of lazily filled tables (--table-fill lazy), in a "
                     "graph API (session, monitored), without --compact-steps")
    if args.promote_hot_rows and args.capacity and args.promote_hot_rows >= args.capacity:
        parser.error(f"--promote-hot-rows {args.promote_hot_rows} leaves none of the tables' {args.capacity} rows for "
                     "new ids: fewer hot rows, or larger tables (--capacity, --table-gb)")
    if args.summary_dir and (args.api not in ("session", "monitored") or _cluster_task(argv) is not None):
        parser.error("--summary-dir: a single-process graph API (--api session or monitored)")
    if args.grappler_arithmetic == "off" and (args.api not in ("session", "monitored") or _cluster_task(argv) is not None):
        parser.error("--grappler-arithmetic off: a single-process graph API (--api session or monitored)")
    if args.print_params_digest and (args.api != "session" or _cluster_task(argv) is not None):
        parser.error("--print-params-digest: a single-process --api session run")
    if args.input_latency_ms < 0 or (args.input_latency_ms and args.input != "legacy"):
        parser.error("--input-latency-ms: a non-negative latency, with --input legacy only")
    from rtkit.workloads import data

    task = _cluster_task(argv)
    if task is not None and (args.ids == "zipf" or args.compact_steps):
        sys.stderr.write("rtkit.workloads: --ids zipf and --compact-steps are for one process, not a cluster task\n")
        return 2
    try:   # before TensorFlow is imported: a bad --data-dir is one line, not a traceback
        if (task is None or task.role != "ps") and args.ids == "file":
            data.ensure_dataset(args.data_dir, args.rows, args.seed, progress=not args.no_progress)
    except OSError as exc:
        sys.stderr.write(f"rtkit.workloads: cannot create the data set in "
                         f"{args.data_dir or data.default_data_dir()}: {exc}\n")
        return 2
    if args.api == "pss":
        return _run_pss(args, task)
    from rtkit.workloads import ev  # imports TensorFlow

    ev.set_row_assign(args.row_assign, _rank_of(args))
    ev.set_table_fill(args.table_fill)
    ev.set_compaction(bool(args.compact_steps))
    ev.set_promotion(args.promote_hot_rows or 0)
    if task is not None:
        from rtkit.workloads import distributed  # imports TensorFlow

        result = distributed.run(task, model=args.model, steps=args.steps, batch=args.batch, rows=args.rows,
                                 data_dir=args.data_dir, seed=args.seed, emb_dim=args.emb_dim,
                                 capacity=args.capacity, learning_rate=args.learning_rate,
                                 threads_inter=args.threads_inter, threads_intra=args.threads_intra,
                                 print_losses=args.print_losses, checkpoint_dir=args.checkpoint_dir,
                                 checkpoint_secs=args.checkpoint_secs,
                                 checkpoint_steps=args.checkpoint_steps, progress=not args.no_progress)
        sys.stdout.write(distributed.summary_line(result) + "\n")
        sys.stdout.flush()
        return 0
    from rtkit.workloads import train  # imports TensorFlow

    result = train.run(model=args.model, api=args.api, steps=args.steps, batch=args.batch,
                       rows=args.rows, data_dir=args.data_dir, seed=args.seed, emb_dim=args.emb_dim,
                       capacity=args.capacity, epochs=args.epochs, learning_rate=args.learning_rate,
                       threads_inter=args.threads_inter, threads_intra=args.threads_intra,
                       print_losses=args.print_losses, progress=not args.no_progress,
                       input_mode=args.input, input_latency_ms=args.input_latency_ms,
                       zipf_ids=_zipf_ids(args), compact=_compact(args), summary_dir=args.summary_dir,
                       grappler_arithmetic=args.grappler_arithmetic == "on",
                       print_params=args.print_params_digest)
    sys.stdout.write(train.summary_line(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
