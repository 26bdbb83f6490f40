#!/usr/bin/env bash
# The GPU check (issues 40 and 60), in one run of under 8 minutes on a machine with cupy,
# NCCL and a GPU (no Ray: the process launcher), its results written to one folder; each
# part under its own timeout, so one failing or slow part never stops the others:
#   env.txt         the device (nvidia-smi), driver, CUDA, NCCL, cupy, numpy versions
#   tests.log/.xml  pytest tests/gpu: the paper's cases on nccl in int32, float32 and
#                   bfloat16, partial sums (float32, bfloat16), casts on the wire (bf16,
#                   fp8 with tensor and 128x128 block scales), random layouts, bad
#                   input, a killed worker; reshard.bits and pitched copies on cupy;
#                   the fused casts (tests/gpu/test_fused_casts.py: every scale format,
#                   fp32 -> bf16, on cupy and torch CUDA tensors, bit-exact against
#                   reference_cast; torch's eager CUDA path exact); the batched box copies
#                   (200 mixed boxes, 1,000 x 16 KiB) and calibrate.gpu_cast_bandwidth;
#                   NIXL WRITEs of strided rows into and out of GPU memory (VRAM
#                   registrations), when NIXL is there: the image has none, so carry
#                   the wheels scripts/gpu_wheels.sh downloads (`carry: [".whl"]`)
#   gpu_cast.log/.json  the DeepSeek-V3 FFN weight [7168, 18432] cast as the nccl
#                   backend casts it (bf16 -> fp8 block128 / tensor / block128-ue8m0 /
#                   mx32, e5m2, unscaled; fp32 -> bf16) vs cudaMemcpy moving the same
#                   bytes, each with its time / bound, issue 60's goal and exactness;
#                   torch.compile and eager of the plain recipe and reshard on torch
#                   tensors beside it; 1,000 x 16 KiB boxes: per-box launches vs one
#                   batched launch vs one copy; the presets' cast_bandwidth line
#   gpu_pack.log/.json  pack / unpack of the paper's strided boxes vs a plain
#                   device-to-device copy of the same bytes, 1 MiB - 1 GiB
#   summary.txt     the lines to read first: pytest's tally, every cast's ratio, goals,
#                   the boxes, cast_bandwidth
# With one GPU, the four ranks share it (a distinct NCCL_HOSTID each: correctness only,
# never timings). With several, the ranks get their own GPUs.
#
# usage: scripts/gpu_check.sh [--dry-run] [OUTDIR]    (OUTDIR default: $OUT, else gpu-results)
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
RESULTS="${1:-${OUT:-gpu-results}}"
PY="${PYTHON:-python3}"
TESTS_S="${GPU_TESTS_TIMEOUT:-200}"   # the pytest run's wall-clock cap
CAST_S="${GPU_CAST_TIMEOUT:-200}"     # the cast benchmark's
PACK_S="${GPU_PACK_TIMEOUT:-45}"      # the pack benchmark's
export PYTHONUNBUFFERED=1

run() {  # print the command; run it unless --dry-run
  echo "+ $*"
  if (( ! DRY )); then "$@"; fi
}

mkdir -p "$RESULTS"
start=$(date +%s)
{
  run nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm \
      --format=csv
  run nvidia-smi -L
  run "$PY" -c "import sys, numpy, cupy
from cupy.cuda import nccl, runtime
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__)
print('CUDA runtime', runtime.runtimeGetVersion(), 'driver', runtime.driverGetVersion(),
      'NCCL', nccl.get_version(), 'GPUs', runtime.getDeviceCount())"
} 2>&1 | tee "$RESULTS/env.txt"

# wheels carried in .whl/ (scripts/gpu_wheels.sh), installed beside the image's packages
if compgen -G ".whl/*.whl" > /dev/null; then
  run "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
run "$PY" -c "import importlib.util as u
print('nixl', 'present' if u.find_spec('nixl') else 'absent (tests/gpu/test_nixl_vram.py skips)')" \
    2>&1 | tee -a "$RESULTS/env.txt"

# reshard as CI installs it (editable: the top-level folders are reshard's subpackages),
# without dependencies: the image has them and no registry is reachable
run "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
run "$PY" -c "import reshard.planner, reshard.comm.backends.nccl as n; assert n.available()"

run timeout -k 10 "$TESTS_S" "$PY" -m pytest tests/gpu -v -p no:cacheprovider \
    --junitxml="$RESULTS/tests.xml" 2>&1 | tee "$RESULTS/tests.log"

run timeout -k 10 "$CAST_S" "$PY" -m reshard.microbench.gpu_cast -n 10 -w 2 \
    -J "$RESULTS/gpu_cast.json" 2>&1 | tee "$RESULTS/gpu_cast.log"

run timeout -k 10 "$PACK_S" "$PY" -m reshard.microbench.gpu_pack -n 10 -w 2 \
    -J "$RESULTS/gpu_pack.json" 2>&1 | tee "$RESULTS/gpu_pack.log"

if (( ! DRY )); then
  {
    echo "== tests/gpu"; grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$RESULTS/tests.log"
    echo "== gpu_cast (ms; device / bound; goal; exact)"
    grep -E " -> |goals met|boxes|cast_bandwidth|FAILED" "$RESULTS/gpu_cast.log"
    echo "== gpu_pack"; grep -E "^goal" "$RESULTS/gpu_pack.log"
  } > "$RESULTS/summary.txt" 2>&1
  cat "$RESULTS/summary.txt"
fi
echo "gpu_check: $(( $(date +%s) - start )) s; results in $RESULTS"
