# pmem.py -- Python API of rtkit's PMEM segment allocator (cffi ABI mode over librtkit_pmem.so).
"""Persistent, recoverable pools of records.

    from rtkit.allocators.pmem import Pool
    with Pool.create("/mnt/pmem/emb.pool", 1 << 30) as pool:
        h = pool.alloc(4096)                      # handle: byte offset, stable across reopen
        pool.view(h, "float32", (1024,))[:] = 1.0 # numpy view of the record, no copy
        pool.persist(h)                           # payload durable (header already is, in durable mode)
    with Pool.open("/mnt/pmem/emb.pool") as pool:
        for h, nbytes in pool.records(): ...

Errors are PmemError subclasses carrying .path, .reason, .code and .errno. Views and pointers are
valid only while the pool is open.
"""
import errno as _errno
import os
import threading

from . import pmem_library_path

# error codes of rtkit/pmem.h
EINVAL, ESYS, ENOTPOOL, EVERSION, EGEOMETRY, ECORRUPT, ENOSPC, ETOOBIG, EDOUBLEFREE, EBADHANDLE, EBUSY, EEXIST = \
    range(-1, -13, -1)
PERSIST_KINDS = {0: "none", 1: "msync", 2: "flush"}


class PmemError(Exception):
    """A failed pool operation; .path and .reason say where and why, .code is the C code."""

    def __init__(self, message, path="", reason="", code=0, errno=0):
        super().__init__(message)
        self.path, self.reason, self.code, self.errno = path, reason, code, errno


class InvalidArgumentError(PmemError, ValueError): pass          # noqa: E701
class PoolSystemError(PmemError, OSError): pass                  # noqa: E701
class NotAPoolError(PmemError): pass                             # noqa: E701
class VersionMismatchError(PmemError): pass                      # noqa: E701
class GeometryMismatchError(PmemError): pass                     # noqa: E701
class CorruptPoolError(PmemError): pass                          # noqa: E701
class PoolFullError(PmemError, MemoryError): pass                # noqa: E701
class AllocationTooLargeError(PmemError, ValueError): pass       # noqa: E701
class DoubleFreeError(PmemError): pass                           # noqa: E701
class BadHandleError(PmemError, ValueError): pass                # noqa: E701
class PoolBusyError(PmemError): pass                             # noqa: E701
class PoolExistsError(PmemError, FileExistsError): pass          # noqa: E701
class PoolClosedError(PmemError): pass                           # noqa: E701

_CLASSES = {EINVAL: InvalidArgumentError, ESYS: PoolSystemError, ENOTPOOL: NotAPoolError,
            EVERSION: VersionMismatchError, EGEOMETRY: GeometryMismatchError, ECORRUPT: CorruptPoolError,
            ENOSPC: PoolFullError, ETOOBIG: AllocationTooLargeError, EDOUBLEFREE: DoubleFreeError,
            EBADHANDLE: BadHandleError, EBUSY: PoolBusyError, EEXIST: PoolExistsError}

_lock = threading.Lock()
_ffi = None
_lib = None


def _load():
    """Load the library once (cffi is imported only here, so `import rtkit.allocators.pmem` stays light)."""
    global _ffi, _lib
    if _lib is not None:
        return _ffi, _lib
    with _lock:
        if _lib is None:
            import cffi
            from ._pmem_cdef import cdef_for_library, header_path
            path = pmem_library_path()
            if not path:
                raise PmemError("librtkit_pmem.so is not built: run `python allocators/build.py --only pmem`",
                                reason="library missing", code=ESYS)
            try:
                cdef = cdef_for_library(path)
            except OSError:
                raise PmemError(f"{header_path(path)} is missing beside {path}: rebuild with "
                                "`python allocators/build.py --only pmem`", reason="header missing",
                                code=ESYS) from None
            ffi = cffi.FFI()
            ffi.cdef(cdef)
            _lib = ffi.dlopen(path)
            _ffi = ffi
    return _ffi, _lib


def _raise(rc, path=""):
    ffi, lib = _load()
    message = ffi.string(lib.rtkit_pmem_last_error()).decode(errors="replace")
    err = ffi.errno
    where, _, reason = message.partition(": ")
    cls = _CLASSES.get(rc, PmemError)
    exc = cls(message or f"{path}: {ffi.string(lib.rtkit_pmem_strerror(rc)).decode()}",
              path=path or where, reason=reason or ffi.string(lib.rtkit_pmem_strerror(rc)).decode(),
              code=rc, errno=err)
    if isinstance(exc, OSError):
        exc.errno, exc.strerror, exc.filename = err, reason or message, path or where
    raise exc


def _options(segment_size=None, block_size=None, max_record=None, size=None, durable=None, rebalance_ms=None,
             rebalance_min=None, recovery_threads=None, force_msync=False):
    ffi, lib = _load()
    o = ffi.new("rtkit_pmem_options *")
    lib.rtkit_pmem_options_init(o)
    if segment_size:
        o.segment_size = int(segment_size)
    if block_size:
        o.block_size = int(block_size)
    if max_record:
        o.max_record = int(max_record)
    if size:
        o.expect_size = int(size)
    if durable is not None:
        o.durable = 1 if durable else 0
    if rebalance_ms is not None:
        o.rebalance_ms = int(rebalance_ms) if rebalance_ms > 0 else -1
    if rebalance_min:
        o.rebalance_min = int(rebalance_min)
    if recovery_threads:
        o.recovery_threads = int(recovery_threads)
    o.force_msync = 1 if force_msync else 0
    return o


def _fields(ffi, obj, names):
    return {name: getattr(obj, name) for name in names}


class Pool:
    """An open pool. Create with Pool.create / Pool.open / Pool.anonymous; close (or use `with`)."""

    def __init__(self, handle, path):
        self._ffi, self._lib = _load()
        self._p = handle
        self.path = path

    # -- construction
    @classmethod
    def create(cls, path, size, **options):
        """New pool file at path (must not exist). options: segment_size, block_size, max_record, durable,
        rebalance_ms, rebalance_min, recovery_threads, force_msync."""
        ffi, lib = _load()
        path = os.fspath(path)
        out = ffi.new("rtkit_pmem_pool **")
        rc = lib.rtkit_pmem_create(path.encode(), int(size), _options(**options), out)
        if rc:
            _raise(rc, path)
        return cls(out[0], path)

    @classmethod
    def open(cls, path, size=None, **options):
        """Open and recover an existing pool; geometry options given must match the file."""
        ffi, lib = _load()
        path = os.fspath(path)
        out = ffi.new("rtkit_pmem_pool **")
        rc = lib.rtkit_pmem_open(path.encode(), _options(size=size, **options), out)
        if rc:
            _raise(rc, path)
        return cls(out[0], path)

    @classmethod
    def anonymous(cls, size, **options):
        """A DRAM-only pool (nothing survives the process)."""
        ffi, lib = _load()
        out = ffi.new("rtkit_pmem_pool **")
        rc = lib.rtkit_pmem_anonymous(int(size), _options(**options), out)
        if rc:
            _raise(rc, "<anonymous>")
        return cls(out[0], None)

    # -- lifetime
    @property
    def closed(self):
        return self._p is None

    def _pool(self):
        if self._p is None:
            raise PoolClosedError(f"{self.path}: pool is closed", path=self.path or "", reason="pool is closed")
        return self._p

    def close(self):
        if self._p is not None:
            p, self._p = self._p, None
            rc = self._lib.rtkit_pmem_close(p)
            if rc:
                _raise(rc, self.path or "")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- records
    def alloc(self, nbytes):
        """Allocate a record of nbytes; returns its handle (an int, stable across reopen)."""
        if nbytes < 0:
            raise InvalidArgumentError(f"{self.path}: negative size {nbytes}", path=self.path or "",
                                       reason="negative size", code=EINVAL)
        h = self._ffi.new("uint64_t *")
        rc = self._lib.rtkit_pmem_alloc(self._pool(), int(nbytes), h)
        if rc:
            _raise(rc, self.path or "")
        return int(h[0])

    def free(self, handle):
        rc = self._lib.rtkit_pmem_free(self._pool(), int(handle))
        if rc:
            _raise(rc, self.path or "")

    def size_of(self, handle):
        """(requested bytes, usable bytes) of a live record."""
        req = self._ffi.new("uint64_t *")
        usable = self._ffi.new("uint64_t *")
        rc = self._lib.rtkit_pmem_record_size(self._pool(), int(handle), req, usable)
        if rc:
            _raise(rc, self.path or "")
        return int(req[0]), int(usable[0])

    def persist(self, target, offset=0, nbytes=0):
        """Make [offset, offset+nbytes) of the record `target` (a handle) durable (nbytes 0: to its end);
        or, with a numpy array (a view into the pool), the bytes of that array."""
        iface = getattr(target, "__array_interface__", None)
        if iface is not None:
            if not target.flags["C_CONTIGUOUS"]:
                raise InvalidArgumentError(f"{self.path}: persist needs a contiguous array", path=self.path or "",
                                           reason="array not contiguous", code=EINVAL)
            addr = self._ffi.cast("void *", iface["data"][0])
            rc = self._lib.rtkit_pmem_persist_range(self._pool(), addr, int(target.nbytes))
            if rc:
                _raise(rc, self.path or "")
            return
        rc = self._lib.rtkit_pmem_persist(self._pool(), int(target), int(offset), int(nbytes))
        if rc:
            _raise(rc, self.path or "")

    def sync(self):
        """Make the whole pool durable (volatile mode's group commit)."""
        rc = self._lib.rtkit_pmem_sync(self._pool())
        if rc:
            _raise(rc, self.path or "")

    def buffer(self, handle, nbytes=None):
        """A writable buffer over the record's payload (no copy)."""
        req, usable = self.size_of(handle)
        n = req if nbytes is None else int(nbytes)
        if n > usable:
            raise InvalidArgumentError(f"{self.path}: {n} bytes exceed the record's {usable}",
                                       path=self.path or "", reason="view larger than record", code=EINVAL)
        return self._ffi.buffer(self._lib.rtkit_pmem_ptr(self._pool(), int(handle)), n)

    def view(self, handle, dtype="uint8", shape=None):
        """numpy array over the record (no copy); shape None: as many items as the requested size holds."""
        import numpy as np
        dtype = np.dtype(dtype)
        req, usable = self.size_of(handle)
        if shape is None:
            shape = (req // dtype.itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        count = 1
        for dim in shape:
            count *= int(dim)
        if count * dtype.itemsize > usable:
            raise InvalidArgumentError(f"{self.path}: view of {count * dtype.itemsize} bytes exceeds the record's "
                                       f"{usable}", path=self.path or "", reason="view larger than record",
                                       code=EINVAL)
        buf = self._ffi.buffer(self._lib.rtkit_pmem_ptr(self._pool(), int(handle)), count * dtype.itemsize)
        return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)

    def records(self):
        """Iterate (handle, requested bytes) of every live record, in address order."""
        h = self._ffi.new("uint64_t *")
        req = self._ffi.new("uint64_t *")
        after = 0
        while True:
            rc = self._lib.rtkit_pmem_next(self._pool(), after, h, req)
            if rc:
                _raise(rc, self.path or "")
            if not h[0]:
                return
            after = int(h[0])
            yield after, int(req[0])

    def __iter__(self):
        return (h for h, _ in self.records())

    def rebalance(self):
        """Run one background pass now (moves long thread lists into the shared pool)."""
        self._lib.rtkit_pmem_rebalance_now(self._pool())

    def release_thread_cache(self):
        """Give the calling thread's cache back to the shared pool now."""
        self._lib.rtkit_pmem_thread_release(self._pool())

    # -- statistics
    def stats(self):
        ffi, lib = self._ffi, self._lib
        s = ffi.new("rtkit_pmem_stats *")
        rc = lib.rtkit_pmem_stats_get(self._pool(), s)
        if rc:
            _raise(rc, self.path or "")
        out = _fields(ffi, s, [name for name, _ in ffi.typeof("rtkit_pmem_stats").fields])
        out["persist_kind"] = PERSIST_KINDS.get(out["persist_kind"], str(out["persist_kind"]))
        for key in ("durable", "is_pmem", "anonymous", "membarrier"):
            out[key] = bool(out[key])
        out["path"] = self.path
        cs = ffi.new("rtkit_pmem_class_stats *")
        classes = {}
        first = -(-(16 + 8) // s.block_size)
        for c in range(max(1, first), s.nclasses + 1):
            if lib.rtkit_pmem_class_stats_get(self._pool(), c, cs):
                continue
            if cs.segments or cs.allocated or cs.free_pool or cs.free_threads:
                classes[int(cs.record_size)] = {
                    "class": int(cs.cls), "record_size": int(cs.record_size), "segments": int(cs.segments),
                    "allocated": int(cs.allocated), "bytes": int(cs.allocated) * int(cs.record_size),
                    "free_pool": int(cs.free_pool), "free_threads": int(cs.free_threads),
                    "unused_slots": int(cs.unused_slots)}
        out["classes"] = classes
        out["bytes_by_class"] = {size: c["bytes"] for size, c in classes.items()}
        out["free_lists"] = {size: c["free_pool"] + c["free_threads"] for size, c in classes.items()}
        out["segments_used"] = out["segments_class"] + out["segments_extent"]
        return out

    def __repr__(self):
        return f"<rtkit Pool {self.path or 'anonymous'}{' closed' if self.closed else ''}>"


def _report(fn, path):
    ffi, lib = _load()
    path = os.fspath(path)
    r = ffi.new("rtkit_pmem_check_report *")
    rc = getattr(lib, fn)(path.encode(), r)
    if rc and rc != ECORRUPT:
        _raise(rc, path)
    out = {name: getattr(r, name) for name, _ in ffi.typeof("rtkit_pmem_check_report").fields}
    out["first_error"] = ffi.string(r.first_error).decode(errors="replace")
    out["clean"] = bool(out["clean"])
    out["ok"] = rc == 0
    out["path"] = path
    return out


def check(path):
    """Verify a closed pool without changing it. Returns a dict (ok False on corruption); raises
    PmemError when the file cannot be read as a pool at all."""
    return _report("rtkit_pmem_check", path)


def info(path):
    """Layout of a pool (header and segment table only)."""
    return _report("rtkit_pmem_info", path)


__all__ = ["Pool", "PmemError", "check", "info"] + [c.__name__ for c in _CLASSES.values()] + ["PoolClosedError"]
_ = _errno
