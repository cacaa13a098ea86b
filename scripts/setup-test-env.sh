#!/usr/bin/env bash
# Create .venv with the official Python SDKs the server tests call the API with (anthropic,
# openai, httpx), the reference JSON Schema validator (jsonschema) the generation test uses, the
# `oras` SDK (tests/oci_registry.rs: interoperability of `bundle push`/`pull` with oras), the
# agent frameworks tests/py/agents_client.py runs (openai-agents, langchain-openai; pinned), and
# NVIDIA's NVRTC and ptxas wheels (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12, pinned to CUDA
# 12.2, the oldest CUDA of the targets: JetPack 6) with which `applianced build` compiles the CUDA
# kernels to PTX and the tests assemble it; no GPU and no CUDA toolkit needed. Also installs
# Mesa's software Vulkan driver (lavapipe) for the wgpu backend's tests. Idempotent: an existing
# venv that already has everything is kept.
# Usage: scripts/setup-test-env.sh   (then APPLIANCED_TEST_PYTHON=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian tools some tests use when present: curl (socket client), promtool (metrics lint, from
# `prometheus`), systemd-analyze / systemd-socket-activate (unit hardening, socket activation),
# skopeo (tests/oci_layout.rs: `skopeo copy` of an exported OCI layout; required when
# APPLIANCED_SLOW_TESTS is set), docker-registry (the CNCF distribution registry, for
# tests/oci_registry.rs on loopback; required likewise), openssl (a site CA for its TLS test).
# Installed when running as root on Debian; a failure here only
# makes those checks skip.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  command -v curl >/dev/null || need+=(curl)
  command -v promtool >/dev/null || need+=(prometheus)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v skopeo >/dev/null || need+=(skopeo)
  command -v docker-registry >/dev/null || need+=(docker-registry)
  command -v openssl >/dev/null || need+=(openssl)
  ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup-test-env: installing ${need[*]}" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >&2 \
      || echo "setup-test-env: could not install ${need[*]}; those checks will be skipped" >&2
  fi
fi
VENV=.venv
PY="$VENV/bin/python"
NVRTC_PIN='nvidia-cuda-nvrtc-cu12==12.2.140'
NVCC_PIN='nvidia-cuda-nvcc-cu12==12.2.140'
have_nvidia() { compgen -G "$VENV/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" >/dev/null \
  && compgen -G "$VENV/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas" >/dev/null; }
if [ -x "$PY" ] && "$PY" -c 'import anthropic, openai, httpx, jsonschema, oras, agents, langchain_openai' 2>/dev/null && have_nvidia; then
  exit 0
fi
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null; then
  echo "setup-test-env: $PYTHON not found; the SDK tests will be skipped" >&2
  exit 0
fi
[ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
"$PY" -m pip install --quiet --disable-pip-version-check 'anthropic>=0.40' 'openai>=1.50' 'httpx>=0.27' 'jsonschema[format-nongpl]>=4.23' 'oras==0.2.43' \
  'openai-agents==0.24.0' 'langchain-openai==1.8.1' "$NVRTC_PIN" "$NVCC_PIN"
"$PY" -c 'import importlib.metadata, anthropic, openai, httpx, jsonschema; print("setup-test-env: anthropic", anthropic.__version__, "openai", openai.__version__, "httpx", httpx.__version__, "jsonschema", importlib.metadata.version("jsonschema"))' >&2
