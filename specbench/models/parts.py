"""The kinds of part a method reads beside its target, each declared once: its config node, trainer, cache folder.

A part is something a method needs besides the target's own weights and that specbench can build for a target
(a distilled draft model, Medusa / EAGLE / EAGLE-3 / EAGLE-3.1 / Hydra heads, a DFlash drafter, a
draft-vocabulary ranking, Draft&Verify's searched skipped set, Sequoia's measured acceptance vector). Everything that
needs to know about part kinds reads this table: the runner (which model nodes are parts, which enter the
configuration digest only through the method that reads them), the reproduction plan (which parts a pending job
needs trained) and ``python -m specbench.train`` (its subcommands). Adding a trained method adds one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from omegaconf import DictConfig

from specbench.errors import ModelUnavailable
from specbench.manifest import digest, finished_manifest
from specbench.paths import cache_root


class DigestRoute(Enum):
    """How a part's model-config node enters a run's configuration digest."""

    MODEL = "model"  # as part of the model node (every run of the model carries it; kept for stored digests)
    METHOD = "method"  # only through the method node that interpolates it (other methods' digests ignore it)


@dataclass(frozen=True)
class PartKind:
    """One kind of part: the model node naming it, what ``source`` there means "built here", where it is built."""

    command: str  # the ``python -m specbench.train`` subcommand that builds it
    trainer: str  # the module whose ``main(overrides)`` the subcommand runs
    summary: str  # one line for the subcommand list
    title: str  # what the part is called in messages ("Medusa heads")
    folder_pattern: str  # under the cache root; ``{target}`` is the model config's name
    node: str | None = None  # the model-config node that names it (None: read through a method key only)
    built_source: str = "trained"  # the node's ``source`` value that means "the part this trainer built"
    digest: DigestRoute = DigestRoute.METHOD
    needed_by: Callable[[DictConfig], bool] | None = None  # a part the method's own settings key (no model node):
    # whether a run config needs it built; the trainer then takes the run's method overrides, and skips a built one

    def folder(self, target_name: str) -> Path:
        """Where the trainer writes this part for ``target_name``."""
        return cache_root() / self.folder_pattern.format(target=target_name)

    def keyed_file(self, target_name: str, key: dict) -> Path:
        """Where the trainer stores the part for ``target_name`` built at the settings ``key`` (a part the method's
        settings key: one file per key)."""
        return self.folder(target_name) / f"{digest(key)}.json"

    def command_line(self, target_name: str) -> str:
        """The command that builds this part for ``target_name``."""
        return f"python -m specbench.train {self.command} model={target_name}"

    def built(self, target_name: str) -> tuple[Path, dict]:
        """This part's folder for ``target_name`` and its finished manifest, or a ModelUnavailable saying how to
        build it."""
        folder = self.folder(target_name)
        if not folder.is_dir():
            raise ModelUnavailable(
                f"No trained {self.title} for model '{target_name}' (looked in {folder}). "
                f"Train with: {self.command_line(target_name)}"
            )
        return folder, finished_manifest(folder, self.title, self.command_line(target_name))


def searches_layer_skip(cfg: DictConfig) -> bool:
    """Whether the run's method searches a skipped set (Draft&Verify on a model config that gives none)."""
    drafter = cfg.method.get("drafter") or {}
    given = drafter.get("layers") is not None or drafter.get("exit_layer") is not None
    return drafter.get("search") is not None and not given


def measures_acceptance_vector(cfg: DictConfig) -> bool:
    """Whether the run's method builds Sequoia's tree from a measured acceptance vector (none given)."""
    drafter = cfg.method.get("drafter") or {}
    return drafter.get("shape") == "sequoia" and drafter.get("acceptance_vector") is None


PART_KINDS: dict[str, PartKind] = {
    kind.command: kind
    for kind in (
        PartKind(
            "draft",
            "specbench.train.draft",
            "distil a small draft model from the target (spede, opt_tree)",
            "distilled draft",
            "drafts/{target}-distilled",
            node="draft",
            built_source="distilled",
            digest=DigestRoute.MODEL,
        ),
        PartKind(
            "pard",
            "specbench.train.pard",
            "adapt the distilled draft to draft K tokens in one forward with mask tokens (PARD)",
            "PARD draft",
            "pard/{target}",
            node="pard",
        ),
        PartKind(
            "medusa",
            "specbench.train.medusa",
            "train Medusa heads on the target's self-distilled answers",
            "Medusa heads",
            "medusa/{target}",
            node="medusa",
            digest=DigestRoute.MODEL,
        ),
        PartKind(
            "eagle",
            "specbench.train.eagle",
            "train an EAGLE draft head on the target's self-distilled answers",
            "EAGLE head",
            "eagle/{target}",
            node="eagle",
        ),
        PartKind(
            "eagle3",
            "specbench.train.eagle3",
            "train an EAGLE-3 head (training-time test) on the self-distilled answers",
            "EAGLE-3 head",
            "eagle3/{target}",
            node="eagle3",
        ),
        PartKind(
            "eagle3_1",
            "specbench.train.eagle3_1",
            "train an EAGLE-3.1 head (EAGLE-3 with a norm per fused layer and post-norm feedback) on the answers",
            "EAGLE-3.1 head",
            "eagle3_1/{target}",
            node="eagle3_1",
        ),
        PartKind(
            "dflash",
            "specbench.train.dflash",
            "train a DFlash block drafter (mask-token blocks, the target's layers as context) on the answers",
            "DFlash drafter",
            "dflash/{target}",
            node="dflash",
        ),
        PartKind(
            "hydra",
            "specbench.train.hydra",
            "train Hydra heads (Hydra++ recipe) on the target's self-distilled answers",
            "Hydra heads",
            "hydra/{target}",
            node="hydra",
        ),
        PartKind(
            "layer_skip",
            "specbench.train.layer_skip",
            "search Draft&Verify's skipped sub-layers for speed on calibration prompts (method.drafter.search)",
            "Draft&Verify skipped set",
            "layer_skip/{target}",
            needed_by=searches_layer_skip,
        ),
        PartKind(
            "sequoia",
            "specbench.train.sequoia",
            "measure Sequoia's acceptance vector of the target and its draft (method.drafter.calibration)",
            "Sequoia acceptance vector",
            "sequoia/{target}",
            needed_by=measures_acceptance_vector,
        ),
        PartKind(
            "vocab",
            "specbench.train.vocab",
            "count the target's tokens in its answers (method.drafter.draft_vocab)",
            "draft-vocabulary ranking",
            "vocab/{target}",
        ),
    )
}
"""Every part kind, by its trainer subcommand."""

GIVEN_PART_NODES = ("layer_skip",)
"""Model-config nodes that name a method's part which is given in the config (Draft&Verify's skipped sub-layers,
as its authors published them; without one, the ``layer_skip`` trainer searches a set), not built by a trainer."""


def part_kind(command: str) -> PartKind:
    """The part kind a trainer subcommand builds."""
    return PART_KINDS[command]


def part_nodes() -> tuple[str, ...]:
    """Model-config nodes that name a method's parts (drafts, heads, skipped sets), not the target itself."""
    return tuple(kind.node for kind in PART_KINDS.values() if kind.node) + GIVEN_PART_NODES


def method_input_nodes() -> tuple[str, ...]:
    """Part nodes that enter a run's digest only through the method node that reads them."""
    routed = tuple(kind.node for kind in PART_KINDS.values() if kind.node and kind.digest is DigestRoute.METHOD)
    return routed + GIVEN_PART_NODES
