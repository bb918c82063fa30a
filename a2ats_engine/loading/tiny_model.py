"""A tiny random-weight model and a tiny byte-level BPE tokenizer, built in-process.

For the tests and `a2ats-chat --self-test`: 2 layers, 4 query heads, 2 KV heads, head_dim 16,
vocab 400, a ChatML chat template; seconds to build, no downloads. `tiny_model(arch)` gives an
mlx-lm model (float32, `model.config` holds its config.json), `save_tiny_model(folder)` an
mlx-lm model folder `load_model` reads (config.json, model.safetensors, tokenizer files).
"""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog.",
    "Hello! How are you today? I am fine, thank you. Numbers: 0123456789.",
    "def main():\n    print('hello world')\n    return 0\n",
    "Ünïcödé tëxt, 日本語のテキスト, emoji 🙂 and more words to merge.",
] * 4


@functools.lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """tokenizer.json text of a byte-level BPE (vocab 400, SPECIALS) trained on a few lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return tok.to_str()


def save_tiny_tokenizer(folder: str | Path) -> Path:
    """Write tokenizer.json + tokenizer_config.json (ChatML template) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json())
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "chat_template": CHATML,
                "model_max_length": 2048,
            }
        )
    )
    return folder


def tiny_config(arch: str = "llama", **overrides: Any) -> dict:
    """config.json contents of a tiny model: 2 layers, 4 query heads, 2 KV heads, head_dim 16."""
    config = {
        "model_type": arch,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 400,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_traditional": False,
        "tie_word_embeddings": True,
    }
    config.update(overrides)
    return config


def tiny_model(arch: str = "llama", seed: int = 0, **overrides: Any):
    """A random-weight mlx-lm model (float32) of `arch` (an `mlx_lm.models` module name, e.g.
    "llama", "qwen2"); `overrides` patch the config, which the model keeps as `model.config`."""
    import mlx.core as mx

    config = tiny_config(arch, **overrides)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    model.config = config
    return model


def save_tiny_model(
    folder: str | Path, arch: str = "llama", seed: int = 0, **overrides: Any
) -> Path:
    """Write an mlx-lm model folder (config.json, model.safetensors, tokenizer) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    folder = Path(folder)
    model = tiny_model(arch, seed=seed, **overrides)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(model.config))
    save_tiny_tokenizer(folder)
    return folder
