"""How good a draft is for its target: teacher-forced agreement, simulated chain acceptance, step latency.

Teacher-forced agreement is exact for greedy speculative decoding: every committed token is the
target's own greedy token, so when a chain step starts at answer position ``t`` the draft sees
exactly the target's context, and its i-th drafted token is accepted iff the draft's argmax agrees
with the target's at ``t .. t+i-1``. Walking the held-out answers step by step (the prefill emits
the first token; each step accepts the run of agreements, at most gamma, plus one target token)
therefore gives the tokens per step a gamma-chain SpeDe run would get on those answers, up to
float noise between batched and incremental forwards.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache

from specbench.train.batches import answer_logits, collate
from specbench.train.selfdistill import SelfDistilled


def chain_steps(matches: list[bool], gamma: int) -> int:
    """Verify steps a gamma-chain needs to emit answer tokens 1.. (token 0 comes from the prefill)."""
    position, steps = 1, 0
    while position < len(matches):
        accepted = 0
        while accepted < gamma and position + accepted < len(matches) and matches[position + accepted]:
            accepted += 1
        position += accepted + 1  # the accepted drafts plus the target's correction / bonus token
        steps += 1
    return steps


RANKS_REPORTED = 8
"""Rank hit rates reported: a^(r) for r < RANKS_REPORTED, the profile a static draft tree is built from."""


@torch.no_grad()
def target_ranks(draft, items: list[SelfDistilled], pad_id: int, batch_size: int) -> list[list[int]]:
    """Per held-out answer: the rank of the target's greedy token among the draft's logits at each position."""
    device = next(draft.parameters()).device
    ranks = []
    for start in range(0, len(items), batch_size):
        batch = collate(items[start : start + batch_size], pad_id).to(device)
        logits = answer_logits(draft, batch)  # [rows, vocab]
        target = logits.gather(1, batch.teacher_argmax[:, None])  # [rows, 1]
        rank = (logits > target).sum(dim=-1).tolist()  # [rows]: 0 = the draft's argmax agrees
        for length in batch.lengths():
            ranks.append(rank[:length])
            rank = rank[length:]
    return ranks


def agreement_report(draft, items: list[SelfDistilled], pad_id: int, gammas: list[int], batch_size: int = 8) -> dict:
    """Top-1 agreement and rank hit rates on held-out answers and, per gamma, simulated tokens per step."""
    was_training = draft.training
    draft.eval()
    ranks = target_ranks(draft, items, pad_id, batch_size)
    draft.train(was_training)
    matches = [[rank == 0 for rank in answer] for answer in ranks]
    positions = sum(map(len, matches))
    emitted = sum(len(m) - 1 for m in matches)  # tokens emitted by verify steps (prefill excluded)
    flat = [rank for answer in ranks for rank in answer]
    report = {
        "sequences": len(items),
        "positions": positions,
        "agreement": round(sum(map(sum, matches)) / positions, 4),
        "rank_hits": [round(flat.count(r) / positions, 4) for r in range(RANKS_REPORTED)],
    }
    for gamma in gammas:
        steps = sum(chain_steps(m, gamma) for m in matches)
        report[f"tokens_per_step_gamma{gamma}"] = round(emitted / steps, 3) if steps else None
    return report


def median_latency(model, context: torch.Tensor, new_tokens: int, repeats: int) -> float:
    """Median seconds of one cached forward of ``new_tokens`` tokens after ``context`` ([1, ctx])."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=context, past_key_values=cache, use_cache=True)
        step = context[:, -new_tokens:]  # [1, new_tokens] (their values do not affect the cost)
        times = []
        for _ in range(repeats + 2):  # two untimed warm-up passes
            start = time.perf_counter()
            model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=new_tokens)
            times.append(time.perf_counter() - start)
            cache.crop(-new_tokens)  # back to the context alone
    return statistics.median(times[2:])


def latency_report(target, draft, context_ids: list[int], gammas: list[int], repeats: int = 10) -> dict:
    """Draft vs target step latency at one context, and the speedup each gamma-chain would give.

    A gamma-chain step costs gamma draft forwards plus one target forward of gamma + 1 tokens;
    AR costs one one-token target forward per token.
    """
    device = next(draft.parameters()).device
    context = torch.tensor([context_ids], device=device)  # [1, ctx]
    draft_s = median_latency(draft, context, 1, repeats)
    target_s = median_latency(target, context, 1, repeats)
    report = {
        "context_tokens": len(context_ids),
        "draft_step_ms": round(draft_s * 1e3, 2),
        "target_step_ms": round(target_s * 1e3, 2),
        "draft_to_target": round(draft_s / target_s, 3),
    }
    for gamma in gammas:
        verify_s = median_latency(target, context, gamma + 1, repeats)
        report[f"target_verify{gamma + 1}_ms"] = round(verify_s * 1e3, 2)
        report[f"chain_step_cost_gamma{gamma}"] = round((gamma * draft_s + verify_s) / target_s, 3)
    return report


def expected_speedup(heldout: dict, latency: dict, gammas: list[int]) -> dict:
    """Tokens per step / step cost in AR steps, per gamma (the ideal speedup, ignoring Python overhead)."""
    return {
        f"gamma{g}": round(heldout[f"tokens_per_step_gamma{g}"] / latency[f"chain_step_cost_gamma{g}"], 3)
        for g in gammas
        if heldout.get(f"tokens_per_step_gamma{g}")
    }
