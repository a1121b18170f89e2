"""The package ships every subpackage and its data (a non-editable install must work too)."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "autotune").rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages"
    assert "autotune.search_spaces" in listed


def test_search_spaces_resolve_through_the_package():
    from autotune.space import load_space

    assert load_space("deepspeed").source.endswith("deepspeed.yaml")


def test_every_data_file_is_package_data():
    """A preset's config.json (``data/hf_configs/``) ships with a wheel, not only with a checkout."""
    from fnmatch import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = ROOT / "autotune" / "data"
    files = [p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file() and p.suffix != ".py"]
    assert files and any(f.startswith("hf_configs/") for f in files)
    assert [f for f in files if not any(fnmatch(f, g) for g in globs["autotune.data"])] == []
