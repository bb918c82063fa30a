"""Realistic synthetic telemetry, and a standalone inspector for screenshots.

`synthetic_snapshots` imitates what the A2ATS cache reports on a long prompt: per layer and KV
head, the union over the GQA group of each query head's top-K far tokens (scores = a stable
per-layer salience + recency + per-step noise), sinks and a trailing window, code histograms
growing one token per step, bytes of a 4-bit K/V store plus 2-byte codes, and optional recall.

    python -m app.inspector.demo --out /tmp/inspector [--dark] [--steps 96] [--fidelity]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from a2ats_engine.cache.telemetry import CacheSnapshot, LayerStats

WORDS = (
    "the",
    "cache",
    "keeps",
    "every",
    "key",
    "but",
    "attends",
    "only",
    "to",
    "a",
    "few",
    "far",
    "tokens",
    "chosen",
    "by",
    "a",
    "codebook",
    "lookup",
    "while",
    "the",
    "recent",
    "window",
    "stays",
    "exact",
    "and",
    "the",
    "sinks",
    "anchor",
    "attention",
    "so",
    "memory",
    "drops",
    "and",
    "speed",
    "holds",
)


def synthetic_tokens(n: int, seed: int = 0) -> list[str]:
    """Token texts for n positions: words with leading spaces, punctuation and newlines."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if i % 97 == 96:
            out.append("\n")
        elif r < 0.08:
            out.append(str(rng.choice([",", ".", ":", ";"])))
        else:
            word = str(rng.choice(WORDS))
            out.append(word if r < 0.2 else " " + word)
    return out


def _far_bytes_per_token(kv_heads: int, head_dim: int, kv_bits: int | None) -> float:
    elems = 2 * kv_heads * head_dim  # K and V
    if kv_bits is None:
        return elems * 2.0 + 2 * kv_heads
    # mx.quantize: bits/8 bytes per element + an fp16 scale and bias per group of 64
    return elems * (kv_bits / 8 + 4 / 64) + 2 * kv_heads


def synthetic_snapshots(
    *,
    layers: int = 30,
    kv_heads: int = 3,
    group: int = 3,
    head_dim: int = 64,
    prompt_tokens: int = 2000,
    steps: int = 64,
    window: int = 64,
    sinks: int = 8,
    budget: float = 0.03,
    min_k: int = 16,
    n_centroids: int = 1024,
    kv_bits: int | None = 4,
    fidelity_every: int | None = None,
    seed: int = 0,
    estimate_missed: bool = True,
    coverage: bool = False,
    exact_below: int = 0,
) -> Iterator[CacheSnapshot]:
    """Yield `steps` snapshots (layers x kv_heads) continuing a prompt of `prompt_tokens`.

    estimate_missed: fill `missed_mass` (near the measured 1 - recall, a little under it).
    coverage:        fill `budget_used` as an adaptive budget would (per query head, >= min_k).
    exact_below:     steps whose context is shorter attend exactly (`exact`, `exact_until`).
    """
    rng = np.random.default_rng(seed)
    extra = np.random.default_rng(seed + 1)  # the new fields' draws leave the others unchanged
    cap = prompt_tokens + steps
    # stable salience per layer/head: a few hot tokens, shared in part across layers
    shared_hot = rng.choice(np.arange(sinks, prompt_tokens), size=40, replace=False)
    salience = rng.gumbel(size=(layers, kv_heads, cap)).astype(np.float32) * 0.6
    for layer in range(layers):
        own_hot = rng.choice(np.arange(sinks, cap), size=30, replace=False)
        keep = shared_hot[rng.random(shared_hot.size) < 0.5 + 0.5 * layer / layers]
        salience[layer, :, own_hot] += rng.uniform(2.0, 4.0, size=(kv_heads, own_hot.size)).T
        salience[layer, :, keep] += rng.uniform(1.5, 3.5, size=(kv_heads, keep.size)).T
    recency_scale = np.linspace(3.0, 0.5, layers)  # early layers look more locally
    zipf = [
        np.arange(1, n_centroids + 1, dtype=np.float64) ** -(0.6 + 0.8 * layer / layers)
        for layer in range(layers)
    ]
    code_p = [z / z.sum() for z in zipf]
    perms = [[rng.permutation(n_centroids) for _ in range(kv_heads)] for _ in range(layers)]
    counts = [
        [
            np.bincount(
                perms[layer][h][rng.choice(n_centroids, size=prompt_tokens, p=code_p[layer])],
                minlength=n_centroids,
            ).astype(np.int64)
            for h in range(kv_heads)
        ]
        for layer in range(layers)
    ]
    per_token = _far_bytes_per_token(kv_heads, head_dim, kv_bits)
    quality = rng.uniform(0.86, 0.97, size=(layers, kv_heads))

    for step in range(steps):
        offset = prompt_tokens + step + 1
        window_start = max(sinks, offset - window)
        k = max(min_k, math.ceil(budget * offset))
        positions = np.arange(offset)
        far = positions[sinks:window_start]
        dist = (window_start - far).astype(np.float32)
        layer_stats = []
        if offset < exact_below:
            layer_stats = [
                replace(
                    _exact_layer(step, offset, window_start, sinks, layer, kv_heads, exact_below),
                    code_counts=tuple(c.copy() for c in counts[layer]),
                    bytes_held=int(offset * per_token),
                    bytes_fp16=offset * 2 * kv_heads * head_dim * 2,
                )
                for layer in range(layers)
            ]
            yield CacheSnapshot(step=step, layers=tuple(layer_stats), token_id=step % 400)
            continue
        for layer in range(layers):
            recency = recency_scale[layer] * np.exp(-dist / 300.0)
            selected, code_counts = [], []
            for h in range(kv_heads):
                base = salience[layer, h, far] + recency
                picks = []
                for _ in range(group):
                    score = base + rng.normal(0.0, 0.2, size=far.size).astype(np.float32)
                    picks.append(far[np.argpartition(-score, k - 1)[:k]])
                chosen = np.unique(np.concatenate(picks))
                sel = np.concatenate(
                    [positions[:sinks], chosen, positions[window_start:offset]]
                ).astype(np.int32)
                selected.append(sel)
                new_code = perms[layer][h][rng.choice(n_centroids, p=code_p[layer])]
                counts[layer][h][new_code] += 1
                code_counts.append(counts[layer][h].copy())
            recall = None
            if fidelity_every and step % fidelity_every == 0:
                noise = rng.normal(0.0, 0.01, size=kv_heads)
                recall = tuple(
                    float(np.clip(q + n, 0, 1)) for q, n in zip(quality[layer], noise, strict=True)
                )
            layer_stats.append(
                LayerStats(
                    step=step,
                    offset=offset,
                    window_start=window_start,
                    sinks=sinks,
                    selected=tuple(selected),
                    code_counts=tuple(code_counts),
                    bytes_held=int(offset * per_token),
                    bytes_fp16=offset * 2 * kv_heads * head_dim * 2,
                    layer=layer,
                    recall=recall,
                    missed_mass=_missed(extra, quality[layer]) if estimate_missed else None,
                    exact_until=exact_below,
                    budget_used=_budget(extra, kv_heads, group, min_k, k) if coverage else None,
                )
            )
        yield CacheSnapshot(step=step, layers=tuple(layer_stats), token_id=int(rng.integers(400)))


def _missed(rng: np.random.Generator, quality: np.ndarray) -> tuple[float, ...]:
    """Estimated missed mass per KV head: a noisy, slightly low guess of 1 - recall."""
    guess = (1.0 - quality) * rng.uniform(0.55, 1.0, size=quality.size)
    return tuple(float(v) for v in np.clip(guess, 0.0, 1.0))


def _budget(
    rng: np.random.Generator, kv_heads: int, group: int, floor: int, k: int
) -> tuple[np.ndarray, ...]:
    """Adaptive budget: far tokens each query head of each KV head's group kept (int32 [G])."""
    return tuple(
        rng.integers(floor, 2 * k + 1, size=group).astype(np.int32) for _ in range(kv_heads)
    )


def _exact_layer(
    step: int, offset: int, window_start: int, sinks: int, layer: int, heads: int, until: int
) -> LayerStats:
    """An exact step below the crossover: every position attended, no codes sent."""
    every = np.arange(offset, dtype=np.int32)
    return LayerStats(
        step=step,
        offset=offset,
        window_start=window_start,
        sinks=sinks,
        selected=tuple(every for _ in range(heads)),
        code_counts=(),
        bytes_held=0,
        bytes_fp16=0,
        exact=True,
        layer=layer,
        exact_until=until,
    )


def main(argv: list[str] | None = None) -> int:
    """Render the inspector fed with synthetic telemetry; save PNGs and the telemetry JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for PNGs and JSON")
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--dark", action="store_true", help="use a dark palette")
    parser.add_argument("--fidelity", action="store_true", help="include recall every 4 steps")
    parser.add_argument("--size", default="720x1040", help="inspector size WxH")
    parser.add_argument("--frequency", action="store_true", help="map in frequency mode")
    parser.add_argument("--coverage", action="store_true", help="adaptive budget per head")
    args = parser.parse_args(argv)

    from PySide6.QtWidgets import QApplication

    from .panel import InspectorPanel

    app = QApplication.instance() or QApplication(["a2ats-inspector-demo"])
    app.setStyle("Fusion")
    if args.dark:
        app.setPalette(dark_palette())
    width, height = (int(v) for v in args.size.lower().split("x"))
    panel = InspectorPanel()
    panel.resize(width, height)
    panel.show()
    panel.set_context_tokens(synthetic_tokens(args.prompt_tokens + args.steps))
    if args.fidelity:
        panel.set_fidelity_info(True, every=4, cost_ms=3.2, overhead=0.06)
    if args.frequency:
        panel.map_panel.set_mode("frequency")
    panel.on_generation_started()
    fidelity = 4 if args.fidelity else None
    for snap in synthetic_snapshots(
        layers=args.layers,
        prompt_tokens=args.prompt_tokens,
        steps=args.steps,
        fidelity_every=fidelity,
        coverage=args.coverage,
    ):
        panel.on_snapshot(snap)
        app.processEvents()
    panel.on_generation_finished()
    panel.flush()
    app.processEvents()
    panel.map_panel.set_highlight_choice("all")
    show_hover(panel)
    paths = panel.export_pngs(args.out)
    paths.append(panel.export_telemetry(args.out / "telemetry.json"))
    for p in paths:
        print(p)
    return 0


def show_hover(panel) -> None:
    """Put the hover text of the most retrieved far token of the middle layer on screen."""
    snap = panel.viewed_snapshot()
    if snap is None or not snap.layers:
        return
    from . import data

    row = len(snap.layers) // 2
    entry = panel.state.entry()
    freq = panel.state.frequency.at(entry.seq, None)
    picked = data.retrieved_positions(snap.layers[row])
    if picked.size:
        counts = [freq.count(row, int(p)) for p in picked]
        position = int(picked[int(np.argmax(counts))])
        panel.map_panel.info.setText(panel.map_panel.describe(row, position))


def dark_palette():
    """A neutral dark QPalette (for screenshots of the dark look)."""
    from PySide6.QtGui import QColor, QPalette

    pal = QPalette()
    roles = {
        QPalette.ColorRole.Window: "#202225",
        QPalette.ColorRole.WindowText: "#E3E5E8",
        QPalette.ColorRole.Base: "#17181A",
        QPalette.ColorRole.AlternateBase: "#222428",
        QPalette.ColorRole.Text: "#E3E5E8",
        QPalette.ColorRole.Button: "#2A2D31",
        QPalette.ColorRole.ButtonText: "#E3E5E8",
        QPalette.ColorRole.Highlight: "#3D6FB6",
        QPalette.ColorRole.HighlightedText: "#FFFFFF",
        QPalette.ColorRole.ToolTipBase: "#2A2D31",
        QPalette.ColorRole.ToolTipText: "#E3E5E8",
        QPalette.ColorRole.Mid: "#3A3D42",
        QPalette.ColorRole.Dark: "#111214",
    }
    for role, colour in roles.items():
        pal.setColor(role, QColor(colour))
    disabled = QPalette.ColorGroup.Disabled
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        pal.setColor(disabled, role, QColor("#6E737B"))
    return pal


if __name__ == "__main__":
    sys.exit(main())
