# config.py -- THE table of rtkit settings, their parsing, and resolution: CLI flag > environment > profile > default.
"""Every RTKIT_* setting is declared here once. CLI flags, profiles, the C libraries' defaults and the
docs are derived from or tested against this table. This module imports nothing of rtkit."""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - older Pythons
    import tomli as _toml  # type: ignore

ENV_PREFIX = "RTKIT_"
PROFILE_DIR_ENV = "RTKIT_PROFILE_PATH"  # extra folders searched for profiles (os.pathsep-separated)


class ConfigError(ValueError):
    """A bad setting: the message is the one clear line shown to the user."""


class OutOfRange(ValueError):
    """A value of the right form outside the table's limits: it falls back to the default wherever it came
    from (environment, --set or a profile), with one line naming the source, as the C libraries do."""


# The C libraries keep sizes in size_t and whole numbers in long: a value beyond them is out of range on
# both sides (docs/safety.md: Python and C enforce the same limits).
C_SIZE_MAX = (1 << 64) - 1
C_LONG_MIN, C_LONG_MAX = -(1 << 63), (1 << 63) - 1


# ---------------------------------------------------------------------------------------------
# value parsing (the C side implements the same grammar; tests keep the two in step)

# ASCII only, as C's isdigit/isspace: a Unicode digit or space is not valid on either side
_SIZE_RE = re.compile(r"^\s*([0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*$", re.ASCII)
_INT_RE = re.compile(r"^\s*[+-]?[0-9]+\s*$", re.ASCII)
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def parse_size(text: str) -> int:
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError("a size such as 4096, 64K, 1M or 2G")
    return int(m.group(1)) * _SIZE_MULT[m.group(2).lower()]


def parse_bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    low = str(text).strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("one of 1/0/true/false/on/off")


def parse_int(text: Any) -> int:
    if isinstance(text, bool):
        raise ValueError("a whole number")
    if isinstance(text, int):
        return text
    if not _INT_RE.match(str(text)):
        raise ValueError("a whole number")
    return int(str(text))


def format_size(n: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


@dataclass(frozen=True)
class Setting:
    key: str            # config key, used in profiles and --set: the env name without RTKIT_, lower case
    kind: str           # bool | int | size | str | path | choice
    default: Any
    unit: str           # '' when the value has none
    doc: str
    choices: tuple = ()
    minimum: Optional[int] = None
    maximum: Optional[int] = None
    # the C part that reads it ("malloc": the preload allocator, "tier": its tier mode, "pmem": the pool, in both
    # libraries); allocators/build.py generates the C libraries' settings header from these rows
    c: str = ""
    deprecated: str = ""  # a retired setting: what to do instead. Set anywhere, it is ignored with one warning line
    # The setting's old key, still accepted (profile, --set, RTKIT_<ALIAS>; C reads the old variable too) with one
    # warning line for one release; the new name wins where both are set. alias_inverted: a boolean whose old
    # name meant the opposite (pmem_no_membarrier=1 is pmem_membarrier=0).
    alias: str = ""
    alias_inverted: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    def accepted(self) -> str:
        if self.kind == "bool":
            return "one of 1/0/true/false/on/off"
        if self.kind == "choice":
            return "one of " + "/".join(self.choices)
        if self.kind == "size":
            what = "a size such as 4096, 64K, 1M or 2G"
        elif self.kind == "int":
            what = "a whole number"
        else:
            return "a text value"
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {self.minimum}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum}")
        return what + (f" ({', '.join(bounds)})" if bounds else "")

    def parse(self, raw: Any) -> Any:
        """Parse a raw value (a string from env/CLI, or a TOML value). Raises ValueError(accepted)."""
        if self.kind == "bool":
            return parse_bool(raw)
        if self.kind in ("int", "size"):
            value = parse_size(raw) if self.kind == "size" else parse_int(raw)
            lo, hi = (0, C_SIZE_MAX) if self.kind == "size" else (C_LONG_MIN, C_LONG_MAX)
            if (self.minimum is not None and value < self.minimum) or (
                    self.maximum is not None and value > self.maximum) or not lo <= value <= hi:
                raise OutOfRange(self.accepted())
            return value
        if self.kind == "choice":
            low = str(raw).strip().lower()
            if low not in self.choices:
                raise ValueError(self.accepted())
            return low
        if not isinstance(raw, (str, int, float)):
            raise ValueError(self.accepted())
        return str(raw)

    @property
    def alias_env(self) -> str:
        return ENV_PREFIX + self.alias.upper() if self.alias else ""

    def renamed_message(self, where: str) -> str:
        flip = "; its value is the opposite" if self.alias_inverted else ""
        return (f"rtkit: {where} {self.alias_env} is renamed {self.env}{flip}: use the new name (the old one is read "
                "until the next release)")

    def from_alias(self, raw: Any) -> Any:
        """A value given under the old name, as this setting's raw value. Raises ValueError(accepted)."""
        return not parse_bool(raw) if self.alias_inverted else raw

    def retired_message(self, where: str) -> str:
        return f"rtkit: {where} {self.env} is retired and ignored: {self.deprecated}"

    def to_env(self, value: Any) -> str:
        """The string the child process sees; the C side parses exactly this."""
        if self.kind == "bool":
            return "1" if value else "0"
        return str(value)


def _s(key, kind, default, unit, doc, **kw) -> Setting:
    return Setting(key=key, kind=kind, default=default, unit=unit, doc=doc, **kw)


INT32_MAX = (1 << 31) - 1  # step counts: the C side keeps them in an int

# The table. Order is the order of `rtkit config` and of the README.
SETTINGS: List[Setting] = [
    # -- the run itself
    _s("out", "path", "rtkit-runs", "", "folder that receives one run directory per `rtkit run`"),
    _s("name", "str", "", "", "name of the run (default: the command's basename); part of the run directory name"),
    _s("sample_interval_ms", "int", 200, "ms", "how often `rtkit run` samples the child's RSS, faults, CPU and threads",
       minimum=10, maximum=60000),
    _s("hooks", "bool", True, "", "instrument TensorFlow (sessions, tf.function, Keras fit) inside the child to find and time steps"),
    _s("warmup_steps", "int", 3, "steps", "first steps left out of the step-time summary", minimum=0),
    _s("log", "choice", "info", "", "how much rtkit itself prints on stderr", choices=("quiet", "info", "debug")),
    _s("live_interval_ms", "int", 2000, "ms", "how often `rtkit run` takes a live snapshot (the report so far, for "
       "the TensorBoard and Prometheus exporters) and rewrites RUN_DIR/live.json from it (for `rtkit report` and "
       "`rtkit top`; a larger file less often: at most 8 KiB of rewrites a second); 0: no live snapshot", minimum=0, maximum=600000),
    _s("tensorboard_dir", "path", "", "", "write the per-step figures as TensorBoard scalars into this folder "
       "(rtkit run --tensorboard)"),
    _s("metrics_port", "int", 0, "", "serve the live figures as OpenMetrics (Prometheus) on this TCP port while "
       "the job runs; 0: off (rtkit run --metrics-port)", minimum=0, maximum=65535),
    _s("metrics_host", "str", "127.0.0.1", "", "address the metrics endpoint binds to (rtkit run --metrics-host)"),
    # -- PRMalloc, the LD_PRELOAD allocator
    _s("malloc", "bool", True, "", "preload librtkit_malloc.so (census, profiling, planned arenas)", c="malloc"),
    _s("malloc_route_tf", "bool", True, "",
       "set TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 (unless the user set it) so TensorFlow's tensors reach the allocator"),
    _s("malloc_profile_start", "int", 2, "steps", "steps treated as warm-up before the allocator starts profiling",
       minimum=0, maximum=INT32_MAX, c="malloc"),
    _s("malloc_profile_stable", "int", 3, "steps", "profiling ends once the plan is unchanged for this many steps",
       minimum=1, maximum=INT32_MAX, c="malloc"),
    _s("malloc_profile_max", "int", 20, "steps", "profiling ends after this many steps even if the plan still changes",
       minimum=1, maximum=INT32_MAX, c="malloc"),
    _s("malloc_drift_steps", "int", 16, "steps", "a plan in use is checked over windows of this many steps: when "
       "fewer than half of a window's allocations >= min_size had a planned class (the sizes drifted: another model, "
       "batch size or phase), the plan is retired and the job profiled and planned again; the window doubles after "
       "each re-plan, at most 8 re-plans a process (0: never)", minimum=0, maximum=INT32_MAX, c="malloc"),
    _s("malloc_min_size", "size", 32 * 1024, "bytes", "smallest allocation that the profiler and the arenas consider",
       minimum=16, c="malloc"),
    _s("malloc_arena_limit", "size", 4 << 30, "bytes", "upper bound on bytes reserved for planned arenas", minimum=0,
       c="malloc"),
    _s("malloc_class_max", "size", 64 << 20, "bytes", "largest block size the plan gives a class of its own: a class "
       "holds its peak's blocks for the whole run, idle while other sizes peak; larger blocks go to the large heap, "
       "which shares its pages across sizes and keeps them for reuse (0: no bound)", minimum=0, c="malloc"),
    _s("malloc_thp", "bool", True, "", "ask for transparent huge pages on glibc's heaps "
       "(GLIBC_TUNABLES=glibc.malloc.hugetlb=1 unless set; with malloc_large, glibc's thread heaps too); rtkit's own "
       "large heap keeps 4 KiB pages, so its decay can give back single idle extents", c="malloc"),
    _s("malloc_plan", "path", "", "", "plan file from an earlier run to load instead of profiling (ignored if it does not match)",
       c="malloc"),
    _s("malloc_plan_process", "str", "", "", "program name (e.g. python3) that reserves the plan's arenas as it starts; "
       "by default only the process that marks steps reserves them, after its warm-up (malloc_profile_start steps)",
       c="malloc"),
    _s("malloc_census", "bool", True, "", "count every allocation per step and size class", c="malloc"),
    _s("malloc_debug", "bool", False, "", "debug lines from the allocator (double and foreign frees of rtkit's memory abort in every mode)",
       c="malloc"),
    _s("malloc_large", "bool", True, "", "serve allocations >= min_size that no planned class takes from rtkit's retained "
       "large-object heap (from the first step), not glibc", c="malloc"),
    _s("malloc_plan_release", "bool", False, "", "retired",
       deprecated="remove it: a plan's classes hold the large heap's own blocks, so installing a plan takes no "
       "fresh pages to give back"),
    _s("malloc_decay_steps", "int", 16, "steps", "idle pages of the large-object heap beyond its high-water mark since "
       "the plan, and planned classes unused, are given back after this many steps (0: never)", minimum=0, maximum=INT32_MAX, c="malloc"),
    # -- tier mode (the preload allocator's PMEM pool) and the PMEM segment allocator
    _s("tier_pool_path", "path", "", "", "pool file for tier mode; empty keeps everything in DRAM", c="tier", alias="pmem_path"),
    _s("tier_pool_size", "size", 1 << 30, "bytes", "size of the pool file created for tier mode", minimum=1 << 20,
       c="tier", alias="pmem_size"),
    _s("tier_min_size", "size", 64 * 1024, "bytes", "smallest long-lived allocation that tier mode places in the pool",
       minimum=64, c="tier", alias="pmem_min_size"),
    _s("tier_resident_max", "size", 0, "bytes", "tier mode: pool pages kept in DRAM at most; past it the coldest "
       "64 KiB chunks by measured write heat (tier_heat_every) are written out and dropped with MADV_PAGEOUT (whole "
       "records round-robin, checked at most once a second, where the kernel cannot measure heat); 0 leaves it to "
       "the kernel", minimum=0, c="tier", alias="pmem_resident_max"),
    _s("tier_heat_every", "int", 4, "steps", "tier mode with tier_resident_max or tier_dram_head: every this many "
       "step marks, learn which pool pages the steps wrote (userfaultfd async write-protect + PAGEMAP_SCAN, Linux >= "
       "6.7), enforce the budget on that heat and give the hottest chunks their share of tier_dram_head "
       "(tier_dram_head_heat_pct); 0: no heat, the budget drops whole records round-robin and the heads take all "
       "of tier_dram_head", minimum=0,
       maximum=1 << 20, c="tier"),
    _s("tier_heat_worker", "bool", True, "", "tier mode with heat: run the budget's heat passes on a thread of the "
       "allocator beside the steps; off: inside the step marks, on the steps' time (what a pass dropped is then out "
       "of DRAM before the next step)", c="tier"),
    _s("tier_cold_hint", "bool", True, "", "tier mode: at the first step mark, advise the kernel that every pool page "
       "written so far is cold (MADV_COLD), so pages only initialisers touched are reclaimed before the ones steps use",
       c="tier", alias="pmem_cold_hint"),
    _s("tier_dram_head", "size", 0, "bytes", "tier mode: pool pages kept as the process's own DRAM, never written to "
       "the pool file, this many bytes in all (at most half of MemAvailable at the first step mark): a private "
       "mapping over them, whose pages become anonymous once a step writes them. At the first mark the same leading "
       "share of every pooled record of 1 MiB or more (with rows in first-seen order, the hottest rows); where page "
       "heat runs (tier_heat_every), tier_dram_head_heat_pct of it goes to the 64 KiB chunks the steps write most "
       "instead, as the heat passes find them; 0: off", minimum=0, c="tier", alias="pmem_dram_head"),
    _s("tier_dram_head_heat_pct", "int", 0, "%", "tier mode with tier_dram_head and page heat (tier_heat_every): the "
       "share of tier_dram_head the heat passes give to the 64 KiB chunks the steps write most, as they find them; "
       "the rest goes to the first step mark's leading shares. At most 256 MiB (4,096 promotions of one chunk: a "
       "process makes no more). Worth it where tables are used unequally (e.g. 50: -22% major faults); with heads "
       "alone it arms the heat watch, whose write faults cost the full-scale bench 1.4x its step time. 0: all "
       "leading shares (no chunk promoted); 100: all by heat, up to that",
       minimum=0, maximum=100, c="tier"),
    _s("tier_pager", "bool", False, "", "tier mode: at the first step mark, every pooled record of 1 MiB or more "
       "becomes the process's anonymous memory paged by rtkit itself (userfaultfd, Linux >= 6.8) instead of the "
       "kernel's page cache over the pool file: a page is read from the pool at its first touch (a hole: zeroed pages, "
       "that one and the next ones), written to it only when evicted, and evicted once the process's anonymous memory "
       "nears MemAvailable less tier_pager_reserve: pages written in the fewest heat scans first, the least recently "
       "written first among them. Replaces tier_dram_head; where the kernel refuses, the DRAM heads run instead and "
       "the report says why", c="tier"),
    _s("tier_pager_reserve", "size", 3 << 30, "bytes", "tier mode with tier_pager: DRAM the pager leaves free for "
       "the rest of the machine (the page cache of the job's own files, other processes, TensorFlow's growth): it "
       "evicts once the process's anonymous memory reaches its value at the first step mark plus MemAvailable then "
       "less this", minimum=64 << 20, c="tier"),
    _s("tier_pager_max", "size", 0, "bytes", "tier mode with tier_pager: at most this much more anonymous memory than "
       "the process held at the first step mark before the pager evicts (acts out a smaller DRAM, as "
       "tier_resident_max does for the page cache); 0: what MemAvailable less tier_pager_reserve allows",
       minimum=0, c="tier"),
    _s("tier_pager_heat_every", "int", 32, "steps", "tier mode with tier_pager: every this many step marks, learn "
       "which paged pages the steps wrote (asynchronous write-protect, one cheap fault at the next write to each "
       "page): the eviction order. Fewer scans cost fewer faults and see heat coarser", minimum=1,
       maximum=1 << 20, c="tier"),
    _s("tier_pager_heat_from", "int", 90, "%", "tier mode with tier_pager: the heat scans start at the latest once "
       "the process's anonymous memory has grown by this share of the pager's room (from the first step mark to its "
       "limit): before that nothing is near eviction, and a scan costs the steps a fault at the next write to each "
       "page they write. 0: from the first step mark", minimum=0, maximum=100, c="tier"),
    _s("tier_pager_heat_lead", "int", 16, "scans", "tier mode with tier_pager: the heat scans start earlier, this many "
       "scans (of tier_pager_heat_every steps) before the process would reach its limit at the rate its anonymous "
       "memory grew over the last steps: enough scans to rank pages by the first eviction, no faults for the steps "
       "long before it. 0: by tier_pager_heat_from alone", minimum=0, maximum=1 << 16, c="tier"),
    _s("pmem_segment_size", "size", 1 << 20, "bytes", "segment size of new pools", minimum=64 * 1024,
       maximum=1 << 40, c="pmem"),
    _s("pmem_block_size", "size", 64, "bytes", "block size (smallest unit) of new pools, a power of two >= 8",
       minimum=8, maximum=65536, c="pmem"),
    _s("pmem_max_record", "size", 4096, "bytes", "largest record served from record classes; larger ones take whole segments",
       minimum=64, maximum=1 << 30, c="pmem"),
    _s("pmem_rebalance_ms", "int", 1000, "ms", "interval of the background thread that moves thread-cache free lists to the pool",
       minimum=1, maximum=3_600_000, c="pmem"),
    _s("pmem_rebalance_min", "int", 8, "records", "a thread-cache free list is moved once it holds at least this many records",
       minimum=1, maximum=1 << 30, c="pmem"),
    _s("pmem_durable", "bool", True, "", "pools made by the Python API persist a header per record before alloc returns "
       "(off: DeepRec's volatile mode); tier mode's pool is always volatile", c="pmem"),
    _s("pmem_membarrier", "bool", True, "", "guard thread caches with membarrier where the kernel has it; off: a spin "
       "lock instead (a diagnostic, for ThreadSanitizer runs)", c="pmem", alias="pmem_no_membarrier",
       alias_inverted=True),
    # -- stage-aware scheduler
    _s("sched", "bool", False, "", "give TensorFlow sessions rtkit's thread configuration and per-stage pools; off "
       "in tier mode (a pool path), only the lookahead of fed ids runs (sched_lookahead)"),
    _s("sched_stage", "bool", False, "", "pipeline the input stage ahead of compute (SmartStage)"),
    _s("sched_stage_depth", "int", 2, "steps", "how many steps the input stage may run ahead", minimum=1, maximum=64),
    _s("sched_stage_read_ahead", "int", 2, "batches", "batches a reader may read ahead of the input stage's decode "
       "when the read mostly waits (a probe's CPU time under half its wall time); the tuner keeps it only if faster "
       "(0: never)", minimum=0, maximum=64),
    _s("sched_lookahead", "choice", "auto", "", "make the rows the next staged batch gathers resident before its step "
       "(a worker touches their pages of the tables and optimizer slots), or a step's fed rows just before it runs; "
       "auto: on in tier mode (a pool path), where the fed rows' lookahead runs even with sched=0, alone (no pools, "
       "staging or tuning); measure: count the resident pages only, touch nothing",
       choices=("auto", "on", "off", "measure")),
    _s("sched_lookahead_max_rows", "int", 1 << 20, "rows", "rows a batch's lookahead touches at most (all tables)",
       minimum=1, maximum=1 << 30),
    _s("sched_lookahead_wait_ms", "int", 0, "ms", "a step whose batch the lookahead has not finished waits for it at "
       "most this long (its pages asked for together, instead of faulted in one by one inside the step); 0: never "
       "waits", minimum=0, maximum=600_000),
    _s("sched_inter_op", "int", 0, "threads", "inter-op threads for compute (0: chosen by rtkit)", minimum=0),
    _s("sched_intra_op", "int", 0, "threads", "intra-op threads (0: chosen by rtkit)", minimum=0),
    _s("sched_input_threads", "int", 0, "threads", "threads of the input stage's pool (0: chosen by rtkit)", minimum=0),
    _s("sched_tune", "bool", False, "", "try thread configurations in the first steps and keep the fastest"),
    _s("sched_tune_steps", "int", 60, "steps", "step budget for tuning trials", minimum=0),
    _s("sched_pin", "bool", False, "", "pin each stage pool's threads to its own CPU set"),
    _s("sched_override_user", "bool", False, "", "let rtkit's thread settings win over the script's own ConfigProto"),
    _s("sched_save_profile", "path", "", "", "write the tuned configuration as a profile TOML to this path"),
]

BY_KEY: Dict[str, Setting] = {s.key: s for s in SETTINGS}
BY_ENV: Dict[str, Setting] = {s.env: s for s in SETTINGS}
BY_ALIAS: Dict[str, Setting] = {s.alias: s for s in SETTINGS if s.alias}
BY_ALIAS_ENV: Dict[str, Setting] = {s.alias_env: s for s in SETTINGS if s.alias}

# RTKIT_* variables that are not settings: set by rtkit itself for the child.
INTERNAL_ENV = {"RTKIT_RUN_DIR", "RTKIT_LAUNCH_SERVING", "RTKIT_LAUNCH_CLOCK", "RTKIT_LAUNCHER_PID", "RTKIT_RUN_PID", "RTKIT_PROFILE_PATH", "RTKIT_ACTIVE", "RTKIT_LIB_DIR", "RTKIT_PROFILE"}


def _normal_key(key: str) -> str:
    norm = key.strip().lower().replace("-", "_").replace(".", "_")
    if norm.startswith("rtkit_"):
        norm = norm[len("rtkit_"):]
    if norm not in BY_KEY and norm not in BY_ALIAS:
        raise ConfigError(f"unknown setting '{key}': run `rtkit config --list` to see the settings")
    return norm


def lookup(key: str) -> Setting:
    """The setting a key (or its old name) names."""
    norm = _normal_key(key)
    return BY_KEY.get(norm) or BY_ALIAS[norm]


# ---------------------------------------------------------------------------------------------
# profiles


def profile_dirs() -> List[str]:
    dirs = [p for p in os.environ.get(PROFILE_DIR_ENV, "").split(os.pathsep) if p]
    import importlib.resources as ir

    dirs.append(str(ir.files("rtkit.profiles")))  # profiles/ itself in the editable install
    return dirs


def available_profiles() -> Dict[str, str]:
    found: Dict[str, str] = {}
    for d in profile_dirs():
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(".toml") and f[:-5] not in found:
                    found[f[:-5]] = os.path.join(d, f)
    return found


def find_profile(name_or_path: str) -> str:
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        if not os.path.isfile(name_or_path):
            raise ConfigError(f"profile file '{name_or_path}' not found")
        return name_or_path
    profiles = available_profiles()
    if name_or_path not in profiles:
        raise ConfigError(f"unknown profile '{name_or_path}': available profiles are "
                          f"{', '.join(sorted(profiles)) or '(none)'}")
    return profiles[name_or_path]


@dataclass
class Profile:
    name: str
    path: str
    description: str
    values: Dict[str, Any]           # parsed values, includes resolved first
    origin: Dict[str, str]           # key -> profile name that set it
    errors: List[str] = field(default_factory=list)  # out-of-range values that fell back to the default


def load_profile(name_or_path: str, _chain: tuple = ()) -> Profile:
    path = find_profile(name_or_path)
    name = os.path.splitext(os.path.basename(path))[0]
    if path in _chain:
        raise ConfigError(f"profile '{path}': include cycle through {' -> '.join(_chain + (path,))}")
    # Safety rule (docs/safety.md): a profile is bounded before it is trusted: a regular file, at most
    # PROFILE_MAX_BYTES, UTF-8 TOML; anything else is one line naming the file.
    try:
        data = _toml.loads(_read_profile_text(path))
    except (OSError, UnicodeDecodeError, _toml.TOMLDecodeError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            ("not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc) or type(exc).__name__)
        raise ConfigError(f"profile '{path}': cannot be read: {reason}") from None
    unknown_top = set(data) - {"description", "include", "settings"}
    if unknown_top:
        raise ConfigError(f"profile '{path}': unknown top-level key(s) {', '.join(sorted(unknown_top))}; "
                          "accepted: description, include, settings")
    values: Dict[str, Any] = {}
    origin: Dict[str, str] = {}
    errors: List[str] = []
    include = data.get("include")
    if include:
        base = load_profile(str(include), _chain + (path,))
        values.update(base.values)
        origin.update(base.origin)
        errors.extend(base.errors)
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"profile '{path}': [settings] must be a table of key = value")
    for key, raw in settings.items():
        if key in BY_ALIAS and BY_ALIAS[key].key not in settings:
            setting = BY_ALIAS[key]
            errors.append(setting.renamed_message(f"profile '{path}':"))
            try:
                raw = setting.from_alias(raw)
            except ValueError as exc:
                raise ConfigError(f"profile '{path}': {key} = {raw!r} is not valid: expected {exc}") from None
            key = setting.key
        elif key in BY_ALIAS:
            continue  # the new name is set too: it wins
        if key not in BY_KEY:
            raise ConfigError(f"profile '{path}': unknown setting '{key}': run `rtkit config --list` to see the settings")
        setting = BY_KEY[key]
        if setting.deprecated:
            errors.append(setting.retired_message(f"profile '{path}':"))
            continue
        try:
            values[key] = setting.parse(raw)
        except OutOfRange:
            errors.append(bad_value_message(setting, raw, f"profile '{path}':"))
            values.pop(key, None)
            continue
        except ValueError as exc:
            raise ConfigError(f"profile '{path}': {key} = {raw!r} is not valid: expected {exc}") from None
        origin[key] = name
    return Profile(name=name, path=path, description=str(data.get("description", "")), values=values, origin=origin,
                   errors=errors)


PROFILE_MAX_BYTES = 1 << 20


def _read_profile_text(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        if st.st_size > PROFILE_MAX_BYTES:
            raise OSError(0, f"larger than {PROFILE_MAX_BYTES} bytes")
        data = os.read(fd, PROFILE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    return data.decode("utf-8")


def _toml_string(text: str) -> str:
    out = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if " " <= c != "\x7f" else f"\\u{ord(c):04x}" for c in out) + '"'


def profile_text(values: Mapping[str, Any], description: str) -> str:
    """A profile in the format load_profile reads (the one place that knows it); keys are table keys."""
    lines = [f"description = {_toml_string(description)}", "", "[settings]"]
    for key, value in values.items():
        setting = BY_KEY[key]  # a key outside the table is a programming error, not user input
        if isinstance(value, bool):
            lines.append(f"{setting.key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            lines.append(f"{setting.key} = {value}")
        else:
            lines.append(f"{setting.key} = {_toml_string(value)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# resolution


@dataclass
class Resolved:
    values: Dict[str, Any]
    sources: Dict[str, str]          # key -> 'cli' | 'env' | 'profile:NAME' | 'default'
    profile: Optional[str] = None
    errors: List[str] = field(default_factory=list)  # env errors that were replaced by the fallback value

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def child_env(self) -> Dict[str, str]:
        """RTKIT_* variables for the child: every setting, so the C side and the hooks see final values (a
        retired one is not passed on: nothing reads it)."""
        return {BY_KEY[k].env: BY_KEY[k].to_env(v) for k, v in self.values.items() if not BY_KEY[k].deprecated}

    def as_report(self) -> Dict[str, Dict[str, Any]]:
        return {k: {"value": self.values[k], "source": self.sources[k], "env": BY_KEY[k].env} for k in self.values}


def bad_value_message(setting: Setting, raw: Any, where: str) -> str:
    return (f"rtkit: {where} {setting.env}={raw!r} is not valid: expected {setting.accepted()}; "
            f"using the default {setting.to_env(setting.default)!r}")


def _old_name(setting: Setting, raw: Any, where: str, said: Dict[str, str], new_is_set: bool) -> Any:
    """A value given under a setting's old name: its warning line (once per setting), and the value in the new
    name's form; None when the new name is set too (it wins). A value the old name cannot take is passed on as
    it is: the new setting's parse names it."""
    said.setdefault(setting.key, setting.renamed_message(where))
    if new_is_set:
        return None
    try:
        return setting.from_alias(raw)
    except ValueError:
        return str(raw)


def resolve(cli: Optional[Mapping[str, Any]] = None, env: Optional[Mapping[str, str]] = None,
            profile: Optional[str] = None, strict_env: bool = False) -> Resolved:
    """Resolve every setting. CLI values and profiles must be valid (ConfigError). A bad environment
    value raises with strict_env, otherwise it is recorded in .errors and the default is used, so
    that the user's job still runs."""
    env = os.environ if env is None else env
    cli = cli or {}
    values = {s.key: s.default for s in SETTINGS}
    sources = {s.key: "default" for s in SETTINGS}
    errors: List[str] = []
    retired: Dict[str, str] = {}  # one line per retired setting, however many places set it
    profile_name = profile or env.get("RTKIT_PROFILE") or None
    if profile_name:
        prof = load_profile(profile_name)
        errors.extend(prof.errors)
        for key, value in prof.values.items():
            values[key] = value
            sources[key] = f"profile:{prof.origin[key]}"
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in INTERNAL_ENV:
            continue
        if name in BY_ALIAS_ENV:
            raw = _old_name(BY_ALIAS_ENV[name], raw, "environment", retired, BY_ALIAS_ENV[name].env in env)
            if raw is None:
                continue
        setting = BY_ENV.get(name) or BY_ALIAS_ENV.get(name)
        if setting is None:
            errors.append(f"rtkit: unknown environment variable {name} ignored: run `rtkit config --list` "
                          "to see the settings")
            continue
        if setting.deprecated:
            retired.setdefault(setting.key, setting.retired_message("environment"))
            continue
        try:
            values[setting.key] = setting.parse(raw)
            sources[setting.key] = "env"
        except ValueError:
            msg = bad_value_message(setting, raw, "environment")
            if strict_env:
                raise ConfigError(msg) from None
            errors.append(msg)
    for key, raw in cli.items():
        setting = lookup(key)
        if _normal_key(key) in BY_ALIAS:
            raw = _old_name(setting, raw, "--set", retired, setting.key in cli)
            if raw is None:
                continue
        if setting.deprecated:
            retired.setdefault(setting.key, setting.retired_message("--set"))
            continue
        try:
            values[setting.key] = setting.parse(raw)
        except OutOfRange:
            errors.append(bad_value_message(setting, raw, "--set"))
            values[setting.key] = setting.default
            sources[setting.key] = "default"
            continue
        except ValueError:
            raise ConfigError(f"rtkit: --set {setting.key}={raw!r} is not valid: expected {setting.accepted()}") from None
        sources[setting.key] = "cli"
    errors.extend(retired.values())
    return Resolved(values=values, sources=sources, profile=profile_name, errors=errors)


def parse_assignments(items: List[str]) -> Dict[str, str]:
    """`--set key=value` items to a dict, with a clear error for a malformed item."""
    out: Dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"rtkit: --set {item!r} must look like KEY=VALUE (e.g. --set malloc_min_size=64K)")
        key, value = item.split("=", 1)
        out[_normal_key(key)] = value  # an old name stays as written: resolve() warns and converts it
    return out


def from_child_env(key: str, env: Optional[Mapping[str, str]] = None) -> Any:
    """Read one resolved setting inside the child (falls back to the default on a bad value)."""
    env = os.environ if env is None else env
    setting = BY_KEY[key]
    raw = env.get(setting.env)
    if raw is None:
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError:
        return setting.default


def doc_table() -> str:
    """The settings table as Markdown, for the README (a test keeps the README in step)."""
    rows = ["| variable | type | default | doc |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = format_size(s.default) if s.kind == "size" else s.to_env(s.default)
        unit = f" {s.unit}" if s.unit and s.kind != "size" else ""
        doc = f"retired, ignored with one warning line: {s.deprecated}" if s.deprecated else s.doc
        if s.alias:
            doc += (f" (old name `{s.alias_env}`, {'its value the opposite, ' if s.alias_inverted else ''}"
                    "read with a warning until the next release)")
        rows.append(f"| `{s.env}` | {s.kind} | `{default}`{unit} | {doc} |")
    return "\n".join(rows)


