"""The PARD draft's format: the config key naming its mask token, how a draft gets one, and how a run finds it.

A PARD draft (An et al., ICLR 2026) is a causal LM whose config names the token that stands for a position not
known yet (``pard_token``, as the published ``amd/PARD-*`` checkpoints and vLLM's parallel drafting read it). The
trainer (``specbench.train.pard``) gives an adapted draft one; the drafter (``specbench.drafters.pard``) reads it.
"""

from __future__ import annotations

import torch

from specbench.errors import ConfigError

MASK_CONFIG_KEY = "pard_token"
"""The draft config's key naming its mask token."""


def with_mask_token(draft, given: int | None) -> int:
    """The draft's mask token: ``given``, else a new id appended to its vocabulary (its embedding row starts at the
    mean row); recorded in its config under MASK_CONFIG_KEY."""
    if given is None:
        vocab = draft.get_input_embeddings().weight.shape[0]
        mean = draft.get_input_embeddings().weight.detach().mean(dim=0)
        draft.resize_token_embeddings(vocab + 1, mean_resizing=False)
        with torch.no_grad():
            draft.get_input_embeddings().weight[vocab] = mean
        given = vocab
    setattr(draft.config, MASK_CONFIG_KEY, int(given))
    return int(given)


def mask_token_of(draft_config, given: int | None, node_token: int | None, vocab: int, named: str, way_out: str) -> int:
    """The mask token a run drafts with: ``given`` (a setting), else the draft config's MASK_CONFIG_KEY, else
    ``node_token`` (a random draft's model node names one); a ConfigError naming the draft (``named``) and
    ``way_out`` when there is none, or when it is outside the draft's ``vocab`` token ids."""
    mask = next(
        (token for token in (given, getattr(draft_config, MASK_CONFIG_KEY, None), node_token) if token is not None),
        None,
    )
    if mask is None:
        raise ConfigError(
            f"the draft {named} names no mask token (config.{MASK_CONFIG_KEY}): it is not a PARD draft. {way_out}"
        )
    if not 0 <= mask < vocab:
        raise ConfigError(f"the PARD mask token {mask} is outside the draft's {vocab} token ids")
    return int(mask)
