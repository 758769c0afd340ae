# prmalloc_steps.py -- runs the prmalloc_steps C program under the preloaded allocator and reads what it wrote.
import glob
import json
import os
import subprocess

from conftest import preload_env as _env
from rtkit.report import alloc_steps


def run_steps(native, run_dir, extra=None, args=("4", "1M"), timeout=30, umask=None):
    env = _env(native, {"RTKIT_RUN_DIR": str(run_dir), **(extra or {})})
    return subprocess.run([os.path.join(native, "tests", "prmalloc_steps"), *args], env=env, capture_output=True,
                          timeout=timeout, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def alloc_docs(run_dir):
    return [alloc_steps.load_file(f) for f in glob.glob(os.path.join(str(run_dir), "allocator-*.json"))]
