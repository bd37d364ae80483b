"""Parity with the official implementations: the authors' code and specbench on the same token prompts.

``python -m specbench.parity METHOD`` (``make parity``) renders the prompts with specbench's own
dataset loader, runs the official package in its side virtual env (``.venv-parity-<method>``, built by
``make parity``) as a subprocess on those token ids, runs specbench's loop + drafter in this process
with the same settings, and writes a per-prompt table to ``results/parity/<method>.md`` (raw records
beside it as ``<method>.json``). Steps are verify forwards after the prefill on both sides; every
number is measured over several seeds, because the random initial state of a method (LADE's window)
moves a single generation's step count by several percent.

Only LADE is wired (``specbench.parity.lade``); ``docs/reproduction.md`` says for every other method
why its official code cannot run here.
"""
