# test_pmem.py -- the PMEM segment allocator: C test programs, Python API, bad input, crash recovery, CLI.
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import REPO, SHM, run_rtkit



@pytest.fixture
def pm(pmem_build, monkeypatch):
    """The bindings over the private build. RTKIT_LIB_DIR is set only for this test (a session-wide value
    would hide librtkit_malloc.so from later `rtkit run` tests); the library, once loaded, stays loaded."""
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_build)  # also reaches the child of test_kill9_python_child
    from rtkit.allocators import pmem
    pmem._load()
    return pmem




@pytest.mark.parametrize("program,args", [("pmem_basic", []), ("pmem_stress", []), ("pmem_crash", ["120"])])
def test_c_programs(pmem_build, program, args, tmp_path):
    exe = os.path.join(pmem_build, "tests", program)
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"{program} failed:\n{proc.stderr[-4000:]}"
    assert "ok" in proc.stderr


def test_crash_trials_on_disk(pmem_build, tmp_path):
    """The same kill -9 trials with the pool on an ordinary file system (msync persistence)."""
    exe = os.path.join(pmem_build, "tests", "pmem_crash")
    proc = subprocess.run([exe, "20", str(tmp_path), "80"], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_cdef_generated_from_header(pm, pmem_build):
    """The bindings declare what the header beside the loaded library says: every function it declares is
    callable, and the Python error codes are the header's enum values."""
    from rtkit.allocators import _pmem_cdef
    ffi, lib = pm._load()
    header = open(os.path.join(REPO, "allocators", "include", "rtkit", "pmem.h")).read()
    assert open(os.path.join(pmem_build, "librtkit_pmem.h")).read() == header
    cdef = _pmem_cdef.cdef_from_header(header)
    assert "#" not in cdef and "/*" not in cdef and "extern" not in cdef
    functions = re.findall(r"\b(rtkit_pmem_\w+)\(", cdef)
    assert len(functions) > 20 and all(callable(getattr(lib, f)) for f in functions)
    for name in ("EINVAL", "ESYS", "ENOTPOOL", "EVERSION", "EGEOMETRY", "ECORRUPT", "ENOSPC", "ETOOBIG",
                 "EDOUBLEFREE", "EBADHANDLE", "EBUSY", "EEXIST"):
        assert getattr(pm, name) == getattr(lib, "RTKIT_PMEM_" + name), name
    assert pm.PERSIST_KINDS == {lib.RTKIT_PMEM_PERSIST_NONE: "none", lib.RTKIT_PMEM_PERSIST_MSYNC: "msync",
                                lib.RTKIT_PMEM_PERSIST_FLUSH: "flush"}


def test_cdef_reader_refuses_what_it_cannot_evaluate():
    from rtkit.allocators._pmem_cdef import CdefError, cdef_from_header
    text = "#ifndef G\n#define G\n#ifdef __cplusplus\nextern \"C\" {\n#else\nint kept(void); // c\n#endif\n#endif\n"
    assert cdef_from_header(text).split() == ["int", "kept(void);"]
    with pytest.raises(CdefError, match="x.h:1: '#if'"):
        cdef_from_header("#if FOO > 1\nint f(void);\n#endif\n", "x.h")


def test_roundtrip_views_iteration(pm, pool_dir):
    import numpy as np
    path = os.path.join(pool_dir, "a.pool")
    with pm.Pool.create(path, 64 << 20, segment_size=256 << 10) as pool:
        handles = {}
        for i in range(200):
            n = 8 + (i * 37) % 4000
            h = pool.alloc(n)
            pool.view(h, "uint8")[:] = i % 251
            pool.persist(h)
            handles[h] = n
        big = pool.alloc(600_000)  # an extent of whole segments
        arr = pool.view(big, "float32", (1000, 150))
        arr[:] = np.arange(150, dtype=np.float32)
        pool.persist(big, 0, arr.nbytes)
        handles[big] = 600_000
        dead = list(handles)[:50]
        for h in dead:
            pool.free(h)
            del handles[h]
        st = pool.stats()
        assert st["allocated_records"] == len(handles)
        assert st["extents"] == 1 and st["segments_used"] >= 3
        assert sum(st["bytes_by_class"].values()) + st["extent_bytes"] == st["allocated_bytes"]
        assert 0.0 <= st["fragmentation"] < 1.0
        assert st["persist_kind"] in ("none", "msync", "flush")
    assert pool.closed
    with pm.Pool.open(path) as pool:
        found = dict(pool.records())
        assert found == handles
        for h, n in handles.items():
            if h == big:
                assert pool.view(h, "float32", (1000, 150))[7, 149] == 149.0
            else:
                v = pool.view(h)
                assert v.shape == (n,) and (v == v[0]).all()
        v = pool.view(big, "float32", (10,))
        v[0] = 42.0  # a view is the record itself
        assert pool.view(big, "float32", (1,))[0] == 42.0
        assert pool.stats()["recovered_records"] == len(handles)
    assert pm.check(path)["ok"] and pm.check(path)["clean"]


def test_bad_input(pm, pool_dir):
    import errno
    with pytest.raises(pm.PoolSystemError) as e:
        pm.Pool.create("/nonexistent-rtkit-dir/p.pool", 8 << 20)
    assert e.value.errno == errno.ENOENT and "/nonexistent-rtkit-dir/p.pool" in str(e.value)
    small = os.path.join(pool_dir, "small.pool")
    with pytest.raises(pm.InvalidArgumentError, match="below one segment"):
        pm.Pool.create(small, 100_000, segment_size=1 << 20)
    assert not os.path.exists(small)
    with pytest.raises(pm.InvalidArgumentError, match="power of two"):
        pm.Pool.create(small, 8 << 20, block_size=24)
    junk = os.path.join(pool_dir, "junk")
    with open(junk, "wb") as fh:
        fh.write(b"hello" * 2000)
    with pytest.raises(pm.NotAPoolError) as e:
        pm.Pool.open(junk)
    assert e.value.path == junk and "not an rtkit pool" in e.value.reason
    assert open(junk, "rb").read() == b"hello" * 2000
    with pytest.raises(pm.PoolExistsError):
        pm.Pool.create(junk, 8 << 20)
    assert open(junk, "rb").read() == b"hello" * 2000

    path = os.path.join(pool_dir, "g.pool")
    pm.Pool.create(path, 8 << 20, segment_size=64 << 10).close()
    before = open(path, "rb").read()
    with pytest.raises(pm.GeometryMismatchError, match="segment"):
        pm.Pool.open(path, segment_size=1 << 20)
    with pytest.raises(pm.GeometryMismatchError):
        pm.Pool.open(path, block_size=128)
    with pytest.raises(pm.GeometryMismatchError):
        pm.Pool.open(path, size=16 << 20)
    assert open(path, "rb").read() == before
    with pm.Pool.open(path, segment_size=64 << 10) as pool:
        with pytest.raises(pm.PoolBusyError):
            pm.Pool.open(path)
        with pytest.raises(pm.AllocationTooLargeError):
            pool.alloc(64 << 20)
        h = pool.alloc(100)
        pool.free(h)
        with pytest.raises(pm.DoubleFreeError):
            pool.free(h)
        with pytest.raises(pm.BadHandleError):
            pool.free(h + 8)
        with pytest.raises(pm.BadHandleError):
            pool.free(1 << 40)
        with pytest.raises(pm.InvalidArgumentError):
            pool.view(pool.alloc(64), "float64", (100,))
        hs = []
        with pytest.raises(pm.PoolFullError):
            while True:
                hs.append(pool.alloc(4000))
        assert len(hs) > 1000
    with pytest.raises(pm.PoolClosedError):
        pool.alloc(8)
    assert issubclass(pm.PoolFullError, pm.PmemError)


@pytest.mark.skipif(not SHM, reason="needs /dev/shm (tmpfs refuses an oversized fallocate at once)")
def test_no_space_at_create(pm, pool_dir):
    st = os.statvfs(pool_dir)
    too_big = st.f_blocks * st.f_frsize * 2
    path = os.path.join(pool_dir, "huge.pool")
    with pytest.raises(pm.PoolFullError) as e:
        pm.Pool.create(path, too_big)
    assert "no space" in str(e.value) and e.value.path == path
    assert not os.path.exists(path)


def test_persist_array_view(pm, pool_dir):
    path = os.path.join(pool_dir, "p.pool")
    with pm.Pool.create(path, 8 << 20, segment_size=64 << 10, force_msync=True) as pool:
        h = pool.alloc(1024)
        v = pool.view(h, "int32")
        v[:] = 7
        pool.persist(v)          # the array's bytes
        pool.persist(h, 128, 64)  # a sub-range of the record
        with pytest.raises(pm.InvalidArgumentError):
            pool.persist(h, 1000, 1000)
        with pytest.raises(pm.InvalidArgumentError):
            pool.persist(v[::2])
        assert pool.stats()["persist_kind"] in ("msync", "flush")


def test_sync_volatile_pool(pm, pool_dir):
    """sync(), volatile mode's commit point, makes a file pool's writes durable and is refused on a closed pool."""
    path = os.path.join(pool_dir, "s.pool")
    pool = pm.Pool.create(path, 8 << 20, segment_size=64 << 10, durable=False, force_msync=True)
    h = pool.alloc(512)
    pool.view(h)[:] = 9
    pool.sync()
    with pm.Pool.anonymous(4 << 20, segment_size=64 << 10) as anon:
        anon.sync()
    pool.close()
    with pytest.raises(pm.PoolClosedError):
        pool.sync()
    with pm.Pool.open(path) as pool:
        assert pool.size_of(h)[0] == 512 and (pool.view(h) == 9).all()


def test_version_refused(pm, pool_dir):
    path = os.path.join(pool_dir, "v.pool")
    pm.Pool.create(path, 4 << 20, segment_size=64 << 10).close()
    with open(path, "r+b") as fh:
        fh.seek(8)
        fh.write((99).to_bytes(4, "little"))
    with pytest.raises(pm.VersionMismatchError, match="version 99"):
        pm.Pool.open(path)


def test_threads_background_and_exit(pm):
    with pm.Pool.anonymous(64 << 20, segment_size=256 << 10, rebalance_ms=5, rebalance_min=8) as pool:
        handles = []

        def producer():
            handles.extend(pool.alloc(200) for _ in range(500))

        t = threading.Thread(target=producer)
        t.start()
        t.join()
        for h in handles:  # cross-thread frees land in this thread's cache...
            pool.free(h)
        deadline = time.time() + 10
        while pool.stats()["background_moves"] == 0 and time.time() < deadline:
            time.sleep(0.01)
        st = pool.stats()
        assert st["background_moves"] >= 1 and st["moved_records"] >= 8  # ...and move to the shared pool
        assert st["threads_cached"] == 1  # the producer's cache went back when it exited

        def consumer(out):
            out.extend(pool.alloc(200) for _ in range(400))

        got = []
        t = threading.Thread(target=consumer, args=(got,))
        t.start()
        t.join()
        assert len(set(got) & set(handles)) >= 300  # another thread reuses the moved records
        assert pool.stats()["allocated_records"] == 400


def test_rebalance_and_release_on_demand(pm):
    """rebalance() and release_thread_cache() do at once what the background thread and thread exit do."""
    with pm.Pool.anonymous(16 << 20, segment_size=64 << 10, rebalance_ms=3_600_000, rebalance_min=8) as pool:
        handles = [pool.alloc(200) for _ in range(100)]
        for h in handles:
            pool.free(h)
        assert pool.stats()["background_moves"] == 0  # the hourly background pass has not run
        pool.rebalance()
        st = pool.stats()
        assert st["background_moves"] == 1 and st["moved_records"] == 100
        seen = {}

        def worker():
            got = [pool.alloc(200) for _ in range(50)]
            seen["cached"] = pool.stats()["threads_cached"]
            pool.release_thread_cache()
            seen["released"] = pool.stats()["threads_cached"]
            seen["reused"] = len(set(got) & set(handles))

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert seen == {"cached": 2, "released": 1, "reused": 50}


def test_kill9_python_child(pm, pool_dir):
    """A Python process writes records through numpy views and is killed; acknowledged ones survive."""
    path = os.path.join(pool_dir, "k.pool")
    acks = os.path.join(pool_dir, "acks")
    pm.Pool.create(path, 32 << 20, segment_size=256 << 10).close()
    script = textwrap.dedent(f"""
        import os
        from rtkit.allocators.pmem import Pool
        pool = Pool.open({path!r})
        fd = os.open({acks!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        i = 0
        while True:
            n = 64 + (i * 97) % 3000
            h = pool.alloc(n)
            pool.view(h)[:] = i % 256
            pool.persist(h)
            os.write(fd, f"{{h}} {{n}} {{i % 256}}\\n".encode())
            i += 1
            if i % 7 == 0:
                os.write(fd, f"F {{h}}\\n".encode())
                pool.free(h)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    deadline = time.time() + 30
    while time.time() < deadline and (not os.path.exists(acks) or os.path.getsize(acks) < 20000):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    live = {}
    for line in open(acks).read().splitlines():
        parts = line.split()
        if len(parts) == 3:
            live[int(parts[0])] = (int(parts[1]), int(parts[2]))
        elif len(parts) == 2:
            live.pop(int(parts[1]), None)
    assert len(live) > 100
    assert pm.check(path)["ok"]
    with pm.Pool.open(path) as pool:
        for h, (n, val) in live.items():
            assert pool.size_of(h)[0] == n
            v = pool.view(h)
            assert v.shape == (n,) and (v == val).all()
        assert pool.stats()["allocated_records"] >= len(live)


def test_cli_check_info(pm, pool_dir, pmem_build):
    path = os.path.join(pool_dir, "c.pool")
    with pm.Pool.create(path, 8 << 20, segment_size=64 << 10) as pool:
        for _ in range(10):
            pool.alloc(500)
    env = {"RTKIT_LIB_DIR": pmem_build}
    ok = run_rtkit(["pmem", "check", path], env=env, check_rc=0)
    assert "10 allocated" in ok.stdout and "result          ok" in ok.stdout
    info = run_rtkit(["pmem", "info", path, "--json"], env=env, check_rc=0)
    assert '"segment_size": 65536' in info.stdout
    with open(path, "r+b") as fh:  # flip a bit in the header
        fh.seek(24)
        b = fh.read(1)
        fh.seek(24)
        fh.write(bytes([b[0] ^ 0x10]))
    bad = run_rtkit(["pmem", "check", path], env=env)
    assert bad.returncode == 1 and "checksum" in bad.stderr
    missing = run_rtkit(["pmem", "check", os.path.join(pool_dir, "nope.pool")], env=env)
    assert missing.returncode == 2 and "nope.pool" in missing.stderr


def test_bad_env_value_warns_once(pmem_build, pool_dir):
    script = ("from rtkit.allocators.pmem import Pool\n"
              "for _ in range(3):\n"
              "    p = Pool.anonymous(4 << 20, segment_size=64 << 10)\n"
              "    durable = p.stats()['durable']\n"
              "    p.close()\n"
              "print(durable)\n")
    env = dict(os.environ, RTKIT_PMEM_REBALANCE_MS="soon", RTKIT_PMEM_DURABLE="maybe", RTKIT_LIB_DIR=pmem_build)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2
    assert "RTKIT_PMEM_REBALANCE_MS" in lines[0] + lines[1] and "soon" in proc.stderr
    assert "RTKIT_PMEM_DURABLE" in proc.stderr and "maybe" in proc.stderr
    assert proc.stdout.strip() == "True"
