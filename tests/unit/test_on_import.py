"""hvdlite.utils.on_import: a callback runs on a module whether it is imported before or after."""

import sys
import textwrap

from hvdlite.utils.on_import import when_imported


def test_a_callback_runs_after_a_later_import_and_at_once_for_an_imported_module(tmp_path, monkeypatch):
    (tmp_path / "later_module_for_hvdlite.py").write_text(textwrap.dedent("""
        VALUE = 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("later_module_for_hvdlite", lambda module: seen.append(("later", module.VALUE)))
    assert seen == []
    import later_module_for_hvdlite  # noqa: F401
    assert seen == [("later", 1)]
    when_imported("later_module_for_hvdlite", lambda module: seen.append(("now", module.VALUE)))
    assert seen == [("later", 1), ("now", 1)]
    del sys.modules["later_module_for_hvdlite"]
    import later_module_for_hvdlite  # noqa: F401,F811  (a second import: the callbacks ran once)
    assert seen == [("later", 1), ("now", 1)]
