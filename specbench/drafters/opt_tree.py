"""OPT-Tree (Wang et al., TACL 2025): a per-step adaptive draft tree that maximizes E[accept length].

Each step the draft model builds the tree layer by layer (docs/methods/opt_tree.md#one-step):
layer 1 is the top-n tokens of q(.|root); every deeper layer comes from ONE draft forward over all n nodes of the layer
above (tree mask on the draft's own cache): each node's top-n children, scored p̂ = p̂(parent)·q,
then the global top-n. Drafting stops when the gain in E (sum of the top-n p̂ over the layers built)
is <= threshold or the depth limit is reached; the tree verified is the top-n nodes by p̂, which
always contains the root and is closed under parents (p̂ decreases along every path).

The paper's fixed-tree baselines run on the same drafter: ``FixedTree`` fills a fixed shape (EAGLE-1's
published tree, a static tree built from the draft's rank profile, a binary tree, Sequoia's tree for an acceptance
vector measured on calibration texts, or any list of rank paths) with the draft's top-k tokens per node (or, with
``sample_children``, draws without replacement recorded for the ``speculative`` rule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, knob_choice, knob_int, knob_number
from specbench.core.tree import DraftTree
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.tree_fill import fill_shape
from specbench.errors import ConfigError, ModelUnavailable
from specbench.manifest import digest, model_identity
from specbench.models.parts import part_kind
from specbench.structures.sequoia_tree import checked_acceptance, expected_length
from specbench.structures.tree_builders import OptTreeBuilder
from specbench.structures.tree_shapes import PUBLISHED_TREES, TreeShape, fixed_shape


class LayeredTreeDrafter(DraftModelDrafter):
    """Tree drafters fed layer by layer: remembers each node's draft-cache row, keeps the accepted path's rows.

    NOTE: trees are proposed in depth order and no deeper than ``remaining - 1``, so the loop's
    pruning leaves node indices unchanged and ``node_rows`` indexes the verified tree.
    """

    COUNTERS = (*DraftModelDrafter.COUNTERS, "depth_sum")

    def __init__(self, **draft_settings: Any) -> None:
        super().__init__(**draft_settings)
        self.node_rows: list[int] = [-1]  # draft-cache tree row of each node of the proposed tree (-1: none)

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted: Acceptance) -> None:
        """Keep the draft rows of the accepted path (those that were fed), drop the rest of the tree."""
        assert self.lm is not None  # loaded by setup
        self.lm.keep_tree_rows([self.node_rows[i] for i in accepted.path[1:] if self.node_rows[i] >= 0])
        self.books.add(depth_sum=max(tree.depths))

    def stats(self) -> dict:
        """Base stats plus the mean verified tree depth."""
        return {**super().stats(), "tree_depth_mean": self.books.per("depth_sum", "steps")}


class OptTree(LayeredTreeDrafter):
    """OPT-Tree's adaptive draft tree (node budget n, threshold delta, depth counter max_depth)."""

    def __init__(self, nodes: int = 50, threshold: float = 0.5, max_depth: int = 10, **draft_settings):
        self.nodes = knob_int("nodes", nodes, 1, "n")
        self.max_depth = knob_int("max_depth", max_depth, 2)
        self.threshold = knob_number("threshold", threshold, 0.0, symbol="delta")
        super().__init__(**draft_settings)
        self.step_expected: list[float] = []  # per step: E, the sum of p̂ over the verified tree (Fig 4)
        self.step_accepted: list[int] = []  # per step: drafted tokens accepted

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """Build the layers while E grows by more than delta, then verify the top-n nodes by p̂.

        NOTE: the official loop also feeds the last layer it keeps, then discards the layer that
        forward produced; the stopping test needs only p̂ values already known, so it runs first
        here and that forward is skipped (same trees, one draft forward less per step).
        """
        depth_limit = min(self.max_depth - 1, ctx.remaining - 1)
        if depth_limit < 1:
            self.node_rows = [-1]
            self.step_expected.append(0.0)
            return DraftTree.root_only(ctx.root)
        assert self.lm is not None  # loaded by setup
        builder = OptTreeBuilder(self.nodes)
        builder.add_layer(torch.softmax(self.lm.sync(ctx.tokens), dim=-1)[None])  # [1, vocab] raw q(.|root)
        offsets: list[int] = []  # first draft-cache tree row of each fed layer
        while builder.grows(self.threshold, depth_limit):
            above = offsets[-1] if offsets else 0
            parent_rows = [above + p if p >= 0 else -1 for p in builder.parents[-1]]
            offsets.append(len(self.lm.tree_tokens))
            logits = self.lm.tree_layer(builder.tokens[-1], parent_rows, depth=builder.depth)  # [n, vocab]
            builder.add_layer(torch.softmax(logits, dim=-1))
        tree, chosen, expected = builder.tree(ctx.root)
        self.node_rows = [-1] + [offsets[layer] + i if layer < len(offsets) else -1 for layer, i in chosen]
        self.step_expected.append(round(expected, 3))
        return tree

    def update(self, ctx: DecodeContext, tree: DraftTree, accepted: Acceptance) -> None:
        """Keep the accepted rows and record this step's actual acceptance next to its E."""
        super().update(ctx, tree, accepted)
        self.step_accepted.append(len(accepted.path) - 1)

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh draft cache and fresh per-step E / acceptance traces (the paper's Fig 4 data)."""
        super().reset(prompt_ids)
        self.step_expected = []
        self.step_accepted = []

    def stats(self) -> dict:
        """Base stats plus E (sum of p̂ of the verified tree) and the accepted drafted tokens, per step."""
        return {
            **super().stats(),
            "expected_accept_mean": sum(self.step_expected) / max(len(self.step_expected), 1),
            "step_expected_accept": self.step_expected,
            "step_accepted": self.step_accepted,
        }


SHAPES = ("static", *PUBLISHED_TREES, "binary", "paths", "sequoia")


class FixedTree(LayeredTreeDrafter):
    """A fixed tree shape filled by the draft model each step (OPT-Tree's Binary / static-tree / Sequoia baselines).

    The rank-r child of a node is the draft's r-th most likely token after it (T=0, or always unless
    ``sample_children``); with ``sample_children`` at T>0 the children are ordered draws without
    replacement from the warped q, recorded in ``draft_probs`` for the ``speculative`` rule. One
    draft forward per depth feeds the nodes of that depth that have children.

    ``shape="sequoia"``: Sequoia's tree of ``nodes`` nodes at most ``max_depth`` deep (None: any depth) for the
    acceptance vector p (``acceptance_vector``), or, when that is None, for p measured once by ``calibration``
    (``AcceptanceCalibration``: the target and the draft teacher-forced over calibration texts), cached.
    """

    def __init__(
        self,
        shape: str = "eagle1",
        nodes: int | None = 25,
        paths=None,
        rank_hits=None,
        max_depth: int | None = 5,
        sample_children: bool = False,
        acceptance_vector=None,
        calibration=None,
        **draft_settings,
    ):
        shape = knob_choice("shape", shape, SHAPES)
        self.calibration = (
            AcceptanceCalibration.from_node(calibration) if shape == "sequoia" and acceptance_vector is None else None
        )
        self.acceptance = None if acceptance_vector is None else checked_acceptance(acceptance_vector)
        self.calibration_record: dict | None = None  # where a measured acceptance vector came from
        self.shape_settings = (shape, nodes, paths, rank_hits, max_depth)
        if self.calibration is None:
            self.shape: TreeShape | None = fixed_shape(*self.shape_settings, acceptance=self.acceptance)
        else:  # the tree waits for the measured p (setup); its knobs are checked now
            knob_int("nodes", nodes, 1, "n")
            if max_depth is not None:
                knob_int("max_depth", max_depth, 1)
            self.shape = None
        super().__init__(**draft_settings)
        self.sample_children = bool(sample_children)

    def setup(self, target, tokenizer) -> None:
        """Load the draft (measure p and build Sequoia's tree when calibrating); refuse shapes that want more
        children per node than the vocabulary has."""
        super().setup(target, tokenizer)
        assert self.lm is not None  # loaded by super().setup
        if self.calibration is not None:
            self.acceptance, self.calibration_record = self.calibrated_acceptance(target)
            self.shape = fixed_shape(*self.shape_settings, acceptance=self.acceptance)
        assert self.shape is not None  # built in __init__ or above
        widest = max(len(kids) for kids in self.shape.children())
        if widest > self.lm.target_vocab:
            raise ConfigError(
                f"the tree shape gives a node {widest} children but the vocabulary has "
                f"only {self.lm.target_vocab} tokens"
            )

    def draft_tree(self, ctx: DecodeContext) -> DraftTree:
        """Fill the shape (pruned to the budget) depth by depth, one draft forward per depth with children."""
        assert self.lm is not None and self.shape is not None  # loaded / built by setup
        lm = self.lm
        shape = self.shape.pruned(ctx.remaining - 1)
        self.node_rows = [-1] * len(shape)
        if len(shape) == 1:
            return DraftTree.root_only(ctx.root)

        def feed(depth: int, nodes: list[int], tokens: list[int]) -> torch.Tensor:
            first = len(lm.tree_tokens)
            parent_rows = [self.node_rows[shape.parents[node]] for node in nodes]
            for i, node in enumerate(nodes):
                self.node_rows[node] = first + i
            return lm.tree_layer([tokens[node] for node in nodes], parent_rows, depth)  # [k, vocab]

        return fill_shape(
            shape, ctx.root, lm.sync(ctx.tokens), feed, ctx.draft_law(self.sample_children), ctx.generator
        )

    # -- Sequoia's acceptance vector ----------------------------------------------------------------------

    def calibration_key(self, target) -> dict:
        """What decides a measured acceptance vector: the target, the draft (its part and vocabulary), the device and
        the calibration settings (a change measures anew)."""
        assert self.lm is not None and self.calibration is not None  # loaded by setup; set when measuring
        return {
            "target": {**model_identity(target), "weights": weights_fingerprint(target)},
            "draft": {
                **model_identity(self.lm.model),
                "weights": weights_fingerprint(self.lm.model),
                "part": self.draft_part,
                "draft_vocab": self.draft_vocab,
            },
            "device": target.device.type,
            "calibration": self.calibration.identity(),
        }

    def calibration_file(self, target) -> Path:
        """Where the ``sequoia`` trainer stores the vector measured for this target, draft and calibration."""
        return part_kind("sequoia").keyed_file(self.target_name, self.calibration_key(target))

    def calibrated_acceptance(self, target) -> tuple[list[float], dict]:
        """The acceptance vector the ``sequoia`` trainer measured for this target, draft and calibration, or a
        ModelUnavailable naming the command that measures it."""
        path = self.calibration_file(target)
        if not path.is_file():
            raise ModelUnavailable(
                f"No measured Sequoia acceptance vector for model '{self.target_name}' and this draft at these "
                f"settings (looked for {path}). Measure it with: {part_kind('sequoia').command_line(self.target_name)}"
                f", adding this run's method overrides (method.drafter.*), or give method.drafter.acceptance_vector"
            )
        record = json.loads(path.read_text(encoding="utf-8"))
        info = {
            "file": f"sequoia/{self.target_name}/{path.name}",
            "texts": record["texts"],
            "positions": record["positions"],
        }
        return checked_acceptance(record["acceptance_vector"]), info

    def artefacts(self) -> list[str]:
        """Base artefacts plus, for a measured acceptance vector, its digest (other calibrations: other settings)."""
        measured = [f"sequoia:{digest(self.acceptance)}"] if self.calibration is not None and self.acceptance else []
        return [*super().artefacts(), *measured]

    def stats(self) -> dict:
        """Base stats; Sequoia's trees add p and E, the expected accepted drafted tokens per step p predicts."""
        stats = super().stats()
        if self.shape_settings[0] == "sequoia" and self.acceptance is not None and self.shape is not None:
            paths = self.shape.rank_paths()
            stats.update(
                acceptance_vector=[round(a, 4) for a in self.acceptance],
                tree_expected_accept=round(expected_length(paths, self.acceptance), 4),
                acceptance_calibration=self.calibration_record,
            )
        return stats


CALIBRATION_KEYS = ("dataset", "limit", "max_length", "top_k", "data_dir")
"""The keys of ``method.drafter.calibration``."""
CALIBRATION_SOURCES = ("c4", "mbpp_train", "dolly_dev")
"""Where Sequoia's calibration texts may come from (``specbench.train.sequoia``): C4, as the paper, or the prompt
sources outside every evaluation split."""


@dataclass(frozen=True)
class AcceptanceCalibration:
    """Where Sequoia's acceptance vector is measured (``method.drafter.calibration``)."""

    dataset: str  # c4 (the paper: 200 C4 samples) | mbpp_train | dolly_dev (offline, outside every evaluation split)
    limit: int  # calibration texts, the first ones of the source
    max_length: int  # tokens per text (longer texts are cut)
    top_k: int  # k: ranks counted, the length of p
    data_dir: str | None  # local copies of the source

    @classmethod
    def from_node(cls, node) -> AcceptanceCalibration:
        """Checked settings from the config node (a mapping with exactly ``CALIBRATION_KEYS``)."""
        given = dict(node or {})
        if set(given) != set(CALIBRATION_KEYS):
            raise ConfigError(
                f"method.drafter.calibration must have the keys {list(CALIBRATION_KEYS)} (or give "
                f"method.drafter.acceptance_vector); got {sorted(given)}"
            )
        return cls(
            dataset=knob_choice("calibration.dataset", given["dataset"], CALIBRATION_SOURCES),
            limit=knob_int("calibration.limit", given["limit"], 1),
            max_length=knob_int("calibration.max_length", given["max_length"], 2),
            top_k=knob_int("calibration.top_k", given["top_k"], 1, "k"),
            data_dir=given["data_dir"],
        )

    def identity(self) -> dict:
        """What decides the measured vector (not where the texts were read from)."""
        return {k: v for k, v in vars(self).items() if k != "data_dir"}


def weights_fingerprint(model) -> str:
    """A digest of a few input-embedding weights: tells apart models that share a path and a config (random seeds)."""
    row = model.get_input_embeddings().weight[1, :16]
    return digest([round(float(v), 6) for v in row.float().tolist()])
