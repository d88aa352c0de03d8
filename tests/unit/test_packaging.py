"""pyproject.toml lists packages explicitly (runner/ is installed as hvdlite.runner): a package
missing there works in an editable install and is absent from a real one."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_under_hvdlite_is_listed_in_pyproject():
    listed = set(re.findall(r'"(hvdlite[\w.]*)"', re.search(r"packages = \[(.*?)\]",
                                                          (ROOT / "pyproject.toml").read_text(), re.S).group(1)))
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "hvdlite").rglob("__init__.py")}
    # runner/ is installed as hvdlite.runner, its subpackages under it
    found |= {".".join(("hvdlite", *init.parent.relative_to(ROOT).parts)) for init in (ROOT / "runner").rglob("__init__.py")}
    assert found - listed == set(), "packages missing from pyproject.toml [tool.setuptools] packages"
    assert listed - found == set(), "listed but not found"
