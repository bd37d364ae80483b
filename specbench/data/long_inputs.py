"""Long inputs by length bucket: several consecutive CNN/DailyMail test articles to summarize, the prompt cut to a
given number of the model's tokens (``input_tokens``: a bucket such as 1024, 2048, 4096 or 7936 for an 8k context).

Input length changes which method wins (a step reads the whole KV cache, so long contexts make every forward
slower and drafting relatively cheaper; retrieval drafters find more to copy in a long prompt). This dataset holds
the task fixed and moves only the length: each sample is a run of consecutive articles, as many as its bucket
needs (whole articles, taken in file order, no article in two samples of one bucket), and its prompt is the
instruction and the articles cut at the token where the rendered prompt reaches ``input_tokens`` (``prompt``;
the run's records keep the exact ``prompt_tokens``). The articles come from CNN/DM's test split (the offline copy in
data_dir, else the Hub), not from the text corpus, which the corpus-backed drafters (SAM, REST, Self-Draft) index:
a prompt from their own datastore would hand them its continuation.

The dataset's name carries the bucket (``long_inputs_4096``): runs of two buckets are two datasets for the report,
so each pairs with the AR run of its own length.
"""

from __future__ import annotations

import dataclasses

from specbench.data.base import Dataset, Sample
from specbench.data.prompts import encode
from specbench.data.summarization import CNNDailyMail
from specbench.errors import ConfigError

INSTRUCTION = "Summarize the news articles below in a few sentences."
WORDS_PER_TOKEN = 0.75
"""English words per token of the usual BPE vocabularies (about 1.3 tokens a word): a sample gathers articles until
their words reach the bucket's tokens, which leaves a margin after the cut."""
ARTICLE_SEPARATOR = "\n\n"


class LongInputs(Dataset):
    """CNN/DM test articles grouped into prompts of ``input_tokens`` tokens (a length bucket); no reference summary
    (a group has none), so no quality metric."""

    local_file = CNNDailyMail.local_file
    hub_id = CNNDailyMail.hub_id
    hub_config = CNNDailyMail.hub_config
    sampler = "prefix"

    def __init__(self, name: str, input_tokens: int, instruction: str = INSTRUCTION, **kwargs):
        if not isinstance(input_tokens, int) or input_tokens < 64:
            raise ConfigError(f"dataset.input_tokens must be an integer >= 64 (got {input_tokens!r})")
        super().__init__(name, **kwargs)
        self.input_tokens = input_tokens
        self.instruction = instruction

    def required_fields(self) -> tuple[tuple[str, ...], ...]:
        """CNN/DM records: id and article."""
        return ("id",), (CNNDailyMail.document_field,)

    def field_types(self) -> dict:
        """The id and the article are text."""
        return dict.fromkeys(("id", CNNDailyMail.document_field), str)

    def group_from(self, records: list[dict], start: int) -> range | None:
        """The records from ``start`` on whose words first reach the bucket (``WORDS_PER_TOKEN``); None when the
        records left do not."""
        words = 0
        for index in range(start, len(records)):
            words += len(records[index][CNNDailyMail.document_field].split())
            if words >= self.input_tokens * WORDS_PER_TOKEN:
                return range(start, index + 1)
        return None

    def groups(self, records: list[dict]) -> list[range]:
        """Consecutive, disjoint groups (``group_from``) in file order; the tail that does not fill one is left out."""
        groups: list[range] = []
        while (group := self.group_from(records, groups[-1].stop if groups else 0)) is not None:
            groups.append(group)
        return groups

    def pool(self, records: list[dict]) -> list[int]:
        """The first record of every group (``groups``): one sample each."""
        starts = [group.start for group in self.groups(records)]
        if not starts:
            raise ConfigError(
                f"dataset {self.name}: the {len(records)} articles of {self.resolved_source} do not fill one prompt of "
                f"{self.input_tokens} tokens; use a smaller dataset.input_tokens or the Hub's full split"
            )
        return starts

    def to_sample(self, index: int, record: dict) -> Sample:
        """The group that starts at ``index``: its articles joined, the instruction as the user turn's head."""
        records = self.records()
        group = self.group_from(records, index)
        assert group is not None  # index is a group's start (pool)
        articles = [records[i][CNNDailyMail.document_field].strip() for i in group]
        return Sample(
            sample_id=f"{record['id']}+{len(group) - 1}",
            turns=[self.turn(ARTICLE_SEPARATOR.join(articles))],
            category=f"{self.input_tokens}_tokens",
            meta={"articles": len(group), "input_tokens": self.input_tokens},
        )

    def turn(self, document: str) -> str:
        """The user turn: the instruction, then the articles."""
        return f"{self.instruction}\n\n{document}"

    def prompt(self, tokenizer, sample: Sample, answers: list[str]) -> str:
        """The prompt of the sample cut to ``input_tokens`` tokens: the articles end at the last of their tokens that
        keeps the rendered prompt within the bucket (bisection over the articles' tokens)."""
        ids = list(tokenizer(sample.turns[0][len(self.turn("")) :], add_special_tokens=False)["input_ids"])
        fmt = self.format_used(tokenizer)

        def rendered(count: int) -> str:
            """The prompt with the articles' first ``count`` tokens."""
            cut = dataclasses.replace(sample, turns=[self.turn(tokenizer.decode(ids[:count]))])
            return super(LongInputs, self).prompt(tokenizer, cut, answers)

        def fits(count: int) -> bool:
            """Whether that prompt stays within the bucket."""
            return len(encode(tokenizer, rendered(count), fmt)) <= self.input_tokens

        if not fits(0):
            raise ConfigError(f"dataset {self.name}: instruction and format alone exceed {self.input_tokens} tokens")
        low, high = 0, len(ids)
        while low < high:  # the largest count that fits
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        if low == len(ids):
            raise ConfigError(
                f"dataset {self.name}: sample {sample.sample_id} holds fewer than {self.input_tokens} tokens of "
                "articles (the words-per-token margin, WORDS_PER_TOKEN, is too small for this tokenizer)"
            )
        return rendered(low)
