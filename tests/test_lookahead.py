"""Lookahead drafter: greedy output equals AR (tiny and embedded models), all draft modes, warm-up."""

from types import SimpleNamespace

import pytest
import torch

from specbench.core.acceptance import Sampling
from specbench.core.loop import Decoder
from specbench.drafters.ar import NoDraft
from specbench.drafters.lookahead import MODES, Lookahead, warmup_answer_ids
from specbench.errors import ConfigError
from tests.test_loop import ar_greedy

PROMPT = [5, 6, 7, 8, 9, 10] * 4
GREEDY = Sampling()
OFFICIAL_RULES = {
    "cut_at_eos": True,
    "insert_first_prompt_token": False,
    "selection": "output_threshold",
    "query_fallback": "official",
    "single_ranking": "output_first",
    "parallel_verify": "all_branches",
    "node_pruning": "official",
    "branch_window": "fixed",
}
"""Every switch set to the official code's rule (docs/methods/lookahead.md)."""
RULES = {"specbench": {}, "official": OFFICIAL_RULES}


def generate(model, drafter, prompt, max_new_tokens, eos_ids=frozenset(), sampling=GREEDY, seed=None):
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.inference_mode():
        return Decoder(model, drafter, eos_ids, sampling).generate(prompt, max_new_tokens, generator)


def lookahead(mode, **kwargs):
    drafter = Lookahead(mode=mode, **{"decoding_length": 16, "branch_length": 6, **kwargs})
    drafter.setup(None, None)
    return drafter


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("mode", MODES)
def test_greedy_equals_ar_and_memory_learns_across_requests(tiny, mode, rules):
    truth = ar_greedy(tiny, PROMPT, 60).output_ids
    drafter = lookahead(mode, **RULES[rules])
    first = generate(tiny, drafter, PROMPT, 60)
    assert first.output_ids == truth
    assert max(first.accept_lengths) > 1  # the output repeats itself: its own branches get accepted
    second = generate(tiny, drafter, PROMPT, 60)  # the first answer is now in the output memory
    assert second.output_ids == truth
    assert second.target_forwards < first.target_forwards
    stats = drafter.stats()
    assert stats["steps"] == second.target_forwards and stats["hit_rate"] > 0.5
    assert stats["output_nodes"] > 0 and stats["input_nodes"] > 0 and stats["retrieve_s"] > 0
    assert stats["nodes_per_step"] <= 15 and stats["depth_per_step"] <= 6
    if mode == "single":
        assert second.draft_tokens and max(second.draft_tokens) <= 6


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("mode", MODES)
def test_eos_inside_a_draft_and_budget_cut(tiny, mode, rules):
    truth = ar_greedy(tiny, PROMPT, 60).output_ids
    stop = next(i for i, token in enumerate(truth) if i >= 8 and truth.index(token) == i)
    eos = truth[stop]  # a token first produced late in the answer
    drafter = lookahead(mode, **RULES[rules])  # no EOS known to the drafter: cut_at_eos cuts nothing
    generate(tiny, drafter, PROMPT, 60)  # learn the full answer
    gen = generate(tiny, drafter, PROMPT, 60, frozenset({eos}))
    assert gen.output_ids == truth[: stop + 1] and gen.stop_reason == "eos"
    assert gen.accept_lengths[-1] > 1  # the EOS came inside an accepted draft
    cut = generate(tiny, drafter, PROMPT, 9)
    assert cut.output_ids == truth[:9] and cut.stop_reason == "max_new_tokens"
    assert max(cut.accept_lengths) > 1


def test_sampling_through_the_loop_matches_ar_draws(tiny):
    sampling = Sampling(temperature=0.7, top_p=0.95)
    reference = generate(tiny, NoDraft(), PROMPT, 40, sampling=sampling, seed=3).output_ids
    drafter = lookahead("hierarchical")
    for _ in range(2):  # sample-and-match draws one target sample per emitted token, like AR
        assert generate(tiny, drafter, PROMPT, 40, sampling=sampling, seed=3).output_ids == reference


def test_prompt_branches_are_drafted_and_eliminated_at_the_next_request(tiny):
    drafter = lookahead("hierarchical", branch_length=4)
    drafter.reset([1, 2, 3, 4, 5, 6])
    assert drafter.memory.sizes()["input_nodes"] > 0
    drafter.reset([9, 9])
    assert drafter.memory.match([2, 3]) is None  # the first prompt's branches are gone
    assert drafter.memory.match([9, 9]) is not None


@pytest.mark.parametrize("mode", MODES)
def test_branch_length_zero_and_decoding_length_one_mean_no_draft(tiny, mode):
    truth = ar_greedy(tiny, PROMPT, 20).output_ids
    for kwargs in ({"branch_length": 0}, {"decoding_length": 1}):
        for rules in RULES.values():
            drafter = lookahead(mode, **kwargs, **rules)
            generate(tiny, drafter, PROMPT, 20)
            gen = generate(tiny, drafter, PROMPT, 20)
            assert gen.output_ids == truth and set(gen.draft_tokens) == {0}


def test_official_fallback_does_not_cap_the_single_branch_by_decoding_length(tiny):
    """The official one-branch retrieval clips L_b to the budget only; specbench's default also to L_d - 1."""
    depths = {}
    for fallback in ("drafted", "official"):
        drafter = lookahead("single", decoding_length=2, query_fallback=fallback)
        generate(tiny, drafter, PROMPT, 30)
        gen = generate(tiny, drafter, PROMPT, 30)
        assert gen.output_ids == ar_greedy(tiny, PROMPT, 30).output_ids
        depths[fallback] = max(gen.draft_tokens)
    assert depths == {"drafted": 1, "official": 6}


def all_tokens(memory) -> set[int]:
    """Every token in the memory: the tries' first tokens and every node's."""
    found = set(memory.mem)
    stack = list(memory.mem.values())
    while stack:
        node = stack.pop()
        found.update(node.children)
        stack.extend(node.children.values())
    return found


def test_cut_at_eos_and_skipped_first_prompt_token_follow_the_official_insertions(tiny):
    """The official put / stream_put cut every inserted sequence at its first EOS, and the prompt's first
    token opens no branch; specbench's default inserts the whole prompt and the output's EOS."""
    truth = ar_greedy(tiny, PROMPT, 60).output_ids
    stop = next(i for i, token in enumerate(truth) if i >= 8 and truth.index(token) == i)
    eos = truth[stop]
    prompt = [50, 51, 54, eos, 52, 53]
    eos_tokenizer = SimpleNamespace(eos_token_id=eos)
    default = Lookahead(decoding_length=16, branch_length=6)
    default.setup(tiny, eos_tokenizer)
    default.reset(prompt)
    assert all_tokens(default.memory) >= {50, 51, eos, 52, 53}
    official = Lookahead(decoding_length=16, branch_length=6, cut_at_eos=True, insert_first_prompt_token=False)
    official.setup(tiny, eos_tokenizer)
    official.reset(prompt)
    assert sorted(official.memory.mem) == [51] and all_tokens(official.memory) == {51, 54}
    gen = generate(tiny, official, PROMPT, 60, frozenset({eos}))
    assert gen.output_ids == truth[: stop + 1]
    official.reset([60, 61])  # the previous output's last windows go in, without its EOS
    assert eos not in all_tokens(official.memory) and truth[stop - 1] in official.memory.mem


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"decoding_length": 0}, "decoding_length"),
        ({"branch_length": -1}, "branch_length"),
        ({"mode": "tree"}, "mode"),
        ({"output_weight": 1.5}, "output_weight"),
        ({"max_query_length": 0}, "max_query_length"),
        ({"selection": "top"}, "selection"),
        ({"query_fallback": "never"}, "query_fallback"),
        ({"single_ranking": "input"}, "single_ranking"),
        ({"parallel_verify": "last"}, "parallel_verify"),
        ({"node_pruning": "never"}, "node_pruning"),
        ({"branch_window": "long"}, "branch_window"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        Lookahead(**kwargs)


class WordTokenizer:
    """A whitespace tokenizer with the HF batch-call shape (enough for warm-up)."""

    eos_token_id = 0

    def __init__(self):
        self.vocab = {}

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [[self.vocab.setdefault(w, len(self.vocab) + 1) for w in t.split()] for t in texts]}


def test_warmup_inserts_dev_answers_as_output_branches(shared_data):
    tokenizer = WordTokenizer()
    spec = {"dataset": "dolly", "limit": 3, "data_dir": str(shared_data)}
    ids = warmup_answer_ids(spec, tokenizer)
    assert len(ids) == 3 and all(seq[-1] == 0 for seq in ids)
    drafter = Lookahead(warmup=spec)
    drafter.setup(None, tokenizer)
    sizes = drafter.stats()
    assert sizes["warmup_answers"] == 3 and sizes["output_nodes"] > 0 and sizes["input_nodes"] == 0
    draft = drafter.memory.retrieve(ids[0][:2], 64, 12)
    assert draft.tokens[1:4] == ids[0][2:5]
    assert warmup_answer_ids({"dataset": None}, tokenizer) == []
    with pytest.raises(ConfigError, match="no dev split"):
        warmup_answer_ids({"dataset": "humaneval", "data_dir": str(shared_data)}, tokenizer)
    with pytest.raises(ConfigError, match="not a dataset config"):
        warmup_answer_ids({"dataset": "nope"}, tokenizer)
    with pytest.raises(ConfigError, match="unknown keys"):
        warmup_answer_ids({"datasets": "dolly"}, tokenizer)


def test_gsm8k_warms_up_from_its_train_split(tmp_path):
    """The PIA README warms the trie with the data it does not evaluate: GSM8K's train split."""
    import json

    train = [{"question": f"q{i}", "answer": f"step {i} #### {i}"} for i in range(3)]
    (tmp_path / "gsm8k_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"question": "t", "answer": "x #### 1"}) + "\n")
    ids = warmup_answer_ids({"dataset": "gsm8k", "data_dir": str(tmp_path)}, WordTokenizer())
    assert len(ids) == 3 and all(seq[-1] == 0 for seq in ids)


def test_table5_ablation_switches(tiny, shared_data):
    """W/o prompt inserts no prompt branches, W/o output no output branches (not even the warm-up's), W/o
    elimination keeps a finished prompt's branches for the next request; every variant stays lossless."""
    no_prompt = Lookahead(branch_length=4, insert_prompt=False)
    no_prompt.reset([1, 2, 3, 4, 5, 6])
    assert no_prompt.memory.sizes()["nodes"] == 0
    no_output = Lookahead(
        branch_length=4, insert_output=False, warmup={"dataset": "dolly", "limit": 3, "data_dir": str(shared_data)}
    )
    no_output.setup(None, WordTokenizer())
    no_output.reset([1, 2, 3, 4])
    no_output.memory.stream_output([5, 6, 7, 8, 9, 10, 11])
    no_output.reset([9, 9])
    assert no_output.memory.sizes()["output_nodes"] == 0
    kept = Lookahead(branch_length=4, eliminate_input=False)
    kept.reset([1, 2, 3, 4, 5, 6])
    kept.reset([9, 9])
    assert kept.memory.match([2, 3]) is not None  # the first prompt's branches survive the next request
    truth = ar_greedy(tiny, PROMPT, 30).output_ids
    for switch in ("insert_prompt", "insert_output", "eliminate_input"):
        drafter = lookahead("hierarchical", **{switch: False})
        for _ in range(2):
            assert generate(tiny, drafter, PROMPT, 30).output_ids == truth


@pytest.mark.parametrize(
    "ablation,setting",
    [
        ("full", ""),
        ("no_prompt", "method.drafter.insert_prompt=false"),
        ("no_output", "method.drafter.insert_output=false"),
        ("no_pruning", "method.drafter.prune_min_trees=1000000000"),
        ("no_elimination", "method.drafter.eliminate_input=false"),
    ],
)
def test_ablation_configs_set_one_switch(ablation, setting):
    """conf/lookahead_ablation/<name> sets exactly the knob the paper_values rows of Table 5 name."""
    from specbench.reproduce.coverage import job_of

    job = job_of("test", ["method=lookahead", "model=tiny_llama", f"+lookahead_ablation={ablation}"])
    assert job.setting == setting


@pytest.mark.slow
def test_embedded_greedy_equals_ar_in_every_mode(embedded):
    tok = embedded.tokenizer
    questions = [
        "Write a Python function add(a, b) that returns a + b, then call it on 2 and 3.",
        "What is the capital of France? Answer in one word.",  # stops with EOS after 8 tokens
        "Repeat this list exactly, twice: red apple, green pear, yellow lemon, blue plum.",
    ]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for q in questions
    ]
    truths = [ar_greedy(embedded.model, p, 40, embedded.eos_ids) for p in prompts]
    assert truths[1].stop_reason == "eos"
    for mode, rules in [(mode, rules) for mode in MODES for rules in RULES.values()]:
        drafter = Lookahead(decoding_length=16, branch_length=8, mode=mode, **rules)
        drafter.setup(embedded.model, tok)
        for prompt, truth in zip(prompts if mode == "hierarchical" else prompts[:2], truths):
            assert generate(embedded.model, drafter, prompt, 40, embedded.eos_ids).output_ids == truth.output_ids
        again = generate(embedded.model, drafter, prompts[0], 40, embedded.eos_ids)  # learned: long drafts
        assert again.output_ids == truths[0].output_ids and max(again.accept_lengths) > 4
        cut = generate(embedded.model, drafter, prompts[0], 13, embedded.eos_ids)  # budget inside a draft
        assert cut.output_ids == truths[0].output_ids[:13] and max(cut.accept_lengths) > 1
        eos = generate(embedded.model, drafter, prompts[1], 40, embedded.eos_ids)  # EOS inside a draft
        assert eos.output_ids == truths[1].output_ids and eos.stop_reason == "eos"
        assert eos.accept_lengths[-1] > 1, mode


def switches(drafter: Lookahead) -> dict:
    """The drafter's official-rule switches by option name."""
    return {
        "cut_at_eos": drafter.cut_at_eos,
        "insert_first_prompt_token": drafter.insert_first_prompt_token,
        "parallel_verify": drafter.parallel_verify,
        **vars(drafter.rules),
    }


def test_parity_cases_set_the_official_rules_through_the_config():
    """The parity driver's cases compose (the `+method.drafter.<key>` overrides) into the drafters they name."""
    from specbench.config import compose_config
    from specbench.engines import check_method
    from specbench.parity.lookahead import CASE_LABELS, cases

    mode_only = {"hierarchical": set(), "parallel": {"parallel_verify"}, "single": {"single_ranking"}}
    default = switches(Lookahead())
    found = cases(None)
    assert [case.label for case in found] == list(CASE_LABELS)
    for case in found:
        drafter = check_method(compose_config("model=tiny_llama", "method=lookahead", *case.overrides).method)
        assert isinstance(drafter, Lookahead) and case.label.startswith(drafter.mode)
        on = set()
        if case.label.endswith("official-rules"):
            on = set(OFFICIAL_RULES) - {"parallel_verify", "single_ranking"} | mode_only[drafter.mode]
        assert switches(drafter) == {key: OFFICIAL_RULES[key] if key in on else value for key, value in default.items()}
