"""Quality of generated outputs, scored against the dataset's references (no model, no tokenizer, no torch).

Each dataset class names its metric in ``Dataset.quality``:

- ``pass@1`` (HumanEval, MBPP): the output's program passes its tests in a time-limited child process
  (``specbench.quality.code``; the only place where code is executed);
- ``answer_accuracy`` (GSM8K, GSM-100): the output's last number equals the reference's ``#### N``
  (``specbench.quality.answers``);
- ``rouge`` (CNN/DailyMail, XSum): ROUGE-1/2/L F1 against the reference summary
  (``specbench.quality.summaries``);
- None elsewhere: the report says "no quality metric for dataset X".

``score_run(run_dir)`` rebuilds a run's samples from its config and scores its records;
``score_records`` scores records against samples the caller already holds; ``compare_quality`` puts two
runs' scores side by side with a paired bootstrap interval of their difference.
"""

from __future__ import annotations

from specbench.quality.compare import QualityDifference, compare_quality
from specbench.quality.scores import (
    SCORERS,
    QualityReport,
    SampleScore,
    run_dataset,
    run_records,
    score_records,
    score_run,
)

__all__ = [
    "SCORERS",
    "QualityDifference",
    "QualityReport",
    "SampleScore",
    "compare_quality",
    "run_dataset",
    "run_records",
    "score_records",
    "score_run",
]
