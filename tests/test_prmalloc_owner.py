# test_prmalloc_owner.py -- whose block a pointer is, and how big, is decided in one place: prmalloc/owner.h.
import glob
import os
import re

from conftest import REPO
from test_prmalloc import run_c

PRMALLOC = os.path.join(REPO, "allocators", "src", "prmalloc")
# a pointer tested against one of rtkit's ranges: the first half of every "is it the tier's / the large heap's"
IN_RANGE = re.compile(r"\(uintptr_t\)\s*\w+\s*-\s*(rtk_large_lo|rtk_fastpath\.tier_lo)\b")
# the large heap's page map read for a block's state, bytes and owner word
PAGE_MAP_READ = re.compile(r"\brtk_large_block\s*\(")
# "does the fallback stash keep this block": the stash's answer to the owner question
STASH_ASKED = re.compile(r"\brtk_stash_holds\s*\(")


def _sources():
    for path in sorted(glob.glob(os.path.join(PRMALLOC, "*.[ch]"))):
        with open(path) as fh:
            text = re.sub(r"/\*.*?\*/|//[^\n]*", "", fh.read(), flags=re.S)
        yield os.path.basename(path), text


def test_a_pointer_is_tested_against_rtkits_ranges_only_by_the_owner_lookup():
    testers = {name for name, text in _sources() if IN_RANGE.search(text)}
    # large.c turns a pointer into a page index of its own map (its definition of the range)
    assert testers - {"large.c"} == {"owner.h"}, sorted(testers)


def test_the_page_map_is_asked_by_the_owner_lookup_alone():
    # the class free checks and clears the owner word in one call under its lock (rtk_large_swap_owner)
    callers = {name for name, text in _sources() if PAGE_MAP_READ.search(text)}
    assert callers - {"large.c", "large.h"} == {"owner.h"}, sorted(callers)


def test_free_realloc_usable_size_and_the_public_checks_use_the_owner_lookup():
    texts = dict(_sources())
    users = {name for name, text in texts.items() if re.search(r"\brtk_owner_of\s*\(", text)} - {"owner.h"}
    assert users == {"alloc.c", "interpose.c", "init.c"}, sorted(users)
    for name, function in (("alloc.c", "rtk_usable_size"), ("alloc.c", "rtk_realloc"), ("interpose.c", "free_special"),
                           ("init.c", "rtkit_malloc_in_arena"), ("init.c", "rtkit_malloc_in_pmem")):
        body = re.search(r"\b%s\([^)]*\)\s*\{(.*?)\n\}" % function, texts[name], re.S)
        assert body and "rtk_owner_of(" in body.group(1), f"{name}: {function} asks the owner elsewhere"


def test_the_fallback_stash_is_asked_only_as_one_of_the_owners():
    # free, realloc and malloc_usable_size asked the stash apart from the owner lookup
    askers = {name for name, text in _sources() if STASH_ASKED.search(text)}
    assert askers - {"fallback_stash.h"} == {"owner.h"}, sorted(askers)


def test_a_block_the_stash_keeps_is_the_stashs_for_free_realloc_and_usable_size(prm):
    # the lookup said "glibc's" for a kept block: its size was glibc's, and only a second ask caught the bug
    proc = run_c(prm, "prmalloc_unit_owner", preload=False, extra={"RTKIT_MALLOC_LARGE": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "prmalloc_unit_owner: ok\n"
    assert proc.stderr.count("aborting") == 2, proc.stderr  # the second free and the realloc, one line each
