#!/usr/bin/env bash
# A GPU session's checks in one command (docs/gpu.md), most valuable first: each phase has its
# own time limit and its own log, so one that fails or runs out of time leaves the others'
# results. Run from the repository root where CuPy sees a GPU:
#
#     bash bench/gpu_session.sh                  # logs and JSON in $OUT, else runs/gpu-session/
#     bash bench/gpu_session.sh tests profile    # only these phases, in this order
#     BASE=path/to/older/checkout bash bench/gpu_session.sh   # also that code's nanobert profile
#
# Phases (default: env tests targets profile fused eager base; ~9 minutes without BASE, an
# estimate from the last session's 8 profile runs in under 5 minutes; each limit caps a phase
# that hangs):
#   env      the GPU, versions, load, the CUDA wheels; require_gpu's check (NVRTC compiles)
#   tests    every test marked gpu: first, so that a kernel CUDA refuses shows at once
#   targets  bench.gpu_profile, TF32: BERT-mini B=128 T=128 (tokens/s, beside torch) and
#            `python train.py --device gpu`, the nano default (tokens/s of its progress line)
#   profile  bench.gpu_profile: nanobert and torch, BERT-base T=128 B=32,128 and T=512 B=32,
#            tf32 and float16 (time, host time, tokens/s, peak memory, kernels), and the
#            float64 parity line
#   fused    BERT-base T=128 B=128 and T=512 B=32, nanobert alone, NANOBERT_FUSED_ATTENTION=1:
#            the fused attention (float16 on tensor cores, float32 SIMT) against `profile`
#   eager    the same BERT-base B=32, BERT-mini and train.py cases, nanobert alone, with
#            NANOBERT_CUDA_GRAPH=0: each step issued kernel by kernel (the graph's own effect)
#   base     $BASE's nanobert (an older checkout), profiled by this bench.gpu_profile, alone:
#            BERT-base T=128 B=32,128 and its train.py
#   train    train.py --device gpu --preset mini, B=128 T=128: the progress line, the checkpoint
#   host     bench.gpu_host: host cost per call, and where the host waits (the GPU kept busy
#            200 ms before each step), BERT-base and BERT-mini at B=32
#   adds     bench.gpu_host --adds --vector --graph --vocab: GPU time of the step's adds, row
#            means and row kernels against the alternatives, of adds that move 16 bytes a
#            thread; a CUDA graph's replay against eager launches, and cuBLAS (through ctypes)
#            inside a graph; the MLM decoder's products at B=128, the vocab's rows padded and
#            not (float16, TF32)
set -u
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

phase() {        # phase NAME LIMIT_S COMMAND...: run it under a limit, log to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name: start $(date +%T), limit ${limit} s"
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: rc $? at $(date +%T)"
    tail -n "${TAIL:-25}" "$OUT/$name.log"
}

run_phase() {
    case $1 in
    env) phase env 30 bash -c "uptime; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv; $PY -c 'import cupy, numpy, sys; print(sys.version.split()[0], \"cupy\", cupy.__version__, \"numpy\", numpy.__version__, \"CUDA runtime\", cupy.cuda.runtime.runtimeGetVersion())'; $PY -c 'import torch, transformers; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__)'; \
        $PY -m pip list 2>/dev/null | grep -i -E '^(cupy|cuda-|nvidia-)'; \
        $PY -c 'from nanobert.backend import require_gpu; require_gpu(); print(\"require_gpu: ok\")'" ;;
    targets) TAIL=20 phase targets "${TARGETS_LIMIT:-90}" $PY -m bench.gpu_profile \
        --cases mini:128x128,train.py --precisions tf32 --no-parity --out "$OUT/targets.json" ;;
    profile) TAIL=70 phase profile "${PROFILE_LIMIT:-330}" $PY -m bench.gpu_profile \
        --cases base:32x128,base:128x128,base:32x512 --precisions tf32,float16 --steps 10 \
        --out "$OUT/profile.json" ;;
    fused) TAIL=30 NANOBERT_FUSED_ATTENTION=1 phase fused "${FUSED_LIMIT:-100}" $PY -m \
        bench.gpu_profile --no-torch --no-parity --cases base:128x128,base:32x512 \
        --precisions tf32,float16 --steps 10 --out "$OUT/fused.json" ;;
    eager) TAIL=30 NANOBERT_CUDA_GRAPH=0 phase eager "${EAGER_LIMIT:-100}" $PY -m \
        bench.gpu_profile --no-torch --no-parity --cases base:32x128,mini:128x128,train.py \
        --precisions tf32,float16 --steps 10 --out "$OUT/eager.json" ;;
    tests) phase tests "${TESTS_LIMIT:-110}" $PY -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_gpu_numerics.py tests/test_inputs.py tests/test_special.py \
        tests/test_cuda_graph.py tests/test_fused_attention.py ;;
    train) phase train 60 $PY train.py --device gpu --preset mini --max-seq-length 128 \
        --batch-size 128 --steps 200 --log-every 50 --heldout none --out /tmp/gpu-session-train ;;
    base) if [ -n "${BASE:-}" ]; then
            cp bench/gpu_profile.py "$BASE/bench/gpu_profile.py"
            TAIL=40 phase base "${BASE_LIMIT:-150}" bash -c "cd '$BASE' && $PY -m \
                bench.gpu_profile --no-torch --no-parity --cases base:32x128,base:128x128,train.py \
                --precisions tf32,float16 --steps 10 --out '$(cd "$OUT" && pwd)/base.json'"
        fi ;;
    host) TAIL=45 phase host 90 bash -c "$PY -m bench.gpu_host --busy-ms 200 --top 30 && \
        $PY -m bench.gpu_host --no-calls --preset mini --busy-ms 200 --top 8" ;;
    adds) phase adds 90 $PY -m bench.gpu_host --adds --vector --graph --vocab --batch-size 128 \
        --no-calls --no-profile ;;
    *) echo "bench/gpu_session.sh: no phase '$1' (env tests targets profile base train host adds)"
       return 2 ;;
    esac
}

for name in "${@:-env tests targets profile fused eager base}"; do
    for one in $name; do run_phase "$one"; done
done
