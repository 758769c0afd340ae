#!/usr/bin/env python3
# pmem_build.py -- build the PMEM benchmark driver (allocators/bench/pmem_bench.c) against the pool sources.
"""Usage: python allocators/bench/pmem_build.py [--out DIR]; then DIR/pmem_bench [throughput|recovery|all]."""
import argparse
import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ALLOC = os.path.dirname(HERE)
sys.path.insert(0, ALLOC)
import build  # noqa: E402  the flags and pmem settings of the one native build


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(ALLOC), "build", "native", "bench"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    cflags, ldflags = build.pmem_flags()
    sources = [os.path.join(HERE, "pmem_bench.c")]
    for folder in ("common", "pmem"):
        sources += sorted(glob.glob(os.path.join(ALLOC, "src", folder, "*.c")))
    target = os.path.join(args.out, "pmem_bench")
    cmd = [build.CC, *build.CFLAGS, *build._gen_flags(args.out), *cflags, "-o", target, *sources, *ldflags, "-lpmemobj", "-ldl", "-lm"]
    if subprocess.run(cmd).returncode:
        sys.exit("pmem_bench build failed: " + " ".join(cmd))
    print(target)


if __name__ == "__main__":
    main()
