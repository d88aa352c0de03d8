"""The fenced code blocks of the documentation (docs/**/*.md and README.md), with their line numbers.

The docs' convention: a ```python block is a complete program that tests/multirank/test_docs.py runs
at np=2; a ```py block is a fragment, highlighted the same way and never run; other languages
(bash, text, yaml...) are never run. A fence may be indented (inside a list, an admonition or a
content tab); its block is dedented by the fence's indentation. A longer fence (````) or a ~~~
fence can hold ``` lines, which then are text, not blocks.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# An opening fence: indentation, ``` or ~~~ (3 or more), then the info string ("python title=...").
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    page: str  # docs-relative path ("running/hvdliterun.md"), or "README.md"
    line: int  # 1-based line of the opening fence
    lang: str  # the info string's first word, without a leading "." or braces ("" for none)
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def code_blocks(text: str, page: str = "<text>") -> list[CodeBlock]:
    """Every fenced code block of Markdown ``text``, in order."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        info = match["info"].strip().lstrip("{").rstrip("}").strip()
        lang = info.split()[0].lstrip(".").lower() if info else ""
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body = []
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        blocks.append(CodeBlock(page, i + 1, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def python_blocks(text: str, page: str = "<text>") -> list[CodeBlock]:
    """The ```python blocks (complete programs); ```py fragments and other languages are left out."""
    return [block for block in code_blocks(text, page) if block.lang == "python"]


def doc_pages() -> list[Path]:
    """The Markdown pages whose ```python blocks are run: docs/**/*.md (not docs/_*/) and README.md."""
    pages = sorted(p for p in DOCS.rglob("*.md") if not any(part.startswith("_") for part in p.relative_to(DOCS).parts))
    return [*pages, ROOT / "README.md"]


def page_name(path: Path) -> str:
    return path.relative_to(DOCS).as_posix() if path.is_relative_to(DOCS) else path.relative_to(ROOT).as_posix()


def all_python_blocks() -> list[CodeBlock]:
    return [block for path in doc_pages() for block in python_blocks(path.read_text(encoding="utf-8"), page_name(path))]
