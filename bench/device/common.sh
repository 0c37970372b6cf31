# Sourced at the start of a device call (repository root): the router, the tokenizer, a GPU
# line in $OUT, and `stage NAME SECONDS CMD...`, which caps a stage and logs it to $OUT/NAME.log.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TOKENIZER=$PWD/.gpurun/tokenizer
ROUTER=/tmp/textgen-router
if [ -e .gpurun/textgen-router.xz ]; then
  xz -dc .gpurun/textgen-router.xz > "$ROUTER" && chmod +x "$ROUTER"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

stage() {
  local name=$1 seconds=$2; shift 2
  local started=$SECONDS
  echo "== $name (cap ${seconds}s)"
  timeout --kill-after=10 "$seconds" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc after $((SECONDS - started))s" | tee -a "$OUT/$name.log"
  tail -n 15 "$OUT/$name.log"
  return $rc
}
