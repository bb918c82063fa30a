"""Cost of the visible inspector on generation: decode tokens/s and GUI-thread CPU, panel on/off.

One chat session; the prompt is prefilled once, then `regenerate` re-answers it (decode only) in
alternating rounds, with the panel hidden or visible. Generation runs on a worker thread and
snapshots reach the panel through a queued signal, as in the app.

    python -m app.inspector.bench --model demo --prompt-file long.txt --tokens 40 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help='model source (default "demo")')
    parser.add_argument("--codebook", type=Path, help="codebook file (default: random)")
    parser.add_argument("--prompt-file", type=Path, required=True, help="text of the prompt")
    parser.add_argument("--tokens", type=int, default=40, help="decode tokens per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (each: panel on and off)")
    args = parser.parse_args(argv)

    from PySide6.QtCore import QObject, Qt, Signal
    from PySide6.QtWidgets import QApplication

    from a2ats_engine import (
        A2ATSConfig,
        CacheSnapshot,
        ChatSession,
        Codebook,
        GenerationStats,
        SamplingSettings,
        load_model,
    )

    from .panel import InspectorPanel

    app = QApplication.instance() or QApplication(["a2ats-inspector-bench"])
    model, tokenizer, _ = load_model(args.model)
    tokenizer.eos_token_ids = []  # every round decodes exactly --tokens tokens
    codebook = Codebook.load(args.codebook) if args.codebook else None
    sampling = SamplingSettings(temperature=0.0, max_tokens=args.tokens)
    if codebook is None:  # the caches are built on the first reply: warn once, here
        print("no --codebook: a random codebook (retrieval near random; costs are the same)")
        warnings.filterwarnings("ignore", message="A2ATS: no codebook given")
    session = ChatSession(
        model,
        tokenizer,
        sampling=sampling,
        a2ats=A2ATSConfig(telemetry=True),
        codebook=codebook,
    )

    class Bridge(QObject):
        snapshot = Signal(object)

    bridge = Bridge()
    panel = InspectorPanel()
    panel.resize(560, 940)
    bridge.snapshot.connect(panel.on_snapshot, Qt.ConnectionType.QueuedConnection)

    def run(events, visible: bool) -> tuple[GenerationStats, float]:
        """Drain one reply on a worker thread; returns (stats, GUI-thread share of a core)."""
        out: dict = {}

        def work() -> None:
            for event in events():
                if isinstance(event, CacheSnapshot) and visible:
                    bridge.snapshot.emit(event)
                elif isinstance(event, GenerationStats):
                    out["stats"] = event

        panel.setVisible(visible)
        if visible:
            panel.on_generation_started()
        worker = threading.Thread(target=work)
        worker.start()
        wall, cpu = time.perf_counter(), time.thread_time()
        while worker.is_alive():
            app.processEvents()
            time.sleep(0.002)
        share = (time.thread_time() - cpu) / (time.perf_counter() - wall)
        panel.on_generation_finished()
        app.processEvents()
        return out["stats"], share

    first, _ = run(lambda: session.send(args.prompt_file.read_text()), False)
    print(f"prefilled {first.prompt_tokens} tokens (context {first.context_tokens})")
    tps: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for visible in (False, True) if r % 2 == 0 else (True, False):
            stats, share = run(session.regenerate, visible)
            tps[visible].append(stats.generation_tps)
            print(
                f"round {r} panel {'visible' if visible else 'hidden '}: "
                f"{stats.generation_tps:.2f} tok/s, GUI thread {100 * share:.1f}% of a core, "
                f"redraws so far {panel.redraw_count}"
            )
    off, on = statistics.mean(tps[False]), statistics.mean(tps[True])
    print(f"mean tok/s hidden {off:.2f}, visible {on:.2f}: ratio {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
