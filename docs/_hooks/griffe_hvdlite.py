"""Griffe extension for the API reference (mkdocs.yml: the mkdocstrings python handler's ``extensions``).

- ``hvdlite.runner`` is installed from the top-level ``runner/`` folder (setuptools ``package-dir``), so
  static analysis of ``hvdlite/`` does not see it. The public adapters re-export one of its names
  (``hvdlite.spark.RemoteJobError``, ``hvdlite.ray.RemoteJobError``); to resolve those, ``runner/`` is
  loaded and attached to the ``hvdlite`` package as ``hvdlite.runner``. No page documents it.
- The docstrings are written in reStructuredText style (Sphinx roles such as ``:class:`~a.B```, and
  ``text::`` before an indented example). The pages are Markdown: roles become code spans and those
  examples fenced Python blocks, so neither shows up as stray markup.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

# :class:`~pkg.mod.Name`, :func:`name`, :meth:`Title <target>` ...
_ROLE = re.compile(r":(?:py:)?[a-z]+:`(?P<tilde>~?)(?P<text>[^`<]+?)(?:\s*<[^>`]+>)?`")


def _role(match: re.Match) -> str:
    text = match["text"].strip()
    if match["tilde"]:
        text = text.rsplit(".", 1)[-1]
    return f"`{text}`"


def markdown_docstring(text: str) -> str:
    """A reST-flavoured docstring as Markdown (roles as code; ``::`` examples as fenced blocks)."""
    text = _ROLE.sub(_role, text)
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.rstrip().endswith("::"):
            out.append(line)
            i += 1
            continue
        # "Text::" introduces a literal block: everything after it indented deeper than the line.
        indent = len(line) - len(line.lstrip())
        stripped = line.rstrip()[:-2]
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        k = j
        while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > indent):
            k += 1
        while k > j and not lines[k - 1].strip():
            k -= 1
        if k == j:  # no indented block follows: keep the line as it is
            out.append(line)
            i += 1
            continue
        block = lines[j:k]
        dedent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
        head = stripped.rstrip()
        if head.strip():  # "Example::" -> "Example:"; a lone "::" disappears
            out.append(head + ":" if not stripped.endswith(" ") else head)
        out.append("")
        pad = " " * indent
        out.append(pad + "```python")
        out.extend(pad + b[dedent:] if b.strip() else "" for b in block)
        out.append(pad + "```")
        out.append("")
        i = k
    return "\n".join(out)


def _walk(obj: griffe.Object, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if obj.docstring is not None:
        obj.docstring.value = markdown_docstring(obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)


class HvdliteReference(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "hvdlite":
            return
        if "runner" not in pkg.members and pkg.filepath is not None:
            root = Path(pkg.filepath).parent.parent
            if (root / "runner" / "__init__.py").exists():
                runner = loader.load(root / "runner")
                loader.modules_collection.members.pop("runner", None)
                pkg.set_member("runner", runner)  # now hvdlite.runner, as installed
        _walk(pkg, set())
