"""Where retrieval starts to pay off: the measured default of `A2ATSConfig.exact_below`.

Below the crossover context a decode step of exact attention is faster than A2ATS's retrieval
(lookup tables, top-K, gathers), so the cache attends exactly there (keys are still coded, so
switching retrieval on later costs nothing). The crossover depends on the machine, the backend
and the model's attention geometry, so the default comes from measurements, looked up in order:

1. the user's own table, `crossover.json` in the engine's data dir (`data_dirs.py`;
   `$A2ATS_CROSSOVER_FILE` overrides the path; `crossover_table.py` reads and writes it),
   written by `a2ats crossover SOURCE` (`commands/crossover.py`) on this machine: rows keyed
   by (backend, machine, attention layers, KV heads, head dim, step kind, host step);
2. the built-in table `MEASURED` below, keyed by (backend, attention layers, KV heads, head dim,
   step kind);
3. else 0: retrieve as soon as anything can be dropped (the behaviour before this setting).

`A2ATSConfig.exact_below` overrides all of them.

The key. `backend()` is "cpu" or "metal"; `machine_id()` names the machine as
"<OS> <architecture>, <N> cores[, <CPU or chip name>][, <family / model numbers>]" (the name
from /proc/cpuinfo on Linux, `sysctl machdep.cpu.brand_string` on macOS: "Apple M2 Pro"; the
numbers on Linux x86, `cpu_model`, since virtual machines of different CPUs share a name such
as "AMD EPYC", and two such 2-core hosts measured the same retrieval step's fixed cost a fifth
apart: docs/BENCHMARKS.md, "Hosts", `decode_native_step.json` and
`decode_native_step_f25m1_before_row_kernels.json`), so a table copied or shared with another
machine is not used there. The geometry is what a cache knows when it is made: the codebook's
attention layers and KV heads, and the RoPE head dim. The number of layers A2ATS serves is not
in the key: a decode step's A2ATS layers cost retrieval instead of exact attention, the other
layers and the MLP cost the same in both, so the context where the two are equally fast does not
move with them (to first order). Two models with the same key share a row (the last measured
wins); the row names the model it was measured on. The step kind (`step_kind`) is what else a
retrieval step's cost depends on: the codebook (one VQ or product VQ with S subspaces), the
budget, the rerank, the distance buckets, the stored K/V precision and the missed-attention
estimate. A row measured with other settings does not apply (turning the estimate on makes a
step about a fifth slower on the CPU: the crossover measured without it would send decode into
retrieval where it is slower); rows written before the kind was recorded count as measured with
the default settings. The user table's key also holds the host step the row was measured with
(`host_step`: the C++ step in MLX's graph, the synced C++ step or the NumPy step; the same
machine's crossover moves with it), so when the step changes (a new build, the graph step
refused for another MLX version) no row measured with another applies, `a2ats info` says so
(`unused_rows`) and the app measures again; a row from before the host step was recorded was
measured with the NumPy step, the slowest, and applies to any (`crossover_table.host_step_of`).

The decision (`decide_crossover`): from the median ratio a2ats / full decode speed per measured
context, the crossover is the first context (ascending) from which the ratio is >= 1 and stays
>= 1 at every larger context measured. Outside the measured range the rule follows the trend
every measurement so far shows (retrieval gains on exact attention as the context grows):
- retrieval already at least as fast at the smallest context: exact below that context;
- retrieval slower at the largest context ("never" within the range): exact attention through
  the largest context measured (`exact_below` = largest + 1) and retrieval beyond it, where
  nothing was measured; `a2ats crossover` and `a2ats info` say so, and measuring longer
  contexts (`--contexts ...,32768`) settles it.

The missed-attention estimate (`A2ATSConfig.estimate_missed`). Its cost is a share of each
retrieval step that depends on the machine and on the retrieving layers and KV heads, so its
default is measured too: the probe behind `a2ats crossover` (with the estimate left at its
default, None) also times, at its largest context, a retrieval step with the estimate, and the
row records the median speed ratio with / without (`estimate.ratio`). None resolves to on every
layer where that ratio is >= `ESTIMATE_FREE` (`measured_estimate`); below it, to on as many
layers as keep a step within that margin (`affordable_layers`, recorded as `estimate.layers`;
which ones: the layers that miss most, `estimate_layers.py`), off where that is none or where
nothing was measured (rows recorded before `estimate.layers`: on every layer or none).
The row stays the settings without the estimate: its crossover serves both, and the top-K
strategy faster with the estimate is recorded beside the one faster without (`estimate.top_k`:
the two strategies' estimates are different code).

The built-in rows come from `a2ats bench decode --contexts 512,1024,2048,4096,8192 --methods
full,a2ats_eb0` on a quiet machine (docs/BENCHMARKS.md); `a2ats crossover SOURCE` measures the
same thing on synthetic caches for any model and records it in the user table.

MLX-free at import; `backend()` asks MLX which device it runs on.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .config import estimate_runs
from .crossover_table import FORMAT as FORMAT  # the user table (re-exported: its one reader)
from .crossover_table import HOST_STEPS, host_step_of, user_table, user_table_path
from .crossover_table import MAX_TABLE_BYTES as MAX_TABLE_BYTES
from .crossover_table import VERSION as VERSION
from .crossover_table import record_crossover as record_crossover
from .crossover_table import reload_user_table as reload_user_table


@dataclass(frozen=True)
class Crossover:
    """One measured crossover: the context (tokens) from which retrieval is faster.

    origin: "built-in" (the `MEASURED` table) or the path of the user table it came from.
    never: retrieval was slower at every context measured; `tokens` is the largest + 1.
    """

    tokens: int
    source: str
    origin: str = "built-in"
    never: bool = False
    top_k: str | None = None  # the top-K strategy measured faster here ("mlx" or "numpy")
    estimate: float | None = None  # speed of a retrieval step with the estimate / without
    estimate_top_k: str | None = None  # the top-K strategy measured faster with the estimate
    estimate_layers: int | None = None  # layers it affords (`affordable_layers`); None: all
    host_step: str | None = None  # the host step it was measured with (`HOST_STEPS`); None: any

    @property
    def estimate_on(self) -> bool:
        """Whether the measurement turns the missed-attention estimate on (None-valued
        `A2ATSConfig.estimate_missed`): on every layer where it costs nothing measurable
        (`estimate_pays`), on `estimate_layers` of them where the row affords some."""
        if self.estimate is None:
            return False
        return estimate_pays(self.estimate) or bool(self.estimate_layers)


ESTIMATE_FREE = 0.95
"""The missed-attention estimate goes on by default (`A2ATSConfig.estimate_missed` None) on every
layer where a retrieval step with it on every layer decoded at >= this share of the speed of one
without (median of the probe's repeats at its largest context), and on fewer layers where that
keeps a step at this share (`affordable_layers`): within the run-to-run spread of a 2-core
machine, so "costs nothing measurable". On a 2-core AMD host the demo model's 30 layers measured well below
it (on 10 or 11 of them by the layer rule) and Gemma 3 270M's 3 at it (one run on all three,
an earlier one on 2) (docs/BENCHMARKS.md section 1, "Across texts: code, prose and dialogue", the
estimate's default, and "The estimate on the layers that miss most")."""


def estimate_pays(ratio: float) -> bool:
    """Whether a measured speed ratio (with the estimate / without) counts as costing nothing."""
    return ratio >= ESTIMATE_FREE


def affordable_layers(ratio: float, layers: int) -> int:
    """Of `layers` layers whose estimate on all of them measured `ratio` (speed with / without),
    on how many it keeps a step at >= `ESTIMATE_FREE` of the speed without: all where it pays,
    else the share of layers whose cost fits, each layer taken to cost the same (what a step
    with it on fewer layers measured: docs/BENCHMARKS.md section 1, "The estimate on the layers
    that miss most")."""
    if estimate_pays(ratio):
        return layers
    return max(0, min(layers, int(layers * (1.0 - ESTIMATE_FREE) / (1.0 - ratio) + 1e-9)))


def step_kind(config: Any, subspaces: int = 1) -> str:
    """The settings of an `A2ATSConfig` (and its codebook's subspace count) that a retrieval
    step's cost depends on, as a crossover row's `step`: 'vq, budget 0.03, rerank 2, buckets 4,
    kv model dtype' (', estimate mean' with the missed-attention estimate where it runs:
    `config.estimate_runs`; ', estimate mean on 13 layers' on the layers that miss most)."""
    rerank = f"{config.rerank}{' shared' if config.rerank_shared else ''}"
    parts = [
        "vq" if subspaces == 1 else f"pq{subspaces}",
        f"budget {config.budget:g}",
        f"rerank {rerank}",
        f"buckets {config.far_buckets}",
        f"kv {config.kv_bits or 'model dtype'}",
    ]
    if estimate_runs(config, subspaces):
        on = getattr(config, "estimate_layers", None)
        parts.append(f"estimate {config.estimate_scores}{f' on {on} layers' if on else ''}")
    return ", ".join(parts)


DEFAULT_KIND = "vq, budget 0.03, rerank 2, buckets 4, kv model dtype"  # A2ATSConfig(), one VQ


def _default_settings(kind: str) -> bool:
    """Whether `kind` is the default settings (any codebook): what a row without a `step`
    (written before it was recorded, always with the defaults) was measured with."""
    return kind.split(", ", 1)[-1] == DEFAULT_KIND.split(", ", 1)[-1]


# (backend, attention layers, KV heads, head dim, step kind) -> crossover
MEASURED: dict[tuple[str, int, int, int, str], Crossover] = {
    ("cpu", 30, 3, 64, DEFAULT_KIND): Crossover(
        4096,
        "SmolLM2-135M (the demo model), 2-core x86_64, rerank 2, no estimate: retrieval from "
        "the start (a2ats_eb0_noest) 0.90x full at 2K, 1.01x at 4K, 1.24x at 8K, median of 3 "
        "runs (docs/benchmarks/decode_v2.json)",
    ),
}


def backend() -> str:
    """ "cpu" on CPU-only MLX, else "metal" (the same test as the top-K strategy's)."""
    from .host_attention import cpu_only

    return "cpu" if cpu_only() else "metal"


@lru_cache(maxsize=1)
def machine_id() -> str:
    """'Linux x86_64, 2 cores, AMD EPYC, family 25 model 1 stepping 1': this machine in the user
    table's key (the CPU's name and numbers where the OS gives them)."""
    parts = [f"{platform.system()} {platform.machine()}", f"{os.cpu_count()} cores"]
    parts += [part for part in (cpu_name(), cpu_model()) if part]
    return ", ".join(parts)


def cpu_model(cpuinfo: str | None = None) -> str:
    """'family 25 model 17 stepping 1' on Linux x86 (from `cpuinfo`, else /proc/cpuinfo), else
    "": what tells two hosts apart whose CPU name is the same (a virtual machine's "AMD EPYC")."""
    if cpuinfo is None:
        if not sys.platform.startswith("linux"):
            return ""
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines()[:64]:  # the first processor's block
        if not line.strip():
            break
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("cpu family", "model", "stepping") and key not in fields:
            fields[key] = " ".join(value.split())[:16]
    if "cpu family" not in fields or "model" not in fields:
        return ""
    text = f"family {fields['cpu family']} model {fields['model']}"
    return text + (f" stepping {fields['stepping']}" if "stepping" in fields else "")


def cpu_name() -> str:
    """The CPU or chip name where the OS says it cheaply, else ""."""
    try:
        if sys.platform.startswith("linux"):
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                if line.lower().startswith(("model name", "hardware")):
                    return " ".join(line.split(":", 1)[1].split())
        elif sys.platform == "darwin":
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            return " ".join(out.stdout.split())
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return ""


# -- the decision -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What `decide_crossover` chose: `exact_below` for the measured contexts, and whether
    retrieval never caught up within them (then `exact_below` = the largest context + 1)."""

    exact_below: int
    never: bool

    def describe(self, largest: int) -> str:
        """One line for `a2ats crossover` and `a2ats info`."""
        if self.never:
            return (
                f"retrieval was slower than full attention at every context measured (up to "
                f"{largest:,}): exact attention through {largest:,} tokens, retrieval beyond "
                f"(not measured; measure longer contexts with --contexts)"
            )
        return f"retrieval pays off from {self.exact_below:,} tokens: exact attention below"


def decide_crossover(ratios: Mapping[int, float]) -> Decision:
    """The crossover from median decode-speed ratios a2ats / full per context (tokens).

    The first context (ascending) from which every ratio is >= 1.0; when the largest context's
    ratio is < 1.0, `never` with exact_below = largest + 1 (module docstring). ValueError when
    `ratios` is empty."""
    if not ratios:
        raise ValueError("decide_crossover needs at least one measured context")
    contexts = sorted(ratios)
    start = None
    for n in reversed(contexts):
        if ratios[n] < 1.0:
            break
        start = n
    if start is None:
        return Decision(contexts[-1] + 1, True)
    return Decision(start, False)


def today() -> str:
    return _dt.datetime.now(_dt.UTC).date().isoformat()


# -- lookup -------------------------------------------------------------------------------------


def host_step() -> str:
    """The host step this process runs (`native_step.kind`, a `HOST_STEPS` key): a user-table
    row applies only where it was measured with it (or before the step was recorded)."""
    from . import native_step

    return native_step.kind()


def _user_rows(
    num_layers: int, num_kv_heads: int, head_dim: int, kind: str
) -> tuple[dict | None, list[dict]]:
    """(the user-table row that applies to this machine, backend, geometry, step kind and host
    step, or None; the rows for the same measured with another host step, which do not)."""
    rows = user_table(user_table_path())
    key = (backend(), machine_id(), num_layers, num_kv_heads, head_dim)
    steps = (kind, None) if _default_settings(kind) else (kind,)  # None: before kinds were kept
    here = host_step()
    for step in steps:
        for host in (here, None):  # None: measured before the host step was recorded
            if (row := rows.get((*key, step, host))) is not None:
                return row, []
    others = [r for k, r in rows.items() if k[:5] == key and k[5] in steps]
    return None, others


def lookup_crossover(
    num_layers: int, num_kv_heads: int, head_dim: int, kind: str = DEFAULT_KIND
) -> Crossover | None:
    """The crossover that applies on this machine and backend to this geometry, step kind
    (`step_kind`) and host step (`host_step`): the user table's row, else the built-in one, else
    None (module docstring)."""
    row, _ = _user_rows(num_layers, num_kv_heads, head_dim, kind)
    if row is not None:
        top_k = row.get("top_k")
        return Crossover(
            int(row["exact_below"]),
            _row_source(row),
            origin=str(user_table_path()),
            never=bool(row.get("never", False)),
            top_k=top_k if top_k in TOP_K_STRATEGIES else None,
            estimate=estimate_ratio(row),
            estimate_top_k=_estimate_top_k(row),
            estimate_layers=_estimate_layers(row),
            host_step=host_step_of(row),
        )
    return MEASURED.get((backend(), num_layers, num_kv_heads, head_dim, kind))


def unused_rows(num_layers: int, num_kv_heads: int, head_dim: int, kind: str = DEFAULT_KIND) -> str:
    """Where no user-table row applies but this machine has one for the geometry and step kind
    measured with another host step (the step this build runs changed, or the graph step cannot
    load): one clause saying so for `a2ats info`, else ""."""
    row, others = _user_rows(num_layers, num_kv_heads, head_dim, kind)
    if row is not None or not others:
        return ""
    last = max(others, key=lambda r: str(r.get("date", "")))
    date = last.get("date")
    when = f" on {date[:10]}" if isinstance(date, str) and date[:10].strip() else ""
    with_ = HOST_STEPS.get(host_step_of(last) or "", "another host step")
    return (
        f"; measured here{when} with {with_}, which does not apply to {HOST_STEPS[host_step()]} "
        f"running now"
    )


def estimate_ratio(row: Mapping[str, Any]) -> float | None:
    """The row's measured speed ratio of a retrieval step with the estimate / without (its
    `estimate.ratio`), None where it was not measured or is not a number in (0, 10]."""
    ratio = _estimate_entry(row).get("ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        return None
    return float(ratio) if 0 < ratio <= 10 else None


def _estimate_top_k(row: Mapping[str, Any]) -> str | None:
    top_k = _estimate_entry(row).get("top_k")
    return top_k if top_k in TOP_K_STRATEGIES else None


def _estimate_layers(row: Mapping[str, Any]) -> int | None:
    """The layers the row's estimate measurement affords (`estimate.layers`, recorded since
    2026-12-06, bounded by the row's A2ATS layers), None where absent or malformed (the row's
    ratio alone decides then: every layer or none)."""
    layers, total = _estimate_entry(row).get("layers"), row.get("a2ats_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        return None
    if isinstance(total, int) and not isinstance(total, bool) and layers >= total:
        return None  # every layer
    return layers if layers <= 4096 else None


def _estimate_entry(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """The row's `estimate` measurement, {} where it has none or it is not a mapping."""
    measured = row.get("estimate")
    return measured if isinstance(measured, dict) else {}


def measured_estimate(
    num_layers: int, num_kv_heads: int, head_dim: int, kind: str = DEFAULT_KIND
) -> bool:
    """Whether the missed-attention estimate was measured to cost nothing on this machine for
    this geometry and step kind (`ESTIMATE_FREE`): what `A2ATSConfig.estimate_missed` None
    resolves to; False where nothing was measured."""
    row = lookup_crossover(num_layers, num_kv_heads, head_dim, kind)
    return row is not None and row.estimate_on


def measured_estimate_layers(
    num_layers: int, num_kv_heads: int, head_dim: int, kind: str = DEFAULT_KIND
) -> int | None:
    """On how many layers the measurement affords the estimate (`Crossover.estimate_layers`),
    None for every layer (or where the measurement did not turn it on: `measured_estimate`)."""
    row = lookup_crossover(num_layers, num_kv_heads, head_dim, kind)
    if row is None or row.estimate is None or estimate_pays(row.estimate):
        return None
    return row.estimate_layers or None


TOP_K_STRATEGIES = ("mlx", "numpy")
STRATEGY_NAMES = {"mlx": "MLX", "numpy": "NumPy"}


def measured_top_k(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kind: str = DEFAULT_KIND,
    with_estimate: bool = False,
) -> str | None:
    """The top-K strategy (`topk.py`) the crossover measurement found faster on this machine
    for this geometry and step kind ("mlx" or "numpy"), None where none was measured.
    `with_estimate`: the estimate was turned on by the measurement (`measured_estimate`): the
    strategy faster with it, where the row has one."""
    row = lookup_crossover(num_layers, num_kv_heads, head_dim, kind)
    if row is None:
        return None
    return (row.estimate_top_k if with_estimate else None) or row.top_k


def _row_source(row: Mapping[str, Any]) -> str:
    """'SmolLM2-135M-Instruct, 2026-05-01: 512 0.76x, 2048 0.90x' from a user-table row."""
    ratios = row.get("ratios")
    text = ""
    if isinstance(ratios, dict):
        text = ", ".join(f"{n} {r:.2f}x" for n, r in ratios.items() if isinstance(r, int | float))
    head = ", ".join(str(row[k]) for k in ("model", "date") if row.get(k))
    if row.get("top_k") in TOP_K_STRATEGIES:
        text += f"; top-K in {STRATEGY_NAMES[row['top_k']]}, measured faster"
    return f"{head}: {text}" if text else head


def measured_crossover(
    num_layers: int, num_kv_heads: int, head_dim: int, kind: str = DEFAULT_KIND
) -> int:
    """The measured crossover for this machine, backend, geometry and step kind, 0 where none
    was measured (user table first, then the built-in table; module docstring)."""
    row = lookup_crossover(num_layers, num_kv_heads, head_dim, kind)
    return row.tokens if row is not None else 0


def describe_crossover(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    source: str,
    estimate: int | None = None,
    kind: str = DEFAULT_KIND,
) -> str:
    """What `a2ats info SOURCE` says about the default `exact_below` for this geometry and step
    kind: measured on this machine, the built-in row, or `estimate` (the cost model's,
    `crossover_model.py`) until a measurement exists."""
    row = lookup_crossover(num_layers, num_kv_heads, head_dim, kind)
    unused = unused_rows(num_layers, num_kv_heads, head_dim, kind)
    if row is None and estimate is not None:
        return (
            f"exact until {estimate:,} tokens (estimated from the geometry: nothing measured on "
            f"this machine yet{unused}; the app measures it the first time the model is loaded, "
            f"or run `a2ats crossover {source}`)"
        )
    if row is None:
        return (
            f"none measured: retrieval from the first step{unused}; run `a2ats crossover "
            f"{source}` to measure it on this machine"
        )
    if row.origin == "built-in":
        where = f"built-in table, measured on another machine: {row.source}{unused}; `a2ats "
        where += f"crossover {source}` measures this one"
    else:
        step = f" with {HOST_STEPS[row.host_step]}" if row.host_step in HOST_STEPS else ""
        where = f"measured on this machine{step}: {row.origin}; {row.source}"
    estimate = (
        f"; missed-attention estimate off by default (its cost not measured here: `a2ats "
        f"crossover {source}` measures it)"
    )
    if row.estimate is not None:
        state = "on" if row.estimate_on else "off"
        if row.estimate_on and not estimate_pays(row.estimate):
            state = f"on the {row.estimate_layers} layers that miss most"
        estimate = (
            f"; missed-attention estimate {state} by default ({row.estimate:.2f}x the speed "
            f"without it on every layer, on all from {ESTIMATE_FREE:.2f}x)"
        )
    if row.never:
        return (
            f"exact until {row.tokens:,} tokens, retrieval beyond (not measured: retrieval was "
            f"slower at every measured context) ({where}){estimate}"
        )
    return f"exact until {row.tokens:,} tokens ({where}){estimate}"
