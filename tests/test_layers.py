"""The package's layering: a module imports only from its own layer or lower ones (docs/design.md#layering)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

LAYERS = [  # lowest first, as docs/design.md#layering draws them; a module belongs to the layer of its longest prefix
    (
        "foundation",
        (
            "specbench.errors",
            "specbench.schema",
            "specbench.settings",
            "specbench.config",
            "specbench.cli",
            "specbench.manifest",
            "specbench.environment",
            "specbench.energy",
            "specbench.dependencies",
            "specbench.hub",
            "specbench.files",
            "specbench.paths",
            "specbench.store",
            "specbench.costmodel",
        ),
    ),
    ("core", ("specbench.core",)),
    ("parts", ("specbench.structures", "specbench.models", "specbench.data")),
    ("part builders", ("specbench.train", "specbench.corpus")),
    ("drafters", ("specbench.drafters",)),
    (
        "engines and metrics",
        (
            "specbench.engines",
            "specbench.vllm_engine",
            "specbench.vllm_worker",
            "specbench.metrics",
            "specbench.quality",
            "specbench.profile",
            "specbench.bandwidth",
        ),
    ),
    ("runner", ("specbench.runner", "specbench.budget", "specbench.train.layer_skip", "specbench.train.sequoia")),
    (
        "apps",
        (
            "specbench.bench",
            "specbench.report",
            "specbench.reproduce",
            "specbench.parity",
            "specbench.conformance",
            "specbench.quality.teacher",
            "specbench.diagnosis",
            "specbench.__main__",
        ),
    ),
]
REPORT_IMPORTS = {
    "specbench.metrics",
    "specbench.costmodel",
    "specbench.schema",
    "specbench.settings",
    "specbench.errors",
    "specbench.cli",
    "specbench.dependencies",
    "specbench.quality",
}
"""What ``specbench/report/`` may import from the rest of the package (docs/design.md#layering): no model, no
runner, so notebooks and the reproduction build read results without loading torch models (``specbench.quality``
rebuilds datasets for their references and runs generated code in a child process; it loads no model)."""
SHARED_DRAFTER_PARTS = {
    "specbench.drafters.draft_model",
    "specbench.drafters.ngram_chain",
    "specbench.drafters.jacobi",
    "specbench.drafters.tree_fill",
}
"""The drafter modules other drafters may build on (a method never imports another method's drafter)."""


def module_name(path: Path) -> str:
    """``specbench/core/loop.py`` -> ``specbench.core.loop`` (a package's ``__init__`` -> the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """Index of the module's layer in LAYERS: the layer of its longest matching prefix (the package: bottom)."""
    if module == "specbench":
        return 0
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in tests/test_layers.py")
    return max(matches)[1]


def imports(path: Path) -> set[str]:
    """The specbench modules one file imports (at any depth of the file, lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specbench"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("specbench"))
    return found


MODULES = sorted((ROOT / "specbench").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_no_module_imports_from_a_higher_layer(path):
    """core <- structures/models <- drafters <- runner <- bench/report/reproduce, never upward."""
    own = module_name(path)
    upward = sorted(target for target in imports(path) if layer(target) > layer(own))
    assert not upward, f"{own} ({LAYERS[layer(own)][0]}) imports from higher layers: {upward}"


@pytest.mark.parametrize("path", sorted((ROOT / "specbench" / "drafters").glob("*.py")), ids=lambda p: p.stem)
def test_drafters_share_code_only_through_common_parts(path):
    """A method's drafter builds on the shared drafter parts, never on another method's drafter."""
    own = module_name(path)
    borrowed = sorted(
        target
        for target in imports(path)
        if target.startswith("specbench.drafters.") and target != own and target not in SHARED_DRAFTER_PARTS
    )
    assert not borrowed, f"{own} imports other methods' drafters: {borrowed}"


def test_report_imports_only_what_the_design_allows():
    """The report reads and compares results; it never reaches the model, the loop or the runner. Its command line
    may also hand ``--diagnose`` to the diagnosis app, which reruns models (a lazy import, so the library and the
    other options never load it)."""
    for path in sorted((ROOT / "specbench" / "report").glob("*.py")):
        allowed = REPORT_IMPORTS | ({"specbench.diagnosis"} if path.name == "__main__.py" else set())
        outside = {name for name in imports(path) if not name.startswith("specbench.report")}
        assert outside <= allowed, (path.name, outside - allowed)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """Negative control: a core module importing the runner is reported."""
    assert layer("specbench.core.loop") < layer("specbench.runner")
    fake = tmp_path / "loop.py"
    fake.write_text("from specbench.runner import Runner\n")
    assert any(layer(target) > layer("specbench.core.loop") for target in imports(fake))
