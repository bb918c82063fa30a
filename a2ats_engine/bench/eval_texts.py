"""The built-in evaluation texts of `a2ats eval` (none in the calibration corpus): Python's
`http.client` source, an essay and a dialogue written for this repository (`resources/texts/`)."""

from __future__ import annotations

from pathlib import Path

TEXTS = Path(__file__).resolve().parents[2] / "resources" / "texts"
ESSAY = TEXTS / "brackmoor_canal_essay.txt"
ESSAY_DESCRIPTION = (
    "resources/texts/brackmoor_canal_essay.txt (original prose written for this repository; "
    "not in the calibration corpus)"
)
DIALOGUE = TEXTS / "keeper_dialogue.txt"
DIALOGUE_DESCRIPTION = (
    "resources/texts/keeper_dialogue.txt (a two-person dialogue written for this repository; "
    "not in the calibration corpus)"
)


def builtin_texts() -> dict[str, tuple[str, str]]:
    """{name: (text, description)} of the evaluation texts shipped or found offline, none in
    the calibration corpus: "code" (`default_text`), "prose" (resources/texts/
    brackmoor_canal_essay.txt, an expository essay written for this repository, about 8.9K
    tokens with the demo's tokenizer), "dialogue" (resources/texts/keeper_dialogue.txt, about
    9.1K tokens); both are long enough for an 8K context (Gemma 3's tokenizer: 8.7K each).
    The haystack of `a2ats bench tasks` (`tasks.default_haystack`) is separate and unchanged."""
    essay = (ESSAY.read_text(encoding="utf-8"), ESSAY_DESCRIPTION)
    dialogue = (DIALOGUE.read_text(encoding="utf-8"), DIALOGUE_DESCRIPTION)
    return {"code": default_text(), "prose": essay, "dialogue": dialogue}


def default_text() -> tuple[str, str]:
    """(text, description) of the built-in evaluation text: the source of Python's `http.client`
    module (code and docstrings; not part of the calibration corpus)."""
    import http.client
    import inspect

    return inspect.getsource(
        http.client
    ), "Python stdlib http/client.py (held out from calibration)"
