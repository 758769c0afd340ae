# test_config.py -- the settings table: parsing, precedence, profiles and their validation, `rtkit config`, docs.
import json
import os

import pytest

from conftest import REPO, run_rtkit
from rtkit import config as cfg


@pytest.mark.parametrize("text,value", [("4096", 4096), ("64K", 65536), ("1m", 1 << 20), ("2G", 2 << 30),
                                        ("3KiB", 3072), (" 5 ", 5)])
def test_sizes(text, value):
    assert cfg.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1.5M", "-1", "12Q", "K"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        cfg.parse_size(text)


@pytest.mark.parametrize("text,value", [("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False),
                                        ("false", False)])
def test_bools(text, value):
    assert cfg.parse_bool(text) is value


def test_every_setting_default_is_valid_and_env_named():
    for s in cfg.SETTINGS:
        assert s.env == "RTKIT_" + s.key.upper()
        assert s.parse(s.to_env(s.default)) == s.default, s.key
        assert s.doc and s.kind in ("bool", "int", "size", "str", "path", "choice")


def test_precedence_cli_env_profile_default():
    env = {"RTKIT_MALLOC_MIN_SIZE": "128K", "RTKIT_SCHED_STAGE_DEPTH": "5"}
    r = cfg.resolve(cli={"sched_stage_depth": "7"}, env=env, profile="throughput")
    assert r["sched_stage_depth"] == 7 and r.sources["sched_stage_depth"] == "cli"
    assert r["malloc_min_size"] == 128 << 10 and r.sources["malloc_min_size"] == "env"
    assert r["sched"] is True and r.sources["sched"] == "profile:throughput"
    assert r["malloc"] is True and r.sources["malloc"] == "profile:default"  # through include
    assert r["warmup_steps"] == 3 and r.sources["warmup_steps"] == "default"


def test_bad_env_value_falls_back_with_one_message():
    r = cfg.resolve(env={"RTKIT_MALLOC_ARENA_LIMIT": "huge"})
    assert r["malloc_arena_limit"] == 4 << 30
    assert len(r.errors) == 1 and "RTKIT_MALLOC_ARENA_LIMIT" in r.errors[0] and "64K" in r.errors[0]
    with pytest.raises(cfg.ConfigError):
        cfg.resolve(env={"RTKIT_MALLOC_ARENA_LIMIT": "huge"}, strict_env=True)


def test_unknown_env_variable_is_reported():
    r = cfg.resolve(env={"RTKIT_MALOC": "1"})
    assert any("RTKIT_MALOC" in e for e in r.errors)


def test_child_env_round_trips():
    r = cfg.resolve(env={}, profile="memory")
    again = cfg.resolve(env=r.child_env())
    assert again.values == r.values


def test_shipped_profiles_load():
    names = set(cfg.available_profiles())
    assert {"default", "throughput", "memory", "off"} <= names
    for name in names:
        cfg.load_profile(name)
    assert cfg.load_profile("off").values["malloc"] is False


def _write(tmp_path, name, text):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return str(path)


def test_profile_unknown_key_names_file_and_key(tmp_path):
    path = _write(tmp_path, "p", "[settings]\nmaloc = true\n")
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load_profile(path)
    assert "p.toml" in str(err.value) and "maloc" in str(err.value)


def test_profile_bad_value_names_accepted(tmp_path):
    path = _write(tmp_path, "p", "[settings]\nmalloc_min_size = \"big\"\n")
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load_profile(path)
    assert "malloc_min_size" in str(err.value) and "'big'" in str(err.value) and "64K" in str(err.value)


def test_profile_include_cycle(tmp_path, monkeypatch):
    _write(tmp_path, "a", 'include = "b"\n')
    _write(tmp_path, "b", 'include = "a"\n')
    monkeypatch.setenv(cfg.PROFILE_DIR_ENV, str(tmp_path))
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load_profile("a")
    assert "cycle" in str(err.value)


def test_profile_include_overrides(tmp_path, monkeypatch):
    _write(tmp_path, "mine", 'include = "throughput"\n[settings]\nsched_tune = false\n')
    monkeypatch.setenv(cfg.PROFILE_DIR_ENV, str(tmp_path))
    prof = cfg.load_profile("mine")
    assert prof.values["sched_tune"] is False and prof.origin["sched_tune"] == "mine"
    assert prof.values["sched_stage"] is True and prof.origin["sched_stage"] == "throughput"


def test_rtkit_config_shows_sources():
    proc = run_rtkit(["config", "--profile", "throughput", "--set", "warmup_steps=9", "--json"],
                     env={"RTKIT_MALLOC_MIN_SIZE": "64K"}, check_rc=0)
    data = json.loads(proc.stdout)["settings"]
    assert data["warmup_steps"] == {"value": 9, "source": "cli", "env": "RTKIT_WARMUP_STEPS"}
    assert data["malloc_min_size"]["source"] == "env"
    assert data["sched_stage"]["source"] == "profile:throughput"
    text = run_rtkit(["config"], check_rc=0).stdout
    assert "RTKIT_MALLOC_PROFILE_MAX" in text and "default" in text


def test_rtkit_config_bad_profile_exit_2():
    proc = run_rtkit(["config", "--profile", "nope"])
    assert proc.returncode == 2 and "unknown profile" in proc.stderr


def test_readme_settings_table_is_current():
    with open(os.path.join(REPO, "README.md")) as fh:
        readme = fh.read()
    assert cfg.doc_table() in readme, "README settings table is stale: paste `rtkit config --markdown` into it"


def test_c_allocator_defaults_match_the_table(tmp_path, malloc_lib):
    """librtkit_malloc.so parses its own environment: its defaults must be the table's."""
    import glob
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_")}
    env.update(LD_PRELOAD=malloc_lib, RTKIT_RUN_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL(None).rtkit_step_mark()"], env=env, check=True)
    with open(glob.glob(str(tmp_path / "allocator-*.json"))[0]) as fh:
        seen = json.load(fh)["config"]
    # the stats file echoes every setting of the allocator's part under the table's key; run_dir is rtkit's, not a setting
    expected = {s.key for s in cfg.SETTINGS if s.c == "malloc"}
    assert set(seen) - {"run_dir"} == expected
    for key in expected:
        assert seen[key] == cfg.BY_KEY[key].default, (key, seen[key], cfg.BY_KEY[key].default)


def test_profile_text_is_read_back_by_load_profile(tmp_path):
    """The one profile format: what the scheduler's tuner writes (config.profile_text) loads unchanged."""
    values = {"sched": True, "sched_stage": False, "sched_inter_op": 3, "malloc_arena_limit": "1G",
              "sched_save_profile": 'odd "name"\\with\ttab'}
    path = tmp_path / "tuned.toml"
    path.write_text(cfg.profile_text(values, 'Tuned "today"'))
    prof = cfg.load_profile(str(path))
    assert prof.description == 'Tuned "today"'
    assert prof.values == {k: cfg.BY_KEY[k].parse(v) for k, v in values.items()}


def test_bundled_profiles_say_what_they_set():
    """A profile's description must not contradict its settings (the scheduler part, at least)."""
    for name, path in cfg.available_profiles().items():
        prof = cfg.load_profile(path)
        text = prof.description.lower()
        if "scheduler off" in text or "no scheduler" in text:
            assert prof.values.get("sched") is False, name
        elif "scheduler" in text:
            assert prof.values.get("sched") is True, name


# ---- retired settings: ignored with one line naming the setting and what to do, wherever they are set

RETIRED = [s for s in cfg.SETTINGS if s.deprecated]


def test_a_retired_setting_warns_once_and_is_ignored(tmp_path):
    assert RETIRED, "the table has a retired row to check"
    s = RETIRED[0]
    prof = tmp_path / "old.toml"
    prof.write_text(f"[settings]\n{s.key} = {json.dumps(s.to_env(not s.default) if s.kind != 'bool' else not s.default)}\n")
    res = cfg.resolve(cli={s.key: "1"}, env={s.env: "1"}, profile=str(prof))
    lines = [e for e in res.errors if s.env in e]
    assert len(lines) == 2, res.errors  # one for the profile (its own file), one for the command line and environment
    assert all("retired and ignored" in e and s.deprecated in e for e in lines)
    assert res[s.key] == s.default and res.sources[s.key] == "default"
    assert s.env not in res.child_env()


def test_rtkit_run_says_one_line_for_a_retired_setting_and_runs_the_job(tmp_path):
    s = RETIRED[0]
    proc = run_rtkit(["run", "--out", str(tmp_path), "--set", f"{s.key}=1", "--", "python3", "-c", "print('ran')"],
                     env={s.env: "1", "RTKIT_MALLOC": "0"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == "ran", proc.stderr
    said = [line for line in proc.stderr.splitlines() if s.env in line and "retired and ignored" in line]
    # one warning line before the job runs (the run's summary repeats its notes, as for any bad value)
    assert len([line for line in said if not line.startswith("rtkit: note:")]) == 1, proc.stderr


# ---- renamed settings: the old name is read for one release, with one line naming the new one

RENAMED = [s for s in cfg.SETTINGS if s.alias]


def test_a_renamed_setting_is_read_under_its_old_name_with_one_line(tmp_path):
    assert RENAMED, "the table has a renamed row to check"
    s = cfg.BY_KEY["pmem_membarrier"]
    assert s.alias == "pmem_no_membarrier" and s.alias_inverted
    res = cfg.resolve(env={"RTKIT_PMEM_NO_MEMBARRIER": "1"})
    assert res["pmem_membarrier"] is False and res.sources["pmem_membarrier"] == "env"
    lines = [e for e in res.errors if "RTKIT_PMEM_NO_MEMBARRIER" in e]
    assert len(lines) == 1 and "renamed RTKIT_PMEM_MEMBARRIER" in lines[0], res.errors
    assert "RTKIT_PMEM_NO_MEMBARRIER" not in res.child_env() and res.child_env()["RTKIT_PMEM_MEMBARRIER"] == "0"
    # the new name wins where both are set; the old one still gets its line
    both = cfg.resolve(env={"RTKIT_PMEM_NO_MEMBARRIER": "1", "RTKIT_PMEM_MEMBARRIER": "1"})
    assert both["pmem_membarrier"] is True and len([e for e in both.errors if "renamed" in e]) == 1, both.errors
    # the command line beats the environment, whichever name either uses
    over = cfg.resolve(env={"RTKIT_PMEM_MEMBARRIER": "1"}, cli=cfg.parse_assignments(["pmem_no_membarrier=1"]))
    assert over["pmem_membarrier"] is False and over.sources["pmem_membarrier"] == "cli"
    cli = cfg.resolve(cli=cfg.parse_assignments(["pmem_no_membarrier=0"]), env={})
    assert cli["pmem_membarrier"] is True and cli.sources["pmem_membarrier"] == "cli"
    prof = tmp_path / "old.toml"
    prof.write_text("[settings]\npmem_no_membarrier = true\n")
    loaded = cfg.resolve(profile=str(prof), env={})
    assert loaded["pmem_membarrier"] is False and any("renamed" in e for e in loaded.errors)
    assert cfg.lookup("RTKIT_PMEM_NO_MEMBARRIER") is s
