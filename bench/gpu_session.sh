#!/usr/bin/env bash
# A GPU session's measurements in one device call (docs/gpu.md), most valuable first: each
# phase has its own time limit, so one that fails or runs out of time leaves the others'
# results. Run from the repository root where CuPy sees a GPU:
#
#     bash bench/gpu_session.sh                 # the first call's phases (below)
#     bash bench/gpu_session.sh second          # a second call's phases, if a second comes
#     bash bench/gpu_session.sh tests profile   # only these phases, in this order
#     DRY_RUN=1 bash bench/gpu_session.sh       # on the CPU stand-in of CuPy, tiny models
#
# What comes back, at most 4 files in $OUT (else runs/gpu-session/): session.json (every run's
# figures, its phase and environment, and the ratios: nanobert over torch eager and over
# torch.compile, graph over eager, fused attention over unfused; bench/gpu_session.py),
# summary.txt (a short table of the same), session.log (every phase's output). Work files
# go to a temporary folder.
#
# The first call's phases, limits 20 + 70 + 150 + 110 + 90 + 40 = 480 s (a call has 600; the
# machine's start comes on top). The limits cap phases that hang; what fits in them is an
# estimate, unmeasured: bench.gpu_profile runs a framework's cases at one precision in one
# process (the last session paid ~35 s a case for a process each: imports, CUDA's start,
# NVRTC), ~10 s a process then ~5-8 s a BERT-base case; torch.compile's first step of
# BERT-base ~40-60 s (PyTorch's own reports of compile times).
#   env       the GPU, versions, the CUDA wheels; require_gpu (NVRTC compiles)
#   tests     every test marked gpu (a kernel CUDA refuses shows at once)
#   profile   BERT-base T=128 B=32,128 and T=512 B=32, TF32 and float16, nanobert and torch
#             eager: time, host time, tokens/s, memory, kernels, how the step ran; parity
#   compile   torch.compile (default mode) on BERT-base T=128 B=128, float16 and TF32
#   variants  nanobert alone, float16: the step eager (NANOBERT_CUDA_GRAPH=0) at T=128 B=32;
#             the fused attention at T=128 B=128 and T=512 B=32, tiles of 32 keys and of 64
#   models    BERT-mini B=128 T=128 and BERT-large B=16 T=128, float16, nanobert and torch
# The second call's phases ("second"): targets (BERT-mini TF32 and train.py's tokens/s), eager
# (more cases without the graph), host (host cost per call), adds (kernel experiments).
set -u
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG="$OUT/session.log"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
FIRST="env tests profile compile variants models"
SECOND="targets eager host adds"
STEPS=5
if [ -n "${DRY_RUN:-}" ]; then     # the CPU stand-in (tests/standin_site), tiny models
    export NANOBERT_CUPY_STANDIN=1 PYTHONPATH=tests/standin_site:tests:$PYTHONPATH
    STEPS=1
fi

cases() {        # a phase's cases; in a dry run each becomes tiny:2x16
    if [ -n "${DRY_RUN:-}" ]; then echo tiny:2x16; else echo "$1"; fi
}

phase() {        # phase NAME LIMIT_S COMMAND...: run it under a limit, its output to the log
    local name=$1 limit=$2
    shift 2
    echo "== $name: start $(date +%T), limit ${limit} s" | tee -a "$LOG"
    timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "== $name: rc $rc$([ $rc = 124 ] && echo ' (out of time)') at $(date +%T)" | tee -a "$LOG"
}

profile_phase() {   # NAME LIMIT_S [ENV=VALUE ...] -- gpu_profile flags: its JSON in $WORK
    local name=$1 limit=$2
    shift 2
    local env=()
    while [ "$1" != "--" ]; do env+=("$1"); shift; done
    shift
    phase "$name" "$limit" env "${env[@]}" $PY -m bench.gpu_profile --steps "$STEPS" \
        --worker-timeout "$((limit - 5))" --out "$WORK/$name.json" "$@"
}

run_phase() {
    case $1 in
    env) phase env 20 bash -c "nvidia-smi --format=csv \
        --query-gpu=name,memory.total,driver_version,clocks.max.sm; \
        $PY -c 'import cupy, numpy, sys; print(sys.version.split()[0], \"cupy\", \
            cupy.__version__, \"numpy\", numpy.__version__)'; \
        $PY -c 'import torch, transformers; print(\"torch\", torch.__version__, \
            \"transformers\", transformers.__version__)'; \
        $PY -c 'from nanobert.backend import require_gpu; require_gpu(); \
            print(\"require_gpu: ok\")'" ;;
    tests) phase tests 70 $PY -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_gpu_numerics.py tests/test_inputs.py tests/test_special.py \
        tests/test_cuda_graph.py tests/test_fused_attention.py ;;
    profile) profile_phase profile 150 -- --no-compile --precisions tf32,float16 \
        --cases "$(cases base:32x128,base:128x128,base:32x512)" ;;
    compile) profile_phase compile 110 -- --frameworks torch.compile --no-parity \
        --precisions float16,tf32 --cases "$(cases base:128x128)" ;;
    variants)
        profile_phase eager 25 NANOBERT_CUDA_GRAPH=0 -- --no-torch --no-parity \
            --precisions float16 --cases "$(cases base:32x128)"
        profile_phase fused 35 NANOBERT_FUSED_ATTENTION=float16 -- --no-torch --no-parity \
            --precisions float16 --cases "$(cases base:128x128,base:32x512)"
        profile_phase fused-tile64 30 NANOBERT_FUSED_ATTENTION=float16 \
            NANOBERT_ATTENTION_TILE=64 -- --no-torch --no-parity --precisions float16 \
            --cases "$(cases base:128x128,base:32x512)" ;;
    models) profile_phase models 40 -- --no-compile --no-parity --precisions float16 \
        --cases "$(cases mini:128x128,large:16x128)" ;;
    targets) profile_phase targets 90 -- --no-compile --no-parity --precisions tf32 \
        --cases "$(cases mini:128x128),train.py" --train-py-steps "$((STEPS * 40))" ;;
    eager) profile_phase eager-more 100 NANOBERT_CUDA_GRAPH=0 -- --no-torch --no-parity \
        --precisions tf32,float16 --cases "$(cases base:128x128,mini:128x128)" ;;
    host) phase host 90 bash -c "$PY -m bench.gpu_host --busy-ms 200 --top 30 && \
        $PY -m bench.gpu_host --no-calls --preset mini --busy-ms 200 --top 8" ;;
    adds) phase adds 90 $PY -m bench.gpu_host --adds --vector --graph --vocab --batch-size 128 \
        --no-calls --no-profile ;;
    *) echo "bench/gpu_session.sh: no phase '$1' ($FIRST; second: $SECOND)" | tee -a "$LOG"
       return 2 ;;
    esac
    # after every phase: a call cut short keeps what it measured
    $PY -m bench.gpu_session "$WORK" --out "$OUT/session.json" --summary "$OUT/summary.txt" \
        >>"$LOG" 2>&1
}

names=${*:-first}
names=${names/second/$SECOND}
names=${names/first/$FIRST}
for name in $names; do run_phase "$name"; done
cat "$OUT/summary.txt" 2>/dev/null
rm -rf "$WORK"
