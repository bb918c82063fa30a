"""Print the Markdown tables of docs/BENCHMARKS.md from the JSON results in this folder.

    .venv/bin/python docs/benchmarks/tables.py [eval|diag|sweep|passkey|decode|memory|seed|
                                                estimate|ladder|b001|reuse]...

No argument prints every table whose JSON file exists. The numbers in BENCHMARKS.md are pasted
from this output, so they are the measured ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str) -> dict | None:
    path = HERE / name
    return json.loads(path.read_text()) if path.is_file() else None


def eval_table(data: dict) -> str:
    lines = [
        "| method | recall | output rel. error | ppl | ppl / full (95% CI) | argmax = full "
        "| attended per KV head | bytes / token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in data["methods"].items():
        low, high = r.get("ppl_vs_full_ci95", [1.0, 1.0])
        lines.append(
            f"| {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | {r['ppl']:.3f} | "
            f"{r.get('ppl_vs_full', 1.0):.3f} ({low:.3f}-{high:.3f}) | "
            f"{r.get('argmax_agreement', 1.0):.3f} | {r['attended_per_head']:.0f} | "
            f"{r['bytes_per_token']:.0f} |"
        )
    return "\n".join(lines)


def sweep_table(data: dict) -> str:
    runs = sorted(data["runs"], key=lambda r: r["budget"])
    methods = [m for m in runs[0]["methods"] if m != "full"]
    out = []
    for metric, fmt in (("recall", ".4f"), ("ppl_vs_full", ".3f")):
        head = f"| {metric} | " + " | ".join(str(r["budget"]) for r in runs) + " |"
        lines = [head, "|---|" + "---:|" * len(runs)]
        for m in methods:
            cells = " | ".join(format(r["methods"][m][metric], fmt) for r in runs)
            lines.append(f"| {m} | {cells} |")
        if metric == "recall":
            a2, oracle = "a2ats", "oracle_topk"
            if a2 in methods and oracle in methods:
                cells = " | ".join(
                    f"{r['methods'][a2]['recall'] / r['methods'][oracle]['recall']:.3f}"
                    for r in runs
                )
                lines.append(f"| a2ats / oracle_topk | {cells} |")
            cells = " | ".join(f"{r['methods'][a2]['attended_per_head']:.0f}" for r in runs)
            lines.append(f"| (a2ats attended per KV head) | {cells} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def passkey_table(data: dict) -> str:
    contexts = sorted({t["context"] for t in data["trials"]})
    depths = sorted({t["depth"] for t in data["trials"]})
    lines = [
        "| method | " + " | ".join(f"{c}" for c in contexts) + " |",
        "|---|" + "---:|" * len(contexts),
    ]
    for method, row in data["accuracy"].items():
        cells = " | ".join(f"{row[str(c)]:.2f}" for c in contexts)
        lines.append(f"| {method} | {cells} |")
    lines.append("")
    lines.append(f"Depths: {', '.join(str(d) for d in depths)}. Failures (method, context, depth: "
                 "answer):")  # fmt: skip
    for t in data["trials"]:
        if not t["correct"]:
            lines.append(
                f"- {t['method']}, {t['context']}, {t['depth']}: `{t['answer'].strip()!r}` "
                f"(key {t['passkey']})"
            )
    return "\n".join(lines)


def decode_table(data: dict, data_1thread: dict | None) -> str:
    def index(d):
        return {(r["context"], r["method"]): r for r in d["results"]}

    a, b = index(data), index(data_1thread) if data_1thread else {}
    lines = [
        "| context | method | tok/s (2 BLAS threads) | vs full | tok/s (1 BLAS thread) | vs full |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for (ctx, method), r in a.items():
        other = b.get((ctx, method))
        extra = f"{other['tokens_per_s']:.2f} | {other['speed_vs_full']:.2f}x" if other else "- | -"
        lines.append(
            f"| {ctx} | {method} | {r['tokens_per_s']:.2f} | {r['speed_vs_full']:.2f}x | {extra} |"
        )
    return "\n".join(lines)


def memory_table(data: dict) -> str:
    rows = data["results"]
    contexts = sorted({r["context"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["context"], r["method"]): r for r in rows}
    lines = [
        "| method | bytes / token | vs full | vs fp16 full |",
        "|---|---:|---:|---:|",
    ]
    for m in methods:
        r = by[(contexts[-1], m)]
        lines.append(
            f"| {m} | {r['bytes_per_token']:.0f} | {r['vs_full']:.3f}x | {r['vs_fp16_full']:.3f}x |"
        )
    same = all(
        abs(by[(c, m)]["bytes_per_token"] - by[(contexts[-1], m)]["bytes_per_token"]) < 1
        for c in contexts
        for m in methods
    )
    lines.append("")
    lines.append(
        f"Contexts {', '.join(map(str, contexts))}: bytes per token "
        + ("identical at every context." if same else "vary with context (see memory.json).")
    )
    return "\n".join(lines)


def seed_table(data: dict) -> str:
    lines = [
        "| spectrum | seq | geometry | seed measure: windowed / exact RoPE key MSE | windowed / "
        "exact RoPE score MSE | QA / plain key MSE | far score MSE QA / plain | top-K recall "
        "QA / plain |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        rope, vq = row["rope"], row["vq"]
        lines.append(
            f"| {row['spectrum']} | {row['sequence']} | {row['geometry']} | "
            f"{rope['seed_key_windowed_over_exact']:.2f}x | {rope['windowed_over_exact']:.2f}x | "
            f"{vq['query_aware_key_mse_over_plain']['ratio']:.2f}x | "
            f"{vq['query_aware']['score_mse_far']:.3f} / {vq['plain']['score_mse_far']:.3f} | "
            f"{vq['query_aware']['recall_top_k']:.3f} / {vq['plain']['recall_top_k']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    wanted = set(argv) or {
        "eval", "diag", "sweep", "passkey", "decode", "memory", "seed",
        "estimate", "ladder", "b001", "reuse",
    }  # fmt: skip
    sections = [
        ("eval", "eval_4k_b003.json", eval_table),
        ("diag", "eval_diagnostics.json", eval_table),
        ("sweep", "eval_sweep.json", sweep_table),
        ("passkey", "passkey.json", passkey_table),
        ("memory", "memory.json", memory_table),
        ("seed", "seed_synthetic.json", seed_table),
        ("estimate", "eval_estimate_4k_b003.json", eval_table),
        ("ladder", "eval_beyond_ladder.json", eval_table),
        ("b001", "eval_beyond_b001.json", eval_table),
        ("reuse", "eval_beyond_reuse.json", eval_table),
    ]
    for key, fname, fn in sections:
        data = _load(fname) if key in wanted else None
        if data is not None:
            print(f"<!-- {key}: {fname} -->\n{fn(data)}\n")
    if "decode" in wanted and (data := _load("decode.json")) is not None:
        print(f"<!-- decode: decode.json, decode_1thread.json -->\n"
              f"{decode_table(data, _load('decode_1thread.json'))}\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
