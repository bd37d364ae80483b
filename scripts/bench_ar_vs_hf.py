"""Benchmark: specbench AR (the shared loop) vs HF ``generate`` greedy, same model, same prompts, one process.

    python scripts/bench_ar_vs_hf.py [--model smollm2_135m] [--dataset humaneval] [--limit 10]
                                     [--max-new-tokens 128] [--rounds 2]

Both engines run every prompt in each round, alternating which goes first, so drift in machine speed
hits both alike. Prints tokens/s for each (total tokens / total time), their ratio, and whether the
outputs are identical token for token.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from specbench.config import compose_config
from specbench.core.acceptance import Sampling
from specbench.core.loop import synchronize
from specbench.data.base import build_dataset
from specbench.engines import build_engine
from specbench.environment import device_name, dtype_name
from specbench.models.loading import load_model, resolve_device, resolve_dtype

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the prompts per engine")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    return parser.parse_args(argv)


def engine_config(args: argparse.Namespace, method: str):
    """The run config for one engine, composed from conf/ like the main app."""
    return compose_config(f"model={args.model}", f"method={method}", f"dataset={args.dataset}")


def timed(engine, prompt_ids: list[int], max_new_tokens: int, device: torch.device) -> tuple[list[int], float]:
    """Output ids and synchronized wall time of one generation."""
    with torch.inference_mode():
        synchronize(device)
        start = time.perf_counter()
        out = engine.generate(prompt_ids, max_new_tokens).output_ids
        synchronize(device)
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run both engines on the same prompts and print the comparison."""
    args = parse_args(argv)
    ar_cfg, hf_cfg = engine_config(args, "ar"), engine_config(args, "hf_generate")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    lm = load_model(ar_cfg.model, device, dtype)
    engines = {"specbench_ar": build_engine(ar_cfg.method, lm, Sampling()),
               "hf_generate": build_engine(hf_cfg.method, lm, Sampling())}
    dataset = build_dataset(ar_cfg.dataset, ar_cfg.data_dir)
    prompts = [dataset.prompt_ids(lm.tokenizer, sample, []) for sample in dataset.samples(args.limit)]
    for engine in engines.values():  # warm-up, untimed
        timed(engine, prompts[0], args.max_new_tokens, device)
    tokens = dict.fromkeys(engines, 0)
    seconds = dict.fromkeys(engines, 0.0)
    outputs: dict[str, list[list[int]]] = {name: [] for name in engines}
    for round_index in range(args.rounds):
        for i, prompt in enumerate(prompts):
            order = list(engines) if (i + round_index) % 2 == 0 else list(engines)[::-1]
            for name in order:
                out, wall = timed(engines[name], prompt, args.max_new_tokens, device)
                tokens[name] += len(out)
                seconds[name] += wall
                if round_index == 0:
                    outputs[name].append(out)
    identical = sum(a == b for a, b in zip(outputs["specbench_ar"], outputs["hf_generate"]))
    rate = {name: tokens[name] / seconds[name] for name in engines}
    print(f"model={args.model} dataset={args.dataset} prompts={len(prompts)} max_new_tokens={args.max_new_tokens} "
          f"rounds={args.rounds} device={device_name(device)} dtype={dtype_name(dtype)} "
          f"threads={torch.get_num_threads()}")
    for name in engines:
        print(f"  {name:13s} {tokens[name]:6d} tokens  {seconds[name]:8.2f} s  {rate[name]:7.2f} tok/s")
    print(f"  ratio specbench_ar / hf_generate = {rate['specbench_ar'] / rate['hf_generate']:.3f}")
    print(f"  identical outputs: {identical}/{len(prompts)}")
    return 0 if identical == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
