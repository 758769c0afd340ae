# test_pool_fuzz.py -- pool files under corruption: a changed or zeroed header, a swapped segment is reported, never dropped.
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, run_rtkit

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def pmem_lib(pmem_build):
    return pmem_build




# A pool with class records and extents, some freed; then TRIALS corruptions of one copy each, every copy
# given to check() and Pool.open(). Runs in a child so that a crash is counted rather than fatal to pytest.
FUZZ = textwrap.dedent(r"""
    import json, os, random, shutil, sys
    from rtkit.allocators import pmem
    folder, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    base = os.path.join(folder, "base.pool")
    expect = {}
    with pmem.Pool.create(base, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        made = []
        for i in range(90):
            n = rng.choice([24, 100, 300, 1000, 3000]) if i % 30 else 150_000
            h = pool.alloc(n)
            pool.buffer(h, n)[:] = bytes([(h + k) % 251 for k in range(n)]) if n < 5000 else bytes([h % 251]) * n
            made.append((h, n))
        for h, n in made[::4]:
            pool.free(h)
        expect = {h: n for h, n in made[3::4] + made[1::4] + made[2::4]}
    layout = pmem.info(base)
    data_off, seg = layout["data_offset"], layout["segment_size"]
    pristine = open(base, "rb").read()
    freed = [h for h, n in made[::4]]
    kinds = ["record_bit", "record_byte", "free_record_byte", "pool_header_bit", "pool_header_byte", "segment_table_bit",
             "zeroed_header", "segment_swap", "table_entry_swap"]
    nsegs = layout["nsegments"]
    counts = {"trials": 0, "detected": 0, "harmless": 0, "crashes": 0, "silent_header_accepts": 0,
              "records_lost_or_changed_silently": 0, "changed_by_refused_open": 0, "by_kind": {}}

    def records_intact(pool):
        found = dict(pool.records())
        if found != expect:
            return False
        for h, n in expect.items():
            b = bytes(pool.buffer(h, n))
            want = bytes([(h + k) % 251 for k in range(n)]) if n < 5000 else bytes([h % 251]) * n
            if b != want:
                return False
        return True

    for t in range(trials):
        kind = kinds[t % len(kinds)]
        raw = bytearray(pristine)
        used = sorted({(h - 16 - data_off) // seg for h in expect})
        if kind == "zeroed_header":  # a live record's whole header (a class record or an extent)
            h = rng.choice(list(expect))
            raw[h - 16:h] = bytes(16)
        elif kind in ("segment_swap", "table_entry_swap"):
            a = rng.choice(used)
            b = rng.choice([x for x in range(nsegs) if x != a])
            if kind == "segment_swap":
                pa, pb = data_off + a * seg, data_off + b * seg
                raw[pa:pa + seg], raw[pb:pb + seg] = raw[pb:pb + seg], raw[pa:pa + seg]
            else:
                pa, pb = 4096 + 8 * a, 4096 + 8 * b
                raw[pa:pa + 8], raw[pb:pb + 8] = raw[pb:pb + 8], raw[pa:pa + 8]
        elif kind in ("record_bit", "record_byte", "free_record_byte"):
            h = rng.choice(freed if kind == "free_record_byte" else list(expect))
            off = h - 16 + rng.randrange(16)
        elif kind.startswith("pool_header"):
            off = rng.randrange(80)  # the immutable part (magic .. csum)
        else:
            off = 4096 + 8 * rng.choice(used) + rng.randrange(8)
        if kind.endswith("bit"):
            raw[off] ^= 1 << rng.randrange(8)
        elif kind.endswith("byte"):
            raw[off] = (raw[off] + rng.randrange(1, 256)) % 256
        path = os.path.join(folder, "t.pool")
        with open(path, "wb") as fh:
            fh.write(raw)
        try:
            report = pmem.check(path)
        except pmem.PmemError as exc:  # not a pool any more, or an unreadable header: refused with a message
            report = {"ok": False, "first_error": str(exc)}
        before = bytes(raw)
        try:
            with pmem.Pool.open(path, rebalance_ms=0) as pool:
                intact = records_intact(pool)
            opened = True
        except pmem.PmemError:
            opened = False
            intact = None
            after = open(path, "rb").read()
            # a refused open frees nothing: the table and every allocated record (header and data) are as
            # they were (free slots may hold the free list's links)
            spans = [(0, data_off)] + [(h - 16, h + n) for h, n in expect.items()]
            if any(after[a:b] != before[a:b] for a, b in spans):
                counts["changed_by_refused_open"] += 1
        counts["trials"] += 1
        k = counts["by_kind"].setdefault(kind, {"detected": 0, "harmless": 0, "bad": 0})
        if not report["ok"] or not opened:
            counts["detected"] += 1
            k["detected"] += 1
        elif intact:
            counts["harmless"] += 1
            k["harmless"] += 1
        if opened and not intact:
            counts["records_lost_or_changed_silently"] += 1
            k["bad"] += 1
        if kind.startswith("pool_header") and report["ok"] and opened:
            counts["silent_header_accepts"] += 1
            k["bad"] += 1
    print(json.dumps(counts))
""")


def test_pool_fuzz_counts(pmem_lib, pool_dir):
    env = dict(os.environ, RTKIT_LIB_DIR=pmem_lib)
    proc = subprocess.run([sys.executable, "-c", FUZZ, pool_dir, "450", "20261130"], env=env, capture_output=True,
                          text=True, timeout=500)
    assert proc.returncode == 0, f"the fuzz child crashed or failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    print("pool fuzz:", json.dumps(counts))
    assert counts["trials"] == 450
    assert counts["silent_header_accepts"] == 0, counts
    assert counts["records_lost_or_changed_silently"] == 0, counts   # every corruption detected, or harmless
    assert counts["changed_by_refused_open"] == 0, counts
    for kind in ("record_bit", "record_byte", "pool_header_bit", "pool_header_byte", "segment_table_bit",
                 "zeroed_header", "table_entry_swap"):
        assert counts["by_kind"][kind]["detected"] == 50, counts  # every change to live metadata is reported
    swaps = counts["by_kind"]["segment_swap"]
    assert swaps["detected"] + swaps["harmless"] == 50 and swaps["bad"] == 0, counts


def _one_pool(pm, path):
    with pm.Pool.create(path, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        keep = pool.alloc(300)
        pool.buffer(keep, 300)[:] = b"k" * 300
        big = pool.alloc(150_000)
    return keep, big


@pytest.mark.parametrize("change", ["flipped", "zeroed"])
@pytest.mark.parametrize("which", ["class", "extent"])
def test_changed_record_header_is_corruption_not_a_torn_write(pmem_lib, pool_dir, monkeypatch, which, change):
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_lib)
    from rtkit.allocators import pmem
    pmem._load()
    path = os.path.join(pool_dir, "c.pool")
    keep, big = _one_pool(pmem, path)
    target = keep if which == "class" else big
    layout = pmem.info(path)
    seg = (target - 16 - layout["data_offset"]) // layout["segment_size"]
    with open(path, "r+b") as fh:
        if change == "flipped":  # one byte of the record's requested size
            fh.seek(target - 16 + 4)
            b = fh.read(1)
            fh.seek(target - 16 + 4)
            fh.write(bytes([b[0] ^ 0x01]))
        else:  # the whole header: the record looks like a free slot, only the segment's summary knows it lived
            fh.seek(target - 16)
            fh.write(bytes(16))
    before = open(path, "rb").read()
    report = pmem.check(path)
    assert not report["ok"] and ("corrupt" if change == "flipped" else "summary") in report["first_error"], report
    proc = run_rtkit(["pmem", "check", path], env={"RTKIT_LIB_DIR": pmem_lib})
    assert proc.returncode == 1 and "result          CORRUPT" in proc.stdout, proc.stdout
    assert proc.stderr.count(path) == 1, proc.stderr  # the path once, not "c.pool: c.pool: ..."
    if change == "zeroed":
        assert f"segment {seg}: 0 live record(s) found" in proc.stderr, proc.stderr
    with pytest.raises(pmem.CorruptPoolError) as err:
        pmem.Pool.open(path)
    assert str(err.value).count(path) == 1 and "was not changed" in str(err.value)
    assert open(path, "rb").read() == before  # refused, nothing freed


def test_header_size_validated(pmem_lib, pool_dir, monkeypatch):
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_lib)
    from rtkit.allocators import pmem
    from rtkit.allocators import _pmem_cdef  # noqa: F401  (the bindings' layout)
    pmem._load()
    path = os.path.join(pool_dir, "h.pool")
    _one_pool(pmem, path)
    raw = bytearray(open(path, "rb").read())
    raw[12:16] = (4096).to_bytes(4, "little")  # hdr_size, with the header checksum made to match
    ffi, lib = pmem._load()
    h = 0xcbf29ce484222325
    for b in raw[:72]:
        h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)

    def mix(x):
        x ^= x >> 30; x = (x * 0xbf58476d1ce4e5b9) & (2**64 - 1)
        x ^= x >> 27; x = (x * 0x94d049bb133111eb) & (2**64 - 1)
        return x ^ (x >> 31)
    raw[72:80] = mix(h).to_bytes(8, "little")
    open(path, "wb").write(raw)
    with pytest.raises(pmem.CorruptPoolError) as err:
        pmem.Pool.open(path)
    assert "header size" in str(err.value)


def test_torn_is_said_only_after_a_crash(pmem_lib, pool_dir, monkeypatch):
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_lib)
    from rtkit.allocators import pmem
    pmem._load()
    path = os.path.join(pool_dir, "f.pool")
    with pmem.Pool.create(path, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        pool.alloc(300)
        gone = pool.alloc(300)
        pool.free(gone)
    with open(path, "r+b") as fh:  # a free slot's header changed in a cleanly closed pool: harmless, not "torn"
        fh.seek(gone - 16 + 9)      # a byte of its check word, a hash of the pool's random id: flipped, since
        byte = fh.read(1)[0]       # writing a constant left it as it was when it held that value (1 run in 256)
        fh.seek(gone - 16 + 9)
        fh.write(bytes([byte ^ 0x55]))
    proc = run_rtkit(["pmem", "check", path], env={"RTKIT_LIB_DIR": pmem_lib})
    assert proc.returncode == 0 and "result          ok" in proc.stdout, proc.stdout
    assert "crash" not in proc.stdout and "changed headers 1" in proc.stdout, proc.stdout


def test_older_pool_format_gives_one_clear_line(pmem_lib, pool_dir, monkeypatch):
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_lib)
    from rtkit.allocators import pmem
    pmem._load()
    path = os.path.join(pool_dir, "old.pool")
    _one_pool(pmem, path)
    with open(path, "r+b") as fh:
        fh.seek(8)
        fh.write((2).to_bytes(4, "little"))
    with pytest.raises(pmem.VersionMismatchError, match="version 2 was written by an older rtkit"):
        pmem.Pool.open(path)
    proc = run_rtkit(["pmem", "check", path], env={"RTKIT_LIB_DIR": pmem_lib})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "older rtkit" in proc.stderr
