"""specbench.parity: official-vs-specbench tables, verdicts, trace cuts, official draws (no model, no side env)."""

import random

import pytest

from specbench.parity import lade as parity
from specbench.parity import stepwise
from specbench.parity.common import OfficialSource, SideEnv


def test_setting_and_variant_parse():
    setting = parity.Setting.parse("7,5,7")
    assert (setting.window, setting.ngram, setting.guess) == (7, 5, 7)
    assert setting.overrides()[0] == "method.drafter.window_size=7"
    with pytest.raises(SystemExit):
        parity.Setting.parse("7,5")
    variant = parity.Variant.parse("old=method.drafter.official_step_cap=false;method.drafter.prefill_window=false")
    assert variant.label == "old" and len(variant.overrides) == 2 and not variant.official_start
    assert parity.Variant.parse("specbench=").overrides == []


def test_official_draws_are_python_random_after_random_seed():
    prompt = [11, 22, 33, 44, 55]
    random.seed(3)  # what the patched official generate does for seed 3
    expected = [random.choice(prompt) for _ in range(9)]
    assert parity.official_draws(prompt, 9, 3) == expected


def test_verdict_uses_the_larger_of_two_percent_and_the_seed_noise():
    diff, noise, ok = parity.verdict([100, 100, 100], [101, 101, 101])
    assert diff == pytest.approx(0.01) and noise == 0 and ok
    diff, noise, ok = parity.verdict([100, 100, 100], [105, 105, 105])
    assert not ok
    diff, noise, ok = parity.verdict([90, 100, 110], [95, 105, 115])  # +5 %, but the seeds spread 20 %
    assert diff == pytest.approx(0.05) and noise > 0.05 and ok


def record(sid, seed, steps, out):
    return {"id": sid, "seed": seed, "steps": steps, "accept_lengths": [], "output_ids": out}


def test_table_lists_every_prompt_and_flags_outputs_unequal_to_ar(tmp_path):
    ar = {"p0": [1, 2, 3], "p1": [4, 5]}
    official = [
        {"id": "p0", "seed": None, "ar_output_ids": [1, 2, 3]},
        {"id": "p1", "seed": None, "ar_output_ids": [4, 5]},
        record("p0", 0, 10, [1, 2, 3]),
        record("p0", 1, 12, [1, 2, 3]),
        record("p1", 0, 5, [4, 5]),
        record("p1", 1, 6, [4, 5]),
    ]
    ours = [
        record("p0", 0, 11, [1, 2, 3]),
        record("p0", 1, 11, [1, 2, 3]),
        record("p1", 0, 5, [4, 5]),
        record("p1", 1, 7, [4, 9]),
    ]  # one output differs from AR
    payload = {
        "command": "python -m specbench.parity lade --seeds 0 1",
        "finished_at": "now",
        "wall_min": 1.0,
        "max_new_tokens": 3,
        "model_dir": "/m",
        "seeds": {"official": [0, 1], "ours": [0, 1]},
        "variants": [{"label": "specbench", "overrides": []}],
        "patches": ["a patch"],
        "environment": {
            "cpu": "cpu",
            "official": {"lade": "0.0.2", "transformers": "4.34.0", "torch": "t", "python": "3"},
            "specbench": {"git_commit": "abc", "git_dirty": False, "transformers": "5", "torch": "t"},
        },
        "blocks": [
            {
                "setting": "W=7 N=5 G=7",
                "dataset": "humaneval",
                "prompts": [["p0", [9]], ["p1", [8, 9]]],
                "seeds": {"official": [0, 1], "ours": [0, 1]},
                "ar": ar,
                "official": {"records": official},
                "ours": {"specbench": ours},
            }
        ],
    }
    out = tmp_path / "lade.md"
    parity.write_table(out, payload)
    text = out.read_text()
    assert "python -m specbench.parity lade --seeds 0 1" in text and "1. a patch" in text
    assert "| W=7 N=5 G=7 | humaneval | 2 | specbench | 16.5 ± 2.1 (15–18) | 17.0 ± 1.4 (16–18) | +3.0% |" in text
    assert "| p0 | 1 | 3 | 10 12 | 11.0 | 11 11 | 11.0 | +0% |" in text
    p1_row = next(line for line in text.splitlines() if "| p1 |" in line)
    assert "| yes | NO | yes |" in p1_row  # official = AR, ours != AR, the two ARs agree


# ------------------------------------------------------------------------------ step-for-step drivers


def test_cut_trace_applies_the_loops_stop_rule():
    # prefill token 5, then steps of 3, 2, 4 tokens; budget 6 cuts the third step to 1 token
    out = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert stepwise.cut_trace([3, 2, 4], out, 6, [99]) == ([3, 2], True)
    assert stepwise.cut_trace([3, 2, 4], out, 7, [99]) == ([3, 2, 1], True)
    # EOS (4) inside step 2 is kept and stops; an EOS held as the next token stops one step earlier
    assert stepwise.cut_trace([3, 2, 4], out, 100, [4]) == ([3, 1], True)
    assert stepwise.cut_trace([3, 2, 4], out, 100, [3]) == ([3], True)
    assert stepwise.cut_trace([3, 2, 4], out, 100, [5]) == ([], True)  # the prefill's token is EOS
    # the official loop stopped by its own rule first: specbench's rule never fired
    assert stepwise.cut_trace([3, 2, 4], out, 100, [99]) == ([3, 2, 4], False)


def test_first_difference_counts_length_differences():
    assert stepwise.first_difference([3, 2, 1], [3, 2, 1]) is None
    assert stepwise.first_difference([3, 2, 1], [3, 1, 2]) == 2
    assert stepwise.first_difference([3, 2], [3, 2, 1]) == 3


def stepwise_payload(ours_emitted, official_emitted, official_out):
    return {
        "command": "python -m specbench.parity medusa",
        "finished_at": "now",
        "wall_min": 1.0,
        "max_new_tokens": 6,
        "model_dir": "/m",
        "eos_ids": [99],
        "cases": [{"label": "tree", "overrides": [], "official": {"choices": "mc_sim_7b_63"}}],
        "patches": ["a patch"],
        "environment": {
            "cpu": "cpu",
            "official": {"transformers": "4.36.2"},
            "specbench": {"git_commit": "abc", "git_dirty": False, "transformers": "5", "torch": "t"},
        },
        "blocks": [
            {
                "dataset": "humaneval",
                "prompts": [["p0", [7, 8]]],
                "ar": {"p0": [5, 1, 2, 3, 4, 6]},
                "official_ar": {"p0": [5, 1, 2, 3, 4, 6]},
                "official": [
                    {
                        "case": "tree",
                        "id": "p0",
                        "steps": len(official_emitted),
                        "emitted": official_emitted,
                        "output_ids": official_out,
                    }
                ],
                "ours": [{"case": "tree", "id": "p0", "emitted": ours_emitted, "output_ids": [5, 1, 2, 3, 4, 6]}],
            }
        ],
    }


def test_stepwise_table_matches_step_for_step_and_shows_the_first_difference(tmp_path):
    side = SideEnv(".v", (), OfficialSource("medusa", "https://x", "0" * 40))
    driver = stepwise.Driver("medusa", side, "s.py", "counted", "none")
    # the official loop ran one step past the budget (its own rule): cut, it equals ours step for step
    payload = stepwise_payload([3, 2], [3, 2, 4], [5, 1, 2, 3, 4, 6, 7, 8, 9, 10])
    (row,) = stepwise.compare(payload)
    assert row.official == [3, 2] and row.official_steps == 3 and row.first_difference is None
    assert row.official_equals_ar and row.ours_equals_ar and row.ars_agree
    stepwise.write_table(tmp_path / "m.md", payload, driver)
    text = (tmp_path / "m.md").read_text()
    assert "| tree | humaneval | 1 | 2 | 2 | +0.0% | 1/1 |" in text and "1. a patch" in text
    assert "| tree | all |" not in text  # one dataset: no "all" row
    # one step less on the official side: the first differing step is 1 and the totals differ
    (row,) = stepwise.compare(stepwise_payload([3, 2], [5], [5, 1, 2, 3, 4, 6]))
    assert row.first_difference == 1 and row.official == [5]


def test_official_source_says_how_to_get_a_missing_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr("specbench.parity.common.SOURCES", tmp_path)
    source = OfficialSource("medusa", "https://github.com/FasterDecoding/Medusa", "e2a5d20c" + "0" * 32)
    with pytest.raises(SystemExit, match="make parity METHOD=medusa"):
        source.check()


# ------------------------------------------------------------------------------ OPT-Tree and ANPD


def test_opt_tree_default_case_is_specbench_default_config_and_official_eval_defaults():
    from specbench.config import compose_config
    from specbench.parity import opt_tree

    default, other, fixed = opt_tree.cases(None)
    assert (default.label, default.overrides) == ("n50", ()) and other.official["nodes"] == 60
    assert fixed.overrides == () and fixed.official == {**default.official, "fix_draft_mask": True}
    drafter = compose_config("model=smollm2_135m", "method=opt_tree").method.drafter
    official = {"nodes": drafter.nodes, "threshold": drafter.threshold, "max_depth": drafter.max_depth}
    assert default.official == official == {"nodes": 50, "threshold": 0.5, "max_depth": 10}
    assert [c.label for c in opt_tree.cases(None)] == list(opt_tree.CASE_LABELS)


def test_cut_trace_cuts_an_official_opt_tree_trace_that_overshoots_the_budget():
    # OPT-Tree's own rule stops once committed > budget: 3 + 3 + 2 committed, plus the held token
    out = [5, 1, 2, 3, 4, 6, 7, 8, 9]
    assert stepwise.cut_trace([3, 3, 2], out, 6, [99]) == ([3, 2], True)


def test_anpd_replay_follows_the_loop_rule():
    from specbench.parity.anpd import replay

    output = [10, 11, 12, 13, 14, 15]
    perfect = [output[p : p + 3] for p in range(1, len(output))]  # always right, 3 tokens
    assert replay(output, perfect, 3, budget=100) == [4, 1]  # 3 accepted + the target's; then 1 left
    assert replay(output, perfect, 3, budget=6) == [4, 1]
    assert replay(output, perfect, 2, budget=100) == [3, 2]
    wrong = [[0, 0]] * (len(output) - 1)
    assert replay(output, wrong, 2, budget=100) == [1] * 5


def test_anpd_drafts_per_position_and_sparse_storage():
    from specbench.parity.anpd import Stream, dense, our_drafts, sparse
    from specbench.structures.ngram import MultiLevelNgram

    stream = Stream("d", "s", [3, 4, 5, 3, 4], [5, 3, 4, 9], 10, [1, 1, 1])
    drafts = our_drafts(stream, 3, 2, pad=1)
    assert len(drafts) == 3  # after 1, 2 and 3 output tokens
    table = MultiLevelNgram(3)
    table.extend([3, 4, 5, 3, 4, 5, 3])
    assert drafts[1] == table.chain(2, 1) == [4, 5]
    other = [drafts[0], [7, 7], drafts[2]]
    assert sparse(other, drafts) == {"1": [7, 7]} and dense(sparse(other, drafts), drafts) == other


def test_anpd_cause_names_the_artifacts_that_change_a_draft_on_their_own():
    from specbench.parity.anpd import ARTIFACTS, cause

    ours = [[1, 2], [3, 4]]
    official = dict.fromkeys(ARTIFACTS, ours)
    official["once+id1_token"] = [[1, 2], [3, 9]]  # only the tie order changes position 1
    assert cause(1, ours[1], official) == "tie order"
    assert cause(0, ours[0], official) == "only the three together"


def test_anpd_official_script_runs_class_definitions_only_and_breaks_ties_first_seen(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("anpd_official", stepwise.REPO / "scripts/parity/anpd_official.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    counts = [2, 3, 1, 3]
    assert script.FirstTieNumpy.argsort(counts)[-1] == 1  # the first-seen of the two 3s
    release = "import a_module_the_release_lacks\nclass A:\n    pick = np.argsort([1, 2])\n"
    (tmp_path / "base_ngram.py").write_text(release)
    assert list(script.official_classes(str(tmp_path), script.FirstTieNumpy)["A"].pick) == [0, 1]
    assert script.parse_variant("released") == frozenset()
    assert script.parse_variant("once+id1_token") == {"once", "id1_token"}
    with pytest.raises(SystemExit):
        script.parse_variant("twice")


# ------------------------------------------------------------------------------ EAGLE and EAGLE-2


def test_official_eagle_keys_leave_out_the_first_layers_input_norm():
    from specbench.parity.eagle import official_keys

    keys = official_keys(2, fc_bias=True, qkv_bias=False)
    assert {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.1.input_layernorm.weight"} <= keys
    assert "layers.0.input_layernorm.weight" not in keys and "layers.0.self_attn.q_proj.bias" not in keys
    assert len(keys) == 3 + 2 * 8 + 1
    assert official_keys(1, fc_bias=False, qkv_bias=True) - official_keys(1, fc_bias=False, qkv_bias=False) == {
        f"layers.0.self_attn.{p}_proj.bias" for p in "qkv"
    }


def test_eagle_head_export_is_our_state_plus_the_targets_embeddings_and_the_official_config():
    import torch

    from specbench.models.eagle_heads import random_head
    from specbench.parity.eagle import official_config, official_keys, official_state
    from tests.conftest import tiny_model

    target = tiny_model()
    head = random_head(target, seed=0)
    state = official_state(head, target)
    assert set(state) == official_keys(1, fc_bias=True, qkv_bias=False)
    assert torch.equal(state["embed_tokens.weight"], target.get_input_embeddings().weight)
    for key, value in head.checkpoint_state().items():
        assert torch.equal(state[key], value)
    config = official_config(head)
    assert config["bias"] is True and config["num_hidden_layers"] == 1 and config["rope_scaling"] is None
    assert config["rope_theta"] == head.config.rope_parameters["rope_theta"]
    assert config["hidden_size"] // config["num_attention_heads"] == head.config.head_dim
    assert not {"head_dim", "shares_embeddings", "base_model_name_or_path", "qkv_bias"} & set(config)


def test_eagle_cases_send_specbench_trees_and_knobs_to_the_official_side():
    from specbench.parity import eagle, eagle2
    from specbench.structures.tree_shapes import EAGLE1_TREE

    (tree,) = eagle.eagle1_cases(None)
    assert tree.overrides == () and tree.official["paths"] == [list(p) for p in EAGLE1_TREE]
    default, small = eagle.eagle2_cases(None)
    assert default.overrides == () and default.official == {"total_token": 60, "depth": 5, "top_k": 10}
    assert small.official == {"total_token": 26, "depth": 5, "top_k": 10}
    assert [c.label for c in (default, small)] == list(eagle.EAGLE2_LABELS)
    assert eagle.SIDE.venv == eagle2.SIDE.venv and eagle2.SIDE.source == eagle.EAGLE2_SOURCE


def test_official_source_checks_out_a_commit_off_the_default_branch_from_a_mirror_missing_a_blob(tmp_path, monkeypatch):
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(origin), *args], check=True, capture_output=True, text=True).stdout

    origin = tmp_path / "origin"
    origin.mkdir()
    git("init", "--quiet", "--initial-branch=main")
    (origin / "fig.gif").write_text("a figure the mirror lacks\n")
    git("add", "fig.gif")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "main")
    git("checkout", "--quiet", "-b", "v1")
    (origin / "f.txt").write_text("v1\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "v1")
    commit = git("rev-parse", "HEAD").strip()
    git("checkout", "--quiet", "main")
    blob = git("rev-parse", "HEAD:fig.gif").strip()
    (origin / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # in both commits, as the GIFs of SafeAILab/EAGLE
    monkeypatch.setattr("specbench.parity.common.SOURCES", tmp_path / "src")
    monkeypatch.setenv("SPECBENCH_PARITY_GIT", str(origin))
    source = OfficialSource("x", "https://example.invalid/x", commit)
    source.fetch()
    assert source.check() == tmp_path / "src" / "x" and (tmp_path / "src" / "x" / "f.txt").read_text() == "v1\n"


# ------------------------------------------------------------------------------ Self-Draft driver


def test_self_draft_official_pads_follow_the_official_draw_order():
    from specbench.parity.self_draft import official_pads

    prompt = [11, 22, 33, 44, 55]
    random.seed(10)  # the official generate; then AuxBranch: per branch a length, then its tokens
    expected = []
    for _ in range(9):
        length = random.randint(1, 2)
        expected.append([random.choice(prompt) for _ in range(length)])
    assert official_pads(prompt, 9, 2) == expected


def test_self_draft_official_start_hook_feeds_the_diagonal_filling_only():
    from specbench.drafters.self_draft import SelfDraft
    from specbench.parity.self_draft import official_pads, start_like_official

    drafter = SelfDraft(branch_filling="diagonal", use_corpus_cache=False)
    drafter.reset([11, 22, 33])
    start_like_official(drafter)
    assert drafter._draw_pads(9, None) == official_pads([11, 22, 33], 9, 2)
    with pytest.raises(SystemExit, match="branch_filling=diagonal"):
        start_like_official(SelfDraft(use_corpus_cache=False))


def test_self_draft_cases_send_the_composed_knobs_to_the_official_side():
    from specbench.parity.self_draft import CASE_LABELS, OFFICIAL_START, USES_CORPUS, cases

    by_label = {case.label: case for case in cases(None)}
    assert tuple(by_label) == CASE_LABELS and set(by_label) >= OFFICIAL_START
    knobs = dict(branch_len=6, branch_num=6, gram_len=4, max_pad_len=2, flush_interval=2, keep_num=2)
    assert by_label["official-rules"].official == {**knobs, "use_corpus": False}
    assert by_label["default-corpus"].official == {**knobs, "use_corpus": True}
    assert {label for label, case in by_label.items() if case.official["use_corpus"]} == USES_CORPUS
    for label in OFFICIAL_START:
        assert "method.drafter.branch_filling=diagonal" in by_label[label].overrides


# ------------------------------------------------------------------------------ SWIFT driver


def test_swift_official_draws_follow_numpys_global_choice_after_seed():
    import numpy as np

    from specbench.parity.swift import official_draws

    draw = official_draws(8, 3, seed=5)
    np.random.seed(5)  # the official seed_everything, then layer_random_search's np.random.choice per proposal
    for _ in range(4):
        chosen = set(np.random.choice(8, 3, replace=False).tolist())
        assert draw() == tuple(int(i in chosen) for i in range(8))


def test_swift_official_start_hook_takes_the_official_draws_and_start_rule():
    from types import SimpleNamespace

    from specbench.drafters.swift import Swift
    from specbench.parity.swift import official_draws, start_like_official
    from tests.conftest import tiny_model

    drafter = Swift(context_window=4)
    drafter.setup(tiny_model(num_hidden_layers=4), None)
    start_like_official(drafter, seed=3)
    proposals = drafter.search.proposals
    assert proposals.random_point() == official_draws(proposals.dims, proposals.ones, 3)()
    prompt = [1, 2, 3]

    def ctx(output: int, step: int = 1):
        return SimpleNamespace(tokens=prompt + [7] * output, prompt_len=len(prompt), step=step)

    # specbench's own rule starts once the output with the root exceeds the window + 1; the official one once the
    # committed tokens (the root excluded) do: one token later
    assert Swift.optimization_due(drafter, ctx(6)) and not drafter.optimization_due(ctx(6))
    assert drafter.optimization_due(ctx(7))
    drafter.opt_interval = 2  # the official grid: the index of the step just verified (steps done - 1)
    assert drafter.optimization_due(ctx(7, step=3)) and not drafter.optimization_due(ctx(7, step=2))


def test_swift_cases_send_the_composed_knobs_and_refuse_hard_wired_ones():
    from omegaconf import OmegaConf

    from specbench.parity.swift import CASE_LABELS, OFFICIAL_SEED, cases, compose, official_knobs

    by_label = {case.label: case for case in cases(None)}
    assert tuple(by_label) == CASE_LABELS
    assert by_label["default"].official == {
        "skip_ratio": 0.45,
        "context_window": 50,
        "opt_interval": 1,
        "bayes_interval": 25,
        "max_opt_iter": 1000,
        "max_tolerance_iter": 300,
        "max_score": 0.93,
        "seed": OFFICIAL_SEED,
        "fresh": False,
    }
    draws = by_label["official-draws"].official
    assert draws["fresh"] and draws["bayes_interval"] == 1000 and draws["context_window"] == 16
    drafter = OmegaConf.to_container(compose(()).method.drafter)
    with pytest.raises(SystemExit, match="hard-wires threshold"):
        official_knobs({**drafter, "threshold": 0.7})


# ------------------------------------------------------------------------------ PARD driver


def test_cut_trace_takes_an_official_prefill_that_committed_several_tokens():
    out = [5, 1, 2, 3, 4, 6, 7, 8, 9]  # the official prefill committed 3, then steps of 2 and 4
    assert stepwise.cut_trace([2, 4], out, 100, [99], first=3) == ([2, 4], False)
    assert stepwise.cut_trace([2, 4], out, 6, [99], first=3) == ([2, 1], True)
    assert stepwise.cut_trace([2, 4], out, 2, [99], first=3) == ([], True)  # the budget ends inside the prefill
    assert stepwise.cut_trace([2, 4], out, 100, [1], first=3) == ([], True)  # so does an EOS


def test_stepwise_rows_with_an_official_prefill_that_verified_drafts():
    payload = stepwise_payload([2, 2, 1], [2, 1], [5, 1, 2, 3, 4, 6])
    payload["blocks"][0]["official"][0]["prefill_emitted"] = 3  # 3 + 2 + 1 tokens in 3 forwards
    (row,) = stepwise.compare(payload)
    assert row.official_first == 3 and row.official == [2, 1] and row.official_equals_ar
    assert row.first_difference == 0  # the prefill itself differs
    (plain,) = stepwise.compare(stepwise_payload([3, 2], [3, 2], [5, 1, 2, 3, 4, 6]))
    assert plain.official_first == 1 and plain.first_difference is None


def pard_row(official_first: int, official: list[int], ours: list[int]) -> stepwise.Row:
    same = (True, True, True)  # both = AR, the ARs agree
    return stepwise.Row("k8", "humaneval", "p", 9, len(official), official, True, ours, *same, official_first)


def test_pard_traces_meet_at_the_first_committed_count_both_start_a_step_from():
    from specbench.parity.pard import committed_before, meeting, meeting_lines

    assert committed_before(1, [2, 3, 1]) == [1, 3, 6]
    # specbench: 1 -> 3 -> 6 -> 8; official prefill committed 3, then 3 -> 6 -> 8: they meet at specbench's step 2
    assert meeting(pard_row(3, [3, 2, 1], [2, 3, 2, 1])) == (2, True)
    assert meeting(pard_row(3, [3, 1, 2], [2, 3, 2, 1])) == (2, False)  # a rule (or a near-tie) differs after
    assert meeting(pard_row(1, [2, 2], [2, 2])) == (1, True)
    assert meeting(pard_row(2, [2, 2], [2, 2, 1])) == (None, False)  # odd against even counts: never
    text = "\n".join(meeting_lines([pard_row(3, [3, 2, 1], [2, 3, 2, 1])]))
    assert "| k8 | humaneval | p | 3 | 2 | yes |" in text and "Met: 1/1" in text


def test_pard_cases_send_k_and_the_draft_folder_to_the_official_side(tmp_path):
    from specbench.parity.pard import CASE_LABELS, cases_with

    by_label = {case.label: case for case in cases_with(str(tmp_path))(None)}
    assert tuple(by_label) == CASE_LABELS
    assert by_label["k8"].official == {"draft_k": 8, "draft_dir": str(tmp_path)}
    assert by_label["k4"].official["draft_k"] == 4
    assert f"model.pard.path={tmp_path}" in by_label["k4"].overrides


def test_pard_driver_names_a_missing_draft_before_any_model_loads(monkeypatch, tmp_path):
    from specbench.parity import pard

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SystemExit, match="python -m specbench.train pard model=smollm2_135m"):
        pard.main(["--datasets", "humaneval=1"])


def test_pard_target_stand_in_is_the_target_with_a_mask_token_written_once(monkeypatch, tmp_path):
    import json
    from types import SimpleNamespace

    from specbench.parity.pard import cases_with, stand_in_dir, target_stand_in
    from tests.conftest import tiny_model

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    saved: list = []
    lm = SimpleNamespace(model=tiny_model(), tokenizer=SimpleNamespace(save_pretrained=saved.append))
    folder = target_stand_in(lm)
    assert folder == stand_in_dir() == tmp_path / "parity" / "pard-target"
    config = json.loads((folder / "config.json").read_text())
    assert config["pard_token"] == 97 and config["vocab_size"] == 98
    assert lm.model.config.vocab_size == 97  # the target itself is untouched
    target_stand_in(lm)
    assert len(saved) == 1  # written once
    case = cases_with("target")(None)[0]
    assert case.official["draft_dir"] == str(folder) and f"model.pard.path={folder}" in case.overrides


# ------------------------------------------------------------------------------ DFlash driver


def test_dflash_drafts_agree_when_each_step_of_ours_starts_the_official_block():
    from specbench.parity.dflash import first_draft_difference

    official = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert first_draft_difference(official, [[5, 6, 7], [8, 9, 10], [11]]) is None  # the budget cut the last step
    assert first_draft_difference(official, [[5, 6, 7], [8, 9, 10], []]) is None
    assert first_draft_difference(official, [[5, 6, 7], [8, 4, 10]]) == 2
    assert first_draft_difference(official, [[5, 6, 7, 8]]) == 1  # more drafts than the official block


def test_dflash_draft_section_reads_both_sides_raw_records():
    from specbench.parity.dflash import draft_lines

    payload = stepwise_payload([3, 2], [3, 2, 4], [5, 1, 2, 3, 4, 6, 7, 8, 9, 10])
    block = payload["blocks"][0]
    block["official"][0]["drafts"] = [[1, 2, 9], [4, 7, 7], [8, 9, 9]]
    block["ours"][0]["drafts"] = [[1, 2, 9], [4, 7]]
    (row,) = stepwise.compare(payload)
    assert row.official_record["drafts"] == [[1, 2, 9], [4, 7, 7], [8, 9, 9]] and row.ours_record["id"] == "p0"
    text = "\n".join(draft_lines([row]))
    assert "| tree | humaneval | p0 | 2 | 5 | – |" in text and "every step: 1/1 prompts" in text
    block["ours"][0]["drafts"] = [[1, 2, 9], [4, 6]]
    text = "\n".join(draft_lines(stepwise.compare(payload)))
    assert "| tree | humaneval | p0 | 2 | 5 | 2 |" in text and "every step: 0/1 prompts" in text


def test_dflash_watch_records_each_generations_drafts_apart():
    from types import SimpleNamespace

    from specbench.core.tree import DraftTree
    from specbench.parity.dflash import watch_drafts

    class Drafter:
        def propose(self, ctx):
            return DraftTree.chain(ctx, [ctx + 1, ctx + 2])

    engine = SimpleNamespace(drafter=Drafter())
    first = watch_drafts(engine)
    engine.drafter.propose(5)
    engine.drafter.propose(7)
    second = watch_drafts(engine)  # the next prompt: a fresh list, the class's propose wrapped once
    assert engine.drafter.propose(1).tokens == [1, 2, 3]
    assert first() == {"drafts": [[6, 7], [8, 9]]} and second() == {"drafts": [[2, 3]]}


def test_stepwise_run_ours_adds_what_a_cases_watch_gives_to_each_record(monkeypatch):
    from types import SimpleNamespace

    import specbench.engines

    class Engine:
        def generate(self, ids, max_new_tokens, generator):
            return SimpleNamespace(target_forwards=2, accept_lengths=[1, 2], output_ids=[*ids, 0][:4])

    monkeypatch.setattr(specbench.engines, "build_engine", lambda *args, **kwargs: Engine())
    watched: list = []

    def watch(engine):
        watched.append(engine)
        return lambda: {"prompt_number": len(watched)}

    case = stepwise.Case("b5", ("method.drafter.block_size=5",), {}, watch)
    records = stepwise.run_ours(None, "dflash", case, "humaneval", [("p0", [7]), ("p1", [8])], 4)
    assert [r["prompt_number"] for r in records] == [1, 2] and records[1]["emitted"] == [1, 2]
    plain = stepwise.run_ours(None, "dflash", stepwise.Case("b16", ()), "humaneval", [("p0", [7])], 4)
    assert "prompt_number" not in plain[0] and plain[0]["id"] == "p0"


def test_dflash_drafter_folder_is_the_trained_one_or_a_local_folder(monkeypatch, tmp_path):
    from specbench.errors import ModelUnavailable
    from specbench.parity.dflash import drafter_folder

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailable, match="python -m specbench.train dflash model=smollm2_135m"):
        drafter_folder({"source": "trained"}, "smollm2_135m")
    (tmp_path / "config.json").write_text("{}")
    assert drafter_folder({"source": "hub", "path": str(tmp_path)}, "m") == str(tmp_path)
    with pytest.raises(SystemExit, match="from a folder"):
        drafter_folder({"source": "hub", "path": "z-lab/Qwen3-4B-DFlash-b16"}, "m")  # a Hub id: no folder here
    with pytest.raises(SystemExit, match="from a folder"):
        drafter_folder({"source": "random", "seed": 0}, "m")


def test_dflash_cases_send_the_composed_block_size_and_folder_to_the_official_side(monkeypatch, tmp_path):
    from specbench.parity import dflash

    monkeypatch.setattr(dflash, "drafter_folder", lambda node, target_name: f"{tmp_path}/{target_name}")
    by_label = {case.label: case for case in dflash.cases(None)}
    assert tuple(by_label) == dflash.CASE_LABELS
    assert by_label["b16"].official == {"block_size": 16, "draft_dir": f"{tmp_path}/smollm2_135m"}
    assert by_label["b5"].official["block_size"] == 5 and by_label["b5"].overrides == ("method.drafter.block_size=5",)
    assert all(case.watch is dflash.watch_drafts for case in by_label.values())


def test_dflash_driver_names_a_missing_drafter_before_any_model_loads(monkeypatch, tmp_path):
    from specbench.parity import dflash

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SystemExit, match="python -m specbench.train dflash model=smollm2_135m"):
        dflash.main(["--datasets", "humaneval=1"])
