"""The documentation site builds with ``mkdocs build --strict`` (every nav page present, no broken link or
anchor, every docstring renders), its hvdliterun reference lists the launcher's own flags, and each API
reference page has a section for every name of its module's ``__all__``.

mkdocs and its plugins come with the ``test`` extra (the same pins as ``docs``), so CI always builds.
"""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="mkdocs is not installed; pip install -e '.[docs]' (the test extra has it)")

REFERENCE = {"hvdlite": "hvdlite", "torch": "hvdlite.torch", "tensorflow": "hvdlite.tensorflow",
             "keras": "hvdlite.tensorflow.keras", "jax": "hvdlite.jax", "spark": "hvdlite.spark", "ray": "hvdlite.ray"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                             "--site-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_the_hvdliterun_reference_lists_the_launchers_flags(site):
    from hvdlite.runner.cli import make_parser

    page = (site / "reference" / "hvdliterun" / "index.html").read_text(encoding="utf-8")
    codes = {html.unescape(code) for code in re.findall(r"<code>([^<]*)</code>", page)}
    for known in ("-np", "--timeline-filename", "--fusion-threshold-mb", "--min-np", "-x", "HVDLITE_TIMELINE"):
        assert known in codes, f"{known} is not on the hvdliterun reference page"
    missing = [name for action in make_parser()._actions for name in action.option_strings if name not in codes]
    assert missing == [], "flags of hvdliterun missing from its reference page"
    assert "<!-- hvdliterun-flags -->" not in page and "<!-- hvdlite-variables -->" not in page
    assert "HVDLITE_CHUNK_BYTES" in codes  # the table of variables without a flag


def test_every_public_name_has_a_section_on_its_reference_page(site):
    griffe = pytest.importorskip("griffe", reason="griffe comes with mkdocstrings-python")
    package = griffe.load("hvdlite", search_paths=[str(ROOT)], resolve_aliases=False)
    for page, module in REFERENCE.items():
        text = (site / "reference" / page / "index.html").read_text(encoding="utf-8")
        ids = set(re.findall(r'<h[1-6] id="([^"]+)"', text))
        exports = (package if module == "hvdlite" else package[module.removeprefix("hvdlite.")]).exports
        assert exports, f"{module} declares no __all__"
        missing = [name for name in exports if f"{module}.{name}" not in ids]
        assert missing == [], f"reference/{page}.md lacks sections for {module}'s public names"
    spark = _text(site / "reference" / "spark" / "index.html")
    assert "RemoteJobError" in spark and "Spark or Ray job failed" in spark  # re-exported from hvdlite.runner, with its docstring


def test_docstrings_show_no_rest_markup(site):
    for page in REFERENCE:
        text = _text(site / "reference" / page / "index.html")
        leftovers = re.findall(r".{0,40}(?::(?:class|func|meth|mod|attr|data|exc):`|``).{0,40}", text)
        assert leftovers == [], f"reference/{page}.md shows reST markup"


def test_no_page_a_user_reads_names_a_tracker_number():
    # "issue #22" means something to the team's tracker, nothing to a reader: say what it was about.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "bench").rglob("*.md"))]
    named = [f"{page.relative_to(ROOT)}: {match.group(0)}" for page in pages
             for match in re.finditer(r"\b(?:issues?|PR|pull request) #\d+", page.read_text(encoding="utf-8"), re.I)]
    assert named == [], named
