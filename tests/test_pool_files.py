# test_pool_files.py -- the user's pool files: tier mode keeps an existing one, an open pool is busy, `rtkit pmem` reads and checks them.
import json
import os
import subprocess

import pytest

from conftest import preload_env as _env, run_rtkit

pytestmark = pytest.mark.timeout(300)


def test_tier_keeps_an_existing_durable_pool(prm, pmem_build, tmp_path, monkeypatch):
    native_dir = prm
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_build)
    from rtkit.allocators import pmem
    pmem._load()
    path = str(tmp_path / "durable.pool")
    with pmem.Pool.create(path, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        h = pool.alloc(1000)
        pool.buffer(h, 1000)[:] = b"d" * 1000
    before = open(path, "rb").read()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.run([os.path.join(prm, "tests", "prmalloc_tier"), "plain"],
                          env=_env(prm, {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": path}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert open(path, "rb").read() == before
    assert len([ln for ln in proc.stderr.splitlines() if "RTKIT_TIER_POOL_PATH" in ln]) == 1


def test_pmem_small_things(pmem_build, tmp_path, monkeypatch):
    native_dir = pmem_build
    monkeypatch.setenv("RTKIT_LIB_DIR", native_dir)
    from rtkit.allocators import pmem
    pmem._load()
    path = str(tmp_path / "s.pool")
    with pmem.Pool.create(path, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        for n in (100, 200, 300, 150_000):
            pool.alloc(n)
        with pytest.raises(pmem.PoolBusyError) as err:
            pmem.Pool.open(path)
        assert "this process" in str(err.value)
    env = {"RTKIT_LIB_DIR": native_dir}
    info = json.loads(run_rtkit(["pmem", "info", "--json", path], env=env, check_rc=0).stdout)
    check = json.loads(run_rtkit(["pmem", "check", "--json", path], env=env, check_rc=0).stdout)
    assert info["records_allocated"] == check["records_allocated"] == 4
    junk = tmp_path / "j.pool"
    junk.write_bytes(b"x" * 8192)
    proc = run_rtkit(["pmem", "check", str(junk)], env=env)
    assert proc.returncode == 2 and proc.stderr.count(str(junk)) == 1, proc.stderr
