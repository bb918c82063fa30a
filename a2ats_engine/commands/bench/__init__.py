"""`a2ats bench ...`: benchmarks that compare methods as ratios within one run, one module per
subcommand (each with `register(bench)` and its run function); the shared flags in
`../_flags.py`, their range checks in `../_limits.py`, shared run code in `../_bench_common.py`."""

from __future__ import annotations

import argparse

from . import codebooks, cold, decode, memory, passkey, prefill, seed, tasks


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (decode speed, memory, ...)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH")
    bench.required = True
    for module in (decode, memory, cold, prefill, passkey, tasks, seed, codebooks):
        module.register(bench)
