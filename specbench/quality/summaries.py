"""ROUGE of generated summaries (CNN/DailyMail, XSum) against the reference summary.

``rouge`` gives the F1 (``fmeasure``) of ROUGE-1, ROUGE-2 and ROUGE-L from the ``rouge-score`` package
(Google's reimplementation of the original Perl script) with its default tokenizer (lower-cased,
non-alphanumerics as separators) and the Porter stemmer (``use_stemmer=True``). ROUGE-L is the
summary-level longest common subsequence over the whole text (``rougeL``, not the per-sentence
``rougeLsum``). The output is first cut at the first ``"\\nArticle:"`` (``summary_text``): with the raw
1-shot prompt a base model tends to go on to a next article of its own, which is not its summary.
"""

from __future__ import annotations

from functools import cache
from typing import Any

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
NEXT_ARTICLE = "\nArticle:"


@cache
def scorer() -> Any:
    """The rouge-score scorer for ``ROUGE_TYPES`` with stemming (built once; the import takes a second)."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def summary_text(output: str) -> str:
    """The summary an output holds: the text before a next ``Article:`` block, stripped."""
    return output.split(NEXT_ARTICLE, 1)[0].strip()


def rouge(output: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F1 of the output's summary against the reference summary."""
    scores = scorer().score(reference, summary_text(output))
    return {name: float(scores[name].fmeasure) for name in ROUGE_TYPES}
