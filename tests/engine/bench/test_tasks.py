"""The RULER-style task suite: scoring, deterministic prompts with the needle where it is said to
be, and `a2ats bench tasks --json` on a tiny model."""

import argparse
import json
from collections import Counter

import pytest
from tiny import save_tiny_model, tiny_tokenizer

from a2ats_engine.bench import tasks as tk
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cli import main


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def sentences():
    return tk.haystack_sentences(tk.default_haystack()[0])


def test_score_is_the_share_of_references_found():
    assert tk.score_answer(" 1234567. Remember", ["1234567"]) == 1.0
    assert tk.score_answer(" 1234566", ["1234567"]) == 0.0
    assert tk.score_answer("ABCDE, fghij and more", ["abcde", "FGHIJ", "KLMNO"]) == pytest.approx(
        2 / 3
    )
    assert tk.score_answer("", ["x"]) == 0.0
    with pytest.raises(ValueError, match="references"):
        tk.score_answer("x", [])


def test_summary_and_relative_scores_on_hand_made_trials():
    def trial(method, seed, answer, score):
        return tk.TaskTrial("niah_number", 1024, 0.5, seed, method, answer, score)

    trials = [
        trial("full", 0, "12", 1.0),
        trial("full", 1, "34", 1.0),
        trial("a2ats", 0, "12", 1.0),
        trial("a2ats", 1, "99", 0.0),
    ]
    rows = {r["method"]: r for r in tk.summarize(trials)}
    assert rows["a2ats"] == {
        "task": "niah_number", "context": 1024, "method": "a2ats", "score": 0.5, "n": 2,
    }  # fmt: skip
    rel = {r["method"]: r for r in tk.relative_to_full(trials)}
    assert rel["full"]["score_vs_full"] == 1.0 and rel["full"]["agrees_with_full"] == 1.0
    assert rel["a2ats"]["score_vs_full"] == 0.5 and rel["a2ats"]["agrees_with_full"] == 0.5
    assert rel["full"]["score_vs_full_ci95"] == [1.0, 1.0]
    low, high = rel["a2ats"]["score_vs_full_ci95"]
    assert low == 0.0 and high == 1.0  # two prompts: every resample is 0, 1/2 or 1


def test_the_paired_interval_narrows_with_prompts_and_keeps_pairs_together():
    # 12 prompts where the method loses every other answer: the interval holds 0.5, excludes 1
    low, high = tk.paired_ratio_ci([1, 1, 0, 0] * 3, [1.0] * 12)
    assert 0.0 < low < 0.5 < high < 1.0
    wide = tk.paired_ratio_ci([1, 1, 0, 0], [1.0] * 4)
    assert wide[1] - wide[0] > high - low
    # the same answers as full on every prompt: exactly 1, however the prompts are drawn
    assert tk.paired_ratio_ci([1, 0, 1, 0.5], [1, 0, 1, 0.5]) == (1.0, 1.0)
    assert tk.paired_ratio_ci([0.0, 1.0], [0.0, 0.0]) is None  # full never scored
    low, high = tk.paired_ratio_ci([1.0, 1.0], [1.0, 0.0])  # a draw of only the second prompt
    assert high == float("inf")
    rows = tk.relative_to_full([tk.TaskTrial("vt", 1024, 0.5, seed, m, "x", score)
                                for seed, (mine, full) in enumerate([(1.0, 1.0), (1.0, 0.0)])
                                for m, score in (("a2ats", mine), ("full", full))])  # fmt: skip
    assert {r["method"]: r["score_vs_full_ci95"] for r in rows}["a2ats"][1] is None  # JSON-safe
    with pytest.raises(ValueError, match="as many scores"):
        tk.paired_ratio_ci([1.0], [1.0, 0.0])


@pytest.mark.parametrize("task", tk.TASKS)
def test_prompts_are_deterministic_per_seed(tokenizer, sentences, task):
    a = tk.make_prompt(tokenizer, task, 900, 0.5, 0, sentences)
    b = tk.make_prompt(tokenizer, task, 900, 0.5, 0, sentences)
    c = tk.make_prompt(tokenizer, task, 900, 0.5, 1, sentences)
    assert a == b
    assert a.ids != c.ids and a.references != c.references
    assert len(a.ids) <= 900


@pytest.mark.parametrize("task", [t for t in tk.TASKS if t != "common_words"])
@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_the_answer_is_in_the_needle_at_the_stated_depth(tokenizer, sentences, task, depth):
    context = 1500
    p = tk.make_prompt(tokenizer, task, context, depth, 3, sentences)
    needle = tokenizer.encode(p.needle_text, add_special_tokens=False)
    assert list(p.ids[p.needle_at : p.needle_at + len(needle)]) == needle
    assert p.references[0] in p.needle_text
    # the needle sits at a sentence boundary near `depth` of the filler tokens ...
    longest = max(len(tokenizer.encode(s, add_special_tokens=False)) for s in sentences)
    assert abs(p.filler_before - depth * p.filler_tokens) <= longest / 2 + 1
    # ... and that is where it is in the prompt: after the intro, that filler and other needles
    intro = len(tokenizer.encode(tk.INTRO))
    assert 0 <= p.needle_at - intro - p.filler_before <= len(p.ids) - intro - p.filler_tokens
    assert context - longest < len(p.ids) <= context  # filled up to less than one sentence
    text = tokenizer.decode(list(p.ids))
    for ref in p.references:  # every reference is in the prompt, before the question
        assert ref in text[: text.rindex("\n")]


def test_variable_tracking_chain_is_in_order(tokenizer, sentences):
    p = tk.make_prompt(tokenizer, "variable_tracking", 1500, 0.3, 2, sentences)
    text = tokenizer.decode(list(p.ids))
    names = p.references
    assert 3 <= len(names) <= 5
    spots = [text.index(f"VAR {names[0]} = ")]
    spots += [text.index(f"VAR {b} = VAR {a}.") for a, b in zip(names, names[1:], strict=False)]
    assert spots == sorted(spots)
    value = text[spots[0] :].split("= ")[1].split(".")[0]
    assert f"value {value}" in text[text.rindex("\n") :]


def test_common_words_are_the_most_frequent(tokenizer):
    p = tk.make_prompt(tokenizer, "common_words", 1500, 0.5, 0, [])
    lines = tokenizer.decode(list(p.ids)).split("\n")
    counts = Counter(line.split(". ", 1)[1] for line in lines[1:] if line[:1].isdigit())
    top = {w for w, _ in counts.most_common(tk.COMMON_WORDS)}
    assert top == set(p.references)
    least_common = min(counts[w] for w in p.references)
    assert all(c < least_common for w, c in counts.items() if w not in p.references)


def test_prompt_arguments_are_checked(tokenizer, sentences):
    with pytest.raises(ValueError, match="task="):
        tk.make_prompt(tokenizer, "nope", 900, 0.5, 0, sentences)
    with pytest.raises(ValueError, match="depth="):
        tk.make_prompt(tokenizer, "niah_word", 900, 1.5, 0, sentences)
    with pytest.raises(ValueError, match="too short"):
        tk.make_prompt(tokenizer, "niah_uuid", 60, 0.5, 0, sentences)
    with pytest.raises(ValueError, match="sentences"):
        tk.haystack_sentences("just one")


def test_bench_tasks_json(tmp_path, capsys):
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)  # head_dim 64
    book = tmp_path / "cb.safetensors"
    Codebook.random(2, 2, 64, 32, seed=1).save(book)
    haystack = tmp_path / "hay.txt"
    haystack.write_text("The cat sat on the mat today. " * 3 + "A dog ran in the park again. " * 3)
    argv = ["bench", "tasks", "--model", str(folder), "--codebook", str(book), "--contexts",
            "500", "--methods", "full,a2ats,window,oracle_topk", "--tasks",
            "niah_number,variable_tracking,common_words", "--depths", "0.2,0.8", "--seeds", "2",
            "--haystack", str(haystack), "--budget", "0.05", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out)
    rows = data["results"]
    assert {(r["task"], r["method"]) for r in rows} == {
        (t, m)
        for t in ("niah_number", "variable_tracking", "common_words")
        for m in ("full", "a2ats", "window", "oracle_topk")
    }
    for r in rows:
        assert set(r) == {"task", "context", "method", "score", "n"}
        assert r["context"] == 500 and 0.0 <= r["score"] <= 1.0
        assert r["n"] == 4  # seeds x depths; common_words: as many lists
    full = [r for r in data["relative_to_full"] if r["method"] == "full"]
    assert all(r["agrees_with_full"] == 1.0 for r in full)
    assert data["haystack"] == "hay.txt" and data["seeds"] == 2
    assert data["command"].startswith("a2ats bench tasks --contexts 500")
    assert " --model m " in data["command"] and str(tmp_path) not in data["command"]  # by name

    # with a journal, a run that stopped part-way resumes: finished prompts are not run again
    journal = tmp_path / "tasks.jsonl"
    assert main([*argv, "--journal", str(journal)]) == 0
    first = json.loads(capsys.readouterr().out)
    lines = journal.read_text().splitlines()
    assert len(lines) == 1 + 4 * (4 + 4 + 4)  # setup, then methods x prompts
    setup = json.loads(lines[0])["setup"]
    assert setup["model"] == first["model"] and setup["codebook"] == "cb.safetensors"
    assert setup["codebook_recipe"][:3] == [32, 1, 64] and setup["config"]["budget"] == 0.05
    journal.write_text("\n".join(lines[: 1 + 4 * 3]) + "\n")  # as if stopped after 3 prompts
    answered = []
    real = tk.answer_with_methods

    def counting(*args, **kwargs):
        answered.append(list(args[2]))  # the methods asked for
        return real(*args, **kwargs)

    tk.answer_with_methods = counting
    try:
        assert main([*argv, "--journal", str(journal)]) == 0
    finally:
        tk.answer_with_methods = real
    assert len(answered) == 12 - 3
    assert json.loads(capsys.readouterr().out)["results"] == first["results"]
    assert len(journal.read_text().splitlines()) == len(lines)

    # killed while writing prompt 4: two of its lines whole, the third torn. The torn line is
    # cut, prompt 4 answered again, and its earlier lines count once on the next resume
    torn = lines[: 1 + 4 * 3 + 2] + [lines[1 + 4 * 3 + 2][:25]]
    journal.write_text("\n".join(torn))
    answered.clear()
    tk.answer_with_methods = counting
    try:
        assert main([*argv, "--journal", str(journal)]) == 0
        assert json.loads(capsys.readouterr().out)["results"] == first["results"]
        assert len(answered) == 12 - 3
        # prompt 4 ran only the two methods its whole lines lack, and journalled those two
        assert answered[0] == ["window", "oracle_topk"]
        assert all(len(asked) == 4 for asked in answered[1:])
        assert len(journal.read_text().splitlines()) == len(lines)
        assert main([*argv, "--journal", str(journal), "--trials"]) == 0
        again = json.loads(capsys.readouterr().out)
        assert len(answered) == 12 - 3  # nothing left to answer
    finally:
        tk.answer_with_methods = real
    assert again["results"] == first["results"] and len(again["trials"]) == 4 * 12
    journal.write_text(lines[0] + "\n" + '{"task": "x"}\n')
    assert main([*argv, "--journal", str(journal)]) == 1
    assert f"task journal {journal}, line 2: not a task trial" in capsys.readouterr().err

    # a journal of another setup, or of none, is refused, not mixed in, and left as it was
    journal.write_text("\n".join(lines) + "\n")
    other = [*argv[:-3], "--budget", "0.1", "--json", "--journal", str(journal)]
    assert main(other) == 1
    err = capsys.readouterr().err
    assert f"task journal {journal} was written with another setup: config" in err
    assert "start a new --journal file" in err
    other_book = tmp_path / "cb16.safetensors"
    Codebook.random(2, 2, 64, 16, seed=1).save(other_book)
    renamed = [*argv, "--journal", str(journal)]
    renamed[renamed.index(str(book))] = str(other_book)
    assert main(renamed) == 1
    assert "another setup: codebook " in capsys.readouterr().err
    journal.write_text("\n".join(lines[1:]) + "\n")
    assert main([*argv, "--journal", str(journal)]) == 1
    assert f"task journal {journal}: no setup line" in capsys.readouterr().err
    assert journal.read_text() == "\n".join(lines[1:]) + "\n"


def test_the_default_haystack_is_not_calibration_text(sentences):
    from a2ats_engine.calibration.corpus import builtin_corpus

    corpus = "".join(builtin_corpus())
    assert len(sentences) > 100
    assert not [s for s in sentences if len(s) > 40 and s.strip() in corpus]


def test_the_tasks_command_records_a_model_fetched_by_name():
    from a2ats_engine.commands.bench.tasks import _tasks_command

    args = argparse.Namespace(
        contexts="4096", methods="full,a2ats", tasks=None, depths="0.5", seeds=1, budget=0.03,
        rerank=None, haystack=None, codebook="/home/someone/books/g.safetensors",
        model="gemma3-270m", trials=True,
    )  # fmt: skip
    assert _tasks_command(args) == (
        "a2ats bench tasks --contexts 4096 --methods full,a2ats --depths 0.5 --seeds 1 "
        "--budget 0.03 --codebook g.safetensors --model gemma3-270m --trials --json"
    )


def test_the_missed_attention_estimate_answers_tasks_too():
    """Both estimates (centroid and mean slot scores) are task methods: each answers from the
    same exact prefill, beside full and plain a2ats."""
    import mlx.core as mx
    from tiny import made_for, tiny_model

    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.geometry import model_geometry

    assert {"a2ats_estimate", "a2ats_estimate_mean"} <= set(tk.TASK_METHODS)
    model = tiny_model("llama")
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 32))
    ids = [int(i) for i in mx.random.randint(3, 200, (300,), key=mx.random.key(0)).tolist()]
    methods = ("full", "a2ats", "a2ats_estimate", "a2ats_estimate_mean")
    config = A2ATSConfig(window=16, sinks=4, budget=8, exact_below=0)
    answers = tk.answer_with_methods(
        model, ids, methods, codebook=book, config=config, answer_tokens=3
    )
    assert list(answers) == list(methods)
    assert all(len(tokens) == 3 for tokens, _ in answers.values())


def test_every_prompt_method_answers_a_prompt_and_the_others_are_refused():
    """`bench tasks` and `bench passkey` take every registered method that needs only the run's
    codebook (not a fixed list): each answers the same prompt; the methods that need a second
    codebook or measured layer budgets are refused by name before any model work."""
    import mlx.core as mx
    from tiny import made_for, tiny_model

    from a2ats_engine.bench import passkey
    from a2ats_engine.bench.methods import METHODS
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.geometry import model_geometry

    assert tk.TASK_METHODS == passkey.PASSKEY_METHODS
    refused = set(METHODS) - set(tk.TASK_METHODS)
    assert refused == {"a2ats_random", "a2ats_plain_vq", "a2ats_alloc", "a2ats_no_wrope"}
    model = tiny_model("llama", hidden_size=128, num_hidden_layers=3)  # kv8 / kv4, dense2
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 32))
    ids = [int(i) for i in mx.random.randint(3, 200, (200,), key=mx.random.key(1)).tolist()]
    config = A2ATSConfig(window=16, sinks=4, budget=0.05, exact_below=0)  # dense2: a fraction
    answers = tk.answer_with_methods(
        model, ids, tk.TASK_METHODS, codebook=book, config=config, answer_tokens=2
    )
    assert list(answers) == list(tk.TASK_METHODS)
    assert all(len(tokens) == 2 for tokens, _ in answers.values())
    with pytest.raises(ValueError, match="a2ats_plain_vq"):
        tk.bench_tasks(model, None, [], codebook=book, methods=("full", "a2ats_plain_vq"))
