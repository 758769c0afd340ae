# peers.py -- the catalogue of named benchmark configurations (peers) and the parser of user-defined ones.
"""A configuration is what makes one run differ from another: extra environment variables for the
child, rtkit settings passed as `rtkit run --set key=value`, optionally a profile, and optionally a
library that must exist (a preloaded allocator). A peer whose library is missing is skipped with a
note, never run without it (that would silently measure glibc under the peer's name)."""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from rtkit import config as _config

# Debian's multiarch folder first; the others cover other distributions and local builds.
DEFAULT_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu")

# Variables that decide which allocator TensorFlow and the process use. They are removed from the
# inherited environment of every run, so each configuration is exactly what its definition says,
# whatever the shell that started the bench had exported.
CONTROLLED_ENV = ("LD_PRELOAD", "MALLOC_CONF", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "TF_CPU_ALLOCATOR_USE_BFC",
                  "TF_ENABLE_ONEDNN_OPTS", "MIMALLOC_OPTIONS", "TCMALLOC_RELEASE_RATE", "GLIBC_TUNABLES")

# The MALLOC_CONF Intel recommends for jemalloc under TensorFlow/PyTorch on CPU (DeepRec's
# CPU-Memory-Optimization.md, PyTorch's performance tuning guide): no decay, so freed pages stay
# mapped and are reused, which is what removes the page faults of recurring large tensors.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"

# The debian package that ships each peer library (for notes and `make bench-deps`).
DEBIAN_PACKAGES = {
    "libjemalloc.so.2": "libjemalloc2",
    "libtcmalloc_minimal.so.4": "libtcmalloc-minimal4",
    "libmimalloc.so.2": "libmimalloc2.0",
}

RTKIT_MALLOC_LIBRARY = "librtkit_malloc.so"

# Settings every catalogue peer pins, so that an RTKIT_* variable exported in the shell (or a
# profile in RTKIT_PROFILE) cannot change what a peer measures. Each peer overrides some of them.
_OFF = {"malloc": "0", "malloc_route_tf": "0", "sched": "0", "sched_stage": "0"}

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class PeerError(ValueError):
    """A bad configuration name or definition; the message is the one line shown to the user."""


@dataclass
class Peer:
    name: str
    description: str
    env: Dict[str, str] = field(default_factory=dict)        # extra environment of `rtkit run`
    settings: Dict[str, str] = field(default_factory=dict)   # rtkit settings: `--set key=value`
    profile: Optional[str] = None                            # `rtkit run --profile NAME`
    library: Optional[str] = None                            # basename or absolute path that must exist
    preload: bool = False                                    # put the found library on LD_PRELOAD
    args: List[str] = field(default_factory=list)           # extra arguments appended to the command
    kind: str = "catalogue"                                  # catalogue | user | profile

    def resolve_library(self, lib_dirs: Sequence[str]) -> Optional[str]:
        """Absolute path of the required library, or None when it cannot be found."""
        if not self.library:
            return None
        if self.library == RTKIT_MALLOC_LIBRARY:
            from rtkit.allocators import malloc_library_path
            return malloc_library_path() or None
        if os.path.isabs(self.library):
            return self.library if os.path.exists(self.library) else None
        for folder in lib_dirs:
            path = os.path.join(folder, self.library)
            if os.path.exists(path):
                return path
        return None

    def missing_note(self, lib_dirs: Sequence[str]) -> str:
        if self.library == RTKIT_MALLOC_LIBRARY:
            return (f"{self.name}: skipped: {RTKIT_MALLOC_LIBRARY} is not built "
                    "(run `python3 allocators/build.py` or `pip install .`)")
        where = self.library if os.path.isabs(self.library or "") else \
            f"{self.library} in {', '.join(lib_dirs) or '(no folder)'}"
        pkg = DEBIAN_PACKAGES.get(os.path.basename(self.library or ""))
        hint = f" (Debian package {pkg}; `make bench-deps` installs it)" if pkg else ""
        return f"{self.name}: skipped: library not found: {where}{hint}"

    def run_args(self) -> List[str]:
        """The `rtkit run` options of this configuration (before `--`)."""
        args: List[str] = []
        if self.profile:
            args += ["--profile", self.profile]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        return args

    def child_env(self, base: Dict[str, str], library_path: Optional[str]) -> Dict[str, str]:
        """The environment `rtkit run` is started with: the bench's own, minus the controlled
        variables, plus this configuration's. `rtkit run` appends its own library to LD_PRELOAD
        when malloc is on."""
        env = {k: v for k, v in base.items() if k not in CONTROLLED_ENV}
        env.update(self.env)
        if self.preload and library_path:
            current = env.get("LD_PRELOAD", "")
            env["LD_PRELOAD"] = f"{library_path}:{current}" if current else library_path
        return env

    def describe(self) -> Dict[str, object]:
        return {"name": self.name, "kind": self.kind, "description": self.description, "env": dict(self.env),
                "settings": dict(self.settings), "profile": self.profile, "library": self.library,
                "preload": self.preload, "args": list(self.args), "rtkit_run_args": self.run_args()}


def _peer(name, description, env=None, settings=None, library=None, preload=False) -> Peer:
    merged = dict(_OFF)
    merged.update(settings or {})
    return Peer(name=name, description=description, env=dict(env or {}), settings=merged, library=library,
                preload=preload)


_SYS = {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}

CATALOGUE: Dict[str, Peer] = {p.name: p for p in [
    _peer("tf-default", "TensorFlow as shipped: oneDNN's own pool for large tensors, glibc malloc for the rest"),
    _peer("glibc", "every tensor through glibc malloc (TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1)", env=_SYS),
    # glibc >= 2.35: transparent huge pages for all of glibc's memory (madvise on its heaps and mmap'd chunks),
    # a cheap peer every user can try: fewer page faults at glibc's step time
    _peer("glibc-hugetlb", "glibc malloc with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (THP for its heaps); tensors via malloc",
          env={**_SYS, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
    _peer("jemalloc", "jemalloc 5 (Debian libjemalloc2) preloaded with Intel's MALLOC_CONF; tensors via malloc",
          env={**_SYS, "MALLOC_CONF": JEMALLOC_CONF}, library="libjemalloc.so.2", preload=True),
    _peer("tcmalloc", "gperftools tcmalloc-minimal preloaded; tensors via malloc",
          env=_SYS, library="libtcmalloc_minimal.so.4", preload=True),
    _peer("mimalloc", "mimalloc 2 preloaded; tensors via malloc", env=_SYS, library="libmimalloc.so.2", preload=True),
    _peer("tf-bfc", "TensorFlow's BFC allocator on CPU, oneDNN ops off",
          env={"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPU_ALLOCATOR_USE_BFC": "1"}),
    _peer("rtkit", "rtkit's PRMalloc preloaded, tensors routed to it; scheduler off",
          settings={"malloc": "1", "malloc_route_tf": "1"}, library=RTKIT_MALLOC_LIBRARY),
    _peer("rtkit-sched", "PRMalloc + rtkit's thread configuration (no pipelining)",
          settings={"malloc": "1", "malloc_route_tf": "1", "sched": "1"}, library=RTKIT_MALLOC_LIBRARY),
    _peer("rtkit-stage", "PRMalloc + scheduler with the input stage pipelined (SmartStage)",
          settings={"malloc": "1", "malloc_route_tf": "1", "sched": "1", "sched_stage": "1"},
          library=RTKIT_MALLOC_LIBRARY),
    _peer("sched-only", "rtkit's scheduler with pipelining, TensorFlow's allocators",
          settings={"sched": "1", "sched_stage": "1"}),
]}

DEFAULT_CONFIGS = ("tf-default", "glibc", "tcmalloc", "jemalloc", "mimalloc", "tf-bfc", "rtkit")
DEFAULT_BASELINE = "tf-default"


def _validated_setting(key: str, value: str, where: str) -> Tuple[str, str]:
    try:
        setting = _config.lookup(key)
    except _config.ConfigError:
        raise PeerError(f"{where}: unknown rtkit setting '{key}' (run `rtkit config --list`; "
                        "environment variables are written in upper case)") from None
    try:
        setting.parse(value)
    except ValueError as exc:
        raise PeerError(f"{where}: {setting.key}={value!r} is not valid: expected {exc}") from None
    return setting.key, value


def _split_items(body: str) -> List[str]:
    """Split KEY=VAL,KEY=VAL; a piece without '=' continues the previous value, so values that
    contain commas (MALLOC_CONF=a:1,b:2) need no quoting."""
    items: List[str] = []
    for piece in body.split(","):
        if "=" in piece or not items:
            items.append(piece)
        else:
            items[-1] += "," + piece
    return [i for i in (x.strip() for x in items) if i]


def parse_user_config(spec: str, known: Optional[Dict[str, Peer]] = None) -> Peer:
    """`NAME:KEY=VAL,KEY=VAL` -> Peer. KEY is an rtkit setting key (lower case, as in profiles), an
    environment variable (upper case; RTKIT_<KEY> counts as the setting), or one of the special keys
    `base` (start from a catalogue peer), `profile` (rtkit run --profile), `preload` (a library path,
    required, put on LD_PRELOAD), `args` (extra arguments for the command, e.g. "--threads-intra 2";
    a value holding commas must then be the last key). Without `base`, the run gets rtkit's own defaults plus these keys."""
    known = CATALOGUE if known is None else known
    name, sep, body = spec.partition(":")
    name = name.strip()
    where = f"--config {spec!r}"
    if not sep or not name:
        raise PeerError(f"{where} must look like NAME:KEY=VALUE,KEY=VALUE (e.g. big:malloc_min_size=1M)")
    if not _NAME_RE.match(name):
        raise PeerError(f"{where}: name '{name}' may only hold letters, digits, '_', '.', '+', '-'")
    peer = Peer(name=name, description=f"user configuration {body.strip()}", kind="user")
    items = []
    for item in _split_items(body):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise PeerError(f"{where}: '{item}' must look like KEY=VALUE")
        items.append((key, value))
    # `base` first, wherever it is written, so that the other keys refine it.
    items.sort(key=lambda kv: kv[0] != "base")
    for key, value in items:
        if key == "base":
            if value not in known:
                raise PeerError(f"{where}: base '{value}' is not a catalogue configuration "
                                f"(known: {', '.join(known)})")
            b = known[value]
            peer.env.update(b.env)
            peer.settings.update(b.settings)
            peer.library, peer.preload, peer.profile, peer.args = b.library, b.preload, b.profile, list(b.args)
        elif key == "profile":
            try:
                _config.find_profile(value)
            except _config.ConfigError as exc:
                raise PeerError(f"{where}: {exc}") from None
            peer.profile = value
        elif key == "preload":
            peer.library, peer.preload = value, True
        elif key == "args":
            try:
                peer.args = shlex.split(value)
            except ValueError as exc:
                raise PeerError(f"{where}: args={value!r}: {exc}") from None
        elif key.startswith(_config.ENV_PREFIX) and key[len(_config.ENV_PREFIX):].lower() in _config.BY_KEY:
            k, v = _validated_setting(key, value, where)
            peer.settings[k] = v
        elif _ENV_RE.match(key):
            peer.env[key] = value
        else:
            k, v = _validated_setting(key, value, where)
            peer.settings[k] = v
    return peer


def profile_peer(profile: str) -> Peer:
    """A configuration that is just `rtkit run --profile NAME` (no pinned settings)."""
    try:
        _config.find_profile(profile)
    except _config.ConfigError as exc:
        raise PeerError(str(exc)) from None
    return Peer(name=f"profile:{profile}", description=f"rtkit run --profile {profile}", profile=profile,
                kind="profile")


def select(names: Sequence[str], user: Sequence[Peer] = (), profiles: Sequence[str] = ()) -> List[Peer]:
    """Resolve configuration names (catalogue, user-defined, `profile:NAME` or a bare profile name)
    in the given order; duplicates are an error. Raises PeerError naming what is known."""
    table: Dict[str, Peer] = dict(CATALOGUE)
    for p in user:
        table[p.name] = p
    chosen: List[Peer] = []
    for raw in list(names) + [f"profile:{p}" for p in profiles]:
        name = raw.strip()
        if not name:
            continue
        if name in table:
            peer = table[name]
        elif name.startswith("profile:"):
            peer = profile_peer(name[len("profile:"):])
        elif name in _config.available_profiles():
            peer = profile_peer(name)
        else:
            known = list(table) + [f"profile:{p}" for p in sorted(_config.available_profiles())]
            raise PeerError(f"unknown configuration '{name}': known configurations are {', '.join(known)}")
        if any(p.name == peer.name for p in chosen):
            raise PeerError(f"configuration '{peer.name}' is listed twice")
        chosen.append(peer)
    if not chosen:
        raise PeerError("no configuration to run: give --configs a,b,...")
    return chosen
