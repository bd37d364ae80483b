"""EAGLE parity: SafeAILab/EAGLE's own loop vs specbench's ``Eagle`` (EAGLE-1) and ``Eagle2`` drafters, step for step.

Two drivers share the side env ``.venv-parity-eagle`` and the official script
``scripts/parity/eagle_official.py`` (its job names the generation it drives):

- ``eagle``: the ``v1`` branch (EAGLE-1, static tree ``mc_sim_7b_63``) vs ``method=eagle`` as configured;
- ``eagle2`` (``python -m specbench.parity eagle2``, ``specbench.parity.eagle2``): the last commit before
  EAGLE-3 (dynamic tree) vs ``method=eagle2`` at its defaults (the authors' evaluation values
  total_token 60, depth 5, top_k 10) and at total_tokens 26.

Both sides use the head ``python -m specbench.train eagle model=smollm2_135m`` wrote; the driver exports
it once to the official layout (``official_state``, ``official_config``) in a cache folder keyed by the
head's name (``exported_head``), which the official ``EaModel.from_pretrained`` loads strictly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from specbench.errors import ConfigError
from specbench.parity.common import OfficialSource, SideEnv
from specbench.parity.stepwise import Case, Driver, run

URL = "https://github.com/SafeAILab/EAGLE"
EAGLE1_SOURCE = OfficialSource("eagle", URL, "4a9cf3a1f6cd4a294e6d30a4e7c77cba246d7ca5")
"""The ``v1`` branch (2024-06-27, "filter"): EAGLE-1's code as main had it before EAGLE-2 (only README and
LICENSE differ from main@996026e)."""
EAGLE2_SOURCE = OfficialSource("eagle2", URL, "79d6f7900be89d8d8cabe2d14be929d9b3861a21")
"""The parent of the EAGLE-3 commit (2025-02-17): EAGLE-2's dynamic tree; the last code change is 2024-08-28."""

OFFICIAL_PINS = ("transformers==4.36.2",)
"""What the side env installs beside torch: both commits' requirements.txt pin transformers 4.36.2 (the model
code needs nothing else; fschat, gradio, accelerate serve only the eval, web-UI and training scripts)."""

VENV = ".venv-parity-eagle"
SCRIPT = "scripts/parity/eagle_official.py"

COUNTING = """\
A step is one tree verify forward after the prefill on both sides. specbench's prefill emits the first
token, and each step emits the accepted drafts plus the target's next token (the bonus). The official
loop makes the prefill's token the root of the first tree (drafted from the prompt's features, as
specbench does) and does not count it; each step commits the root and the accepted drafts
(`new_token += accept_length + 1`) and holds the target's next token as the next root. The same verify
forwards therefore give the same per-step counts, and the official output with its held token equals
specbench's output.

Budget: the official loop runs to its own rule: `eagenerate(max_new_tokens=N)` stops after the first
step whose committed count exceeds N, with full trees to the end, so its trace always covers the N
tokens specbench emits. specbench stops once it has emitted N tokens (the last step cut to fit) and
drafts no node deeper than the remaining budget allows. EOS: the official loop stops when its
tokenizer's EOS is among the committed tokens (so a held EOS costs it one more step, and drafts
accepted after an EOS in the same step stay); specbench stops at the first emitted EOS. The official
context cap (`input_ids` longer than 2048 for EAGLE-1, 2048 - total_token - 9 for EAGLE-2) never binds here.
The official trace is cut by specbench's rule (EOS kept, then the budget) before it is compared
("official steps (specbench's rule)"); the official loop's own count is shown beside it.
"""

STOP_RULES = """\
- **Stop rules** (not changed): the official count leaves out the held next root, runs past the budget
  and checks EOS among committed tokens only; see "How steps are counted and cut". A held EOS shows as
  one official step more by its own rule than by specbench's (HumanEval/2).
"""

EAGLE1_DIFFERENCES = (
    STOP_RULES
    + """\
- **Last step's tree** (not changed): specbench prunes the static tree to the depth the remaining
  budget can still emit; the pruned tree is the official tree's top, so the accepted path is the
  official one cut at that depth and no cut count moves.
- **Numerics**: the official target is its own Llama copy (`modeling_llama_kv`, eager attention, float32
  additive mask) on transformers 4.36, specbench's is transformers 5 (sdpa); prompt logits differ by about
  1e-4 at most. No argmax or head top-k near-tie flipped on these prompts.
"""
)

EAGLE2_DIFFERENCES = (
    STOP_RULES
    + """\
- **Last step's tree** (not changed): with fewer than `depth + 2` tokens left, specbench drafts only the
  layers the budget can still emit (`remaining - 1`) and reranks its `total_tokens - 1` nodes among them,
  where the official code drafts all `depth + 1` layers. A layer's candidates do not depend on how many
  layers follow, so specbench's last tree holds every node of the official tree at those depths and
  possibly more shallow ones: it can accept more in its last step, never less of what can be emitted.
  Seen once here, `total26` HumanEval/0 (the only mismatch): at step 63 of 64, 4 tokens left, specbench
  drafts 3 layers and accepts 2 drafts where the official 6-layer tree kept only the first (3 tokens
  against 2), then emits the last token in step 64 against the official 2; both take 64 steps.
  specbench run alone with 135 new tokens (no pruning at step 63) gives the official counts there
  (2, 2, 2).
- **Ties** (not changed): the official expansion and rerank take `torch.topk`'s order among equal scores,
  specbench a stable order that sends ties to the shallower node and always keeps a node's parent.
- **Numerics**: as for EAGLE-1 (transformers 4.36 eager copy vs transformers 5 sdpa, about 1e-4 on the
  logits); a near-tie could flip a target argmax or the head's top-k/rerank order. None did on these
  prompts: every other step matches.
"""
)

DATASETS = {"eagle": ("mt_bench=5", "humaneval=5"), "eagle2": ("mt_bench=3", "humaneval=3")}
"""Default prompts: EAGLE-2 runs two tree sizes of up to 60 tokens a step, so it takes 3 + 3 prompts against
EAGLE-1's 5 + 5 to keep a run short (one core per side; 22 and 34 min on a busy 2-core machine)."""


def official_keys(layers: int, fc_bias: bool, qkv_bias: bool) -> set[str]:
    """The state-dict keys the official head (``cnets.Model``, loaded strictly) has: no input norm in layer 0."""
    keys = {"embed_tokens.weight", "fc.weight"} | ({"fc.bias"} if fc_bias else set())
    for i in range(layers):
        keys |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        keys |= {f"layers.{i}.self_attn.{p}_proj.bias" for p in "qkv"} if qkv_bias else set()
        keys |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        keys |= {f"layers.{i}.post_attention_layernorm.weight"}
        keys |= {f"layers.{i}.input_layernorm.weight"} if i else set()
    return keys


def official_state(head, target) -> dict[str, torch.Tensor]:
    """The head's tensors under the official names (ours are those names), with the target's input embeddings
    as ``embed_tokens.weight`` when the head shares them; refuses anything the official head has no slot for."""
    state = dict(head.checkpoint_state())
    if head.shares_embeddings:
        state["embed_tokens.weight"] = target.get_input_embeddings().weight
    config = head.config
    expected = official_keys(config.num_hidden_layers, head.fc_bias, bool(config.attention_bias))
    if set(state) != expected:
        raise ConfigError(
            f"the head does not fit the official layout: missing {sorted(expected - set(state))[:4]}, "
            f"unexpected {sorted(set(state) - expected)[:4]}"
        )
    return {key: value.detach().float().contiguous().cpu() for key, value in state.items()}


def official_config(head) -> dict:
    """The official head's ``config.json`` (``EConfig``: Llama keys, ``bias``, ``rope_theta``, ``qkv_bias``)."""
    from specbench.models.eagle_heads import config_json

    config = head.config
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        raise ConfigError("the official head derives head_dim as hidden_size // num_attention_heads; this head differs")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"the official head has no rope_scaling for rope_type {rope['rope_type']!r}")
    raw = config_json(head, "")
    for key in ("head_dim", "base_model_name_or_path", "shares_embeddings"):
        raw.pop(key)
    return {**raw, "rope_scaling": None, **({"qkv_bias": True} if config.attention_bias else {})}


def exported_head(lm) -> Path:
    """The model's EAGLE head in the official layout (``config.json`` + ``pytorch_model.bin``), written once into
    ``$SPECBENCH_CACHE/parity/eagle-head/<digest of the head's name>``."""
    from specbench.config import compose_config
    from specbench.files import atomic_dir
    from specbench.models.eagle_heads import load_head
    from specbench.paths import cache_root

    drafter = compose_config("model=smollm2_135m", "method=eagle").method.drafter
    loaded = load_head(drafter.head, lm.model, drafter.target_name)
    folder = cache_root() / "parity" / "eagle-head" / hashlib.sha256(loaded.origin.encode()).hexdigest()[:16]
    if not (folder / "pytorch_model.bin").is_file():
        with atomic_dir(folder) as staging:
            (staging / "config.json").write_text(json.dumps(official_config(loaded.head), indent=2) + "\n")
            torch.save(official_state(loaded.head, lm.model), staging / "pytorch_model.bin")
    return folder


def job_extra(generation: str) -> Callable[[object], dict]:
    """The method-wide job fields: which generation of the official code runs, and the exported head."""
    return lambda lm: {"generation": generation, "head_dir": str(exported_head(lm))}


EAGLE1_LABELS = ("mc_sim_7b_63",)


def eagle1_cases(lm) -> list[Case]:
    """``method=eagle`` as configured (the ``eagle1`` shape); the official side checks its tree is the same."""
    from specbench.config import compose_config
    from specbench.structures.tree_shapes import PUBLISHED_TREES

    shape = compose_config("model=smollm2_135m", "method=eagle").method.drafter.shape
    paths = [list(path) for path in PUBLISHED_TREES[shape]]
    return [Case("mc_sim_7b_63", (), {"tree": "mc_sim_7b_63", "paths": paths})]


EAGLE2_LABELS = ("total60", "total26")


def eagle2_case(label: str, overrides: tuple[str, ...]) -> Case:
    """A ``method=eagle2`` case; the official knobs are read from specbench's composed config (same meanings)."""
    from specbench.config import compose_config

    drafter = compose_config("model=smollm2_135m", "method=eagle2", *overrides).method.drafter
    knobs = {"total_token": int(drafter.total_tokens), "depth": int(drafter.depth), "top_k": int(drafter.top_k)}
    return Case(label, overrides, knobs)


def eagle2_cases(lm) -> list[Case]:
    """The defaults (the authors' evaluation values 60 / 5 / 10) and a 26-token tree."""
    return [eagle2_case("total60", ()), eagle2_case("total26", ("method.drafter.total_tokens=26",))]


def driver(source: OfficialSource, differences: str) -> Driver:
    """One generation's driver: its checkout, the shared side env and script."""
    return Driver(
        method=source.method,
        side=SideEnv(VENV, OFFICIAL_PINS, source),
        script=SCRIPT,
        counting=COUNTING,
        differences=differences,
        default_datasets=DATASETS[source.method],
    )


EAGLE1 = driver(EAGLE1_SOURCE, EAGLE1_DIFFERENCES)
EAGLE2 = driver(EAGLE2_SOURCE, EAGLE2_DIFFERENCES)
SIDE = EAGLE1.side


def main(argv: list[str] | None = None) -> int:
    """``python -m specbench.parity eagle``: EAGLE-1's static tree."""
    return run(EAGLE1, argv, eagle1_cases, EAGLE1_LABELS, job_extra("eagle1"))


def main_eagle2(argv: list[str] | None = None) -> int:
    """``python -m specbench.parity eagle2``: EAGLE-2's dynamic tree."""
    return run(EAGLE2, argv, eagle2_cases, EAGLE2_LABELS, job_extra("eagle2"))
