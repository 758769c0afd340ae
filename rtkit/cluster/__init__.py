# __init__.py -- rtkit on TensorFlow's parameter-server runtime: task specs, the local launcher, merged reports.
"""rtkit wraps TF's gRPC parameter-server runtime, it never replaces it.

- :mod:`rtkit.cluster.spec`: which task this process is (TF_CONFIG or the classic
  ``--job_name/--task_index/--ps_hosts/--worker_hosts`` flags), validated into one line on error.
- :mod:`rtkit.cluster.taskdir`: the cluster section of a task's report and its compact task.json (the
  directory itself, one per task and restart, is named by ``rtkit.rundir.make_task_dir``).
- :mod:`rtkit.cluster.launcher`: ``rtkit launch``, a local cluster of real TF servers on localhost.
- :mod:`rtkit.cluster.merge`, :mod:`~rtkit.cluster.render`, :mod:`~rtkit.cluster.show`: one report for a
  cluster folder (a row per task run, stragglers, timeline), as text, HTML or JSON, and cluster compare.
- :mod:`rtkit.cluster.bench`: the merge and launch benchmarks (docs/cluster.md).

The parameter servers' step signal runs inside the PS process, so it lives with the hooks
(``rtkit/hooks/ps_steps.py``).

Nothing here imports TensorFlow.
"""
