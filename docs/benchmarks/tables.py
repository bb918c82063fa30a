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
    if not path.is_file():
        return None
    LOADED.add(name)
    return json.loads(path.read_text())


def _ppl_ci(r: dict, ci: str = "ppl_vs_full_ci95", *, full: bool = False) -> str:
    """A method's "ppl / full (95% CI)" cell; full=True: a record without them is full
    attention's own (1.000 (1.000-1.000))."""
    if full:
        r = {"ppl_vs_full": 1.0, ci: [1.0, 1.0], **r}
    low, high = r[ci]
    return f"{r['ppl_vs_full']:.3f} ({low:.3f}-{high:.3f})"


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
        extra = ""
        if cost:
            extra = f" {r['attended_fraction']:.3f} | {r['bytes_read_per_step'] / 1e3:,.0f} |"
        lines.append(
            f"| {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | {r['ppl']:.3f} | "
            f"{_ppl_ci(r, full=True)} | {r.get('argmax_agreement', 1.0):.3f} | "
            f"{r['attended_per_head']:.0f} | {r['bytes_per_token']:.0f} |{extra}"
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
    if "measured" in rows[0]:
        lines += ["", *_memory_measured_lines(contexts[-1], methods, by)]
    return "\n".join(lines)


def _memory_measured_lines(n: int, methods: list, by: dict) -> list[str]:
    """What the process measured while each method's caches were filled to `n` tokens."""
    mib = 2**20
    lines = [
        f"Measured at {n:,} tokens, beside the storage that grows with the context (MiB; the "
        "fixed codebook and rotations exist before a fill): what MLX's allocator holds after "
        "each fill minus before (its buffer cache emptied first). The process's "
        "private memory is in the JSON too, but in one process only the first fill's is clean "
        "(later fills reuse pages the C allocator kept); the cold-tier runs below measure it "
        "with a process per method.",
        "",
        "| method | storage | MLX holds more by |",
        "|---|---:|---:|",
    ]
    for m in methods:
        r = by[(n, m)]
        grew = r["measured"]["mlx_active_growth"] / mib
        storage = r["bytes_per_token"] * n / mib
        lines.append(f"| {m} | {storage:,.1f} | {grew:,.1f} |")
    return lines


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
    others = [m for m in methods if m != "full"]
    if any("score_vs_full_ci95" in r for r in agree.values()) and others:
        lines += ["", "Score as a share of `full`'s (95% interval: prompts resampled, each with "
                  "its `full` answer; \"-\" where full scored 0):", "",
                  "| task | context | " + " | ".join(others) + " |",
                  "|---|---:|" + "---:|" * len(others)]  # fmt: skip
        for task, ctx in keys:
            lines.append(f"| {task} | {ctx} | " + " | ".join(
                _share_ci(agree[(task, ctx, m)]) for m in others) + " |")  # fmt: skip
    if agree:
        lines += ["", "Answers identical to `full`'s (share of prompts):", "",
                  "| task | context | " + " | ".join(methods) + " |",
                  "|---|---:|" + "---:|" * len(methods)]  # fmt: skip
        for task, ctx in keys:
            cells = " | ".join(f"{agree[(task, ctx, m)]['agrees_with_full']:.2f}" for m in methods)
            lines.append(f"| {task} | {ctx} | {cells} |")
    lines += ["", f"`{data['command']}`; haystack {data['haystack']}; codebook {data['codebook']}."]
    return "\n".join(lines)


def _share_ci(row: dict) -> str:
    """ "0.92 (0.80-1.00)" from a `relative_to_full` row; "-" where full scored 0."""
    share, ci = row.get("score_vs_full"), row.get("score_vs_full_ci95")
    if share is None or ci is None:
        return "-"
    high = "unbounded" if ci[1] is None else f"{ci[1]:.2f}"
    return f"{share:.2f} ({ci[0]:.2f}-{high})"


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
            lines.append(
                f"| {storage} | {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | "
                f"{_ppl_ci(r)} | {r['bytes_per_token']:.0f} | "
                f"{r['attended_fraction']:.3f} | {r['bytes_read_per_step'] / 1e3:,.0f} | "
                f"{r['tokens']} |"
            )
    first = runs[0]
    lines += ["", f"Context {first['context']}, {first['decode']} teacher-forced tokens of "
              f"{first['text']}; budget {first['budget']}; {first['rests_on']['ci95']}."]  # fmt: skip
    return "\n".join(lines)


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
            budget = "-" if name == "full" else run["budget"]
            lines.append(
                f"| {budget} | {name} | {r['attended_fraction']:.3f} | "
                f"{r['bytes_read_per_step'] / 1e6:.1f} | {r['recall']:.4f} | {_ppl_ci(r)} |"
            )
    rests = runs[0]["rests_on"]
    lines += ["", f"Context {data['context']}, {rests['tokens']} teacher-forced tokens of "
              f"{data['text']}; {rests['ci95']}."]  # fmt: skip
    return "\n".join(lines)


SPEED_COLUMNS = (
    ("a2ats_noest", "A2ATS as shipped: vs KVCache (spread)"),
    ("a2ats_eb0_noest", "retrieving from the first step"),
    ("a2ats", "with the estimate on"),
)


def speed_table(data: dict) -> str:
    """`a2ats bench decode --repeats N` on the demo model, one row per context: KVCache's tok/s,
    A2ATS as shipped (no estimate, exact below the crossover) with its median ratio and spread,
    and the ratio of two settings (retrieval from the first step, the estimate on)."""
    by = {(r["context"], r["method"]): r for r in data["results"]}
    contexts = sorted({r["context"] for r in data["results"]})
    lines = [
        "| context | KVCache tok/s | A2ATS tok/s | "
        + " | ".join(label for _, label in SPEED_COLUMNS)
        + " |",
        "|---:|---:|---:|" + "---:|" * len(SPEED_COLUMNS),
    ]
    for c in contexts:
        cells = []
        for method, _ in SPEED_COLUMNS:
            r = by[(c, method)]
            lo, hi = r["ratio_spread"]
            spread = f" ({lo:.2f}-{hi:.2f})" if method == SPEED_COLUMNS[0][0] else ""
            cells.append(f"{r['speed_vs_full']:.2f}x{spread}")
        lines.append(
            f"| {c:,} | {by[(c, 'full')]['tokens_per_s']:.2f} | "
            f"{by[(c, SPEED_COLUMNS[0][0])]['tokens_per_s']:.2f} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        f"Median of {data['repeats']} runs of {data['steps']} decode steps, the methods "
        f"interleaved within each run; spread: the lowest and highest run. `{data['command']}` "
        f"(method names of the JSON: `a2ats_noest` as shipped, `a2ats_eb0_noest` from the first "
        f"step, `a2ats` with the estimate); {data['machine']}.",
    ]
    return "\n".join(lines)


SPEED_OPTIONS = {
    "window": "recency window attending as many tokens (no selection: the ceiling)",
    "a2ats_rr1": "rerank 1 (the paper's selection)",
    "a2ats_rr4g": "rerank 4, candidates shared by the GQA group",
    "a2ats_cov90": "adaptive budget, p = 0.9",
    "a2ats_est": "estimated missed attention on",
}


def speed_options_table(data: dict) -> str:
    """Settings timed in one `bench decode` run, each against the shipped default of the same
    run (median, and each run: the setting's ratio to KVCache over the default's in that run),
    so no figure competes with the speed table's figure for the default."""
    (ctx,) = {r["context"] for r in data["results"]}
    by = {r["method"]: r for r in data["results"]}
    base = by["a2ats"]
    lines = [
        "| setting (one change from the default) | vs the default (median) | each run |",
        "|---|---:|---|",
    ]
    for method, label in SPEED_OPTIONS.items():
        if method in by:
            r = by[method]
            runs = ", ".join(
                f"{x / d:.2f}" for x, d in zip(r["ratio_runs"], base["ratio_runs"], strict=True)
            )
            lines.append(
                f"| {label} | {r['speed_vs_full'] / base['speed_vs_full']:.2f}x | {runs} |"
            )
    lines += [
        "",
        f"Context {ctx:,}; median of {data['repeats']} runs, the methods interleaved within each "
        f"run (`{data['command']}`; {data['machine']}).",
    ]
    return "\n".join(lines)


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
        error = r.get("heldout_score_error")
        lines.append(
            f"| {r['centroids']} | {r['calib_tokens']:,} | {r['keys_per_head']:,} | "
            f"{r['calib_seconds']:.1f} ({r['collect_seconds']:.1f} + {r['fit_seconds']:.1f}) | "
            f"{r['codebook_bytes'] / 2**20:.2f} | {'-' if error is None else f'{error:.4f}'} | "
            f"{r['recall']:.4f} | {r['output_rel_error']:.4f} | {_ppl_ci(r, 'ppl_ci')} |"
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
            rows.append(
                f"| {label} | {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} | "
                f"{_ppl_ci(r, full=True)} | {r.get('argmax_agreement', 1.0):.3f} | "
                f"{r['attended_per_head']:.0f} | {r['tokens']} |"
            )
    pooled = data["pooled"][0]
    labels = ", ".join(_text_label(t["text"]) for t in data["texts"])
    for name, r in pooled["methods"].items():
        rows.append(
            f"| **pooled** ({labels}) | {name} | {r['recall']:.4f} | {r['output_rel_error']:.4f} "
            f"| {_ppl_ci(r, full=True)} | | | {r['tokens']} |"
        )
    texts = "; ".join(f"{_text_label(t['text'])}: {t['text']}" for t in data["texts"])
    rows += [
        "",
        f"Context {data['context']}, budget {data['budgets'][0]}, {data['decode']} teacher-forced "
        f"tokens per text; pooled intervals: {pooled['rests_on']['ci95']}. Texts: {texts}. "
        f"Codebook {data['codebook']}; {data['machine']}.",
    ]
    return "\n".join(rows)


def estimate_layers_table(data: dict) -> str:
    """`texts_table` of a run with the estimate on the layers that miss most
    (`a2ats_estimate_top<n>`), then per text the layers each such method kept it on, and per
    layer the pooled output error of each method (where the run recorded it)."""
    lines = [f"`{data['command']}`", "", texts_table(data), ""]
    for name in data["pooled"][0]["methods"]:
        kept = [
            (_text_label(t["text"]), t["runs"][0]["methods"][name].get("estimate_layers"))
            for t in data["texts"]
        ]
        if all(layers is not None for _, layers in kept):
            where = "; ".join(f"{label}: {', '.join(map(str, layers))}" for label, layers in kept)
            lines.append(f"- {name} kept the estimate on layers {where}")
    errors = {
        name: r["output_error_per_layer"]
        for name, r in data["pooled"][0]["methods"].items()
        if r.get("output_error_per_layer")
    }
    if errors:
        lines += [
            "",
            "Output rel. error per layer, pooled: "
            + "; ".join(
                f"{name}: " + ", ".join(f"{x:.3f}" if x is not None else "-" for x in per)
                for name, per in errors.items()
            )
            + " (layers 0 to "
            + f"{len(next(iter(errors.values()))) - 1}).",
        ]
    return "\n".join(lines)


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


def model_codebooks_table(data: dict) -> str:
    """A model's codebook and rerank trials on one text (`eval_gemma3_270m_subdim.json`): per
    trial its codebook (subspaces x centroids, calibration tokens, held-out score error) and
    each A2ATS method's recall, its share of oracle_topk's, perplexity and cost."""
    rows = [
        f"Model {data['model']}, {_text_label(data['text'])} text, context {data['context']}, "
        f"budget {data['budget']}, {data['decode']} teacher-forced tokens ({data['machine']}); "
        "each trial's command is in the JSON.",
        "",
        "| codebook | tokens | held-out score error | file (MB) | method | rerank | recall "
        "| / oracle_topk | ppl / full (95% CI) | bytes / token | KB read / step |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    rerank_of = {"a2ats_no_rerank": lambda r: 1, "a2ats_rr4g": lambda r: "4 shared"}
    for run in data["runs"]:
        book, methods = run["codebook"], run["methods"]
        oracle = methods["oracle_topk"]["recall"]
        label = f"{book['subspaces']} x {book['n_centroids']}"
        for name, r in methods.items():
            if name in ("full", "oracle_topk"):
                continue
            rerank = rerank_of.get(name, lambda r: r["rerank"])(run)
            rows.append(
                f"| {label} | {book['tokens']:,} | {book['heldout_score_error']:.4f} | "
                f"{book['file_bytes'] / 1e6:.1f} | {name} | "
                f"{rerank} | {r['recall']:.4f} | {r['recall'] / oracle:.3f} | {_ppl_ci(r)} | "
                f"{r['bytes_per_token']:.0f} | {r['bytes_read_per_step'] / 1e3:,.0f} |"
            )
    first = data["runs"][0]["methods"]
    rows += [
        "",
        f"oracle_topk: recall {first['oracle_topk']['recall']:.4f}, ppl / full "
        f"{_ppl_ci(first['oracle_topk'])}, {first['oracle_topk']['bytes_read_per_step'] / 1e3:,.0f}"
        f" KB read / step; full: {first['full']['bytes_read_per_step'] / 1e3:,.0f} KB read / step "
        f"(every trial: the same text and prefill). Codebook: subspaces x centroids (1 x 512: "
        "full head-dim VQ, the demo's recipe).",
    ]
    for extra in data.get("not_evaluated", []):
        b = extra["codebook"]
        rows.append(
            f"Also calibrated, not evaluated ({extra['why']}): {b['subspaces']} x "
            f"{b['n_centroids']}, held-out score error {b['heldout_score_error']:.4f}."
        )
    return "\n".join(rows)


def softmax_cost_table(data: dict) -> str:
    """`docs/benchmarks/softmax_cost.py`: MLX's vs NumPy's exp, and a prefill chunk's attention."""
    exp = data["exp_ns_per_element"]
    rows = [
        f"`{data['command']}` ({data['machine']}): `exp` costs {exp['mlx']:.1f} ns an element "
        f"in MLX and {exp['numpy']:.1f} ns in NumPy.",
        "",
        "| queries | keys | MLX's attention (ms) | NumPy's (ms) | MLX / NumPy | largest "
        "difference |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["chunk_attention"]:
        rows.append(
            f"| {r['queries']:,} | {r['keys']:,} | {r['mlx_ms']:.1f} | {r['numpy_ms']:.1f} | "
            f"{r['mlx_ms'] / r['numpy_ms']:.1f}x | {r['max_abs_difference']:.1e} |"
        )
    return "\n".join(rows)


def crossover_probe_table(data: dict) -> str:
    """`a2ats crossover ... --json`: decode speed of retrieval from the first step vs KVCache per
    context on synthetic caches, with each top-K strategy's median ratio."""
    strategies = sorted({s for per in data.get("top_k_ratios", {}).values() for s in per})
    names = {"mlx": "MLX top-K", "numpy": "NumPy top-K"}
    head = "| context | KVCache tok/s | A2ATS tok/s | A2ATS / KVCache (each run) |"
    head += "".join(f" {names.get(s, s)} |" for s in strategies)
    rows = [
        f"`{data['command']}` ({data['measured_on']}; model {data['model']}, codebook "
        f"{data['codebook'].rsplit('/', 1)[-1]}, budget {data['budget']}, rerank {data['rerank']}; {data['steps']} "
        f"steps, median of {data['repeats']} runs"
        + (f"; host step {data['host_step']}" if "host_step" in data else "")  # since 2026-12-06
        + "). Top-K kept: "
        f"{names.get(data.get('top_k'), 'the default')}; crossover: exact below "
        f"{data['exact_below']:,} tokens{' (retrieval slower at every context)' if data['never'] else ''}.",
        "",
        head,
        "|---:|---:|---:|---|" + "---:|" * len(strategies),
    ]
    for r in data["results"]:
        runs = ", ".join(f"{x:.2f}" for x in r["ratio_runs"])
        per = data.get("top_k_ratios", {}).get(str(r["context"]), {})
        rows.append(
            f"| {r['context']:,} | {r['full_tokens_per_s']:.2f} | {r['a2ats_tokens_per_s']:.2f} | "
            f"{r['ratio']:.2f}x ({runs}) |" + "".join(f" {per[s]:.2f}x |" for s in strategies)
        )
    est = data.get("estimate")
    if est:
        runs = ", ".join(f"{x:.2f}" for x in est["ratio_runs"])
        state, rule = ("on" if est["on"] else "off"), "(on from 0.95x)"
        layers, total = est.get("layers"), data.get("a2ats_layers")
        if layers is not None:  # recorded since 2026-12-06: on the layers that miss most
            state = (
                f"on all {total} layers" if layers >= total else f"on {layers} of {total} layers"
            )
            state = "off" if not layers else state
            rule = (
                "(on every layer from 0.95x, else on as many as that allows, those that miss most)"
            )
        rows += [
            "",
            f"Missed-attention estimate ({est['scores']} slot scores), timed at "
            f"{est['context']:,}"
            + (f" over {est['steps']} steps" if "steps" in est else "")  # since 2026-12-07
            + f" with each top-K: a retrieval step with it on every layer "
            f"({names.get(est.get('top_k'), 'the default')}, the faster with it) "
            f"{est['ratio']:.2f}x the speed of the faster step without ({runs}): "
            f"**{state}** by default on this machine for this model {rule}.",
        ]
    return "\n".join(rows)


def hosts_table(runs: list[dict]) -> str:
    """The shipped default and retrieval forced against KVCache at 1K and 8K, one row per
    recorded `a2ats bench decode --methods full,a2ats,a2ats_eb0` run (a host on a day)."""
    rows = [
        "| run | machine | KVCache tok/s 1K / 8K | A2ATS / KVCache 1K | A2ATS / KVCache 8K "
        "| forced / KVCache 1K (fixed cost: KVCache time / A2ATS time) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for data in runs:
        by, _ = _by_method_and_context(data)

        def ratio(method: str, n: int, by: dict = by) -> str:
            r = by.get((method, n))
            if r is None:
                return "-"
            lo, hi = r["ratio_spread"]
            return f"{r['ratio_median']:.2f}x ({lo:.2f}-{hi:.2f})"

        full = [by.get(("full", n)) for n in (1024, 8192)]
        speeds = " / ".join(f"{f['tokens_per_s']:.2f}" if f else "-" for f in full)
        forced = by.get(("a2ats_eb0", 1024))
        cost = f"; a step {1 / forced['ratio_median']:.2f}x KVCache's" if forced else ""
        machine = data["machine"].split(", MLX")[0].replace("Linux x86_64, ", "")
        rows.append(
            f"| `{data['_file']}` | {machine} | {speeds} | {ratio('a2ats', 1024)} | "
            f"{ratio('a2ats', 8192)} | {ratio('a2ats_eb0', 1024)}{cost} |"
        )
    return "\n".join(rows)


def _interleaved_note(data: dict) -> str:
    """How a `bench decode` run with interleaved methods was measured, and where."""
    step = f"; host step {data['host_step']}" if "host_step" in data else ""  # since 2026-12-06
    return (
        f"Median of {data['repeats']} runs of {data['steps']} decode steps, interleaved "
        f"(`{data['command']}`; {data['machine']}{step})."
    )


def _by_method_and_context(data: dict) -> tuple[dict[tuple[str, int], dict], list[int]]:
    """A `bench decode` run's results keyed by (method, context), and its contexts in order."""
    by = {(r["method"], r["context"]): r for r in data["results"]}
    return by, sorted({r["context"] for r in data["results"]})


def host_speed_table(data: dict) -> str:
    """`a2ats bench decode --methods full,a2ats` on one host: the shipped default against
    KVCache per context, with the spread of the interleaved runs."""
    by, contexts = _by_method_and_context(data)
    forced = any(m == "a2ats_eb0" for m, _ in by)
    extra = (" | retrieval forced tok/s | forced / KVCache (spread) |", "---:|---:|")
    rows = [
        _interleaved_note(data),
        "",
        "| context | KVCache tok/s | A2ATS tok/s | A2ATS / KVCache (spread)"
        + (extra[0] if forced else " |"),
        "|---:|---:|---:|---:|" + (extra[1] if forced else ""),
    ]
    for n in contexts:
        full, a2 = by[("full", n)], by[("a2ats", n)]
        lo, hi = a2["ratio_spread"]
        row = (
            f"| {n:,} | {full['tokens_per_s']:.2f} | {a2['tokens_per_s']:.2f} | "
            f"{a2['ratio_median']:.2f}x ({lo:.2f}-{hi:.2f}) |"
        )
        if forced:
            eb0 = by[("a2ats_eb0", n)]
            flo, fhi = eb0["ratio_spread"]
            row += (
                f" {eb0['tokens_per_s']:.2f} | {eb0['ratio_median']:.2f}x ({flo:.2f}-{fhi:.2f}) |"
            )
        rows.append(row)
    return "\n".join(rows)


def estimate_speed_table(data: dict) -> str:
    """`a2ats bench decode --methods full,a2ats_eb0,a2ats_eb0_est`: retrieval from the first
    step without and with the missed-attention estimate, against KVCache."""
    by, contexts = _by_method_and_context(data)
    rows = [
        _interleaved_note(data),
        "",
        "| context | KVCache tok/s | retrieval tok/s | / KVCache (spread) | with the estimate "
        "tok/s | / KVCache (spread) | estimate / without |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in contexts:
        full, plain, est = by[("full", n)], by[("a2ats_eb0", n)], by[("a2ats_eb0_est", n)]
        cells = []
        for r in (plain, est):
            lo, hi = r["ratio_spread"]
            cells.append(f"{r['tokens_per_s']:.2f} | {r['ratio_median']:.2f}x ({lo:.2f}-{hi:.2f})")
        rows.append(
            f"| {n:,} | {full['tokens_per_s']:.2f} | {cells[0]} | {cells[1]} | "
            f"{est['ratio_median'] / plain['ratio_median']:.2f} |"
        )
    return "\n".join(rows)


ESTIMATE_SLOTS = (  # bench decode suffix -> (slot scores' column, its ratio's column)
    ("est", "estimate, centroid slots", "centroid / without"),
    ("estm", "estimate, mean slots", "mean / without"),
    ("estc", "estimate, mean slots of codes alone", "codes alone / without"),
)


def estimate_scores_speed_table(data: dict) -> str:
    """`a2ats bench decode --methods full,a2ats_eb0,a2ats_eb0_est,a2ats_eb0_estm[,_estc]`:
    retrieval from the first step without the estimate and with each slot scoring timed."""
    by, contexts = _by_method_and_context(data)
    kinds = [k for k in ESTIMATE_SLOTS if ("a2ats_eb0_" + k[0], contexts[0]) in by]
    rows = [
        _interleaved_note(data),
        "",
        "| context | KVCache tok/s | retrieval / KVCache (spread) | "
        + " | ".join(label for _, label, _ in kinds)
        + " | "
        + " | ".join(ratio for _, _, ratio in kinds)
        + " |",
        "|---:|---:|---:|" + "---:|" * (2 * len(kinds)),
    ]
    for n in contexts:
        full, plain = by[("full", n)], by[("a2ats_eb0", n)]
        each = [by[("a2ats_eb0_" + suffix, n)] for suffix, _, _ in kinds]
        cells = []
        for r in (plain, *each):
            lo, hi = r["ratio_spread"]
            cells.append(f"{r['ratio_median']:.2f}x ({lo:.2f}-{hi:.2f})")
        shares = [f"{r['ratio_median'] / plain['ratio_median']:.2f}" for r in each]
        rows.append(
            f"| {n:,} | {full['tokens_per_s']:.2f} | {' | '.join(cells)} | {' | '.join(shares)} |"
        )
    held = [  # runs since 2026-12-05: the host step's rows of the occupied slots
        f"{label}: "
        + ", ".join(
            f"{by[('a2ats_eb0_' + suffix, n)]['estimate_rows_share']:.0%} at {n:,}"
            for n in contexts
        )
        for suffix, label, _ in kinds
        if all("estimate_rows_share" in by[("a2ats_eb0_" + suffix, n)] for n in contexts)
    ]
    if held:
        rows += [
            "",
            "Slots holding a row (mean over layers, share of all slots): " + "; ".join(held) + ".",
        ]
    return "\n".join(rows)


def decode_methods_table(data: dict) -> str:
    """Any `a2ats bench decode` run: one row per context and method, its speed and its ratio to
    KVCache (median, spread over the runs)."""
    by, contexts = _by_method_and_context(data)
    shares = any("estimate_rows_share" in r for r in by.values())  # runs since 2026-12-05
    layers = any("estimate_layers" in r for r in by.values())  # runs since 2026-12-06
    rows = [
        _interleaved_note(data),
        "",
        "| context | method | tok/s | / KVCache (spread) |"
        + (" layers running the estimate |" if layers else "")
        + (" estimate's slots with a row |" if shares else ""),
        "|---:|---|---:|---:|" + ("---:|" if layers else "") + ("---:|" if shares else ""),
    ]
    for n in contexts:
        for (method, context), r in by.items():
            if context == n:
                lo, hi = r.get("ratio_spread", (1.0, 1.0))
                share, on = r.get("estimate_rows_share"), r.get("estimate_layers")
                if r.get("retrieved_per_step") == 0:  # exact steps only: nothing estimated
                    on = None  # (runs before 2026-12-06 counted every layer there)
                cell = f" {on} of {r['a2ats_layers']} |" if on else " - |"
                rows.append(
                    f"| {n:,} | {method} | {r['tokens_per_s']:.2f} | "
                    f"{r['ratio_median']:.2f}x ({lo:.2f}-{hi:.2f}) |"
                    + (cell if layers else "")
                    + ((f" {share:.0%} |" if share is not None else " - |") if shares else "")
                )
    return "\n".join(rows)


def shadow_cost_table(data: dict) -> str:
    """`a2ats bench decode ... --methods full,a2ats,a2ats_telemetry`: what the inspector costs
    while it is visible (telemetry and a snapshot every step; below the crossover the shadow
    selection too)."""
    rows = [
        _interleaved_note(data),
        "",
        "| context | KVCache tok/s | A2ATS tok/s (inspector hidden) | inspector visible | "
        "visible / hidden |",
        "|---:|---:|---:|---:|---:|",
    ]
    by, contexts = _by_method_and_context(data)
    for n in contexts:
        full, hidden, shown = (by[(m, n)] for m in ("full", "a2ats", "a2ats_telemetry"))
        rows.append(
            f"| {n:,} | {full['tokens_per_s']:.2f} | {hidden['tokens_per_s']:.2f} "
            f"({hidden['ratio_median']:.2f}x) | {shown['tokens_per_s']:.2f} "
            f"({shown['ratio_median']:.2f}x) | "
            f"{shown['tokens_per_s'] / hidden['tokens_per_s']:.2f}x |"
        )
    return "\n".join(rows)


def prefill_table(data: dict) -> str:
    """`a2ats bench prefill`: time to first token, median of the rounds, A2ATS's ratio."""
    rows = [
        f"Median of {data['repeats']} rounds (`{data['command']}`; {data['machine']}; codebook "
        f"{data['codebook']}, K/V storage "
        f"{'float' if data['kv_bits'] is None else str(data['kv_bits']) + '-bit'}).",
        "",
        "| prompt tokens | method | time to first token (s) | vs full (median) | spread | every "
        "round (s) |",
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
        "| peak private memory (MiB) | resident peak (MiB) | decode tok/s | read from the file / "
        "step |",
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


def cold_limited_summary(data: dict) -> str:
    """The capped run: which methods failed, the cold tier's peak against the cap, and its
    greedy tokens against in-memory A2ATS's uncapped run at the same context
    (cold_tier_qwen3.json)."""
    limit = data["data_limit_bytes"]
    warm, source = {}, {}
    for name in ("cold_tier_qwen3.json", "cold_tier_qwen3_64k.json"):
        for r in (_load(name) or {"runs": []})["runs"]:
            if r["method"] == "a2ats" and "failed" not in r:
                warm[r["context"]], source[r["context"]] = r, name
    lines = []
    for r in data["runs"]:
        n = r["context"]
        if "failed" in r:
            lines.append(f"- {n:,} tokens, {r['method']}: did not finish under the "
                         f"{limit / 2**30:.1f} GiB cap ({r['failed']}).")  # fmt: skip
            continue
        line = (f"- {n:,} tokens, {r['method']}: finished, private memory peaking at "
                f"{r['anon_peak_sampled'] / 2**20:,.0f} MiB "
                f"({r['anon_peak_sampled'] / limit:.0%} of the cap)")  # fmt: skip
        if n in warm:
            same = "the same" if r["tokens"] == warm[n]["tokens"] else "**different**"
            line += (f"; {same} {len(r['tokens'])} greedy tokens as in-memory A2ATS without a "
                     f"cap ({source[n]}), whose private memory peaked "
                     f"{warm[n]['anon_peak_sampled'] / r['anon_peak_sampled']:.1f}x higher")  # fmt: skip
        lines.append(line + ".")
    return "\n".join(lines)


def cold_speed_table(data: dict) -> str:
    """`a2ats bench cold --speed`: the cold tier against in-memory A2ATS, interleaved."""
    rows = [
        f"`{data['command']}`; {data['machine']}.",
        "",
        "| context | rerank candidates' keys | cold / in memory (median) | every run "
        "| tok/s in memory, cold (each run) | cold tier's A2ATS layers in memory | read from "
        "the file / step |",
        "|---:|---|---:|---|---|---:|---:|",
    ]
    for r in data["speed"]:
        each = "; ".join(f"{t['a2ats']:.3f}, {t['a2ats_cold']:.3f}" for t in r["tokens_per_s"])
        runs = ", ".join(f"{x:.2f}" for x in r["ratio_runs"])
        bits = r.get("candidate_bits")
        source = "from the file" if bits is None else f"resident {bits}-bit copy"
        resident = r.get("cold_resident_bytes")
        rows.append(
            f"| {r['context']:,} | {source} | {r['ratio_median']:.2f}x | {runs} | {each} | "
            f"{'-' if resident is None else f'{resident / 2**20:,.1f} MiB'} | "
            f"{r['disk_read_bytes_per_step'] / 2**20:,.1f} MiB |"
        )
    return "\n".join(rows)


def cold_page_cache_table(data: dict) -> str:
    """`--page-cache cold`: steps with the cold tier's file pages dropped before each."""
    rows = [
        f"`{data['command']}`; {data['machine']}; steps taking turns one at a time, the cold "
        "tier's pages dropped from the page cache (POSIX_FADV_DONTNEED) before each of its steps.",
        "",
        "| context | pages dropped | cold / in memory (median) | every run | tok/s in memory, cold "
        "(each run) | read from storage / step |",
        "|---:|---|---:|---|---|---:|",
    ]
    for r in data["speed"]:
        d = r.get("cold_page_cache")
        if not d:
            continue
        each = "; ".join(f"{t['a2ats']:.3f}, {t['a2ats_cold']:.3f}" for t in d["tokens_per_s"])
        rows.append(
            f"| {r['context']:,} | {'yes' if d['dropped'] else 'no'} | {d['ratio_median']:.2f}x | "
            f"{', '.join(f'{x:.2f}' for x in d['ratio_runs'])} | {each} | "
            f"{d['storage_read_bytes_per_step'] / 2**20:,.1f} MiB |"
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


def readme_cold_page_cache_line(data: dict) -> str:
    """README: the cold tier's speed with its pages dropped before every step."""
    return "\n".join(
        f"- {r['context']:,} tokens, every row read from the disk: "
        f"{d['ratio_median']:.2f}x in-memory A2ATS's decode speed (runs "
        f"{', '.join(f'{x:.2f}' for x in d['ratio_runs'])}; "
        f"{d['storage_read_bytes_per_step'] / 2**20:,.0f} MiB read from storage a step; "
        f"`{data['command']}`, {data['machine']})"
        for r in data["speed"]
        if (d := r.get("cold_page_cache"))
    )


def readme_prefill_cold_line(data: dict) -> str:
    """README: time to first token with every K/V row in the cold tier against rows in memory."""
    by = {(r["method"], r["context"]): r for r in data["results"]}
    return "\n".join(
        f"- {n:,}-token prompt: {by[('a2ats_cold', n)]['seconds']:.1f} s with every row in the "
        f"cold tier, {by[('a2ats', n)]['seconds']:.1f} s in memory, "
        f"{by[('full', n)]['seconds']:.1f} s for mlx-lm's KVCache (medians of "
        f"{data['repeats']}; `{data['command']}`, {data['machine']})"
        for n in sorted({r["context"] for r in data["results"]})
        if ("a2ats_cold", n) in by and ("a2ats", n) in by
    )


def launcher_cpu_line(data: dict) -> str:
    """README: the launcher's own CPU while two local ranks sleep, mlx.launch vs ours."""
    pct, runs = data["median_cpu_percent"], data["runs"]
    ours = "a2ats_engine.distributed.launcher"
    return (
        f"With two idle local ranks the launcher itself used {pct['mlx.launch']:.1f}% CPU as "
        f"mlx.launch ships it (CPU seconds over {data['window_seconds']} s: "
        f"{', '.join(f'{v:.2f}' for v in runs['mlx.launch'])}) and {pct[ours]:.1f}% calmed "
        f"({', '.join(f'{v:.2f}' for v in runs[ours])}); medians of {len(runs[ours])}, "
        f"`{data['command']}`, {data['machine']}."
    )


def ranks_app_line(data: dict) -> str:
    """README: the served ranks' CPU while they wait for the user, and the telemetry's cost."""
    pct, idle = data["idle_median_cpu_percent"], data["idle_cpu_seconds"]
    now, before = "served ranks (now)", "a rank waiting in a collective"
    tps = data["reply_tps"]

    def runs(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    return (
        f"Two local ranks of the demo model waiting for the next message used {pct[now]:.1f}% "
        f"CPU in all (CPU seconds over {data['idle_window_seconds']:.0f} s: {runs(idle[now])}); "
        f"two ranks waiting inside an MLX collective, as they did before, {pct[before]:.1f}% "
        f"({runs(idle[before])}). A reply of up to {data['reply_tokens']} tokens with the inspector's "
        f"telemetry gathered from both ranks each token ran at "
        f"{data['telemetry_on_over_off']:.2f}x the speed without it (tok/s off: "
        f"{runs(tps['telemetry off'])}; on: {runs(tps['telemetry on'])}). Medians of 3, "
        f"`{data['command']}`, {data['machine']}."
        + (f" {data['note']}" if data.get("note") else "")
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


def readme_reopen_lines(data: dict) -> str:
    """README: one line per context of `a2ats bench reopen`."""
    return "\n".join(
        f"- {r['context']:,} tokens on {data['model']}: the follow-up's first token "
        f"{r['reopen_total_s']:.2f} s after reopening (file {r['file_bytes'] / 2**20:,.0f} MiB), "
        f"{r['reprefill_ttft_s']:.1f} s after prefilling it again (`{data['command']}`, "
        f"{data['machine']})"
        for r in data["results"]
    )


def app_memory_table(data: dict) -> str:
    """docs/benchmarks/app_memory.py: the app's memory panel against the measured process."""
    mib = 2**20
    rows = [
        f"`{data['command']}`; {data['machine']}; model {data['model']}; each case a fresh "
        "scripted app, figures at its last decode step.",
        "",
        "| setting | context | panel: in memory (MiB) | of which codebook | panel: on disk (MiB) "
        "| panel: an fp16 cache would hold (MiB) | measured: process private (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in data["cases"]:
        rows.append(
            f"| {c['setting']} | {c['context']:,} | {c['panel_in_memory_bytes'] / mib:,.1f} | "
            f"{c['panel_codebook_bytes'] / mib:,.1f} | {c['panel_on_disk_bytes'] / mib:,.1f} | "
            f"{c['panel_fp16_bytes'] / mib:,.1f} | {c['process_private_bytes'] / mib:,.1f} |"
        )
    rows += ["", "| setting | context growth | panel: in memory grows by (MiB) "
             "| measured: process grows by (MiB) |", "|---|---:|---:|---:|"]  # fmt: skip
    settings = dict.fromkeys(c["setting"] for c in data["cases"])
    for setting in settings:
        short, long = (c for c in data["cases"] if c["setting"] == setting)
        rows.append(
            f"| {setting} | {short['context']:,} -> {long['context']:,} | "
            f"{(long['panel_in_memory_bytes'] - short['panel_in_memory_bytes']) / mib:,.1f} | "
            f"{(long['process_private_bytes'] - short['process_private_bytes']) / mib:,.1f} |"
        )
    return "\n".join(rows)


def host_step_caches_table(data: dict) -> str:
    """`host_step_caches.py`: one layer's C++ host step call in a decode, in a warm loop, and
    in a loop that writes memory between calls."""
    got = data["us_per_layer_call"]
    where = {
        "in_decode": "in a decode",
        "warm_loop": "in a loop",
        "flushed_loop": f"in a loop, {data['flush_bytes'] // 2**20} MB written between calls",
    }
    lines = [
        f"`{data['command']}` ({data['machine']}; model {data['model']}, context "
        f"{data['context']:,}; host step {data['host_step']}; medians, "
        f"{data['calls_per_loop']} calls in each loop).",
        "",
        "| where | `native_step.run`'s Python (us) | the C++ call (us) |",
        "|---|---:|---:|",
    ]
    for key, label in where.items():
        lines.append(f"| {label} | {got[key]['python']:.1f} | {got[key]['call']:.1f} |")
    return "\n".join(lines)


def profile_table(data: dict) -> str:
    """`a2ats bench decode --profile`: where an A2ATS decode step's time goes, per layer."""
    threads = data["threads"]
    blas = ", ".join(f"{k} {v}" for k, v in threads["blas_threads"].items()) or "none found"
    rows = [
        f"`{data['command']}`; {data['machine']}; MLX's BLAS {threads['mlx_blas']}, BLAS "
        f"threads: {blas}"
        + (
            f"; NumPy's BLAS in the host step: {threads['host_step_numpy_blas']}"
            + (" thread" if threads["host_step_numpy_blas"] == 1 else "")
            if "host_step_numpy_blas" in threads  # runs since 2026-12-05
            else ""
        )
        + (f"; host step: {threads['host_step']}" if "host_step" in threads else "")
        + ". Retrieval forced at every context; each phase evaluated on its own."
        + (f" Method {data['method']}: {data['retrieval']}." if "retrieval" in data else ""),
        "",
    ]
    for r in data["results"]:
        rows += [
            f"Context {r['context']:,}: a KVCache step {r['kvcache_step_ms']:.1f} ms, an A2ATS step "
            f"{r['a2ats_step_ms']:.1f} ms ({r['a2ats_vs_kvcache']:.2f}x KVCache's speed); exact "
            f"attention over one layer {r['exact_attention_ms_per_layer']:.2f} ms"
            + (
                f"; top-K in {'NumPy' if r['top_k'] == 'numpy' else 'MLX'}."
                if "top_k" in r
                else "."
            ),
            "",
        ]
        ran = r.get("phase_layers")  # recorded since 2026-12-07: per layer that ran the phase
        if ran is None:  # before: each phase's time per step over every A2ATS layer
            rows += [
                "| phase | ms per step / A2ATS layers | ms per step (all A2ATS layers) |",
                "|---|---:|---:|",
            ]
        else:
            rows += [
                "| phase | layers that ran it | ms per layer that ran it | ms per step |",
                "|---|---:|---:|---:|",
            ]
        for phase, ms in r["phases_ms_per_layer"].items():
            step = r["phases_ms_per_step"][phase]
            cells = [phase] + ([] if ran is None else [str(ran[phase])])
            rows.append(f"| {' | '.join(cells)} | {ms:.3f} | {step:.2f} |")
        rows.append("")
    return "\n".join(rows).rstrip()


def step_overhead_table(data: dict) -> str:
    """`docs/benchmarks/step_overhead.py`: a retrieval step's fixed cost, piece by piece."""
    runs = data["runs"]
    first = runs[0]
    lines = [
        "| context | KVCache ms / step | + code and store each key | + one sync a layer "
        "| + lookup tables | + NumPy step (= A2ATS forced) | A2ATS forced / KVCache time |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        ms = r["ms_per_step"]
        lines.append(
            f"| {r['context']:,} | {ms['kvcache']:.1f} | {ms['exact']:.1f} | {ms['sync']:.1f} | "
            f"{ms['sync_tables']:.1f} | {ms['host_step']:.1f} | "
            f"{ms['host_step'] / ms['kvcache']:.2f}x |"
        )
    lines += ["", "Each piece per layer (ms; the difference of two medians). The variants before "
              "the NumPy step attend exactly over the A2ATS rows (a slice of the stored rows, "
              "copied for the attention call at long contexts), which the NumPy step replaces: "
              "where that attention costs more than the step (8K) its piece is negative.", "",
              "| context | " + " | ".join(first["pieces_ms_per_layer"]) + " |",
              "|---:|" + "---:|" * len(first["pieces_ms_per_layer"])]  # fmt: skip
    for r in runs:
        lines.append(f"| {r['context']:,} | " + " | ".join(
            f"{v:.3f}" for v in r["pieces_ms_per_layer"].values()) + " |")  # fmt: skip
    lines += [
        "",
        f"`{first['command']}`; {first['machine']}; median of {first['rounds_counted']} rounds of "
        f"{first['steps_per_round']} greedy steps per variant, the variants taking turns; "
        f"{first['a2ats_layers']} A2ATS layers; load average at the end "
        f"{', '.join(str(x) for x in first['load_average_at_end'])}.",
    ]
    return "\n".join(lines)


def graph_step_table(data: dict) -> str:
    """`docs/benchmarks/graph_step/run.py`: the retrieval step inside MLX's graph against the
    synced step (one sync a layer), both against KVCache."""
    lines = [
        "| context | KVCache ms / step | synced step (one sync a layer) ms | in the graph ms "
        "| synced / KVCache time (spread) | in the graph / KVCache time (spread) "
        "| same tokens |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in data["results"]:
        ms, t, sp = r["step_ms"], r["time_vs_kvcache"], r["spread"]
        lines.append(
            f"| {r['context']:,} | {ms['kvcache']:.1f} | {ms['sync']:.1f} | {ms['graph']:.1f} | "
            f"{t['sync']:.2f}x ({sp['sync'][0]:.2f}-{sp['sync'][1]:.2f}) | "
            f"{t['graph']:.2f}x ({sp['graph'][0]:.2f}-{sp['graph'][1]:.2f}) | "
            f"{'yes' if r['same_tokens'] else 'no'}, {r['tokens_compared']} |"
        )
    lines += [
        "",
        f"`{data['command']}`; {data['machine']}; {data['model']}, retrieval forced, the "
        f"estimate off; median of {data['rounds']} rounds of {data['steps_per_round']} greedy "
        f"steps per cache list (each round's median step), the three taking turns, after "
        f"{data['untimed_steps']} untimed steps.",
    ]
    return "\n".join(lines)


def host_step_ab_table(data: dict) -> str:
    """`docs/benchmarks/host_step_ab.py`: this tree's host step against a past commit's, with
    and without the estimate, interleaved in one decode."""
    ms, runs = data["ms_per_step"], data["ms_per_step_runs"]
    est, now = data["estimate_speed_ratio"], data["now_vs_then_speed"]
    commit = data["commit"]
    lines = [
        "| host step | ms / step, no estimate | ms / step, estimate | with / without (speed) |",
        "|---|---:|---:|---:|",
    ]
    for version, label in (("then", f"commit {commit}"), ("now", "this change")):
        lines.append(
            f"| {label} | {ms[version + '_noest']:.1f} | {ms[version + '_estm']:.1f} | "
            f"**{est[version]:.3f}x** |"
        )
    spread = {v: f"{min(r):.0f}-{max(r):.0f}" for v, r in runs.items()}  # the rounds' range, ms
    lines += [
        "",
        f"This change / commit {commit}, speed: {now['noest']:.3f}x without the estimate, "
        f"{now['estm']:.3f}x with it (medians of the rounds' ratios). Rounds' ranges (ms): "
        + ", ".join(f"{v} {r}" for v, r in spread.items())
        + ".",
        "",
        f"`{data['command']}`; {data['machine']}; {data['model']}, context "
        f"{data['context']:,}, retrieval forced, NumPy top-K; median of "
        f"{data['rounds_counted']} rounds of {data['steps_per_round']} greedy steps per "
        f"variant, the four taking turns; load average at the end "
        f"{', '.join(str(x) for x in data['load_average_at_end'])}.",
    ]
    return "\n".join(lines)


def host_step_cold_table(data: dict) -> str:
    """`docs/benchmarks/host_step_cold.py`: the host step's NumPy pieces warm, after one layer's
    weights passed through the caches (and, in runs that have them, right after MLX's layer
    work, the call after that one, and right after NumPy read the same weights), and the whole
    part inside real decode steps."""
    runs = data["runs"]
    first = runs[0]
    mlx = "after_mlx_ms" in first
    extra = (
        " after MLX's layer work ms | its next call ms | after NumPy read the same weights ms |"
        if mlx
        else ""
    )
    lines = [
        "| context | piece | warm ms | after a layer's weights ms |" + extra,
        "|---:|---|---:|---:|" + ("---:|---:|---:|" if mlx else ""),
    ]
    for r in runs:
        for name, warm in r["warm_ms"].items():
            label = f"**{name}**" if name == "whole NumPy part" else name
            row = f"| {r['context']:,} | {label} | {warm:.3f} | {r['cold_ms'][name]:.3f} |"
            if mlx:
                row += (
                    f" {r['after_mlx_ms'][name]:.3f} | {r['after_mlx_second_call_ms'][name]:.3f}"
                    f" | {r['after_numpy_weights_ms'][name]:.3f} |"
                )
            lines.append(row)
    lines += ["", "| context | NumPy part warm | after a layer's weights | "
              + ("after MLX's layer work | " if mlx else "")
              + "inside decode steps (median of the layers' steps) | inside decode / warm |",
              "|---:|---:|---:|---:|---:|" + ("---:|" if mlx else "")]  # fmt: skip
    for r in runs:
        whole, cold = r["warm_ms"]["whole NumPy part"], r["cold_ms"]["whole NumPy part"]
        inside = r["in_decode_ms_per_layer"]
        after = f"{r['after_mlx_ms']['whole NumPy part']:.3f} | " if mlx else ""
        lines.append(f"| {r['context']:,} | {whole:.3f} | {cold:.3f} | {after}{inside:.3f} | "
                     f"{inside / whole:.2f}x |")  # fmt: skip
    mlx_note = ""
    if mlx:
        mlx_note = (
            f"; MLX's layer work: the MLPs of the first {first['mlx_layers']} decoder layers "
            f"on one token, evaluated ({first['mlx_layer_bytes'] / 1e6:.1f} MB of weights), and "
            "NumPy's the same weights times a vector on the main thread; every piece under "
            "`numpy_blas.one_thread()` as in the step"
        )
    lines += [
        "",
        f"`{first['command']}`; {first['machine']}; layer {first['layer']} of the demo model, "
        f"median of {first['reps']} calls per piece (each warm call right after a cold one; "
        f"the sweep reads {first['sweep_bytes'] / 1e6:.1f} MB, one decoder layer's weights)"
        f"{mlx_note}; inside decode: `host_step.step`'s time less its `mx.eval`, over "
        f"{first['decode_steps']} decode steps; other jobs stopped while it ran.",
    ]
    return "\n".join(lines)


def distributed_table(records: list[dict]) -> str:
    """1 rank vs 2 ranks per model (a2ats_engine/distributed/bench.py): what each rank holds and
    sends per decode step; tok/s from a shared machine (indicative only)."""
    mb = 1e6
    lines = [
        "| model | ranks | rank: serves | weights MB | A2ATS cache MB | codebook MB | peak MB "
        "| sent B / decode step | received B / step | tok/s | tokens = 1 process |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        tensor = rec.get("split") == "tensor"
        for n, run in rec["runs"].items():
            for r in run["ranks"]:
                lo, hi = r["layers"]
                serves = f"layers {lo}-{hi - 1}"
                if tensor and n != "1":
                    serves = f"1/{n} of the heads of layers {lo}-{hi - 1} (tensor)"
                model = rec["model"] + (" (tensor run)" if tensor else "")
                lines.append(
                    f"| {model} | {n} | {r['rank']}: {serves} "
                    f"| {r['weight_bytes'] / mb:.0f} | {r['cache_bytes'] / mb:.1f} "
                    f"| {r['codebook_bytes'] / mb:.1f} | {r['peak_memory_bytes'] / mb:.0f} "
                    f"| {r['sent_bytes_per_decode_step']:.0f} "
                    f"| {r['received_bytes_per_decode_step']:.0f} | {r['generation_tps']:.2f} "
                    f"| {'yes' if run['tokens_equal_to_one_process'] else '**no**'} |"
                )
    prompts = ", ".join(
        f"{rec['model']}{' (tensor run)' if rec.get('split') == 'tensor' else ''} "
        f"{rec['runs']['1']['ranks'][0]['prompt_tokens']}"
        for rec in records
    )
    lines.append("")
    lines.append(
        f"Prompt tokens: {prompts}; greedy, A2ATS retrieving from the first step. "
        + records[0]["note"]
    )
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 else str(n)


def _task_means(tasks: dict) -> dict[str, float]:
    """Mean score over the tasks of a `bench tasks` run, per method (full, a2ats, window)."""
    n = len({r["task"] for r in tasks["results"]})
    return {
        meth: sum(r["score"] for r in tasks["results"] if r["method"] == meth) / n
        for meth in ("full", "a2ats", "window")
    }


def readme_summary(d: dict[str, dict]) -> str:
    """README's benchmark summary: one row per question of docs/BENCHMARKS.md, each figure
    from the run that section's current table shows."""
    ev, texts, passkey, tasks = d["eval"], d["texts"], d["passkey"], d["tasks"]
    m = ev["methods"]
    a2, low_high = m["a2ats"], m["a2ats"]["ppl_vs_full_ci95"]
    pooled = texts["pooled"][0]["methods"]
    pooled8 = d["texts_8k"]["pooled"][0]["methods"]
    found = {}
    for t in passkey["trials"]:
        found.setdefault(t["method"], []).append(t["correct"])
    n_pk = len(found["full"])
    mean4k = _task_means(tasks)
    mean8k = _task_means(d["tasks_8k"])
    gem_tasks = _task_means(d["gemma_tasks"])
    gem_tasks_8k = _task_means(d["gemma_tasks_8k"])
    v2 = {(r["context"], r["method"]): r["speed_vs_full"] for r in d["speed"]["results"]}
    ctx = sorted({c for c, _ in v2})
    below = [v2[(c, "a2ats_noest")] for c in ctx[:-1]]
    amd = {(r["context"], r["method"]): r["ratio_median"] for r in d["speed_amd"]["results"]}
    amd_ctx = sorted({c for c, _ in amd})
    amd_below = ", ".join(f"{amd[(c, 'a2ats')]:.2f}x at {_k(c)}" for c in amd_ctx[:-1])
    prefill = [r for r in d["prefill"]["results"] if "ratio_median" in r]
    mem = {r["method"]: r for r in d["memory"]["results"] if r["context"] == max(
        x["context"] for x in d["memory"]["results"])}  # fmt: skip
    be = {(b["method"], b["baseline"]): b["context"] for b in d["memory"]["break_even"]}
    cold = {(r["context"], r["method"]): r for r in d["cold"]["runs"] if "failed" not in r}
    top = max(c for c, _ in cold)
    c_cold, c_full = cold[(top, "a2ats_cold")], cold[(top, "full")]
    cold_speed = [r for run in d["cold_speed"] for r in run["speed"]]
    geo = []
    for name, g in d["geometry"].items():
        r = max((x for x in g["results"] if x["method"] == "a2ats"), key=lambda x: x["context"])
        geo.append(f"{name} {r['speed_vs_full']:.2f}x")
    gem = d["gemma"]["pooled"][0]["methods"]
    gem8 = d["gemma_8k"]["pooled"][0]["methods"]
    rows = [
        "| question | answer | in docs/BENCHMARKS.md |",
        "|---|---|---|",
        f"| How close to full attention? | at {_k(ev['context'])} tokens, budget {ev['budget']} "
        f"({a2['attended_per_head']:.0f} tokens attended per KV head): attention mass recalled "
        f"**{a2['recall']:.3f}** (oracle top-K {m['oracle_topk']['recall']:.3f}, recency window "
        f"{m['window']['recall']:.3f}); perplexity **{a2['ppl_vs_full']:.3f}x** full "
        f"({low_high[0]:.3f}-{low_high[1]:.3f}) over {ev['decode']} tokens of code, "
        f"{pooled['a2ats']['ppl_vs_full']:.3f}x pooled over code, prose and dialogue; at "
        f"8K {pooled8['a2ats']['ppl_vs_full']:.3f}x pooled, recall {pooled8['a2ats']['recall']:.3f} "
        f"(oracle {pooled8['oracle_topk']['recall']:.3f}) | 1. Quality |",
        f"| Does it find what full attention finds? | passkey {sum(found['a2ats'])}/{n_pk} "
        f"like full attention's {sum(found['full'])}/{n_pk} (window {sum(found['window'])}/{n_pk});"
        f" RULER-style tasks at {_k(tasks['results'][0]['context'])}, mean score full "
        f"{mean4k['full']:.2f}, A2ATS {mean4k['a2ats']:.2f}, window {mean4k['window']:.2f}; at "
        f"{_k(d['tasks_8k']['results'][0]['context'])} full {mean8k['full']:.2f}, A2ATS "
        f"{mean8k['a2ats']:.2f}, window {mean8k['window']:.2f} | 1. Quality |",
        f"| How fast does it decode? | vs mlx-lm's KVCache on a 2-core AMD EPYC host, with the "
        f"crossover measured there: {amd_below}, "
        f"**{amd[(amd_ctx[-1], 'a2ats')]:.2f}x** at {_k(amd_ctx[-1])} (retrieving from the first "
        f"step {amd[(amd_ctx[0], 'a2ats_eb0')]:.2f}x at {_k(amd_ctx[0])}); on another 2-core "
        f"host {min(below):.2f}-{max(below):.2f}x from {_k(ctx[0])} to {_k(ctx[-2])}, "
        f"{v2[(ctx[-1], 'a2ats_noest')]:.2f}x at {_k(ctx[-1])} | 2. Speed |",
        "| How fast is the first token? | time to first token vs KVCache's: "
        + ", ".join(f"{r['ratio_median']:.2f}x at {_k(r['context'])}" for r in prefill)
        + " | 2. Speed |",
        f"| How much memory? | bytes per token: float K/V {mem['a2ats']['vs_full']:.3f}x the "
        f"{d['memory']['kv_dtype']} KVCache (K/V plus codes); vs an fp16 cache 8-bit "
        f"{mem['a2ats_kv8']['vs_fp16_full']:.2f}x, 4-bit {mem['a2ats_kv4']['vs_fp16_full']:.2f}x;"
        f" plus a {d['memory']['codebook_bytes'] / 2**20:.1f} MiB codebook per model, so 4-bit "
        f"holds less than fp16 from {be[('a2ats_kv4', 'fp16')]:,} tokens | 3. Memory |",
        f"| And with K/V on disk? | cold tier, {d['cold']['geometry']} geometry at "
        f"{top:,} tokens: the A2ATS layers hold "
        f"{c_cold['cache_resident_bytes'] / c_cold['fp16_kvcache_bytes']:.3f}x an fp16 "
        f"KVCache's bytes in memory, the process peaks at "
        f"{c_cold['anon_peak_sampled'] / c_full['anon_peak_sampled']:.2f}x KVCache's; decode "
        "speed vs rows in memory: "
        + ", ".join(f"{r['ratio_median']:.2f}x at {_k(r['context'])}" for r in cold_speed)
        + " | 3. Memory |",
        f"| Which models? | real-size geometry (random weights) at 32K vs KVCache: "
        f"{', '.join(geo)}; Gemma 3 270M (3 global layers) at 4K: recall "
        f"{gem['a2ats']['recall']:.3f} (window {gem['window']['recall']:.3f}, oracle "
        f"{gem['oracle_topk']['recall']:.3f}), perplexity {gem['a2ats']['ppl_vs_full']:.3f}x "
        f"full; at 8K: recall {gem8['a2ats']['recall']:.3f} (oracle "
        f"{gem8['oracle_topk']['recall']:.3f}), {gem8['a2ats']['ppl_vs_full']:.3f}x; tasks at "
        f"4K, mean score full {gem_tasks['full']:.2f}, A2ATS {gem_tasks['a2ats']:.2f}, window "
        f"{gem_tasks['window']:.2f}; at 8K full {gem_tasks_8k['full']:.2f}, A2ATS "
        f"{gem_tasks_8k['a2ats']:.2f}, window {gem_tasks_8k['window']:.2f} | 4. Models |",
    ]
    return "\n".join(rows)


# Recorded runs that no current table shows: (date first recorded, what it measured).
HISTORY = {
    "graph_step.json": (
        "2026-12-07",
        "`python docs/benchmarks/graph_step/run.py 1024,8192` with a prototype of the graph step "
        "(commit 65e97c5, built by the harness), family 25 model 1 host: in the graph / KVCache "
        "time 0.98x at 1K (the synced step 1.01x), 0.46x at 8K (0.52x); the same tokens",
    ),
    "graph_step_rerun.json": (
        "2026-12-07",
        "the same prototype run again right after: 0.98x at 1K (synced 1.03x), 0.56x at 8K (0.56x)",
    ),
    "graph_step_third.json": (
        "2026-12-07",
        "the same prototype run a third time: 0.95x at 1K (synced 0.96x), 0.53x at 8K (0.53x)",
    ),
    "crossover_gemma3_270m_estimate_before_host_tables.json": (
        "2026-12-06",
        "`a2ats crossover gemma3-270m --contexts 1024,2048,4096,8192 --json`, quiet, before the "
        "sampled top-K and the lookup tables in NumPy: the estimate 0.98x (0.88, 0.98, 1.04), "
        "on; retrieval 0.96x KVCache at 8K, exact through 8K",
    ),
    "crossover_gemma3_270m_estimate_before_cheaper_step.json": (
        "2026-12-06",
        "`a2ats crossover gemma3-270m --contexts 1024,2048,4096,8192 --json`, quiet, before the "
        "estimate's host step took one product over the attended rows instead of two: the "
        "estimate 0.94x (0.92, 0.94, 0.99), off by a hair",
    ),
    "crossover_demo_host_f25m17_before_sampled_topk.json": (
        "2026-12-06",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json` on the host of family 25 "
        "model 17, quiet, before the host top-K's sampled threshold: 0.75x, 0.90x, 0.91x, "
        "1.10x KVCache at 1K-8K (MLX's top-K 1.10x and NumPy's 1.10x at 8K), exact below 8,192",
    ),
    "crossover_demo_host_f25m17_before_host_tables.json": (
        "2026-12-06",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json` on the host of family 25 "
        "model 17, quiet, with the sampled top-K, before the host step's lookup tables in NumPy: "
        "0.76x, 0.76x, 0.85x, 1.10x KVCache at 1K-8K, exact below 8,192; the estimate 0.79x, off",
    ),
    "profile_step_host_f25m17_before_host_tables.json": (
        "2026-12-06",
        "`a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json` on the host of "
        "family 25 model 17, with the sampled top-K, before the lookup tables in NumPy: top-K + "
        "rerank 0.60 ms a layer at 8K, an A2ATS step 1.05x KVCache's speed at 8K, 0.68x at 1K",
    ),
    "host_step_cold_host_f25m17_before_host_tables.json": (
        "2026-12-06",
        "`python docs/benchmarks/host_step_cold.py 1024,8000` on the host of family 25 model 17, "
        "before the lookup tables in NumPy (not a piece then): the NumPy part 0.22 ms a layer "
        "warm at 1K, 0.26 after a layer's weights, 0.47 inside decode steps",
    ),
    "host_step_ab_compiled_selection_1k.json": (
        "2026-12-06",
        "`python docs/benchmarks/host_step_ab.py a951c5e 1024` with the host step's far "
        "scores, top-K and rerank as one numba loop (commit e8f527b, backed out by 85bd921), "
        "the commit's step with its NumPy top-K: 1.02x the speed without the estimate, 1.05x "
        "with it",
    ),
    "host_step_ab_compiled_selection_8k.json": (
        "2026-12-06",
        "the same at 8,192 tokens: 0.98x the speed without the estimate and with it; the "
        "compiled selection was left out",
    ),
    "step_overhead_host_f25m17_before_host_tables.json": (
        "2026-12-06",
        "`python docs/benchmarks/step_overhead.py 1024,8000` on the host of family 25 model 17, "
        "before the sampled top-K and the lookup tables in NumPy: at 1K a forced step 1.54x "
        "KVCache's time; per layer code and store 0.09 ms, sync 0.23, MLX's lookup tables 0.46, "
        "NumPy step 0.38",
    ),
    "profile_step_host_f25m17_before_sampled_topk.json": (
        "2026-12-06",
        "`a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json` on the host of "
        "family 25 model 17, before the host top-K's sampled threshold: top-K + rerank 0.99 ms "
        "a layer at 8K, an A2ATS step 0.93x KVCache's speed",
    ),
    "inspector_cost_f25m1_before.json": (
        "2026-12-07",
        "`a2ats bench decode --contexts 1024,2048,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats,a2ats_telemetry --json` on the host of family 25 model 1, quiet, the bench "
        "taking the app's snapshot after each token, the engine before the stats were made at "
        "the snapshot (commit dca966e): the inspector visible 0.63x KVCache at 1K (exact and "
        "the MLX shadow selection), 0.99x at 2K, 1.43x at 8K; hidden 0.99x, 1.10x, 1.66x",
    ),
    "shadow_cost.json": (
        "2026-12-02",
        "`a2ats bench decode --contexts 1024,2048 --steps 32 --repeats 3 --methods "
        "full,a2ats,a2ats_telemetry --json`, quiet, no snapshot taken in the bench: the "
        "inspector visible 0.50x KVCache at 1K, 0.52x at 2K (both exact then)",
    ),
    "crossover_demo_native_step_f25m1_before_row_kernels.json": (
        "2026-12-07",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json` on the host of family 25 "
        "model 1, quiet, with the host step of the family 25 model 17 figures (commit 26fed3f): "
        "retrieval 0.99x, 1.09x, 1.23x, 1.50x KVCache at 1K-8K, exact below 2,048; the "
        "estimate 0.89x (0.90, 0.85, 0.89), 13 layers",
    ),
    "profile_native_step_f25m1_before_row_kernels.json": (
        "2026-12-07",
        "`a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json` on the host of "
        "family 25 model 1, the same step: the C++ call 0.34 ms a layer at 1K (exact attention "
        "0.56 ms), 1.32 ms at 8K; the estimate's attention 4.37 ms a step at 1K, 10.04 ms at 8K",
    ),
    "crossover_demo_native_step_before_cpp_estimate.json": (
        "2026-12-06",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json`, quiet, the first C++ host "
        "step (tables a dot at a time, the estimate's attention in NumPy): retrieval 0.78x, "
        "0.94x, 1.00x, 1.15x KVCache at 1K-8K, exact below 8,192; the estimate 0.82x, 8 layers",
    ),
    "decode_native_step_noest_before_cpp_estimate.json": (
        "2026-12-06",
        "`a2ats bench decode --contexts 1024,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats_eb0_noest,a2ats_eb0_noest_npstep --json`, quiet, the first C++ host step: "
        "0.80x against 0.72x (NumPy step) at 1K, 1.26x against 1.06x at 8K",
    ),
    "profile_native_step_before_cpp_estimate.json": (
        "2026-12-06",
        "`a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json`, quiet, the first "
        "C++ host step: the call 0.41 ms a layer at 1K, 1.06 ms at 8K; the NumPy attention with "
        "the estimate 0.35 ms on each of its 8 layers at 1K",
    ),
    "decode_gemma3_270m_native_step_before_cpp_estimate.json": (
        "2026-12-06",
        "`a2ats bench decode --model gemma3-270m --contexts 8192 --steps 32 --repeats 3 "
        "--methods full,a2ats_eb0,a2ats_eb0_npstep --json`, quiet, the first C++ host step "
        "(selection only on the estimate's layers): 0.95x KVCache against 0.97x (NumPy step)",
    ),
    "crossover_demo_estimate_before_host_tables.json": (
        "2026-12-06",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json`, quiet, before the sampled "
        "top-K, the lookup tables in NumPy and the estimate's moves once a step: the estimate "
        "0.78x (0.78, 0.79, 0.74), off; MLX's top-K kept (1.07x at 8K)",
    ),
    "crossover_demo_estimate_before_cheaper_step.json": (
        "2026-12-06",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json`, quiet, before the "
        "estimate's host step took one product over the attended rows instead of two: the "
        "estimate 0.82x (0.74, 0.84, 0.82), off",
    ),
    "decode_gemma3_270m_estimate_generic.json": (
        "2026-12-05",
        "`a2ats bench decode --model gemma3-270m --contexts 1024,8192 --steps 32 --repeats 3 "
        "--methods full,a2ats_eb0,a2ats_eb0_estm --json`, quiet, product VQ on the generic MLX "
        "step (dense sums): retrieval forced 0.94x / 0.96x KVCache at 1K / 8K, with the estimate "
        "0.83x / 0.86x",
    ),
    "decode_quality_preset_before_step_sums.json": (
        "2026-12-05",
        "`a2ats bench decode --contexts 1024,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats_eb0,a2ats_rr4_eb0,a2ats_rr4_eb0_estm --json`, quiet, each layer moving its "
        "own estimate sums (before `cache/step_sums.py`): at 8K retrieval 1.36x KVCache (5.70 "
        "tok/s), rerank 4 1.33x, rerank 4 with the estimate 1.03x (the estimate 23% of a "
        "rerank-4 step); at 1K 0.87x, 0.85x, 0.68x",
    ),
    "decode_presets.json": (
        "2026-12-05",
        "`a2ats bench decode --contexts 1024,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats,a2ats_eb0,a2ats_eb0_estm,a2ats_rr4_eb0,a2ats_rr4_eb0_estm --json`, a slow day, "
        "every slot's sums held: at 8K retrieval 1.17x KVCache, rerank 4 1.09x, rerank 4 with "
        "the estimate 0.85x (so the Quality preset was rerank 4 alone until then)",
    ),
    "decode_estimate_rr4.json": (
        "2026-12-04",
        "`a2ats bench decode --contexts 8192 --steps 32 --repeats 3 --methods "
        "full,a2ats_eb0,a2ats_eb0_estm,a2ats_rr4_eb0_estm --json`, quiet, mean slot scores over "
        "every token of a slot (until 2026-12-05): retrieval 1.45x KVCache at 8K, with the "
        "estimate 1.05x, with rerank 4 and the estimate 0.99x",
    ),
    "eval_4k_texts_estimate_mean.json": (
        "2026-12-04",
        "`a2ats eval --texts code,prose,dialogue --context 4096 --decode 256 --budget 0.03 "
        "--methods full,a2ats_estimate,a2ats_estimate_mean --json`, mean slot scores over every "
        "token of a slot, retrieved ones included (the scoring until 2026-12-05): pooled ppl "
        "1.009x full, output error 0.049; centroid slots 1.021x, 0.076 (unchanged since)",
    ),
    "eval_4k_texts_estimate_code.json": (
        "2026-12-04",
        "`a2ats eval --texts code,prose,dialogue --context 4096 --decode 256 --budget 0.03 "
        "--methods full,a2ats_estimate_mean,a2ats_estimate_code --json`, mean slot scores over "
        "every token of a slot (until 2026-12-05): codes alone 1.018x full pooled, output error "
        "0.067; (bucket, code) slots 1.009x, 0.049",
    ),
    "eval_8k_texts_estimate_mean.json": (
        "2026-12-04",
        "`a2ats eval --texts code,prose,dialogue --context 7936 --decode 256 --budget 0.03 "
        "--methods full,a2ats_estimate,a2ats_estimate_mean --json`, with the mean slot scores "
        "over every token of a slot, retrieved ones included (the scoring until 2026-12-05): "
        "pooled ppl 1.017x full, output error 0.047 (centroid slots 1.019x; unchanged since)",
    ),
    "eval_8k_texts_estimate_rr4.json": (
        "2026-12-04",
        "`a2ats eval --texts code,prose,dialogue --context 7936 --decode 256 --budget 0.03 "
        "--rerank 4 --methods full,a2ats_estimate_mean --json`, mean slot scores over every "
        "token of a slot (until 2026-12-05): pooled ppl 0.998x full, output error 0.033",
    ),
    "tasks_8k_estimate_mean.json": (
        "2026-12-04",
        "`a2ats bench tasks --contexts 8192 --methods full,a2ats,a2ats_estimate_mean --tasks "
        "niah_multivalue --depths 0.1,0.5,0.9 --seeds 4 --budget 0.03 --trials --json`, mean "
        "slot scores over every token of a slot (until 2026-12-05): a2ats and the estimate "
        "0.87x full (0.72-1.00), both losing a value on the two depth-0.1 prompts",
    ),
    "decode_gemma3_270m_sd16.json": (
        "2026-12-03",
        "`a2ats bench decode --model gemma3-270m --contexts 1024,8192 --steps 32 --repeats 3 "
        "--methods full,a2ats,a2ats_eb0 --json`, quiet, with the 16-subspace default codebook: "
        "0.98x KVCache at 1K, 1.01x at 8K; retrieval forced 0.97x, 1.02x (KVCache 6.9 tok/s)",
    ),
    "crossover_gemma3_270m_sd16.json": (
        "2026-12-03",
        "`a2ats crossover gemma3-270m --contexts 1024,2048,4096,8192 --json`, quiet, with the "
        "16-subspace default codebook: retrieval 0.95x, 0.96x, 0.94x, 1.01x KVCache, exact below "
        "8K",
    ),
    "tasks_gemma3_270m_4k_sd16.json": (
        "2026-12-03",
        "`a2ats bench tasks --contexts 4096 --methods full,a2ats,window,oracle_topk --depths "
        "0.1,0.5,0.9 --seeds 4 --budget 0.03 --model gemma3-270m --trials --json` (76 prompts) "
        "with the 16-subspace default codebook: mean score full 0.71, A2ATS 0.73, oracle 0.73, "
        "window 0.01",
    ),
    "eval_gemma3_270m_diagnostics_sd16.json": (
        "2026-12-02",
        "`a2ats eval --model gemma3-270m --texts prose --context 4096 --decode 64 --budget 0.03 "
        "--rerank 1 --methods full,a2ats,oracle_topk,a2ats_exact_keys,a2ats_exact_rope --json` "
        "with the 16-subspace default codebook: codes alone recall 0.748, exact keys 0.808, "
        "exact RoPE on the centroids 0.758, oracle_topk 0.822",
    ),
    "eval_gemma3_270m_8k_sd8.json": (
        "2026-12-03",
        "the 32-subspace codebook as a trial at 8K on prose and dialogue, before it became "
        "Gemma's default: 0.976 and 0.977 of oracle_topk's recall, perplexity 1.004x and 1.005x "
        "full",
    ),
    "eval_gemma3_270m_8k_texts_sd16.json": (
        "2026-12-03",
        "`a2ats eval --model gemma3-270m --texts code,prose,dialogue --context 7936 --decode 256 "
        "--budget 0.03 --methods full,a2ats,window,oracle_topk --json` with the 16-subspace "
        "default codebook: pooled recall 0.825, 0.959 of oracle_topk's 0.861 (prose 0.949, "
        "dialogue 0.948), perplexity 1.028x full (prose 1.041x, dialogue 1.033x)",
    ),
    "eval_gemma3_270m_4k_texts_sd16.json": (
        "2026-12-02",
        "`a2ats eval --model gemma3-270m --texts code,prose,dialogue --context 4096 --decode 128 "
        "--budget 0.03 --methods full,a2ats,window,oracle_topk --json` with the 16-subspace "
        "default codebook: pooled recall 0.807, 0.960 of "
        "oracle_topk's 0.841, perplexity 1.006x full",
    ),
    "decode_gemma3_270m_builtin_crossover.json": (
        "2026-12-03",
        "`a2ats bench decode --model gemma3-270m --contexts 1024,8192 --steps 32 --repeats 3 "
        "--methods full,a2ats,a2ats_eb0 --json`, quiet, before this machine's crossover for "
        "Gemma's geometry was measured: the default retrieved from 1K, 0.95x KVCache there "
        "(0.94-1.01), 1.01x at 8K",
    ),
    "decode_amd_epyc_before_step_matrix.json": (
        "2026-12-03",
        "`a2ats bench decode --contexts 1024,4096,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats,a2ats_eb0 --json`, quiet, with the host step but each layer un-rotating its "
        "query and key with RoPE and the built-in crossover (retrieval from 4K): default 1.00x, "
        "0.86x, 0.94x KVCache at 1K, 4K, 8K; retrieval forced 0.74x, 0.85x, 0.96x",
    ),
    "profile_step_before_step_matrix.json": (
        "2026-12-03",
        "`a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json`, quiet, before the "
        "step's un-rotation matrix: A2ATS 0.58x KVCache at 1K, 0.77x at 8K",
    ),
    "crossover_demo_before_step_matrix.json": (
        "2026-12-03",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json --dry-run`, quiet, before "
        "the step's un-rotation matrix: retrieval 0.67x, 0.78x, 0.82x, 0.92x KVCache, so exact "
        "up to 8K",
    ),
    "profile_step_before_host_step.json": (
        "2026-12-02",
        "`a2ats bench decode --profile --contexts 1024,8000 --steps 16 --json`, quiet, before "
        "NumPy's top-K ran the step on the host: retrieval phases about 1.7 ms a layer at 1K "
        "(exact attention 0.62 ms), 3.5 ms at 8K (2.39 ms)",
    ),
    "decode_amd_epyc_mlx_topk.json": (
        "2026-12-02",
        "`a2ats bench decode --contexts 1024,4096,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats --json` with MLX's top-K and the crossover at 4K recorded, before the host "
        "step: 0.96x, 0.86x, 0.99x KVCache",
    ),
    "crossover_demo_normal_keys.json": (
        "2026-12-02",
        "`a2ats crossover demo --contexts 1024,2048,4096,8192 --json --dry-run` with "
        "standard-normal synthetic keys (tied far scores, biased against NumPy's top-K), before "
        "the host step: MLX's top-K kept, crossover 4K",
    ),
    "crossover_demo_codebook_keys_loaded.json": (
        "2026-12-03",
        "`a2ats crossover demo --contexts 1024,8192 --json --dry-run` once the probe's keys use "
        "the codebook's codes (and with the host step), load average 4.7-5.5: A2ATS / KVCache "
        "at 8K 1.21x with NumPy's top-K, 1.17x with MLX's (0.65x and 1.35x in crossover_demo.json, "
        "on tied scores); at 1K 0.68x and 0.81x",
    ),
    "decode_before_host_step_loaded.json": (
        "2026-12-03",
        "full, a2ats and a2ats_eb0 at 1K and 8K before NumPy's top-K ran the step on the host, "
        "taken beside another developer's benchmarks (load average 1.9-5.3 on 2 cores): 8K "
        "0.87x KVCache, 1K retrieving 0.63x",
    ),
    "decode_host_step_loaded.json": (
        "2026-12-03",
        "the same command right before it with the host step (cache/host_step.py), load average "
        "1.8-4.3: 8K 1.02x KVCache (runs 0.93-1.18), 1K retrieving 0.67x; to re-run on a quiet "
        "machine before it replaces a table",
    ),
    "profile_step_host_loaded.json": (
        "2026-12-03",
        "`a2ats bench decode --profile` with the host step, load average 3.5-5.6: retrieval "
        "phases 2.26 ms a layer at 8K (3.47 in profile_step.json), 0.66 at 1K (1.74)",
    ),
    "distributed_demo_spinning_launcher.json": (
        "2026-12-01",
        "demo on 1 process and 2 local ranks, taken beside other work and with mlx.launch's own "
        "stdio relay spinning on the 2 cores (2 ranks 0.16 tok/s, 1 process 0.48); replaced by "
        "distributed_demo.json, run through the calmed launcher on the otherwise idle machine",
    ),
    "prefill_xeon.json": (
        "2026-12-01",
        "time to first token at 1K and 4K on the slower Intel host, before prefill attention "
        "ran in NumPy on the CPU (A2ATS 1.07x and 0.97x of KVCache's time)",
    ),
    "decode.json": (
        "2026-11-30",
        "decode at 1K-8K with 2 BLAS threads, one run each, before the crossover "
        "(A2ATS retrieved from the first step); also rerank 1 and kv_bits 4",
    ),
    "decode_1thread.json": ("2026-11-30", "the same decode run with 1 BLAS thread"),
    "decode_v3.json": (
        "2026-12-01",
        "the shipped default beside the recency window at 512-8K on a second, slower host; "
        "its 2K point was that run's noise",
    ),
    "decode_short.json": ("2026-12-02", "512-2K again on the slower host, nothing else running"),
    "eval_diagnostics.json": (
        "2026-11-30",
        "rerank 1 with exact keys or exact RoPE in the buckets: split the recall gap to the "
        "oracle between the VQ and the distance approximation (both about half); led to rerank 2",
    ),
    "eval_beyond_ladder.json": (
        "2026-12-01",
        "adaptive budget and shared rerank at 4K, 64 tokens, while the estimate was on by default",
    ),
    "eval_beyond_b001.json": ("2026-12-01", "budget 0.01 with and without the estimate"),
    "eval_beyond_reuse.json": (
        "2026-12-01",
        "reuse of the previous step's selection: almost never reused, so off by default "
        "(`docs/benchmarks/reuse_rate.py`)",
    ),
    "seed_synthetic.json": (
        "2026-11-30",
        "`a2ats bench seed-synthetic`: the seed document's synthetic benchmark rebuilt "
        "(windowed RoPE and query-aware codes on planted keys)",
    ),
    "eval_gemma3_270m_2048.json": (
        "2026-12-02",
        "Gemma 3 270M with a 2,048-centroid codebook on the same tokens: recall no better",
    ),
    "codebook_usage_demo.json": (
        "2026-12-02",
        "codes used and distance-bucket spread per A2ATS layer, demo model "
        "(`docs/benchmarks/codebook_usage.py`)",
    ),
    "codebook_usage_gemma3_270m.json": ("2026-12-02", "the same for Gemma 3 270M"),
    "eval_gemma3_270m_4k_texts_vq512.json": (
        "2026-12-02",
        "Gemma 3 270M on code, prose and dialogue at 4K with its earlier default codebook (one "
        "512-centroid VQ over the 256 dims): pooled recall 0.767, 0.91 of oracle_topk's, "
        "perplexity 1.084x full",
    ),
    "openblas_threads_1k.json": (
        "2026-12-04",
        "`[OPENBLAS_NUM_THREADS=1] a2ats bench decode --contexts 1024 --steps 16 --repeats 3 "
        "--methods full,a2ats_eb0 --json`, default threads, one thread, default again: "
        "a2ats_eb0 / full 0.74x, 0.72x, 0.74x (KVCache 16.1, 13.8, 17.1 tok/s)",
    ),
    "decode_estimate_dense.json": (
        "2026-12-05",
        "`a2ats bench decode --contexts 1024,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats_eb0,a2ats_eb0_estm,a2ats_eb0_estc --json` on commit fed0197, quiet, right "
        "after decode_estimate_rows.json: the host step's estimate sums held for every slot "
        "(before `SlotRows`): mean slots 0.73 / 0.75 of a retrieval step's speed at 1K / 8K "
        "(0.82 / 0.80 with rows of the occupied slots only)",
    ),
    "tasks_8k_1prompt.json": (
        "2026-12-01",
        "`a2ats bench tasks --contexts 8192 --methods full,a2ats,window,oracle_topk --depths 0.5 "
        "--seeds 1 --budget 0.03 --trials --json`: one prompt per task at 8K; mean score full "
        "0.41, a2ats 0.24, window 0.00, oracle_topk 0.38",
    ),
    "tasks_4k_2prompts.json": (
        "2026-12-01",
        "`a2ats bench tasks --contexts 4096 --methods full,a2ats,window,oracle_topk --depths 0.5 "
        "--seeds 2 --budget 0.03 --trials --json`: 2 prompts per task at 4K; mean score full "
        "0.40, a2ats 0.51, window 0.00, oracle_topk 0.40",
    ),
    "decode_estimate_host_step_mlx_sums.json": (
        "2026-12-03",
        "`a2ats bench decode --contexts 1024,8192 --steps 32 --repeats 3 --methods "
        "full,a2ats_eb0,a2ats_eb0_est --json`, quiet, with the estimate in the host step but its "
        "per-slot sums still updated in MLX each step: with the estimate 0.54x / 0.81x KVCache at "
        "1K / 8K against 0.72x / 0.98x without",
    ),
    "eval_gemma3_270m_diagnostics_vq512.json": (
        "2026-12-02",
        "Gemma 3 270M diagnostics (prose, 4K, 64 tokens, rerank 1) with the earlier default "
        "codebook (one 512-centroid VQ over the 256 dims): a2ats recall 0.705, exact keys "
        "through the buckets 0.808, exact RoPE on the centroids 0.713, oracle_topk 0.822",
    ),
}


def history_list() -> str:
    """One line per recorded run that no current table shows (KeyError-free: a listed file
    that is not in this folder is an error)."""
    lines = []
    for name, (date, what) in HISTORY.items():
        if not (HERE / name).is_file():
            raise FileNotFoundError(f"HISTORY names {name}, which is not in {HERE}")
        lines.append(f"- `{name}` ({date}): {what}.")
    return "\n".join(lines)


LOADED: set[str] = set()  # the JSON files blocks() read (every one feeds a table)


HOST_RUNS = (
    "decode_amd_epyc.json",
    "decode_amd_epyc_rerun.json",
    "decode_host_f25m17_before_sampled_topk.json",
    "decode_host_f25m17_before_host_tables.json",
    "decode_host_f25m17.json",
    "decode_host_f25m17_rerun.json",
    "decode_native_step_before_cpp_estimate.json",
    "decode_native_step.json",
    "decode_native_step_f25m1_before_row_kernels.json",
    "decode_native_step_f25m1.json",
    "decode_native_step_f25m1_rerun.json",
    "decode_native_step_f25m1_one_pass.json",
    "decode_native_step_f25m1_one_pass_rerun.json",
    "decode_native_step_f25m1_py_entry.json",
    "decode_native_step_f25m1_py_entry_rerun.json",
    "decode_graph_step_f25m1.json",
    "decode_graph_step_f25m1_rerun.json",
    "decode_graph_step_f25m1_ladder.json",
    "decode_graph_estimate_f25m1_ladder.json",
    "decode_host_check_f25m1.json",
)  # `a2ats bench decode --methods full,a2ats,a2ats_eb0` per host and day (section 2, "Hosts")


def recording_set(tag: str, *entries: tuple) -> tuple:
    """The (KEY, JSON, table) of one recording on a host: each entry a (KEY, JSON, table) whose
    `{k}` is the tag with dashes for underscores and `{t}` the tag itself."""
    k = tag.replace("_", "-")
    return tuple((key.format(k=k), name.format(t=tag), table) for key, name, table in entries)


def native_step_set(tag: str) -> tuple:
    """One recording of the C++ host step on a host: its probe, decode, no-estimate decode,
    profile and Gemma runs, named `*_native_step_{tag}.json` and keyed `*-native-{tag}`."""
    return recording_set(
        tag,
        ("crossover-probe-native-{k}", "crossover_demo_native_step_{t}.json", crossover_probe_table),
        ("speed-native-{k}", "decode_native_step_{t}.json", decode_methods_table),
        ("speed-native-noest-{k}", "decode_native_step_noest_{t}.json", decode_methods_table),
        ("profile-native-{k}", "profile_native_step_{t}.json", profile_table),
        ("speed-gemma-native-{k}", "decode_gemma3_270m_native_step_{t}.json", decode_methods_table),
    )  # fmt: skip


def graph_step_set(tag: str) -> tuple:
    """One recording of the graph step on a host: its probe, two decode runs with the synced
    step beside it at 1K and 8K and one at 1K-8K, its profile and the Gemma run, named
    `*_graph_step_{tag}.json` and keyed `*-graph-{tag}`."""
    return recording_set(
        tag,
        ("crossover-probe-graph-{k}", "crossover_demo_graph_step_{t}.json", crossover_probe_table),
        ("speed-graph-{k}", "decode_graph_step_{t}.json", decode_methods_table),
        ("speed-graph-{k}-rerun", "decode_graph_step_{t}_rerun.json", decode_methods_table),
        ("speed-graph-{k}-ladder", "decode_graph_step_{t}_ladder.json", decode_methods_table),
        ("profile-graph-{k}", "profile_graph_step_{t}.json", profile_table),
        ("speed-gemma-graph-{k}", "decode_gemma3_270m_graph_step_{t}.json", decode_methods_table),
    )  # fmt: skip


def graph_estimate_set(tag: str) -> tuple:
    """One recording of the estimate inside the graph step on a host: the decode with it
    synced (before the change) and in the graph, each beside the estimate off, the probe after
    it, the decode again on the layers it chose, a 1K-8K run beside the synced step and the
    profile, named `*_graph_estimate*_{tag}*.json` and keyed `*-graph-estimate*-{tag}`."""
    return recording_set(
        tag,
        ("speed-graph-estimate-before-{k}", "decode_graph_estimate_before_{t}.json",
         decode_methods_table),
        ("speed-graph-estimate-{k}", "decode_graph_estimate_{t}.json", decode_methods_table),
        ("crossover-probe-graph-estimate-{k}", "crossover_demo_graph_estimate_{t}.json",
         crossover_probe_table),
        ("speed-graph-estimate-{k}-12layers", "decode_graph_estimate_{t}_12layers.json",
         decode_methods_table),
        ("speed-graph-estimate-{k}-ladder", "decode_graph_estimate_{t}_ladder.json",
         decode_methods_table),
        ("profile-graph-estimate-{k}", "profile_graph_estimate_{t}.json", profile_table),
    )  # fmt: skip


def host_check_set(tag: str) -> tuple:
    """One host's `docs/benchmarks/host_check.py` runs: the probe, the decode at 1K-8K with the
    forced step in the graph and synced, and the profile, named `*_host_check_{tag}.json` and
    keyed `*-host-check-{tag}` (its decode run is a row of the Hosts table too)."""
    return recording_set(
        tag,
        ("crossover-probe-host-check-{k}", "crossover_demo_host_check_{t}.json",
         crossover_probe_table),
        ("speed-host-check-{k}", "decode_host_check_{t}.json", decode_methods_table),
        ("profile-host-check-{k}", "profile_host_check_{t}.json", profile_table),
    )  # fmt: skip


def blocks() -> dict[str, str]:
    """{KEY: generated text} for every table whose JSON is recorded here."""
    LOADED.clear()
    out: dict[str, str] = {}
    simple = (
        ("eval", "eval_4k_b003.json", eval_table),
        ("sweep", "eval_sweep.json", sweep_table),
        ("passkey", "passkey.json", passkey_table),
        ("memory", "memory.json", memory_table),
        ("tasks", "tasks.json", tasks_table),
        ("tasks-estimate-mean", "tasks_4k_estimate_mean.json", tasks_table),
        ("tasks-rr4-8k", "tasks_8k_rr4.json", tasks_table),
        ("tasks-rr4-4k", "tasks_4k_rr4.json", tasks_table),
        ("tasks-rr4-4k-18", "tasks_4k_rr4_18.json", tasks_table),
        ("tasks-rr4-8k-18", "tasks_8k_rr4_18.json", tasks_table),
        ("tasks-rr4-8k-number-vt", "tasks_8k_rr4_number_vt.json", tasks_table),
        ("tasks-rr4-8k-vt24", "tasks_8k_rr4_vt24.json", tasks_table),
        ("tasks-gemma-estimate-4k", "tasks_gemma3_270m_4k_estimate.json", tasks_table),
        ("tasks-gemma-estimate-8k", "tasks_gemma3_270m_8k_estimate.json", tasks_table),
        ("tasks-8k", "tasks_8k.json", tasks_table),
        ("tasks-gemma", "tasks_gemma3_270m_4k.json", tasks_table),
        ("tasks-gemma-8k", "tasks_gemma3_270m_8k.json", tasks_table),
        ("cost-sweep", "eval_cost_sweep.json", cost_sweep_table),
        ("estimate", "eval_estimate_4k_b003.json", eval_table),
        ("fair-eval", "eval_4k_fair_baselines.json", eval_table),
        ("paper-b", "eval_4k_fair_baselines.json", paper_b_table),
        ("codebook-sweep", "codebook_sweep.json", codebook_sweep_table),
        ("codebook-sweep-4096", "codebook_sweep_4096.json", codebook_sweep_table),
        ("texts", "eval_4k_texts.json", texts_table),
        ("texts-rerank", "eval_4k_texts_rerank.json", texts_table),
        ("speed", "decode_v2.json", speed_table),
        ("speed-options", "decode_ladder_8k.json", speed_options_table),
        ("gemma-texts", "eval_gemma3_270m_4k_texts.json", model_texts_table),
        ("gemma-diag", "eval_gemma3_270m_diagnostics.json", model_eval_table),
        ("gemma-codebooks", "eval_gemma3_270m_subdim.json", model_codebooks_table),
        ("prefill", "prefill.json", prefill_table),
        ("softmax-cost", "softmax_cost.json", softmax_cost_table),
        ("prefill-cold", "prefill_cold.json", prefill_table),
        ("cold", "cold_tier_qwen3.json", cold_table),
        ("cold-summary", "cold_tier_qwen3.json", cold_summary),
        ("cold-limited", "cold_tier_limited.json", cold_table),
        ("cold-limited-summary", "cold_tier_limited.json", cold_limited_summary),
        ("cold-speed", "cold_speed_qwen3.json", cold_speed_table),
        ("readme-cold-speed", "cold_speed_qwen3.json", readme_cold_speed_line),
        ("cold-speed-32k", "cold_speed_qwen3_32k.json", cold_speed_table),
        ("cold-page-cache", "cold_page_cache_qwen3.json", cold_page_cache_table),
        ("readme-cold-page-cache", "cold_page_cache_qwen3.json", readme_cold_page_cache_line),
        ("readme-prefill-cold", "prefill_cold.json", readme_prefill_cold_line),
        ("cold-speed-32k-kv4", "cold_speed_qwen3_32k_kv4keys.json", cold_speed_table),
        ("cold-64k", "cold_tier_qwen3_64k.json", cold_table),
        ("cold-limited-64k", "cold_tier_limited_64k.json", cold_table),
        ("cold-limited-64k-summary", "cold_tier_limited_64k.json", cold_limited_summary),
        ("readme-cold-speed-32k", "cold_speed_qwen3_32k.json", readme_cold_speed_line),
        ("launcher-cpu", "launcher_cpu.json", launcher_cpu_line),
        ("ranks-app", "ranks_app.json", ranks_app_line),
        ("reopen", "reopen.json", reopen_table),
        ("reopen-gemma", "reopen_gemma3_270m.json", reopen_table),
        ("readme-reopen-gemma", "reopen_gemma3_270m.json", readme_reopen_lines),
        ("app-memory", "app_memory_demo.json", app_memory_table),
        ("profile", "profile_step.json", profile_table),
        ("profile-gemma-kept", "profile_gemma3_270m_8k_blas_kept.json", profile_table),
        ("profile-gemma", "profile_gemma3_270m_8k.json", profile_table),
        ("step-overhead", "step_overhead.json", step_overhead_table),
        ("host-step-cold", "host_step_cold.json", host_step_cold_table),
        (
            "host-step-cold-after-mlx",
            "host_step_cold_host_f25m17_after_mlx.json",
            host_step_cold_table,
        ),
        ("crossover-probe", "crossover_demo.json", crossover_probe_table),
        ("crossover-probe-gemma", "crossover_gemma3_270m.json", crossover_probe_table),
        ("inspector-cost", "inspector_cost_f25m1.json", shadow_cost_table),
        ("speed-amd", "decode_amd_epyc.json", host_speed_table),
        ("speed-amd-rerun", "decode_amd_epyc_rerun.json", host_speed_table),
        ("speed-host-f25m17", "decode_host_f25m17.json", host_speed_table),
        ("profile-host-f25m17", "profile_step_host_f25m17.json", profile_table),
        ("host-step-cold-host-f25m17", "host_step_cold_host_f25m17.json", host_step_cold_table),
        ("step-overhead-host-f25m17", "step_overhead_host_f25m17.json", step_overhead_table),
        ("graph-step-engine", "graph_step_engine.json", graph_step_table),
        *graph_step_set("f25m1"),
        *graph_estimate_set("f25m1"),
        *host_check_set("f25m1"),
        ("host-step-ab-estimate", "host_step_ab_estimate.json", host_step_ab_table),
        ("host-step-ab-1k", "host_step_ab_1k.json", host_step_ab_table),
        ("host-step-ab-step-sums", "host_step_ab_step_sums.json", host_step_ab_table),
        ("crossover-probe-host-f25m17", "crossover_demo_host_f25m17.json", crossover_probe_table),
        ("crossover-probe-native", "crossover_demo_native_step.json", crossover_probe_table),
        ("speed-native", "decode_native_step.json", decode_methods_table),
        ("speed-native-noest", "decode_native_step_noest.json", decode_methods_table),
        ("profile-native", "profile_native_step.json", profile_table),
        ("speed-gemma-native", "decode_gemma3_270m_native_step.json", decode_methods_table),
        *native_step_set("f25m1"),
        *native_step_set("f25m1_one_pass"),
        ("speed-exact-default-f25m1", "decode_exact_default_f25m1.json", decode_methods_table),
        ("host-step-caches", "host_step_caches.json", host_step_caches_table),
        ("crossover-probe-estimate", "crossover_demo_estimate_layers.json", crossover_probe_table),
        ("estimate-layers-sweep", "eval_4k_texts_estimate_top.json", estimate_layers_table),
        ("estimate-layers-4k", "eval_4k_texts_estimate_layers.json", estimate_layers_table),
        ("estimate-layers-speed", "decode_estimate_layers.json", decode_methods_table),
        (
            "crossover-probe-gemma-estimate",
            "crossover_gemma3_270m_estimate.json",
            crossover_probe_table,
        ),
        ("speed-gemma", "decode_gemma3_270m.json", host_speed_table),
        ("estimate-speed", "decode_estimate_host_step.json", estimate_speed_table),
        ("estimate-scores-speed", "decode_estimate_scores.json", estimate_scores_speed_table),
        ("estimate-code-speed", "decode_estimate_code.json", estimate_scores_speed_table),
        ("estimate-rows-speed", "decode_estimate_rows.json", estimate_scores_speed_table),
        ("presets-speed", "decode_quality_preset.json", decode_methods_table),
        ("gemma-estimate-speed", "decode_gemma3_270m_estimate.json", decode_methods_table),
        ("texts-8k", "eval_8k_texts.json", texts_table),
        ("texts-estimate-4k", "eval_4k_texts_estimate.json", texts_table),
        ("texts-estimate-left-4k", "eval_4k_texts_estimate_left.json", texts_table),
        ("texts-rr4-8k", "eval_8k_texts_rr4.json", texts_table),
        ("gemma-texts-8k", "eval_gemma3_270m_8k_texts.json", model_texts_table),
        ("gemma-texts-estimate-4k", "eval_gemma3_270m_4k_texts_estimate.json", model_texts_table),
        ("gemma-texts-estimate-8k", "eval_gemma3_270m_8k_texts_estimate.json", model_texts_table),
        (
            "gemma-texts-estimate-mean-4k",
            "eval_gemma3_270m_4k_texts_estimate_mean.json",
            model_texts_table,
        ),
        (
            "gemma-texts-pq-estimate-4k",
            "eval_gemma3_270m_4k_texts_pq_estimate.json",
            model_texts_table,
        ),
        (
            "gemma-texts-pq-estimate-8k",
            "eval_gemma3_270m_8k_texts_pq_estimate.json",
            model_texts_table,
        ),
        ("gemma-texts-rr4-4k", "eval_gemma3_270m_4k_texts_rr4.json", model_texts_table),
    )
    for key, fname, fn in simple:
        if (data := _load(fname)) is not None:
            out[key] = fn(data)
    kv_runs = [_load(f) for f in ("eval_4k_kv_float.json", "eval_4k_kv8.json", "eval_4k_kv4.json")]
    if all(r is not None for r in kv_runs):
        out["kv-bits"] = kv_bits_table(kv_runs)
    geos = {}
    for name in ("llama-3.2-1b", "qwen3-0.6b", "gemma-3-1b"):
        if (geo := _load(f"geometry_{name}.json")) is not None:
            out[f"geometry-{name.replace('.', '-')}"] = geometry_table(geo)
            geos[name] = geo
    names = (
        "distributed_demo.json", "distributed_qwen3-0.6b.json", "distributed_qwen3-0.6b_tensor.json"
    )  # fmt: skip
    if dist := [d for n in names if (d := _load(n)) is not None]:
        out["distributed"] = distributed_table(dist)
    host_runs = []
    for name in HOST_RUNS:
        if (data := _load(name)) is not None:
            host_runs.append({**data, "_file": name})
    if host_runs:
        out["hosts"] = hosts_table(host_runs)
    summary = {
        "eval": "eval_4k_b003.json", "texts": "eval_4k_texts.json", "passkey": "passkey.json",
        "tasks": "tasks.json", "tasks_8k": "tasks_8k.json",
        "speed": "decode_v2.json", "speed_amd": "decode_amd_epyc.json",
        "prefill": "prefill.json",
        "memory": "memory.json", "cold": "cold_tier_qwen3.json",
        "texts_8k": "eval_8k_texts.json",
        "gemma": "eval_gemma3_270m_4k_texts.json", "gemma_8k": "eval_gemma3_270m_8k_texts.json",
        "gemma_tasks": "tasks_gemma3_270m_4k.json", "gemma_tasks_8k": "tasks_gemma3_270m_8k.json",
    }  # fmt: skip
    runs = {k: _load(f) for k, f in summary.items()}
    cold_speed = [r for f in ("cold_speed_qwen3.json", "cold_speed_qwen3_32k.json")
                  if (r := _load(f)) is not None]  # fmt: skip
    if None not in runs.values() and cold_speed and geos:
        out["readme-summary"] = readme_summary(runs | {"cold_speed": cold_speed, "geometry": geos})
    out["history"] = history_list()
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
