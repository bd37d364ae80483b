"""EAGLE-3.1 head training: the EAGLE-3 trainer (``specbench.train.eagle3``) with the head's two norms switched on.

``python -m specbench.train eagle3_1 model=smollm2_135m [head.*=...] [train.*=...] [prompts.*=...]``

conf/train/eagle3_1.yaml is conf/train/eagle3.yaml with ``head.fc_norm`` (an RMSNorm per fused layer before ``fc``)
and ``head.norm_output`` (the post-norm output fed to the next drafting step, in training-time test as in decoding);
the head is saved apart, to ``$SPECBENCH_CACHE/eagle3_1/<model>``, so EAGLE-3 and EAGLE-3.1 can run side by side.
"""

from __future__ import annotations

from pathlib import Path

from specbench.train.eagle3 import Eagle3Settings, Eagle3Trainer
from specbench.train.heads import run_head_trainer


class Eagle31Trainer(
    Eagle3Trainer,
    command="eagle3_1",
    name="EAGLE-3.1",
    head_key="head",
    schema=Eagle3Settings,
    soft_labels=True,
):
    """EAGLE-3's training flow for a head with EAGLE-3.1's norms (its config says which)."""


def main(overrides: list[str]) -> Path:
    """Train (or reuse) the EAGLE-3.1 head for ``model``; print and save its per-depth held-out accuracy."""
    return run_head_trainer(Eagle31Trainer, overrides)
