#!/usr/bin/env bash
# One lent GPU's checks in one device call (the device tool allows 10 minutes a call and 15 a
# session, so this ends by itself after --budget seconds, 540 by default), in order of need,
# each stage within what the budget has left:
#
#   1. set-up from carried wheels (the machine reaches no package index): NumPy 2.4.x first
#      (numba-cuda 0.30 fails on 2.5), then ndp itself (editable, no dependencies);
#   2. benchmarks/gpu/gpu_check.py's checks: the gpu tests, the device-equality tests, the
#      schedules' CUDA tests and memcheck side by side, then two ranks under torchrun (sharing
#      the GPU where there is one);
#   3. benchmarks/gpu/kernel_profile.py: Nsight Compute on the verdict and build kernels (PROFILE=0
#      leaves it out);
#   4. bench_gpu_loader.py alone on the device, packed+documents too (BENCH=0 leaves it out);
#   5. benchmarks/plan/bench_schedule.py --backend cuda: a schedule's cost on the GPU (SCHEDULE=0);
#   6. benchmarks/training/train_gpt2.py at GPT-2-small size: ndp on the GPU, torchdata (the
#      fastest peer of bench_loaders.py, from a carried wheel) and ndp on the CPU (TRAIN=0);
#   7. benchmarks/loaders/bench_loaders.py --quick: ndp on the GPU and on the CPU against torchdata,
#      litdata and nanoGPT's get_batch, every batch on the GPU, in the time left (DALI's wheel,
#      hundreds of MB, is over what a device call carries; LOADERS=0).
#
# Usage, on the lent machine from the repository root, with the wheels in .whl/ (ignored by git;
# the device tool's README says how to download them for it):
#
#   bash benchmarks/gpu_session.sh [--budget SECONDS]
#   CHECKS="gpu-tests device-equality" bash benchmarks/gpu_session.sh   # gpu_check's steps
#   TRAIN=0 LOADERS=0 bash benchmarks/gpu_session.sh                     # without stages 6, 7
#   CHECKS_S=150 bash benchmarks/gpu_session.sh     # seconds for stage 2 (200)
#   NDP_COMMIT=b5e6257 bash benchmarks/gpu_session.sh   # the commit sent, clean
#
# The device tool's copy of .git is the one the session started with, so git there names an
# older commit and reads the tree as changed ("-dirty"): commit first, then pass the commit sent
# as NDP_COMMIT, which the results files record instead.
#
# Everything goes to $OUT (the device tool's folder; ./ndp-results elsewhere): the results files
# (gpu-loader-*.json, kernel-profile-*.json, schedule-*.json, train-gpt2-*.json,
# memcheck-*.log) and gpu-session.log; the logs of
# failed steps and the benchmarks' figures (PNG) are packed into gpu-session-logs.tgz, so that
# few files come back (the device tool returns 8 at most).
set -u
budget=540
[ "${1:-}" = "--budget" ] && budget=$2
OUT=${OUT:-ndp-results}
WHEELS=${WHEELS:-.whl}
RES=$(mktemp -d)
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-session.log") 2>&1
left() { echo $((budget - SECONDS)); }

echo "== set-up ($(date -u +%FT%TZ))"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/numpy-2.4*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
export NDP_PEER_WHEELS=$PWD/$WHEELS PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 - <<'EOF'
import numpy, numba, torch, cupy
from importlib.metadata import version
print(f"numpy {numpy.__version__}, numba {numba.__version__}, numba-cuda {version('numba-cuda')},"
      f" cupy {cupy.__version__}, torch {torch.__version__}, cuda {torch.version.cuda}")
EOF

# a stage's seconds: what it asks for, at most what the budget has left (15 s kept for the end)
cap() { local l=$(( $(left) - 15 )); echo $(( $1 < l ? $1 : (l > 10 ? l : 10) )); }

echo "== gpu_check: the checks ($(left) s left)"
python3 benchmarks/gpu/gpu_check.py --out "$RES" --budget "$(cap ${CHECKS_S:-200})" \
    --steps ${CHECKS:-gpu-tests device-equality device-schedules memcheck two-ranks}
if [ "${PROFILE:-1}" = 1 ]; then
    echo "== kernel_profile ($(left) s left)"
    timeout "$(cap 150)" python3 benchmarks/gpu/kernel_profile.py --out "$RES"
fi
if [ "${BENCH:-1}" = 1 ]; then
    echo "== gpu_check: the loader benchmark ($(left) s left)"
    python3 benchmarks/gpu/gpu_check.py --out "$RES" --budget "$(cap 160)" --steps bench-gpu-loader
fi
if [ "${SCHEDULE:-1}" = 1 ]; then
    echo "== bench_schedule on the GPU ($(left) s left)"
    timeout "$(cap 120)" python3 benchmarks/plan/bench_schedule.py --backend cuda --rounds 3 \
        --out "$RES"
fi
if [ "${TRAIN:-1}" = 1 ]; then
    echo "== train_gpt2 ($(left) s left)"
    timeout "$(cap 200)" python3 benchmarks/training/train_gpt2.py \
        --feeds ndp-gpu-packed torchdata-0w ndp-cpu-packed --steps 100 --warmup 15 --out "$RES"
fi
if [ "${LOADERS:-1}" = 1 ]; then
    echo "== bench_loaders ($(left) s left)"
    timeout "$(cap 150)" python3 benchmarks/loaders/bench_loaders.py \
        --quick --seconds 3 --pipelines ndp-gpu-padded ndp-gpu-packed ndp-cpu-packed \
        torchdata-0w litdata-0w memmap-get-batch --out "$RES"
fi

echo "== results ($(left) s left)"
cp "$RES"/*.json "$RES"/memcheck-*.log "$OUT"/ 2>/dev/null
packed=$(cd "$RES" && ls *.log *.png 2>/dev/null)
[ -n "$packed" ] && tar czf "$OUT/gpu-session-logs.tgz" -C "$RES" $packed
ls -la "$OUT"
