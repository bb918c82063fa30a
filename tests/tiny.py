"""Tiny random-weight models and a tiny byte-level BPE tokenizer, built in-process (no downloads).

Use `tiny_model("llama")`, `tiny_model("qwen2", rope_traditional=True)`, `tiny_tokenizer()`, or
`save_tiny_model(folder)` for an mlx-lm folder on disk (config.json, weights, tokenizer files).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import mlx.core as mx

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)

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
def _tokenizer_json() -> str:
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
    (folder / "tokenizer.json").write_text(_tokenizer_json())
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


def tiny_tokenizer(tmp_dir: str | Path | None = None):
    """A TokenizerWrapper over the tiny BPE tokenizer (vocab 400, ChatML template)."""
    import tempfile

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    folder = Path(tmp_dir) if tmp_dir is not None else Path(tempfile.mkdtemp(prefix="tinytok"))
    save_tiny_tokenizer(folder)
    return load_tokenizer(folder)


def tiny_config(arch: str = "llama", **overrides) -> dict:
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


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    """A random-weight mlx-lm model (float32). `overrides` patch the config."""
    from mlx_lm.utils import _get_classes

    config = tiny_config(arch, **overrides)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    model.config = config  # handy for tests that save it
    return model


def save_tiny_model(folder: str | Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Write an mlx-lm model folder (config.json, model.safetensors, tokenizer) and return it."""
    from mlx_lm.utils import save_config, save_model

    folder = Path(folder)
    model = tiny_model(arch, seed=seed, **overrides)
    save_model(folder, model)
    save_config(dict(model.config), folder / "config.json")
    save_tiny_tokenizer(folder)
    return folder
