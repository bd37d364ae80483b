"""Parity with the official implementations: the authors' code and specbench on the same token prompts.

``python -m specbench.parity METHOD`` (``make parity METHOD=...``) renders the prompts with specbench's
own dataset loader, runs the official code (PyPI package or GitHub checkout at a pinned commit) in its
side virtual env (``.venv-parity-<method>``) as a subprocess on those token ids, runs specbench's loop +
drafter in this process with the same settings, and writes a per-prompt table to
``results/parity/<method>.md`` (raw records beside it as ``<method>.json``). Steps are verify forwards
after the prefill on both sides. Deterministic methods compare step for step (``stepwise``); LADE,
whose random initial window moves a generation's step count by several percent, compares totals over
seeds (``lade``); ANPD's release has no decoding loop, so ``anpd`` compares its n-gram model alone.
"""
