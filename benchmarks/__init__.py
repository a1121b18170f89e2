"""Scripts that measure autotune's speed and accuracy; each runs as ``python benchmarks/<name>.py`` and writes
its results beside them (benchmarks/results/, benchmarks/README.md). A package so that tests and the scripts
import each other as ``benchmarks.<name>`` (pytest puts the repository root on ``sys.path``); not shipped."""
