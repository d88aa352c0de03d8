"""mkdocs hook: the ``hvdliterun`` reference tables, generated at build time from the launcher itself.

A page that contains ``<!-- hvdliterun-flags -->`` gets, in its place, one section per argument group of
the launcher's own argparse parser (``hvdlite.runner.cli.make_parser``) with a table of its flags: the
flag, the ``HVDLITE_*`` variable it sets (the launcher writes it in brackets at the end of the help),
the default, and the help text. ``<!-- hvdlite-variables -->`` becomes a table of the ``HVDLITE_*``
variables that have no flag, from the same settings table the parser's setting flags are built from.
So the page cannot drift from ``hvdliterun --help``. Importing the launcher starts no MPI.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from typing import Any

FLAGS_MARKER = "<!-- hvdliterun-flags -->"
VARIABLES_MARKER = "<!-- hvdlite-variables -->"

MIB = 1024 * 1024
# "[HVDLITE_X]" or "[HVDLITE_X=1]" at the end of a setting flag's help.
_VARIABLE = re.compile(r"\s*\[(?P<name>HVDLITE_\w+)(?:=(?P<value>[^\]]*))?\]\s*$")
# Words shown as code in help text: variable names and option strings.
_CODE_WORDS = re.compile(r"(?<![\w`-])(HVDLITE_[A-Z0-9_*]+|--?[a-z][\w-]*(?=[\s,;:.)]|$))")
_GROUP_TITLES = {"positional arguments": "Program", "options": "Launcher options",
                 "optional arguments": "Launcher options", "settings": "Settings"}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if FLAGS_MARKER in markdown:
        markdown = markdown.replace(FLAGS_MARKER, flags_markdown())
    if VARIABLES_MARKER in markdown:
        markdown = markdown.replace(VARIABLES_MARKER, variables_markdown())
    return markdown


def _launcher() -> Any:
    try:
        from hvdlite.runner import cli
    except ImportError as error:  # a clear build error instead of a traceback from deep inside mkdocs
        raise RuntimeError(f"the hvdliterun page needs hvdlite installed (pip install -e '.[docs]'): {error}") from error
    return cli


def _settings() -> tuple[dict[str, Any], Any, tuple[Any, ...]]:
    """The launcher's flagged settings by option dest, the defaults, and every setting.

    ``SETTING_FLAGS`` is what the launcher builds its setting options from; the module that defines
    its ``Setting`` class also holds the whole table (``SETTINGS``), wherever that module lives.
    """
    cli = _launcher()
    try:
        pairs = cli.SETTING_FLAGS
        table = sys.modules[type(pairs[0][0]).__module__].SETTINGS
        defaults = cli.load_config({})  # an empty environment: every setting at its default
    except AttributeError as error:
        raise RuntimeError(f"{__file__}: the launcher's settings are no longer where this hook looks "
                           f"(hvdlite.runner.cli's SETTING_FLAGS and load_config): {error}") from error
    return {flag.dest: setting for setting, flag in pairs}, defaults, table


def flags_markdown() -> str:
    cli = _launcher()
    parser = cli.make_parser()
    by_dest, defaults, _ = _settings()
    formatter = parser._get_formatter()
    sections = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        lines = [f"## {_GROUP_TITLES.get(group.title, group.title.capitalize())}", ""]
        if group.description:
            description = _text(group.description)
            lines += [description[:1].upper() + description[1:], ""]
        lines += ["| Flag | Variable | Default | Description |", "|---|---|---|---|"]
        for action in actions:
            help_text = formatter._expand_help(action) if action.help else ""
            variable = value = ""
            match = _VARIABLE.search(help_text)
            if match:
                help_text = help_text[:match.start()]
                variable, value = match["name"], match["value"] or ""
            setting = by_dest.get(action.dest)
            if setting is not None:
                default = _default_text(getattr(defaults, setting.field))
            else:
                default = _default_text(action.default, launcher_option=True)
            shown_variable = f"`{variable}={value}`" if value else (f"`{variable}`" if variable else "")
            lines.append(f"| {_invocation(action)} | {shown_variable} | {default} | {_text(help_text)} |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def variables_markdown() -> str:
    by_dest, defaults, table = _settings()
    flagged = {setting.env for setting in by_dest.values()}
    lines = ["| Variable | Default | Description |", "|---|---|---|"]
    for setting in table:
        if setting.env not in flagged:
            lines.append(f"| `{setting.env}` | {_default_text(getattr(defaults, setting.field))} | {_text(setting.help)} |")
    return "\n".join(lines) + "\n"


def _invocation(action: argparse.Action) -> str:
    """``-np N, --num-proc N`` as ``-np``, ``--num-proc`` ``NUM_PROC``; a positional as its metavar."""
    if not action.option_strings:
        return f"`{action.metavar or action.dest} ...`" if action.nargs == argparse.REMAINDER else f"`{action.dest}`"
    names = ", ".join(f"`{name}`" for name in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    elif isinstance(action.nargs, int) and action.nargs > 1:
        metavar = " ".join([metavar] * action.nargs)
    return f"{names} `{metavar}`"


def _default_text(value: Any, launcher_option: bool = False) -> str:
    """A default as the variable's text would give it (``1``/``0`` for switches); empty when unset."""
    if value is None or value == "" or value == [] or value == argparse.SUPPRESS or (launcher_option and value is False):
        return ""
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, tuple):
        return "" if not any(value) else "`" + " ".join(_number(v) for v in value) + "`"
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"`{value}` ({value // MIB} MiB)"
    if dataclasses.is_dataclass(value):
        raise TypeError(f"no text form for default {value!r}")
    return f"`{_number(value)}`"


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _text(text: str) -> str:
    """Help text as a Markdown table cell: variable names and options as code, nothing read as markup."""
    parts = _CODE_WORDS.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a captured word
            out.append(f"`{part}`")
        else:
            out.append(re.sub(r"([\\`*_\[\]<>|])", r"\\\1", part))
    return "".join(out).replace("\n", " ")
