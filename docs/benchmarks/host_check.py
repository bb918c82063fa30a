"""One host's decode-speed runs in one go, and the speed targets checked against them.

Decode speed depends on the host (BENCHMARKS section 2, "Hosts"), and a claim holds only once a
second host has measured it. On a quiet machine, from the repository root:

    .venv/bin/python docs/benchmarks/host_check.py            # about 25 min
    .venv/bin/python docs/benchmarks/host_check.py --verdicts # only the verdicts, from the files

runs, in this order (the probe first: the decode's default reads the crossover it records),

1. `a2ats crossover demo --contexts 1024,2048,4096,8192 --json`
2. `a2ats bench decode --contexts 1024,2048,4096,8192 --steps 32 --repeats 3
   --methods full,a2ats,a2ats_eb0,a2ats_eb0_sync --json`
3. `a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json`

into `docs/benchmarks/{crossover_demo,decode,profile}_host_check_<tag>.json`, the tag naming the
CPU (`f25m17`: family 25 model 17, from /proc/cpuinfo), and prints the targets against them:

- the fixed cost: a retrieval step forced at 1K (`a2ats_eb0`) takes <= 1.2x KVCache's time;
- never slower: the shipped default (`a2ats`) >= 1.0x KVCache at 8K (and each context shown);
- >= 1.5x KVCache at 8K where full attention is the larger part of a KVCache step (its share:
  the profile's exact attention per layer times the A2ATS layers, over a KVCache step).

A run that fails stops the script; nothing half-written is left under the run's name. To put
the runs in BENCHMARKS: `*host_check_set("<tag>")` in `tables.py`'s `blocks()`, the decode file
in its `HOST_RUNS`, the three `<!-- begin/end generated: ...-host-check-<tag> -->` markers where
they belong, then `tables.py --write` (the script prints the keys).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONTEXTS = "1024,2048,4096,8192"
RUNS = (
    ("crossover_demo", ["crossover", "demo", "--contexts", CONTEXTS, "--json"]),
    ("decode", ["bench", "decode", "--contexts", CONTEXTS, "--steps", "32", "--repeats", "3",
                "--methods", "full,a2ats,a2ats_eb0,a2ats_eb0_sync", "--json"]),
    ("profile", ["bench", "decode", "--profile", "--contexts", "1024,8000", "--steps", "16",
                 "--json"]),
)  # fmt: skip
FIXED_COST_MAX = 1.2  # a forced step's time at 1K / KVCache's
DEFAULT_8K_MIN = 1.0
ATTENTION_BOUND_8K_MIN = 1.5  # where full attention is the larger part of a KVCache step


def host_tag(cpuinfo: str | None = None) -> str:
    """'f25m17' from the CPU's family and model numbers, 'host' where the OS gives none."""
    sys.path.insert(0, str(ROOT))
    from a2ats_engine.cache.crossover import cpu_model

    words = cpu_model(cpuinfo).split()
    if len(words) < 4 or not (words[1].isdigit() and words[3].isdigit()):
        return "host"
    return f"f{words[1]}m{words[3]}"


def path_of(kind: str, tag: str) -> Path:
    return HERE / f"{kind}_host_check_{tag}.json"


def _ratio(data: dict, method: str, context: int) -> float | None:
    for r in data["results"]:
        if r["method"] == method and r["context"] == context:
            return float(r["ratio_median"])
    return None


def verdicts(decode: dict, profile: dict) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met: True / False, None where it does not apply) from a
    `bench decode` run with full, a2ats and a2ats_eb0 at 1K and 8K and a profile at 8,000."""
    out: list[tuple[str, str, bool | None]] = []
    forced = _ratio(decode, "a2ats_eb0", 1024)
    if forced is None:
        raise ValueError("the decode run has no a2ats_eb0 row at 1,024")
    cost = 1 / forced
    out.append((f"fixed cost <= {FIXED_COST_MAX}x", f"{cost:.2f}x", cost <= FIXED_COST_MAX))
    contexts = sorted({r["context"] for r in decode["results"]})
    default = {n: _ratio(decode, "a2ats", n) for n in contexts}
    if default.get(8192) is None:
        raise ValueError("the decode run has no a2ats row at 8,192")
    shown = ", ".join(f"{n:,} {r:.2f}x" for n, r in default.items() if r is not None)
    out.append((f"default >= {DEFAULT_8K_MIN}x at 8K", shown, default[8192] >= DEFAULT_8K_MIN))
    row = next((r for r in profile["results"] if r["context"] >= 8000), None)
    if row is None or row.get("exact_attention_ms_per_layer") is None:
        raise ValueError("the profile has no row at 8,000 with exact attention timed")
    share = row["a2ats_layers"] * row["exact_attention_ms_per_layer"] / row["kvcache_step_ms"]
    best = max(default[8192], _ratio(decode, "a2ats_eb0", 8192) or 0.0)
    applies = share > 0.5
    met = best >= ATTENTION_BOUND_8K_MIN if applies else None
    out.append(
        (
            f">= {ATTENTION_BOUND_8K_MIN}x at 8K where attention is most of a step",
            f"{best:.2f}x; full attention {share:.1%} of a KVCache step at {row['context']:,}",
            met,
        )
    )
    return out


def _run(kind: str, argv: list[str], tag: str) -> None:
    target = path_of(kind, tag)
    staged = target.with_name(target.name + ".part")
    a2ats = Path(sys.executable).with_name("a2ats")
    print(f"{kind}: a2ats {' '.join(argv)} > {target.relative_to(ROOT)}", flush=True)
    with open(staged, "w") as out:
        done = subprocess.run([str(a2ats), *argv], stdout=out, cwd=ROOT, check=False)
    if done.returncode:
        staged.unlink(missing_ok=True)
        sys.exit(f"{kind} failed (exit {done.returncode}); nothing recorded for it")
    os.replace(staged, target)


def main(argv: list[str]) -> int:
    tag = host_tag()
    if "--verdicts" not in argv:
        for kind, args in RUNS:
            _run(kind, args, tag)
    try:
        decode, profile = (json.loads(path_of(k, tag).read_text()) for k in ("decode", "profile"))
    except (OSError, ValueError) as exc:
        sys.exit(f"no runs recorded for {tag} here ({exc}): run without --verdicts first")
    print(f"{decode['machine']} (tag {tag}):")
    for target, measured, met in verdicts(decode, profile):
        state = {True: "met", False: "NOT met", None: "does not apply"}[met]
        print(f"  {target}: {measured}: {state}")
    keys = ", ".join(f"{k}-host-check-{tag}" for k in ("crossover-probe", "speed", "profile"))
    print(f"BENCHMARKS markers (tables.py host_check_set({tag!r})): {keys}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
