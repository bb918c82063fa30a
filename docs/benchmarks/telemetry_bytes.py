"""Telemetry bytes per decode step on the demo model (SmolLM2-135M, 30 layers).

    python docs/benchmarks/telemetry_bytes.py [--steps 24]

Sums the numpy array bytes of every `CacheSnapshot` a `ChatSession` with telemetry on yields
(selections, code histograms or new codes) and prints the mean over the decode steps, the
first step (the keyframe after prefill) and the rest.
"""

from __future__ import annotations

import argparse

import numpy as np


def snapshot_bytes(snap) -> int:
    """numpy bytes held by one snapshot (every array field of every layer)."""
    total = 0
    for layer in snap.layers:
        for value in vars(layer).values():
            if isinstance(value, np.ndarray):
                total += value.nbytes
            elif isinstance(value, tuple):
                total += sum(a.nbytes for a in value if isinstance(a, np.ndarray))
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    from a2ats_engine import A2ATSConfig, ChatSession, Codebook, load_model
    from a2ats_engine.cache.telemetry import CacheSnapshot
    from a2ats_engine.data_dirs import data_dir
    from a2ats_engine.records import SamplingSettings

    model, tokenizer, _ = load_model("demo")
    codebook = Codebook.load(data_dir() / "codebooks" / "demo-default.safetensors")
    session = ChatSession(
        model,
        tokenizer,
        sampling=SamplingSettings(temperature=0.0, max_tokens=args.steps),
        a2ats=A2ATSConfig(telemetry=True),
        codebook=codebook,
    )
    prompt = "Tell me a long story about a lighthouse keeper and the sea. " * 20
    sizes = [snapshot_bytes(e) for e in session.send(prompt) if isinstance(e, CacheSnapshot)]
    layers = len(session.caches)
    print(
        f"layers {layers}, steps {len(sizes)}, mean bytes/step {np.mean(sizes):.0f}, "
        f"first step {sizes[0]}, later steps mean {np.mean(sizes[1:]):.0f}"
    )


if __name__ == "__main__":
    main()
