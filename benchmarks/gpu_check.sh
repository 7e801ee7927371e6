#!/usr/bin/env bash
# The GPU check of docs/gpu.md: a few steps of a run on one GPU, with the step time, the peak GPU memory (the
# metric memory/gpu_peak_gb) and the `rlzoo config check` estimate of the same config written to OUT_DIR.
#
#   bash benchmarks/gpu_check.sh OUT_DIR recipe TOKENIZER_DIR   examples/gpu/qwen3_1.7b_grpo.yaml, random init
#   bash benchmarks/gpu_check.sh OUT_DIR smollm2 MODEL_DIR      examples/smollm2_arithmetic.yaml
#
# GPU_CHECK_STEPS (6) sets the recipe's steps, GPU_CHECK_RUNS where the run folders go (OUT_DIR), GPU_CHECK_SET more
# --set pairs for both.
#
# Both run the hf rollout engine and the torch training engine on the GPU (device: auto), in place of the recipes'
# vLLM and DeepSpeed: the check is of rlzoo's own engines, on a machine where those two were not installed.
# `recipe` builds Qwen3-1.7B's layers from random weights with TOKENIZER_DIR's tokenizer (the vocabulary becomes
# that tokenizer's) and replaces the recipe's MATH parquet with the arithmetic task: a random model learns nothing;
# the run measures the engines. Each run's micro-batch token budget is set near its real micro-batch, so that the
# estimate (which assumes full micro-batches) describes the run that is measured.
set -uo pipefail
out="$1"; what="$2"; source_dir="$3"
steps="${GPU_CHECK_STEPS:-6}"
runs="${GPU_CHECK_RUNS:-$out}"  # the run folders (checkpoints included); OUT_DIR gets the logs and metrics
root="$(cd "$(dirname "$0")/.." && pwd)"
model_config="${GPU_CHECK_MODEL_CONFIG:-$root/examples/gpu/models/qwen3-1.7b/config.json}"
read -r -a extra <<<"${GPU_CHECK_SET:-}"  # more --set KEY=VALUE pairs (a shorter smoke run of this script)
mkdir -p "$out" "$runs"
rlzoo=(python3 -m rlzoo.cli)

check_and_train() {  # name config timeout_s --set ...
    local name="$1" config="$2" limit="$3"; shift 3
    local sets=(--set "output_dir=$runs/$name-run" "$@" "${extra[@]}")
    "${rlzoo[@]}" config check "$config" "${sets[@]}" --device-memory 80GB >"$out/$name-check.txt" 2>&1 \
        || { echo "$name: config check failed"; tail -20 "$out/$name-check.txt"; return 1; }
    sed -n '/^# GPU memory/,/^#   total/p' "$out/$name-check.txt"
    local start=$SECONDS
    timeout "$limit" "${rlzoo[@]}" train "$config" "${sets[@]}" >"$out/$name-train.txt" 2>&1
    echo "$name: rlzoo train exit $? after $((SECONDS - start)) s"
    tail -5 "$out/$name-train.txt"
    cp "$runs/$name-run/metrics.jsonl" "$out/$name-metrics.jsonl" 2>/dev/null
    python3 - "$out/$name-metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in rows if "time/train" in r]
for r in steps:
    phases = sum(v for k, v in r.items() if k.startswith("time/"))
    shown = {k: round(v, 2) for k, v in r.items() if k.startswith(("time/", "memory/")) or k in ("step", "reward/mean")}
    print(f"step {r.get('step')}: {phases:.2f} s in its phases", shown)
if steps:
    peak = max(r.get("memory/gpu_peak_gb", float("nan")) for r in steps)
    later = [sum(v for k, v in r.items() if k.startswith("time/")) for r in steps[1:]]
    print(f"peak GPU memory (allocated) {peak:.2f} GB; mean s/step after the first {sum(later) / max(len(later), 1):.2f}")
evals = [r for r in rows if "eval/accuracy" in r]
print("eval/accuracy by step:", [(r.get("step"), round(r["eval/accuracy"], 3)) for r in evals])
EOF
}

case "$what" in
recipe)
    random_model="$runs/qwen3-1.7b-random"  # built once, kept for a rerun
    [ -f "$random_model/config.json" ] || python3 "$root/examples/gpu/make_random_model.py" "$model_config" \
        "$source_dir" "$random_model" || exit 1
    check_and_train qwen3-1.7b "$root/examples/gpu/qwen3_1.7b_grpo.yaml" 330 \
        --set model.path="$random_model" --set 'task={name: arithmetic, digits: 2}' \
        --set prompt.plain=chat \
        --set 'rollout.engine={name: hf, batch_size: 128}' --set 'trainer.engine={name: torch}' \
        --set rollout.prompts_per_step=16 --set rollout.max_new_tokens=256 \
        --set trainer.max_tokens_per_micro_batch=4096 \
        --set train.steps="$steps" --set train.eval_every=1000 --set train.eval_prompts=16 \
        --set train.checkpoint_every=1000
    ;;
smollm2)
    check_and_train smollm2 "$root/examples/smollm2_arithmetic.yaml" 330 \
        --set model.path="$source_dir" --set 'rollout.engine={name: hf, batch_size: 128}' \
        --set 'trainer.engine={name: torch}' --set trainer.max_tokens_per_micro_batch=1024
    ;;
*)
    echo "gpu_check.sh: the second argument is recipe or smollm2, not $what" >&2; exit 2 ;;
esac
