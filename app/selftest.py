"""`a2ats-chat --self-test`: a headless end-to-end check of an installation or a packaged app.

It runs offscreen (no display needed) and checks, in order:

- qt:        PySide6 starts on the offscreen platform plugin, the SVG icon engine renders the app
             icon, pyqtgraph renders a plot.
- app:       every module of the `app` package imports.
- mlx:       MLX runs a matmul on its default device; on macOS that is the GPU, so the Metal
             library (`mlx.metallib` next to `libmlx`) was found.
- models:    mlx-lm's model modules (imported by name from a config's `model_type`) are present.
- corpus:    the texts of the built-in calibration corpus are there (Python reference topics and
             the stdlib sources it reads, which a bundle must carry as files).
- tiny:      a tiny random-weight Llama model (2 layers) and a tiny BPE tokenizer, built here and
             saved to a temporary folder, load through `load_model` (mlx-lm + transformers); a
             short chat reply is generated through A2ATS caches with the attention hook installed,
             and some decode steps must really retrieve (top-K far tokens, not exact attention).
             The check sets `exact_below=0`: a chat this short is below any model's measured
             crossover, where the app would attend exactly, and retrieval is what it checks.
- demo:      the same with the demo model, when it has been fetched (skipped otherwise, or with
             `--model tiny`); its calibrated default codebook is used when present.

Prints one line per check and returns 0 when every check passed, 1 otherwise.
`--model SOURCE` runs the chat check on any model source `load_model` accepts instead of the demo,
`--tokens N` sets the tokens generated per model (`app/main.py` parses both: `run(model, tokens)`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import a2ats_engine  # BLAS preload before mlx.core

# Model types whose mlx-lm module must be importable (the app loads them by name).
COMMON_MODEL_TYPES = ("llama", "mistral3", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
# A small A2ATS setting so that a short conversation already has far tokens to retrieve.
SELFTEST_WINDOW, SELFTEST_SINKS, SELFTEST_BUDGET = 8, 2, 4
_PROMPT = (
    "Please tell me about the quick brown fox and the lazy dog, then count from one to ten, "
    "and finally say hello to the whole world in a friendly way."
)


@dataclass
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def run(self, name: str, func: Callable[[], str | None]) -> None:
        """Run `func`; its return value is the detail line (None = skipped)."""
        start = time.perf_counter()
        try:
            detail = func()
            check = Check(name, True, "skipped" if detail is None else detail)
        except Exception as exc:  # a self-test reports every failure and goes on
            check = Check(name, False, f"{type(exc).__name__}: {exc}")
            if os.environ.get("A2ATS_SELFTEST_TRACEBACK"):
                traceback.print_exc()
        check.seconds = time.perf_counter() - start
        self.checks.append(check)
        status = "ok  " if check.ok else "FAIL"
        print(f"  {status} {name:<7} {check.detail}  ({check.seconds:.1f} s)", flush=True)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


# ------------------------------------------------------------------------------------- qt
def _resources_dir() -> Path:
    """resources/ beside the `app` package (source tree and bundle alike)."""
    return Path(__file__).resolve().parents[1] / "resources"


def check_qt() -> str:
    """Offscreen QApplication, SVG icon rendering, a pyqtgraph plot grabbed to a pixmap."""
    import PySide6
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(["a2ats-chat", "--self-test"])
    platform = app.platformName()
    if platform != "offscreen":
        raise RuntimeError(f"Qt platform is {platform!r}, expected 'offscreen'")
    icon_path = _resources_dir() / "icons" / "app.svg"
    if not icon_path.is_file():
        raise FileNotFoundError(f"app icon missing: {icon_path}")
    image = QIcon(str(icon_path)).pixmap(64, 64).toImage()
    if image.isNull() or image.pixelColor(32, 32).alpha() == 0:
        raise RuntimeError("the SVG icon engine rendered nothing (iconengines plugin missing?)")
    plot = _render_plot()
    return (
        f"PySide6 {PySide6.__version__}, platform {platform}, SVG icon "
        f"{image.width()}x{image.height()}, pyqtgraph plot {plot}"
    )


def _render_plot() -> str:
    import numpy as np
    import pyqtgraph as pg

    widget = pg.PlotWidget()
    widget.resize(200, 120)
    widget.plot(np.arange(16.0), np.arange(16.0) ** 0.5)
    pixmap = widget.grab()
    widget.deleteLater()
    if pixmap.isNull():
        raise RuntimeError("pyqtgraph rendered an empty pixmap")
    return f"{pg.__version__} {pixmap.width()}x{pixmap.height()}"


def check_app_modules() -> str:
    """Import every module of the `app` package (catches modules a bundle left out)."""
    import app

    names = sorted(
        m.name
        for m in pkgutil.walk_packages(app.__path__, "app.")
        if m.name not in {"app.main", "app.selftest", "app.__main__"}
    )
    if not names:
        raise RuntimeError("found no modules in the app package")
    for name in names:
        importlib.import_module(name)
    return f"{len(names)} modules import"


# ------------------------------------------------------------------------------------ mlx
def check_mlx() -> str:
    """A matmul on the default device; on macOS the device must be the GPU (Metal library)."""
    import mlx.core as mx

    from a2ats_engine import _backend

    device = mx.default_device()
    a = mx.arange(64 * 64, dtype=mx.float32).reshape(64, 64) / 4096.0
    total = float((a @ a).sum().item())
    if not total > 0:
        raise RuntimeError(f"matmul gave {total}")
    detail = f"mlx {mx.__version__} on {device}"
    if sys.platform == "darwin":
        if not mx.metal.is_available():
            raise RuntimeError(f"{detail}: Metal is not available (mlx.metallib not found?)")
        detail += f", Metal library {_metallib_path() or 'found'}"
    else:
        from a2ats_engine.cache import native_step  # the retrieval step after its host sync

        detail += f", BLAS {_backend.blas_library or 'MLX built-in'}"
        detail += f", host step {native_step.status()}"
    return detail


def _metallib_path() -> str | None:
    import mlx

    for folder in getattr(mlx, "__path__", []):
        candidate = Path(folder) / "lib" / "mlx.metallib"
        if candidate.is_file():
            return str(candidate)
    return None


def check_model_modules() -> str:
    """mlx-lm imports model modules by `model_type`; a bundle must carry them all."""
    import mlx_lm.models

    available = [m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)]
    for name in COMMON_MODEL_TYPES:
        importlib.import_module(f"mlx_lm.models.{name}")
    return f"{len(available)} mlx-lm model modules, {len(COMMON_MODEL_TYPES)} common ones import"


def check_corpus() -> str:
    """The texts of the built-in calibration corpus are there (a bundle carries them as files).

    Fails when a stdlib module the corpus reads has no source text at all. In a bundle, the few
    modules Python needs at start-up live in base_library.zip: their .py files are shipped but
    their import origin is the zip, so the detail says how many `corpus` reads by file path.
    """
    from pydoc_data.topics import topics

    from a2ats_engine.calibration import corpus

    names = corpus.STDLIB_MODULES
    missing = [name for name in names if not _module_source(name)]
    if missing:
        raise RuntimeError(
            f"no source text for {len(missing)} of {len(names)} stdlib modules the built-in "
            f"corpus reads ({', '.join(missing[:4])})"
        )
    by_path = sum(_source_path(name) is not None for name in names)
    documents = corpus.builtin_corpus(None, seed=0, chars=20_000)
    return (
        f"{len(topics)} reference topics, {len(names)} stdlib sources ({by_path} read by "
        f"path), {len(documents)} documents in a 20K-character sample"
    )


def _module_source(module: str) -> str | None:
    """Source text of a module through its loader (works for frozen and zipped modules)."""
    spec = importlib.util.find_spec(module)
    try:
        return spec.loader.get_source(module) if spec and spec.loader else None
    except (ImportError, OSError):
        return None


def _source_path(module: str) -> Path | None:
    """The module's .py file when its import origin is one (how `corpus` finds source)."""
    spec = importlib.util.find_spec(module)
    origin = getattr(spec, "origin", None)
    path = Path(origin) if origin and origin.endswith(".py") else None
    return path if path is not None and path.is_file() else None


# ----------------------------------------------------------------------------- tiny model
def write_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Save a random-weight tiny Llama as an mlx-lm folder (config, safetensors, tokenizer)."""
    from a2ats_engine.loading.tiny_model import save_tiny_model

    return save_tiny_model(folder, "llama", seed=seed)


def check_tiny_chat(tokens: int) -> str:
    """Load the tiny model through `load_model` and chat through A2ATS caches."""
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.loading.models import load_model

    with tempfile.TemporaryDirectory(prefix="a2ats-selftest-") as tmp:
        model, tokenizer, info = load_model(write_tiny_model(Path(tmp) / "tiny-llama"))
    codebook = Codebook.random(info.num_layers, info.num_kv_heads, info.head_dim, 16, seed=0)
    result = chat_through_a2ats(model, tokenizer, codebook, tokens)
    return f"{info.architecture}, {info.num_layers} layers: {result}"


# ------------------------------------------------------------------------------ demo model
def check_model_chat(source: str, tokens: int) -> str | None:
    """Chat with a real model (the demo when fetched); None when there is nothing to load."""
    from a2ats_engine.loading.models import demo_model_path, load_model

    if source == "demo" and demo_model_path() is None:
        return None
    model, tokenizer, info = load_model(source)
    codebook, origin = _codebook_for(source, model, info)
    result = chat_through_a2ats(model, tokenizer, codebook, tokens)
    return f"{info.name} ({info.num_layers} layers), {origin} codebook: {result}"


def _codebook_for(source: str, model, info):
    """The calibrated codebook found for the model, else a random one (wiring check only)."""
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.loading.fetched_models import default_codebook
    from a2ats_engine.loading.models import demo_model_path

    folder = demo_model_path() if source == "demo" else Path(info.path)
    path = default_codebook(source, folder)
    if path is not None:
        return Codebook.load(path), f"calibrated ({path.name})"
    return Codebook.random(info.num_layers, info.num_kv_heads, info.head_dim, 256), "random"


# ------------------------------------------------------------------------------ generation
def chat_through_a2ats(model, tokenizer, codebook, tokens: int) -> str:
    """Send chat messages until `tokens` tokens came back through A2ATS caches.

    Checks that the attention hook is installed, that at least one decode step retrieved
    (approximate top-K selection, not exact attention) and that the caches hold the context.
    A message may end early on EOS, hence up to three messages.
    """
    from a2ats_engine.cache import hooks
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent
    from a2ats_engine.session import ChatSession, SamplingSettings

    config = A2ATSConfig(
        window=SELFTEST_WINDOW,
        sinks=SELFTEST_SINKS,
        budget=SELFTEST_BUDGET,
        far_buckets=1,
        exact_below=0,  # retrieve at any context: the measured crossover is far above this chat
        telemetry=True,
    )
    sampling = SamplingSettings(temperature=0.0, max_tokens=tokens, seed=0)
    session = ChatSession(model, tokenizer, sampling=sampling, a2ats=config, codebook=codebook)
    generated, retrieval_steps, text = 0, 0, []
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random / uncalibrated codebook notes
        for _ in range(3):
            for event in session.send(_PROMPT):
                if isinstance(event, TokenEvent):
                    text.append(event.text)
                elif isinstance(event, CacheSnapshot):
                    retrieval_steps += sum(not layer.exact for layer in event.layers) > 0
                elif isinstance(event, GenerationStats):
                    generated += event.generation_tokens
            if generated >= tokens and retrieval_steps:
                break
    seconds = time.perf_counter() - start
    _verify_generation(session, hooks.is_installed(model), generated, retrieval_steps)
    sample = "".join(text).strip().replace("\n", " ")[:40]
    return (
        f"{generated} tokens in {seconds:.1f} s, {retrieval_steps} retrieval steps, "
        f"context {session.context_tokens} tokens, {_cache_bytes(session.caches)} B cached, "
        f"reply {sample!r}"
    )


def _verify_generation(session, hooked: bool, generated: int, retrieval_steps: int) -> None:
    from a2ats_engine.cache.a2ats_cache import A2ATSCache

    caches = session.caches or []
    if not caches or not all(isinstance(c, A2ATSCache) for c in caches):
        raise RuntimeError("the session did not build A2ATS caches")
    if not hooked:
        raise RuntimeError("the attention hook is not installed on the model")
    if generated == 0:
        raise RuntimeError("no tokens were generated")
    if retrieval_steps == 0 or sum(c.tokens_retrieved for c in caches) == 0:
        raise RuntimeError("no decode step retrieved far tokens through the A2ATS cache")
    if caches[0].offset != session.context_tokens:
        raise RuntimeError(
            f"cache holds {caches[0].offset} tokens, the session expects {session.context_tokens}"
        )


def _cache_bytes(caches: list | None) -> int:
    return sum(c.nbytes for c in caches or [])


# ------------------------------------------------------------------------------------ main
def run(model: str = "demo", tokens: int = 12) -> int:
    """Run every check, print the report; 0 when all passed, 1 otherwise. `model`: the
    real-model chat check's source ("demo": skipped when not fetched; "tiny": none)."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    frozen = "bundle" if getattr(sys, "frozen", False) else "source"
    print(
        f"A2ATS Chat self-test: version {a2ats_engine.__version__}, {frozen}, "
        f"Python {sys.version.split()[0]}, {sys.platform}",
        flush=True,
    )
    start = time.perf_counter()
    report = Report()
    report.run("qt", check_qt)
    report.run("app", check_app_modules)
    report.run("mlx", check_mlx)
    report.run("models", check_model_modules)
    report.run("corpus", check_corpus)
    report.run("tiny", lambda: check_tiny_chat(tokens))
    if model != "tiny":
        label = "demo" if model == "demo" else "model"
        report.run(label, lambda: check_model_chat(model, tokens))
    elapsed = time.perf_counter() - start
    failed = [c.name for c in report.checks if not c.ok]
    verdict = "passed" if report.ok else f"FAILED ({', '.join(failed)})"
    print(f"self-test {verdict} in {elapsed:.1f} s", flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(run())
