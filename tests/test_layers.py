"""The package layering: nothing below the CLI imports it, and no two packages import each other
(``benchmarks/import_graph.py`` reads the imports with ``ast``; ``docs/architecture.md`` shows the graph)."""

from benchmarks.import_graph import cycles, importers_of, package_graph


def test_nothing_outside_the_cli_imports_it():
    assert importers_of("cli") == []


def test_no_import_cycle_between_packages():
    assert cycles(package_graph()) == []


def test_the_graph_sees_a_cycle_and_an_upward_import(tmp_path):
    root = tmp_path / "autotune"
    (root / "cli").mkdir(parents=True)
    (root / "trials").mkdir()
    (root / "__init__.py").write_text("")
    (root / "cli" / "__init__.py").write_text("")
    (root / "trials" / "__init__.py").write_text("")
    (root / "trials" / "runner.py").write_text("def f():\n    from autotune.backends import base\n")
    (root / "backends.py").write_text("from autotune.trials import runner\nfrom autotune.cli import x\n")
    (root / "specs.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autotune.backends import y\n"
    )
    assert cycles(package_graph(root)) == [["backends", "trials"]]
    assert importers_of("cli", root) == ["autotune.backends"]
