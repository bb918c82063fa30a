"""Reading JSON files the app does not control (settings.json, chat files) without ever letting
one stop the app: a size cap before anything is read, nesting too deep for the parser, bytes
that are not UTF-8 and lone surrogates (`"\\udc80"`, valid JSON but not encodable) all end as a
`ValueError` with one line, or as clean text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """`text` with every lone surrogate (unencodable in UTF-8) replaced by U+FFFD."""
    return _SURROGATE.sub(REPLACEMENT, text)


def read_json(path: Path, max_bytes: int) -> Any:
    """The JSON value in `path`. ValueError with a one-line reason when the file is larger than
    `max_bytes`, is not UTF-8, is not JSON or nests too deeply; OSError when it cannot be read.
    Strings keep lone surrogates: pass them through `clean_text` before they can be written."""
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"the file is too large ({size:,} bytes, at most {max_bytes:,})")
    with path.open("rb") as file:
        # read(n) allocates n bytes up front: ask for the size seen (+1 to notice growth)
        raw = file.read(size + 1)
    if len(raw) > max_bytes:
        raise ValueError(f"the file is too large (more than {max_bytes:,} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def clean_json(value: Any) -> Any:
    """`value` (parsed JSON) with lone surrogates replaced in every string and key
    (`clean_text`), in place where it can be; iterative, so any depth the parser accepted."""
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        holder, key = stack.pop()
        item = holder[key]
        if isinstance(item, str):
            holder[key] = clean_text(item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, dict):
            cleaned = {clean_text(k): v for k, v in item.items()}
            item.clear()
            item.update(cleaned)
            stack.extend((item, k) for k in item)
    return root[0]
