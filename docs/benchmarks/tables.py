"""Print the Markdown tables of docs/BENCHMARKS.md and README.md from the JSON in this folder.

    python docs/benchmarks/tables.py [KEY ...]     print the tables (all, or the KEYs given)
    python docs/benchmarks/tables.py --write       rewrite the generated regions of the docs
    python docs/benchmarks/tables.py --check       exit 1 if a generated region differs

A generated region of a .md file sits between `<!-- begin generated: KEY -->` and
`<!-- end generated: KEY -->`; its text is exactly what KEY's table function prints from the
recorded JSON, so every number in it is a measured one (tests/test_docs_tables.py checks it).
KEYs: see `blocks()`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "BENCHMARKS.md")
REGION = re.compile(
    r"(<!-- begin generated: (?P<key>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=key) -->)",
    re.S,
)


def _load(name: str) -> dict | None:
    path = HERE / name
    return json.loads(path.read_text()) if path.is_file() else None


def eval_table(data: dict) -> str:
    rows = data["methods"]
    cost = all("bytes_read_per_step" in r for r in rows.values())  # recorded since v2
    lines = [
        "| method | recall | output rel. error | ppl | ppl / full (95% CI) | argmax = full "
        "| attended per KV head | bytes / token |"
        + (" attended share | KB read / step |" if cost else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if cost else ""),
    ]
    for name, r in rows.items():
        low, high = r.get("ppl_vs_full_ci95", [1.0, 1.0])
        extra = ""
        if cost:
            extra = f" {r['attended_fraction']:.3f} | {r['bytes_read_per_step'] / 1e3:,.0f} |"
        lines.append(
            f"| {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | {r['ppl']:.3f} | "
            f"{r.get('ppl_vs_full', 1.0):.3f} ({low:.3f}-{high:.3f}) | "
            f"{r.get('argmax_agreement', 1.0):.3f} | {r['attended_per_head']:.0f} | "
            f"{r['bytes_per_token']:.0f} |{extra}"
        )
    return "\n".join(lines)


def paper_b_table(data: dict) -> str:
    """a2ats_paper's b tuned on the development slice, and the chosen b on the evaluation text."""
    tuned = data["paper_b"]
    lines = [
        "| b | recall (dev) | ppl / full (dev) | output rel. error (dev) |",
        "|---:|---:|---:|---:|",
    ]
    for t in tuned["trials"]:
        mark = " (chosen)" if t["b"] == tuned["chosen"] else ""
        lines.append(
            f"| {t['b']}{mark} | {t['recall']:.4f} | {t['ppl_vs_full']:.3f} | "
            f"{t['output_rel_error']:.4f} |"
        )
    paper = data["methods"]["a2ats_paper"]
    low, high = paper["ppl_vs_full_ci95"]
    rests = data["rests_on"]
    lines += [
        "",
        f"Development text: {tuned['dev']}; budget {tuned['budget']}, context {data['context']}, "
        f"{data['decode']} teacher-forced tokens per b; b chosen by recall (then ppl). On the "
        f"evaluation text ({data['text']}, {rests['tokens']} tokens) a2ats_paper at b = "
        f"{tuned['chosen']}: recall {paper['recall']:.4f}, ppl {paper['ppl_vs_full']:.3f}x full "
        f"({low:.3f}-{high:.3f}).",
    ]
    return "\n".join(lines)


def readme_fair_line(data: dict) -> str:
    """README's summary of the fair-baselines run (tuned b, re-calibrated no-WRoPE)."""
    m, tuned = data["methods"], data["paper_b"]

    def fig(name: str) -> str:
        r = m[name]
        return f"recall {r['recall']:.3f}, ppl {r['ppl_vs_full']:.3f}x full"

    values = ", ".join(str(t["b"]) for t in tuned["trials"])
    return (
        f"Fair baselines (`a2ats eval --tune-paper-b {values.replace(', ', ',')}`, "
        f"{data['rests_on']['tokens']} tokens at context {data['context']}): with b tuned on a development slice "
        f"(b = {tuned['chosen']}), a2ats_paper reaches {fig('a2ats_paper')}; a2ats_no_wrope "
        f"calibrated over the evaluated positions {fig('a2ats_no_wrope')}; a2ats "
        f"{fig('a2ats')} in the same run (docs/BENCHMARKS.md section 1)."
    )


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
    if "fixed_bytes" in rows[0]:
        lines += ["", *_memory_held_lines(data, contexts, methods, by)]
    return "\n".join(lines)


def _never(n) -> str:
    return "never" if n is None else f"{n:,}"


def _memory_held_lines(data: dict, contexts: list, methods: list, by: dict) -> list[str]:
    """Whole bytes held (fixed costs counted) per context, and the break-even contexts."""
    mib = 2**20
    lines = [
        "Bytes held in all, fixed costs counted (MiB; A2ATS's fixed part: the codebook, held once "
        "per model and shared by all chats of that model, plus each layer's rotation matrices):",
        "",
        "| method | fixed | " + " | ".join(f"held at {c}" for c in contexts) + " |",
        "|---|---:|" + "---:|" * len(contexts),
    ]
    for m in methods:
        held = " | ".join(
            f"{by[(c, m)]['bytes_held'] / mib:.1f} ({by[(c, m)]['held_vs_fp16_full']:.2f}x fp16)"
            for c in contexts
        )
        lines.append(f"| {m} | {by[(contexts[-1], m)]['fixed_bytes'] / mib:.1f} | {held} |")
    be = {(b["method"], b["baseline"]): b["context"] for b in data.get("break_even", [])}
    a2 = list(dict.fromkeys(b["method"] for b in data.get("break_even", [])))
    if a2:
        lines += [
            "",
            "Context (tokens) from which A2ATS holds less than each baseline, codebook and "
            "rotations counted (solved from bytes/token and the fixed bytes):",
            "",
            "| A2ATS storage | vs fp16 full | vs mlx-lm kv8 | vs mlx-lm kv4 |",
            "|---|---:|---:|---:|",
        ]
        for m in a2:
            cells = " | ".join(_never(be.get((m, b))) for b in ("fp16", "kv8", "kv4"))
            lines.append(f"| {m} | {cells} |")
    return lines


def readme_memory_line(data: dict) -> str:
    """README's memory summary: the codebook counted, and where A2ATS starts to hold less."""
    be = {(b["method"], b["baseline"]): b["context"] for b in data["break_even"]}
    book = data["codebook_bytes"] / 2**20
    names = {"fp16": "an fp16 cache", "kv8": "mlx-lm's kv8", "kv4": "mlx-lm's kv4"}
    last = max(r["context"] for r in data["results"])
    per = {r["method"]: r["bytes_per_token"] for r in data["results"] if r["context"] == last}
    codes = per.get("a2ats_kv4", 0) - per.get("kv4", 0)
    parts = []
    for m, name in (("a2ats", "float K/V"), ("a2ats_kv8", "8-bit K/V"), ("a2ats_kv4", "4-bit K/V")):
        if (m, "fp16") not in be:
            continue
        wins = [f"{names[b]} from {be[(m, b)]:,} tokens" for b in names if be.get((m, b))]
        never = [names[b] for b in names if (m, b) in be and be[(m, b)] is None]
        text = f"{name} holds less than " + ", ".join(wins) if wins else f"{name}"
        if never:
            text += ("; never less than " if wins else " never holds less than ") + " or ".join(
                never
            )
        parts.append(text)
    return (
        f"Memory with everything counted (`a2ats bench memory`): the codebook holds {book:.1f} MiB "
        "(once per model, shared by all chats of that model) plus each layer's rotation "
        "matrices, so A2ATS saves memory only from some context on: "
        + ". ".join(parts)
        + f" (the codes add {codes:,.0f} bytes per token to the same storage)."
    )


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


def _pct(x: float) -> str:
    return f"{x:.3f}x"


def targets_table(ev: dict, passkey: dict, decode: dict, decode_1: dict | None, mem: dict) -> str:
    """The first round of targets (fidelity, memory, speed) against the recorded runs."""
    m = ev["methods"]
    a2, oracle = m["a2ats"], m["oracle_topk"]
    ratio = a2["recall"] / oracle["recall"]
    no_rr = m["a2ats_no_rerank"]["recall"] / oracle["recall"]
    others = ("window", "a2ats_paper", "a2ats_plain_vq")
    margin = min(a2["recall"] - m[o]["recall"] for o in others)
    low, high = a2["ppl_vs_full_ci95"]
    pk = {}
    for t in passkey["trials"]:
        pk.setdefault(t["method"], []).append(t["correct"])
    full_ok = sum(pk["full"])
    a2_ok = sum(c for c, f in zip(pk["a2ats"], pk["full"], strict=True) if f)

    def speed(data, method):
        rows = [r for r in data["results"] if r["method"] == method]
        return max(rows, key=lambda r: r["context"])["speed_vs_full"] if rows else None

    top = max(r["context"] for r in decode["results"])
    s2, s1 = speed(decode, "a2ats"), speed(decode_1, "a2ats") if decode_1 else None
    r2, r1 = speed(decode, "a2ats_rr1"), speed(decode_1, "a2ats_rr1") if decode_1 else None
    kv4 = next(r for r in mem["results"] if r["method"] == "a2ats_kv4")
    one = f" / **{s1:.2f}x** (1 thread)" if s1 else ""
    rr1 = f"; rerank 1: {r2:.2f}x" + (f" / {r1:.2f}x" if r1 else "") if r2 else ""
    fast = s2 >= 1.3
    lines = [
        "| target | measured | met |",
        "|---|---|---|",
        f"| `a2ats` recall >= 0.95 x `oracle_topk` (4K, budget {ev['budget']}) | "
        f"{a2['recall']:.4f} / {oracle['recall']:.4f} = **{ratio:.3f}** ({no_rr:.3f} without "
        f"rerank) | {'yes' if ratio >= 0.95 else 'no'} |",
        f"| `a2ats` recall above `window`, `a2ats_paper`, `a2ats_plain_vq` | {a2['recall']:.4f} "
        f"vs {', '.join(format(m[o]['recall'], '.4f') for o in others)} | "
        f"{'yes' if margin > 0 else 'no'} (smallest margin {margin:.3f}) |",
        f"| `a2ats` ppl within 3% of `full` | **{a2['ppl_vs_full']:.3f}x** (95% CI {low:.3f}-"
        f"{high:.3f}) over {ev['decode']} tokens; {m['a2ats_no_rerank']['ppl_vs_full']:.3f}x "
        f"without rerank | {'yes' if a2['ppl_vs_full'] <= 1.03 else 'no'} |",
        f"| passkey accuracy equal to `full` where `full` succeeds | {a2_ok}/{full_ok} = "
        f"{full_ok}/{len(pk['full'])} | {'yes' if a2_ok == full_ok else 'no'} |",
        f"| decode at {top // 1024}K >= 1.3x `full` | default (rerank {decode['rerank']}): "
        f"**{s2:.2f}x** (2 BLAS threads){one}{rr1} | {'yes' if fast else '**no** at the default'} |",
        f"| bytes per token with `kv_bits` 4 <= 0.35x `full` | {kv4['vs_full']:.3f}x "
        f"{mem['kv_dtype']} full, {kv4['vs_fp16_full']:.3f}x an fp16 full cache | "
        f"{'yes' if min(kv4['vs_full'], kv4['vs_fp16_full']) <= 0.35 else 'no'} |",
    ]
    return "\n".join(lines)


def readme_quality_table(ev: dict, mem: dict, est: dict | None = None) -> str:
    """README's summary of `a2ats eval` at 4K (with the kv_bits bytes from `bench memory`);
    `est`: the run with the missed-attention estimate (eval_estimate_4k_b003.json), whose
    `a2ats_estimate` row is today's default a2ats (`ev`'s a2ats ran without it)."""
    m = ev["methods"]
    held = {r["method"]: r["bytes_per_token"] for r in mem["results"]}

    def row(label, name, bold=False, bytes_=""):
        r = m[name]
        recall, ppl = f"{r['recall']:.3f}", f"{r['ppl_vs_full']:.3f}"
        if bold:
            recall, ppl = f"**{recall}**", f"**{ppl}**"
        return f"| {label} | {recall} | {ppl} | {bytes_} |"

    oracle_share = m["a2ats"]["recall"] / m["oracle_topk"]["recall"]
    a2_bytes = f"{m['a2ats']['bytes_per_token']:,.0f}"
    if "a2ats_kv8" in held and "a2ats_kv4" in held:
        a2_bytes += (
            f"; {held['a2ats_kv8']:,.0f} with kv_bits 8; {held['a2ats_kv4']:,.0f} with kv_bits 4"
        )
    lines = [
        "| method | attention mass recalled | ppl vs full | K/V bytes per token |",
        "|---|---|---|---|",
        row("full (mlx-lm KVCache)", "full", bytes_=f"{m['full']['bytes_per_token']:,.0f} "
            f"({mem['kv_dtype']} on CPU)"),
        f"| kv8 / kv4 (mlx-lm QuantizedKVCache) | {m['kv8']['recall']:.3f} / "
        f"{m['kv4']['recall']:.3f} | {m['kv8']['ppl_vs_full']:.3f} / "
        f"{m['kv4']['ppl_vs_full']:.3f} | {m['kv8']['bytes_per_token']:,.0f} / "
        f"{m['kv4']['bytes_per_token']:,.0f} |",
        row("oracle top-K (exact scores, same budget)", "oracle_topk", bytes_="-"),
        *([] if est is None else [
            f"| a2ats + estimated missed attention (`estimate_missed=True`; off by default: "
            f"it slows decode on the CPU) | {est['methods']['a2ats_estimate']['recall']:.3f} | "
            f"{est['methods']['a2ats_estimate']['ppl_vs_full']:.3f} | "
            f"{est['methods']['a2ats_estimate']['bytes_per_token']:,.0f} (with the estimate's "
            f"sums, a fixed size: this many at 4K) |"
        ]),
        row("**a2ats** (the default: 4 distance buckets, query-aware, rerank 2)", "a2ats", True,
            a2_bytes).replace(f"**{m['a2ats']['recall']:.3f}**",
                              f"**{m['a2ats']['recall']:.3f}** ({oracle_share:.2f}x oracle)"),
        row("a2ats without rerank", "a2ats_no_rerank"),
        row("a2ats_plain_vq (beta = 1)", "a2ats_plain_vq"),
        row("a2ats_paper (one distance b = 2048, no rerank)", "a2ats_paper"),
        row("window (sinks + recent, same count)", "window"),
        f"| a2ats_no_wrope / a2ats_random | {m['a2ats_no_wrope']['recall']:.3f} / "
        f"{m['a2ats_random']['recall']:.3f} | {m['a2ats_no_wrope']['ppl_vs_full']:.3f} / "
        f"{m['a2ats_random']['ppl_vs_full']:.3f} | |",
    ]  # fmt: skip
    return "\n".join(lines)


def tasks_table(data: dict) -> str:
    """`a2ats bench tasks`: score per task, context and method, then agreement with `full`."""
    rows = data["results"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    keys = list(dict.fromkeys((r["task"], r["context"]) for r in rows))
    score = {(r["task"], r["context"], r["method"]): r for r in rows}
    agree = {(r["task"], r["context"], r["method"]): r for r in data.get("relative_to_full", [])}
    lines = [
        "| task | context | prompts | " + " | ".join(methods) + " |",
        "|---|---:|---:|" + "---:|" * len(methods),
    ]
    for task, ctx in keys:
        n = score[(task, ctx, methods[0])]["n"]
        cells = " | ".join(f"{score[(task, ctx, m)]['score']:.2f}" for m in methods)
        lines.append(f"| {task} | {ctx} | {n} | {cells} |")
    for ctx in dict.fromkeys(c for _, c in keys):
        mean = " | ".join(
            f"{sum(score[(t, c, m)]['score'] for t, c in keys if c == ctx) / sum(1 for _, c in keys if c == ctx):.2f}"
            for m in methods
        )
        lines.append(f"| **mean** | {ctx} | | {mean} |")
    if agree:
        lines += ["", "Answers identical to `full`'s (share of prompts):", "",
                  "| task | context | " + " | ".join(methods) + " |",
                  "|---|---:|" + "---:|" * len(methods)]  # fmt: skip
        for task, ctx in keys:
            cells = " | ".join(f"{agree[(task, ctx, m)]['agrees_with_full']:.2f}" for m in methods)
            lines.append(f"| {task} | {ctx} | {cells} |")
    lines += ["", f"`{data['command']}`; haystack {data['haystack']}; codebook {data['codebook']}."]
    return "\n".join(lines)


def kv_bits_table(runs: list[dict]) -> str:
    """`a2ats eval --kv-bits 8|4` next to each other: the A2ATS methods over quantized K/V,
    measured against exact float attention (`full` is float in every run)."""
    lines = [
        "| A2ATS K/V | method | recall | output rel. error | ppl / full (95% CI) | bytes / token "
        "| attended share | KB read / step | tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for data in runs:
        storage = "float" if data.get("kv_bits") is None else f"{data['kv_bits']}-bit"
        for name, r in data["methods"].items():
            low, high = r["ppl_vs_full_ci95"]
            lines.append(
                f"| {storage} | {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | "
                f"{r['ppl_vs_full']:.3f} ({low:.3f}-{high:.3f}) | {r['bytes_per_token']:.0f} | "
                f"{r['attended_fraction']:.3f} | {r['bytes_read_per_step'] / 1e3:,.0f} | "
                f"{r['tokens']} |"
            )
    first = runs[0]
    lines += ["", f"Context {first['context']}, {first['decode']} teacher-forced tokens of "
              f"{first['text']}; budget {first['budget']}; {first['rests_on']['ci95']}."]  # fmt: skip
    return "\n".join(lines)


def readme_tasks_line(data: dict) -> str:
    """README's one-line summary of `a2ats bench tasks`: mean score per method and context."""
    rows = data["results"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    parts = []
    for ctx in dict.fromkeys(r["context"] for r in rows):
        here = [r for r in rows if r["context"] == ctx]
        tasks = len({r["task"] for r in here})
        prompts = here[0]["n"]
        means = ", ".join(
            f"{m} {sum(r['score'] for r in here if r['method'] == m) / tasks:.2f}" for m in methods
        )
        parts.append(f"at {ctx} tokens, {tasks} tasks x {prompts} prompts: {means}")
    return "RULER-style tasks (`a2ats bench tasks`), mean score " + "; ".join(parts) + "."


def readme_kv_line(runs: list[dict]) -> str:
    """README's one-line summary of the kv_bits runs: A2ATS at each K/V storage."""
    parts = []
    for data in runs:
        r = data["methods"]["a2ats"]
        storage = "float" if data.get("kv_bits") is None else f"{data['kv_bits']}-bit"
        low, high = r["ppl_vs_full_ci95"]
        parts.append(
            f"{storage} K/V: recall {r['recall']:.3f}, ppl {r['ppl_vs_full']:.3f}x full "
            f"({low:.3f}-{high:.3f}), {r['bytes_per_token']:,.0f} bytes per token, "
            f"{r['bytes_read_per_step'] / 1e6:.0f} MB read per step"
        )
    full = runs[0]["methods"]["full"]
    return (
        f"A2ATS by K/V storage (`a2ats eval --kv-bits 8|4`, {runs[0]['decode']} tokens): "
        + "; ".join(parts)
        + f" (full attention: {full['bytes_read_per_step'] / 1e6:.0f} MB read per step)."
    )


def cost_sweep_table(data: dict) -> str:
    """A budget sweep with the cost accounting: per budget and method, the attended share, the
    MB one decode step reads (all layers), recall and ppl / full."""
    runs = sorted(data["runs"], key=lambda r: r["budget"])
    lines = [
        "| budget | method | attended share | MB read / step | recall | ppl / full (95% CI) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for run in runs:
        for name, r in run["methods"].items():
            if name == "full" and run is not runs[0]:
                continue
            low, high = r["ppl_vs_full_ci95"]
            budget = "-" if name == "full" else run["budget"]
            lines.append(
                f"| {budget} | {name} | {r['attended_fraction']:.3f} | "
                f"{r['bytes_read_per_step'] / 1e6:.1f} | {r['recall']:.4f} | "
                f"{r['ppl_vs_full']:.3f} ({low:.3f}-{high:.3f}) |"
            )
    rests = runs[0]["rests_on"]
    lines += ["", f"Context {data['context']}, {rests['tokens']} teacher-forced tokens of "
              f"{data['text']}; {rests['ci95']}."]  # fmt: skip
    return "\n".join(lines)


DECODE_V2_METHODS = {
    "a2ats_noest": "a2ats as shipped (no estimate, exact below the crossover)",
    "a2ats": "a2ats with the estimate (exact below the crossover)",
    "a2ats_eb0": "a2ats retrieving from the start (estimate on)",
    "a2ats_eb0_noest": "a2ats retrieving from the start, no estimate",
}


def decode_v2_table(data: dict) -> str:
    """Median of `repeats` runs: tok/s, the median ratio to `full` within each run, its spread."""
    lines = [
        f"Median of {data['repeats']} runs, {data['steps']} decode steps each "
        f"(`{data['command']}`; {data['machine']}).",
        "",
        "| context | method | tok/s | vs full (median) | spread (min-max) | every run |",
        "|---:|---|---:|---:|---|---|",
    ]
    for r in data["results"]:
        runs = ", ".join(f"{x:.2f}" for x in r["ratio_runs"])
        lo, hi = r["ratio_spread"]
        lines.append(
            f"| {r['context']} | {r['method']} | {r['tokens_per_s']:.2f} | "
            f"{r['speed_vs_full']:.2f}x | {lo:.2f}-{hi:.2f} | {runs} |"
        )
    return "\n".join(lines)


def readme_decode_line(data: dict) -> str:
    """One sentence per A2ATS method: its median ratio to KVCache at every context."""
    contexts = sorted({r["context"] for r in data["results"]})
    by = {(r["context"], r["method"]): r for r in data["results"]}
    parts = []
    for method, label in DECODE_V2_METHODS.items():
        if (contexts[0], method) not in by:
            continue
        cells = ", ".join(
            f"{c // 1024}K {by[(c, method)]['speed_vs_full']:.2f}x"
            if c >= 1024
            else f"{c} {by[(c, method)]['speed_vs_full']:.2f}x"
            for c in contexts
        )
        parts.append(f"{label}: {cells}")
    return (
        f"Decode speed vs mlx-lm's KVCache, median of {data['repeats']} runs "
        f"(`{data['command']}`): " + "; ".join(parts) + "."
    )


def geometry_table(data: dict) -> str:
    """Real-size geometry (random weights, synthetic caches): median ratio and spread."""
    calib = data.get("calibration") or {}
    lines = [
        f"{data['description']} ({data['parameters'] / 1e9:.2f}B parameters, float32, random "
        f"weights), {data['layer_plan']}; median of {data['repeats']} runs of "
        f"{data['steps']} steps (`{data['command']}`; {data['machine']}).",
        "",
        "| context | method | tok/s | vs full (median) | spread | MB held | held vs full |",
        "|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in data["results"]:
        lo, hi = r["ratio_spread"]
        lines.append(
            f"| {r['context']} | {r['method']} | {r['tokens_per_s']:.2f} | "
            f"{r['speed_vs_full']:.2f}x | {lo:.2f}-{hi:.2f} | {r['bytes_held'] / 1e6:.0f} | "
            f"{r['bytes_vs_full']:.3f}x |"
        )
    if calib and calib["fit_seconds"] > 0:
        lines += ["", f"Calibration: the forward pass collects {calib['collect_tokens_per_s']:.0f} "
                  f"tokens/s; with the k-means fit ({calib['fit_seconds']:.1f} s) "
                  f"{calib['tokens']} tokens calibrate at {calib['tokens_per_s']:.0f} tokens/s."]  # fmt: skip
    elif calib:
        lines += ["", f"Calibration: the forward pass collects {calib['collect_tokens_per_s']:.0f} "
                  f"tokens/s ({calib['tokens']} tokens; the k-means fit was not timed in this "
                  "run: the fit's start was read from its first report, fixed since)."]  # fmt: skip
    return "\n".join(lines)


def codebook_sweep_table(data: dict) -> str:
    """`a2ats bench codebooks`: per (centroids, calibration tokens) codebook, its calibration
    time (collection + fit, as a calibration of that pair alone), size and fidelity."""
    lines = [
        "| centroids | calibration tokens | keys / head | calibration s (collect + fit) "
        "| codebook MiB | held-out score error | recall | output rel. error "
        "| ppl / full (95% CI) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["results"]:
        low, high = r["ppl_ci"]
        error = r.get("heldout_score_error")
        lines.append(
            f"| {r['centroids']} | {r['calib_tokens']:,} | {r['keys_per_head']:,} | "
            f"{r['calib_seconds']:.1f} ({r['collect_seconds']:.1f} + {r['fit_seconds']:.1f}) | "
            f"{r['codebook_bytes'] / 2**20:.2f} | {'-' if error is None else f'{error:.4f}'} | "
            f"{r['recall']:.4f} | {r['output_rel_error']:.4f} | "
            f"{r['ppl_vs_full']:.3f} ({low:.3f}-{high:.3f}) |"
        )
    shared = data["calibration_shared"]
    rests = data["rests_on"]
    lines += [
        "",
        f"Context {data['context']}, {rests['tokens']} teacher-forced tokens of "
        f"{'; '.join(data['texts'])}; budget {data['budget']}; {rests['ci95']}. Calibration "
        f"forward pass shared by every row: {shared['forward_tokens']:,} tokens in "
        f"{shared['forward_seconds']:.1f} s (`{data['command']}`; {data['machine']}).",
    ]
    return "\n".join(lines)


def _text_label(desc: str) -> str:
    """A short name for an evaluation text's description."""
    for needle, label in (("http/client", "code"), ("essay", "prose"), ("dialogue", "dialogue")):
        if needle in desc:
            return label
    return desc.split(" (")[0]


def texts_table(data: dict) -> str:
    """`a2ats eval --texts ...`: every method on every text, then pooled over the texts."""
    rows = [
        "| text | method | recall | output rel. error | ppl / full (95% CI) | argmax = full "
        "| attended per KV head | tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for text in data["texts"]:
        label = _text_label(text["text"])
        for name, r in text["runs"][0]["methods"].items():
            low, high = r.get("ppl_vs_full_ci95", [1.0, 1.0])
            rows.append(
                f"| {label} | {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | "
                f"{r.get('ppl_vs_full', 1.0):.3f} ({low:.3f}-{high:.3f}) | "
                f"{r.get('argmax_agreement', 1.0):.3f} | {r['attended_per_head']:.0f} | "
                f"{r['tokens']} |"
            )
    pooled = data["pooled"][0]
    labels = ", ".join(_text_label(t["text"]) for t in data["texts"])
    for name, r in pooled["methods"].items():
        low, high = r.get("ppl_vs_full_ci95", [1.0, 1.0])
        rows.append(
            f"| **pooled** ({labels}) | {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} "
            f"| {r.get('ppl_vs_full', 1.0):.3f} ({low:.3f}-{high:.3f}) | | | {r['tokens']} |"
        )
    texts = "; ".join(f"{_text_label(t['text'])}: {t['text']}" for t in data["texts"])
    rows += [
        "",
        f"Context {data['context']}, budget {data['budgets'][0]}, {data['decode']} teacher-forced "
        f"tokens per text; pooled intervals: {pooled['rests_on']['ci95']}. Texts: {texts}. "
        f"Codebook {data['codebook']}; {data['machine']}.",
    ]
    return "\n".join(rows)


def _layer_recall_lines(methods: dict) -> list[str]:
    """One line per retrieval method: its recall on each layer that retrieved (A2ATS layers)."""
    lines = []
    for name, r in methods.items():
        per_layer = r.get("recall_per_layer")
        if per_layer is None:
            continue
        cells = ", ".join(f"layer {i}: {x:.3f}" for i, x in enumerate(per_layer) if x is not None)
        lines.append(f"- {name} recall per A2ATS layer: {cells}")
    return lines


def model_eval_table(data: dict) -> str:
    """`eval_table` for a model other than the demo: model, text and exact command first, then
    the table and each retrieval method's recall per A2ATS layer."""
    head = f"Model {data['model']}, {_text_label(data['text'])} text: `{data['command']}`"
    return "\n".join([head, "", eval_table(data), "", *_layer_recall_lines(data["methods"])])


def model_texts_table(data: dict) -> str:
    """`texts_table` for a model other than the demo: the model and the exact command first,
    and after the table each retrieval method's pooled recall on each A2ATS layer."""
    lines = [f"Model {data['model']}: `{data['command']}`", "", texts_table(data), ""]
    return "\n".join(lines + _layer_recall_lines(data["pooled"][0]["methods"]))


def alloc_table(data: dict) -> str:
    """Per layer: plain a2ats's recall on the development text, the budget multiplier
    `a2ats_alloc` gave the layer, and both methods' recall pooled over the evaluation texts."""
    first = data["texts"][0]["runs"][0]["methods"]["a2ats_alloc"]
    pooled = data["pooled"][0]["methods"]
    dev, mult = first["dev_recall_per_layer"], first["layer_budgets"]
    plain, alloc = pooled["a2ats"]["recall_per_layer"], pooled["a2ats_alloc"]["recall_per_layer"]

    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    rows = [
        "| layer | recall on the dev text (a2ats) | budget multiplier | recall a2ats | "
        "recall a2ats_alloc |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, (d, m, a, b) in enumerate(zip(dev, mult, plain, alloc, strict=True)):
        rows.append(f"| {i} | {cell(d)} | {m:.2f} | {cell(a)} | {cell(b)} |")
    note = next((n for n in data["notes"] if n.startswith("a2ats_alloc")), "")
    rows += ["", f"{note}; recall pooled over the evaluation texts."]
    return "\n".join(rows)


def prefill_table(data: dict) -> str:
    """`a2ats bench prefill`: time to first token, median of the rounds, A2ATS's ratio."""
    rows = [
        f"Median of {data['repeats']} rounds (`{data['command']}`; {data['machine']}; codebook "
        f"{data['codebook']}, K/V storage "
        f"{'float' if data['kv_bits'] is None else str(data['kv_bits']) + '-bit'}).",
        "",
        "| prompt tokens | method | time to first token (s) | vs full (median) | spread | every round (s) |",
        "|---:|---|---:|---:|---|---|",
    ]
    for r in data["results"]:
        runs = ", ".join(f"{x:.2f}" for x in r["seconds_runs"])
        if "ratio_median" in r:
            lo, hi = r["ratio_spread"]
            ratio, spread = f"{r['ratio_median']:.2f}x", f"{lo:.2f}-{hi:.2f}"
        else:
            ratio, spread = "1.00x", ""
        rows.append(
            f"| {r['context']} | {r['method']} | {r['seconds']:.2f} | {ratio} | {spread} | {runs} |"
        )
    return "\n".join(rows)


def _decode_target_rows(
    target: str, contexts: tuple[int, ...], floor: float, runs: list[tuple[str | None, dict]]
) -> list[str]:
    """One targets row per `bench decode` run that measured every context: a2ats's ratios and
    whether each is >= floor. A run missing a context adds no row."""
    rows = []
    for label, run in runs:
        by = {(r["context"], r["method"]): r["speed_vs_full"] for r in run["results"]}
        got = [by[(c, "a2ats")] for c in contexts if (c, "a2ats") in by]
        if len(got) == len(contexts):
            rows.append(
                f"| {target}{f' ({label})' if label else ''} | "
                + ", ".join(f"{x:.2f}x" for x in got)
                + f" | {'yes' if min(got) >= floor else '**no**'} |"
            )
    return rows


def targets15_table(
    decode: dict,
    geometries: dict[str, dict],
    texts: dict,
    tasks: list[dict],
    reruns: tuple[tuple[str, dict], ...] = (),
) -> str:
    """The beyond-the-paper targets against the recorded runs (demo model unless a geometry is named).
    reruns: (label, `bench decode` JSON) of later runs of the same contexts; each adds its own
    row for the contexts it measured, so no run is picked over another."""
    rows = ["| target | measured | met |", "|---|---|---|"]
    rows += _decode_target_rows(
        "decode >= 0.97x KVCache at 512, 1K, 2K", (512, 1024, 2048), 0.97,
        [("default settings", decode), *reruns],
    )  # fmt: skip
    rows += _decode_target_rows(
        "decode >= 1.5x KVCache at 8K", (8192,), 1.5, [(None, decode), *reruns]
    )
    cells, met = [], []
    for name, geo in geometries.items():
        r = next(x for x in geo["results"] if x["context"] == 32768 and x["method"] == "a2ats")
        cells.append(f"{name} {r['speed_vs_full']:.2f}x")
        met.append(r["speed_vs_full"] >= 2.0)
    rows.append(
        f"| decode >= 2x at 32K on real geometry | {', '.join(cells)} | "
        f"{'yes' if all(met) else ('on ' + str(sum(met)) + ' of ' + str(len(met))) if any(met) else '**no**'} |"
    )
    for method, label in (("a2ats", "default"), ("a2ats_estimate", "with the estimate")):
        ppl = {
            _text_label(t["text"]): t["runs"][0]["methods"][method]["ppl_vs_full"]
            for t in texts["texts"]
            if method in t["runs"][0]["methods"]
        }
        if ppl:
            ok = all(v <= 1.015 for v in ppl.values())
            rows.append(
                f"| ppl <= 1.015x full at 4K, budget 0.03, every text ({label}) | "
                + ", ".join(f"{k} {v:.3f}x" for k, v in ppl.items())
                + f" | {'yes' if ok else '**no**'} |"
            )
    for method, label in (("a2ats", "default"), ("a2ats_estimate", "with the estimate")):
        cmp = []
        for t in texts["texts"]:
            m = t["runs"][0]["methods"]
            if method in m and "oracle_topk" in m:
                cmp.append((_text_label(t["text"]), m[method]["output_rel_error"],
                            m["oracle_topk"]["output_rel_error"]))  # fmt: skip
        if cmp:
            ok = all(a <= o for _, a, o in cmp)
            rows.append(
                f"| output error <= oracle_topk's ({label}) | "
                + ", ".join(f"{k} {a:.3f} vs {o:.3f}" for k, a, o in cmp)
                + f" | {'yes' if ok else '**no**'} |"
            )
    for data in tasks:
        res = {(r["task"], r["method"]): r["score"] for r in data["results"]}
        names = list(dict.fromkeys(r["task"] for r in data["results"]))
        ctx = data["results"][0]["context"]
        # a task full attention scores 0 on compares nothing: named apart, not counted as met
        unsolved = [t for t in names if res[(t, "full")] == 0]
        solved = [t for t in names if t not in unsolved]
        short_of = [t for t in solved if res[(t, "a2ats")] < 0.95 * res[(t, "full")]]
        rows.append(
            f"| tasks: a2ats >= 0.95x full on every task at {ctx} | "
            f"{len(solved) - len(short_of)} of the {len(solved)} tasks full scores on"
            + (f" (short: {', '.join(short_of)})" if short_of else "")
            + (f"; full scores 0 on {', '.join(unsolved)}" if unsolved else "")
            + f" | {'yes' if not short_of else '**no**'} |"
        )
    return "\n".join(rows)


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def cold_table(data: dict) -> str:
    """`a2ats bench cold`: each method's process measured on its own, per context."""
    runs = data["runs"]
    limit = data.get("data_limit_bytes")
    rows = [
        f"`{data['command']}`; {data['machine']}; {data['steps']} greedy decode steps per run"
        + (f"; every run under a private-memory cap of {limit / 2**30:.1f} GiB" if limit else "")
        + ".",
        "",
        "| context | method | cache in memory (MiB) | on disk (MiB) | an fp16 KVCache (MiB) "
        "| peak private memory (MiB) | resident peak (MiB) | decode tok/s | read from disk / step |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        if "failed" in r:
            rows.append(f"| {r['context']:,} | {r['method']} | failed: {r['failed']} |||||||")
            continue
        read = r.get("disk_read_bytes_per_step")
        rows.append(
            f"| {r['context']:,} | {r['method']} | {r['cache_resident_bytes'] / 2**20:,.1f} | "
            f"{_mib(r['cache_disk_bytes'])} | {_mib(r['fp16_kvcache_bytes'])} | "
            f"{_mib(r['anon_peak_sampled'])} | {_mib(r['rss_peak'])} | {r['tokens_per_s']:.2f} | "
            f"{'-' if not read else f'{read / 2**20:,.1f} MiB'} |"
        )
    return "\n".join(rows)


def cold_summary(data: dict) -> str:
    """Ratios of the cold tier against KVCache and in-memory A2ATS at each context."""
    by = {(r["context"], r["method"]): r for r in data["runs"] if "failed" not in r}
    lines = []
    for n in sorted({r["context"] for r in data["runs"]}):
        full, warm, cold = (by.get((n, m)) for m in ("full", "a2ats", "a2ats_cold"))
        if cold is None:
            continue
        parts = [f"At {n:,} tokens the cold tier's A2ATS layers hold "
                 f"{cold['cache_resident_bytes'] / cold['fp16_kvcache_bytes']:.3f}x of an fp16 "
                 f"KVCache's bytes in memory"]  # fmt: skip
        if full is not None:
            parts.append(
                f"the whole process peaks at {cold['anon_peak_sampled'] / full['anon_peak_sampled']:.2f}x "
                f"the KVCache run's private memory"
            )
        if warm is not None:
            same = "the same" if cold["tokens"] == warm["tokens"] else "**different**"
            parts.append(f"it gives {same} {len(cold['tokens'])} greedy tokens as in-memory A2ATS")
        lines.append("- " + "; ".join(parts) + ".")
    return "\n".join(lines)


def cold_speed_table(data: dict) -> str:
    """`a2ats bench cold --speed`: the cold tier against in-memory A2ATS, interleaved."""
    rows = [
        f"`{data['command']}`; {data['machine']}.",
        "",
        "| context | cold / in memory (median) | every run | tok/s in memory, cold (each run) "
        "| read from disk / step |",
        "|---:|---:|---|---|---:|",
    ]
    for r in data["speed"]:
        each = "; ".join(f"{t['a2ats']:.3f}, {t['a2ats_cold']:.3f}" for t in r["tokens_per_s"])
        runs = ", ".join(f"{x:.2f}" for x in r["ratio_runs"])
        rows.append(
            f"| {r['context']:,} | {r['ratio_median']:.2f}x | {runs} | {each} | "
            f"{r['disk_read_bytes_per_step'] / 2**20:,.1f} MiB |"
        )
    return "\n".join(rows)


def readme_cold_speed_line(data: dict) -> str:
    """One README line per context: the cold tier's speed against rows in memory."""
    return "\n".join(
        f"- {r['context']:,} tokens: {r['ratio_median']:.2f}x in-memory A2ATS's decode speed "
        f"(runs {', '.join(f'{x:.2f}' for x in r['ratio_runs'])}; `{data['command']}`, "
        f"{data['machine']})"
        for r in data["speed"]
    )


def reopen_table(data: dict) -> str:
    """`a2ats bench reopen`: a chat reopened from its saved cache vs prefilled again."""
    rows = [
        f"`{data['command']}`; {data['machine']}; model {data['model']}"
        + ("; every K/V row in the cold tier" if data.get("cold") else "")
        + ".",
        "",
        "| context | file (MiB) | save (s) | restore (s) | reopen, to first token (s) "
        "| prefill again, to first token (s) | faster |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["results"]:
        rows.append(
            f"| {r['context']:,} | {r['file_bytes'] / 2**20:,.1f} | {r['save_s']:.2f} | "
            f"{r['restore_s']:.2f} | {r['reopen_total_s']:.2f} | {r['reprefill_ttft_s']:.2f} | "
            f"{r['speedup']}x |"
        )
    return "\n".join(rows)


def profile_table(data: dict) -> str:
    """`a2ats bench decode --profile`: where an A2ATS decode step's time goes, per layer."""
    threads = data["threads"]
    blas = ", ".join(f"{k} {v}" for k, v in threads["blas_threads"].items()) or "none found"
    rows = [
        f"`{data['command']}`; {data['machine']}; MLX's BLAS {threads['mlx_blas']}, BLAS "
        f"threads: {blas}. Retrieval forced at every context; each phase evaluated on its own.",
        "",
    ]
    for r in data["results"]:
        rows += [
            f"Context {r['context']:,}: a KVCache step {r['kvcache_step_ms']:.1f} ms, an A2ATS step "
            f"{r['a2ats_step_ms']:.1f} ms ({r['a2ats_vs_kvcache']:.2f}x KVCache's speed); exact "
            f"attention over one layer {r['exact_attention_ms_per_layer']:.2f} ms.",
            "",
            "| phase | ms per layer | ms per step (all A2ATS layers) |",
            "|---|---:|---:|",
        ]
        for phase, ms in r["phases_ms_per_layer"].items():
            rows.append(f"| {phase} | {ms:.3f} | {r['phases_ms_per_step'][phase]:.2f} |")
        rows.append("")
    return "\n".join(rows).rstrip()


def distributed_table(records: list[dict]) -> str:
    """1 rank vs 2 ranks per model (a2ats_engine/distributed/bench.py): what each rank holds and
    sends per decode step; tok/s from a shared machine (indicative only)."""
    mb = 1e6
    lines = [
        "| model | ranks | rank: layers | weights MB | A2ATS cache MB | codebook MB | peak MB "
        "| sent B / decode step | received B / step | tok/s | tokens = 1 process |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        for n, run in rec["runs"].items():
            for r in run["ranks"]:
                lo, hi = r["layers"]
                lines.append(
                    f"| {rec['model']} | {n} | {r['rank']}: {lo}-{hi - 1} "
                    f"| {r['weight_bytes'] / mb:.0f} | {r['cache_bytes'] / mb:.1f} "
                    f"| {r['codebook_bytes'] / mb:.1f} | {r['peak_memory_bytes'] / mb:.0f} "
                    f"| {r['sent_bytes_per_decode_step']:.0f} "
                    f"| {r['received_bytes_per_decode_step']:.0f} | {r['generation_tps']:.2f} "
                    f"| {'yes' if run['tokens_equal_to_one_process'] else '**no**'} |"
                )
    prompts = ", ".join(
        f"{rec['model']} {rec['runs']['1']['ranks'][0]['prompt_tokens']}" for rec in records
    )
    lines.append("")
    lines.append(
        f"Prompt tokens: {prompts}; greedy, A2ATS retrieving from the first step. "
        + records[0]["note"]
    )
    return "\n".join(lines)


def blocks() -> dict[str, str]:
    """{KEY: generated text} for every table whose JSON is recorded here."""
    ev, mem = _load("eval_4k_b003.json"), _load("memory.json")
    decode, decode_1, passkey = (
        _load("decode.json"),
        _load("decode_1thread.json"),
        _load("passkey.json"),
    )
    out: dict[str, str] = {}
    simple = (
        ("eval", "eval_4k_b003.json", eval_table),
        ("diag", "eval_diagnostics.json", eval_table),
        ("sweep", "eval_sweep.json", sweep_table),
        ("passkey", "passkey.json", passkey_table),
        ("memory", "memory.json", memory_table),
        ("seed", "seed_synthetic.json", seed_table),
        ("tasks", "tasks.json", tasks_table),
        ("cost-sweep", "eval_cost_sweep.json", cost_sweep_table),
        ("estimate", "eval_estimate_4k_b003.json", eval_table),
        ("ladder", "eval_beyond_ladder.json", eval_table),
        ("b001", "eval_beyond_b001.json", eval_table),
        ("reuse", "eval_beyond_reuse.json", eval_table),
        ("fair-eval", "eval_4k_fair_baselines.json", eval_table),
        ("paper-b", "eval_4k_fair_baselines.json", paper_b_table),
        ("codebook-sweep", "codebook_sweep.json", codebook_sweep_table),
        ("codebook-sweep-4096", "codebook_sweep_4096.json", codebook_sweep_table),
        ("tasks-8k", "tasks_8k.json", tasks_table),
        ("decode-v3", "decode_v3.json", decode_v2_table),
        ("decode-ladder", "decode_ladder_8k.json", decode_v2_table),
        ("decode-short", "decode_short.json", decode_v2_table),
        ("texts-rerank", "eval_4k_texts_rerank.json", texts_table),
        ("gemma-texts", "eval_gemma3_270m_4k_texts.json", model_texts_table),
        ("gemma-diag", "eval_gemma3_270m_diagnostics.json", model_eval_table),
        ("prefill", "prefill.json", prefill_table),
        ("prefill-cold", "prefill_cold.json", prefill_table),
        ("cold", "cold_tier_qwen3.json", cold_table),
        ("cold-summary", "cold_tier_qwen3.json", cold_summary),
        ("cold-limited", "cold_tier_limited.json", cold_table),
        ("cold-speed", "cold_speed_qwen3.json", cold_speed_table),
        ("readme-cold-speed", "cold_speed_qwen3.json", readme_cold_speed_line),
        ("cold-speed-32k", "cold_speed_qwen3_32k.json", cold_speed_table),
        ("readme-cold-speed-32k", "cold_speed_qwen3_32k.json", readme_cold_speed_line),
        ("reopen", "reopen.json", reopen_table),
        ("profile", "profile_step.json", profile_table),
    )
    for key, fname, fn in simple:
        if (data := _load(fname)) is not None:
            out[key] = fn(data)
    if (texts := _load("eval_4k_texts.json")) is not None:
        out["texts"] = texts_table(texts)
        if "a2ats_alloc" in texts["pooled"][0]["methods"]:
            out["alloc"] = alloc_table(texts)
    if (fair := _load("eval_4k_fair_baselines.json")) is not None:
        out["readme-fair"] = readme_fair_line(fair)
    if mem is not None and "break_even" in mem:
        out["readme-memory"] = readme_memory_line(mem)
    if (tasks := _load("tasks.json")) is not None:
        out["readme-tasks"] = readme_tasks_line(tasks)
    kv_runs = [_load(f) for f in ("eval_4k_kv_float.json", "eval_4k_kv8.json", "eval_4k_kv4.json")]
    if all(r is not None for r in kv_runs):
        out["kv-bits"] = kv_bits_table(kv_runs)
        out["readme-kv"] = readme_kv_line(kv_runs)
    if decode is not None:
        out["decode"] = decode_table(decode, decode_1)
    if (v2 := _load("decode_v2.json")) is not None:
        out["decode-v2"] = decode_v2_table(v2)
        out["readme-decode"] = readme_decode_line(v2)
    for name in ("llama-3.2-1b", "qwen3-0.6b", "gemma-3-1b"):
        if (geo := _load(f"geometry_{name}.json")) is not None:
            out[f"geometry-{name.replace('.', '-')}"] = geometry_table(geo)
    geos = {n: g for n in ("qwen3-0.6b", "llama-3.2-1b", "gemma-3-1b")
            if (g := _load(f"geometry_{n}.json")) is not None}  # fmt: skip
    v3, texts_run = _load("decode_v3.json"), _load("eval_4k_texts.json")
    task_runs = [t for t in (_load("tasks.json"), _load("tasks_8k.json")) if t is not None]
    if v3 is not None and texts_run is not None:
        reruns = tuple((label, run) for label, name in (
            ("quiet rerun", "decode_short.json"), ("speed-ladder run", "decode_ladder_8k.json"),
        ) if (run := _load(name)) is not None)  # fmt: skip
        out["targets15"] = targets15_table(v3, geos, texts_run, task_runs, reruns)
    names = ("distributed_demo.json", "distributed_qwen3-0.6b.json")
    if dist := [d for n in names if (d := _load(n)) is not None]:
        out["distributed"] = distributed_table(dist)
    if None not in (ev, passkey, decode, mem):
        out["targets"] = targets_table(ev, passkey, decode, decode_1, mem)
    if None not in (ev, mem):
        out["readme-quality"] = readme_quality_table(ev, mem, _load("eval_estimate_4k_b003.json"))
    return out


def render(text: str, generated: dict[str, str]) -> str:
    """`text` with every generated region's body replaced by its table (ValueError naming a
    region whose KEY has no table)."""

    def body(match: re.Match) -> str:
        key = match.group("key")
        if key not in generated:
            raise ValueError(f"generated region {key!r} has no table: known {sorted(generated)}")
        return f"{match.group(1)}{generated[key]}\n{match.group(4)}"

    return REGION.sub(body, text)


def regions(text: str) -> list[str]:
    """KEYs of the generated regions in `text`, in order."""
    return [m.group("key") for m in REGION.finditer(text)]


def main(argv: list[str]) -> int:
    generated = blocks()
    if "--write" in argv or "--check" in argv:
        stale = []
        for doc in DOCS:
            text = doc.read_text(encoding="utf-8")
            new = render(text, generated)
            if new != text:
                stale.append(doc.name)
                if "--write" in argv:
                    doc.write_text(new, encoding="utf-8")
        if stale and "--check" in argv:
            print(f"generated tables differ from the JSON in: {', '.join(stale)}", file=sys.stderr)
            return 1
        return 0
    for key, text in generated.items():
        if not argv or key in argv:
            print(f"<!-- begin generated: {key} -->\n{text}\n<!-- end generated: {key} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
