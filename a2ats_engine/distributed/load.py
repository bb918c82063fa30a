"""Load this rank's part of a model: read lazily, split, then evaluate only what it serves.

Every source `loading/models.py` takes works (folder, .gguf, HF repo id, "demo"): each rank
resolves it on its own machine, so the model (and its codebook) must be there on every host
(same path, or the demo fetched on each). mlx-lm's `sharded_load` reads only its shard's files
from a Hugging Face repo; our sources are local folders and GGUF conversions, so the split is
applied here after a lazy load: the other ranks' layer weights are dropped before anything is
evaluated, and each rank's memory holds its own layers plus the embeddings, final norm and
head (which every rank keeps, as in mlx-lm).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from ..loading import models
from ..progress import Progress
from ..records import ModelInfo
from .pipeline import shard_pipeline
from .plan import share_plan
from .tensor import shard_tensor


def load_stage(
    source: str,
    group: Any,
    *,
    split: list[int] | None = None,
    progress: Progress | None = None,
    dequantize: bool | None = None,
    tensor: bool = False,
) -> tuple[Any, Any, ModelInfo, Any]:
    """`(model, tokenizer, info, stage)` for this rank (collective: every rank calls it).

    The model is split with `shard_pipeline` (this rank's layers, `split` layers per rank with
    rank 0 first, default even), or with `tensor` by heads (`tensor.shard_tensor`: this rank's
    heads of every layer), and the layer plan is installed (`share_plan`)."""
    resolved = models.resolve_source(source, progress)
    model, config = models._load_weights(resolved.folder, lazy=True, progress=progress)
    if tensor:
        if split:
            raise ValueError("--split sets layers per rank: it has no meaning with --tensor")
        stage = shard_tensor(model, group)
    else:
        stage = shard_pipeline(model, group, split)
    tokenizer = models._load_tokenizer(resolved.folder, config)
    converted = models.prepare_for_backend(model, dequantize)
    mx.eval([v for _, v in tree_flatten(model.parameters())])
    share_plan(model, stage)
    info = models._model_info(resolved, model, config, converted)
    return model, tokenizer, info, stage


def weight_bytes(model: Any) -> int:
    """Bytes of the weights this process holds."""
    return int(sum(v.nbytes for _, v in tree_flatten(model.parameters())))


__all__ = ["load_stage", "weight_bytes"]
