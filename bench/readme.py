"""Writing a script's results into bench/README.md between its markers, so the numbers there are never typed."""

from __future__ import annotations

import os

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


def replace_block(key: str, text: str, path: str = README) -> None:
    """Put ``text`` between ``<!-- results: KEY -->`` and the next ``<!-- /results -->`` (appended if new)."""
    start, end = f"<!-- results: {key} -->", "<!-- /results -->"
    with open(path) as handle:
        content = handle.read()
    if start not in content:
        content += f"\n{start}\n{end}\n"
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as handle:
        handle.write(f"{head}{start}\n{text}\n{end}{tail}")
