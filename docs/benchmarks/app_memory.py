"""What the app's memory panel shows against what the OS measured: the demo model at 8K.

Each case is a fresh `a2ats-chat --model demo --prompt TEXT --export-telemetry FILE --quit`
(scripted, greedy, 8 tokens, the inspector's telemetry on): a short prompt (about 40 tokens) and
a long one (about 7,900 tokens, filler text), with A2ATS's K/V rows in memory and with a K/V
memory limit of 0 (every row of the A2ATS layers in the cold tier). From each run's last decode
snapshot: the memory panel's figures ("in memory": the caches' arrays and the codebook; "on
disk"; "an fp16 cache would hold") and the process's private memory as the OS measured it at
that step (`RssAnon`). Per setting, the growth from the short prompt to the long one is what the
longer context costs: the panel's "in memory" growth beside the measured growth.

    python docs/benchmarks/app_memory.py > docs/benchmarks/app_memory_demo.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from a2ats_engine.commands._bench_common import machine  # noqa: E402
from app.inspector.data import memory_summary  # noqa: E402
from app.inspector.export import load_telemetry  # noqa: E402

FILLER = (
    "The harbour master counted the boats again. Gulls circled the grey water while the "
    "ferry waited at the pier, and somebody on the quay was whistling an old song. "
)
SETTINGS = {  # kv_memory None: rows in memory; 0: every A2ATS layer's rows in the cold tier
    "in memory": None,
    "cold tier (K/V memory limit 0)": 0,
}
PROMPTS = {"short": 1, "long": 210}  # filler repeats: about 40 and 7,900 tokens


def run_case(kv_memory: int | None, repeats: int, folder: Path) -> dict:
    config = folder / "config"
    config.mkdir(parents=True, exist_ok=True)
    cache: dict = {"fidelity_every": 0}
    if kv_memory is not None:
        cache["kv_memory"] = kv_memory
    (config / "settings.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "cache": cache,
                "sampling": {"temperature": 0.0, "max_tokens": 8},
                "use_model_sampling": False,
                "auto_measure_crossover": False,
            }
        )
    )
    telemetry = folder / "telemetry.json"
    prompt = FILLER * repeats + "\nWhat was the harbour master counting?"
    env = dict(os.environ, A2ATS_CONFIG_DIR=str(config), QT_QPA_PLATFORM="offscreen")
    command = [
        sys.executable, "-m", "app.main", "--model", "demo", "--prompt", prompt,
        "--export-telemetry", str(telemetry), "--quit", "--timeout", "1800",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"a2ats-chat failed ({done.returncode}): {done.stderr[-2000:]}")
    snapshots, _ = load_telemetry(telemetry)
    last = snapshots[-1]
    summary = memory_summary(last)
    return {
        "context": last.offset,
        "panel_in_memory_bytes": summary.total_held,
        "panel_codebook_bytes": summary.codebook,
        "panel_on_disk_bytes": summary.on_disk,
        "panel_fp16_bytes": summary.total_fp16,
        "process_private_bytes": last.process_bytes,
    }


def main() -> int:
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for setting, kv_memory in SETTINGS.items():
            for name, repeats in PROMPTS.items():
                folder = Path(tmp) / f"{len(cases)}"
                row = run_case(kv_memory, repeats, folder)
                cases.append({"setting": setting, "prompt": name, **row})
    json.dump(
        {
            "model": "SmolLM2-135M-Instruct (demo)",
            "machine": machine(),
            "command": "python docs/benchmarks/app_memory.py",
            "cases": cases,
        },
        sys.stdout,
        indent=1,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
