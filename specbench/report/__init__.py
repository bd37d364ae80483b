"""The report: load result folders into pandas, join every run with its AR baseline, print tables.

Every comparison between runs (speedup three ways, overhead, exact match, first divergence, the
bootstrap interval) is computed here and nowhere else; per-run aggregates come from
``specbench.metrics.aggregate``. The benchmark suites (``specbench.bench``) print this module's
``steps`` view of their run folders.

Everything is derived from the raw ``samples.jsonl`` records (docs/design.md#results-on-disk): metrics are
recomputed with ``specbench.metrics.aggregate`` instead of being read from ``summary.json``, and
speedup and exact match are computed against the matching AR run on the (sample_id, turn) keys that
both runs have, since runs can stop at different limits.

Modules: ``read`` (run folders -> frames), ``compare`` (pairing with AR, speedup, exact match,
provenance), ``view`` (the tables), ``__main__`` (the command line).

Usage: ``python -m specbench.report RUN_DIR [RUN_DIR...] [--csv OUT.csv] [--divergences] [--by category]
[--merge-repeats] [--view runs|steps]``
"""
