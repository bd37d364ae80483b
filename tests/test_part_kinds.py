"""The part-kind registry is the one list the runner, the reproduction plan and the trainer command read."""

from __future__ import annotations

import importlib
import re

import pytest

from specbench.errors import ModelUnavailable
from specbench.models.parts import PART_KINDS, DigestRoute, PartKind, method_input_nodes, part_nodes
from specbench.reproduce.parts import trained_kinds
from specbench.runner import METHOD_INPUT_KEYS, PART_NODES
from specbench.train.__main__ import COMMANDS, usage
from tests.conftest import ROOT


@pytest.mark.parametrize("kind", PART_KINDS.values(), ids=list(PART_KINDS))
def test_every_part_kind_has_a_trainer_and_a_config_that_reads_it(kind: PartKind):
    assert callable(importlib.import_module(kind.trainer).main)
    assert COMMANDS[kind.command] == (kind.trainer, kind.summary) and kind.command in usage()
    methods = "".join(path.read_text() for path in (ROOT / "conf" / "method").glob("*.yaml"))
    if kind.node is not None:  # some method interpolates the node, some model config names it
        assert re.search(rf"model\.{kind.node}\b", methods)
        models = "".join(path.read_text() for path in (ROOT / "conf" / "model").glob("*.yaml"))
        assert re.search(rf"^{kind.node}:", models, re.MULTILINE)


def test_the_runner_and_the_plan_take_their_part_lists_from_the_registry():
    nodes = {kind.node for kind in PART_KINDS.values() if kind.node}
    assert set(PART_NODES) == set(part_nodes()) and nodes <= set(PART_NODES)
    assert set(METHOD_INPUT_KEYS) == set(method_input_nodes())
    routed = {kind.node for kind in PART_KINDS.values() if kind.digest is DigestRoute.METHOD and kind.node}
    assert routed <= set(METHOD_INPUT_KEYS) and not ({"draft", "medusa"} & set(METHOD_INPUT_KEYS))
    assert {kind.command for kind in trained_kinds()} == {command for command, kind in PART_KINDS.items() if kind.node}


def test_a_missing_part_names_the_command_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    kind = PART_KINDS["hydra"]
    assert kind.folder("tiny_x") == tmp_path / "hydra" / "tiny_x"
    assert PART_KINDS["draft"].folder("tiny_x") == tmp_path / "drafts" / "tiny_x-distilled"
    with pytest.raises(ModelUnavailable, match=r"python -m specbench\.train hydra model=tiny_x"):
        kind.built("tiny_x")
    kind.folder("tiny_x").mkdir(parents=True)  # a folder without a manifest: never used
    with pytest.raises(ModelUnavailable, match="no manifest.json"):
        kind.built("tiny_x")
