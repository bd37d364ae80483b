"""Compare two runs' quality (a method against AR at the same temperature) on the samples both scored.

For each score of the metric, the difference of means (run minus baseline) over the common samples and a
paired percentile bootstrap interval of it: ``BOOTSTRAP_SAMPLES`` resamples of the per-sample
differences, drawn with replacement with ``numpy.random.default_rng(seed)``, the interval between the
(1 - level) / 2 and (1 + level) / 2 quantiles of the resampled means (95 % by default, as the report's
speedup interval). Pairing removes the problem-to-problem variance both runs share. An interval that holds
0 means the runs agree within sampling error (``agrees``), which is not proof that they are equal: with
few samples the interval is wide. When every pair scores the same the interval is [0, 0].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbench.quality.scores import QualityReport

BOOTSTRAP_SAMPLES = 1000
LEVEL = 0.95


@dataclass(frozen=True)
class QualityDifference:
    """One score of two runs on their common samples: the means, their difference and its interval."""

    score: str
    n_pairs: int
    mean: float
    baseline_mean: float
    difference: float
    ci_low: float
    ci_high: float

    @property
    def agrees(self) -> bool:
        """Whether the interval holds 0: no quality difference beyond sampling error."""
        return self.ci_low <= 0.0 <= self.ci_high


def paired_scores(run: QualityReport, baseline: QualityReport, score: str) -> tuple[np.ndarray, np.ndarray]:
    """The two runs' ``score`` on the sample ids both scored, in the run's order."""
    theirs = {s.sample_id: s.scores[score] for s in baseline.samples}
    common = [s for s in run.samples if s.sample_id in theirs]
    return np.array([s.scores[score] for s in common]), np.array([theirs[s.sample_id] for s in common])


def bootstrap_interval(
    differences: np.ndarray, resamples: int = BOOTSTRAP_SAMPLES, seed: int = 0, level: float = LEVEL
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``differences`` at ``level``."""
    draws = np.random.default_rng(seed).integers(len(differences), size=(resamples, len(differences)))
    means = differences[draws].mean(axis=1)
    tail = (1.0 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def check_comparable(run: QualityReport, baseline: QualityReport) -> None:
    """A ValueError unless both reports scored the same metric."""
    if run.metric is None or run.metric != baseline.metric:
        raise ValueError(
            f"cannot compare quality: the runs were scored with {run.metric!r} and {baseline.metric!r} "
            f"({run.note or baseline.note or 'different metrics'})"
        )


def compare_quality(
    run: QualityReport,
    baseline: QualityReport,
    *,
    resamples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> list[QualityDifference]:
    """Per score: run mean - baseline mean on the common samples, with its paired bootstrap interval."""
    check_comparable(run, baseline)
    differences = []
    for score in run.means:
        mine, theirs = paired_scores(run, baseline, score)
        if not len(mine):
            raise ValueError(f"cannot compare quality: {run.run_dir} and {baseline.run_dir} share no scored sample")
        low, high = bootstrap_interval(mine - theirs, resamples, seed, level)
        mean, baseline_mean = float(mine.mean()), float(theirs.mean())
        differences.append(QualityDifference(score, len(mine), mean, baseline_mean, mean - baseline_mean, low, high))
    return differences
