# Sourced at the start of a device call (repository root): the router, the tokenizer, and
# `stage NAME SECONDS CMD...`, which caps a stage, logs it and prints its tail. At most 8 files
# come back from $OUT, so the logs travel as one $OUT/logs.tgz, refreshed after every stage.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TOKENIZER=$PWD/.gpurun/tokenizer
ROUTER=/tmp/textgen-router
LOGS=/tmp/device-logs
mkdir -p "$LOGS"
if [ -e .gpurun/textgen-router.xz ]; then
  xz -dc .gpurun/textgen-router.xz > "$ROUTER" && chmod +x "$ROUTER"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"

stage() {
  local name=$1 seconds=$2; shift 2
  local started=$SECONDS
  echo "== $name (cap ${seconds}s)"
  timeout --kill-after=10 "$seconds" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc after $((SECONDS - started))s" >> "$LOGS/$name.log"
  tail -n "${TAIL_LINES:-12}" "$LOGS/$name.log"
  tar -C "$LOGS" -czf "$OUT/logs.tgz" .
  return $rc
}

# vLLM's environment, kept beside its unpacked site: a later call on the same machine need not
# carry .peer/tools again to serve it.
PEER_ENV=/tmp/peer/env.sh
install_peer() {  # unpacks the carried vLLM bundle (after the .peer/c1 and c2 carry calls), or exits 3
  # install.sh reads PEER as its parts folder: a caller's PEER=1 must not reach it
  PEER=/tmp/peer bash .peer/tools/install.sh > "$LOGS/peer_install.log" 2>&1 || { cat "$LOGS/peer_install.log"; exit 3; }
  cp .peer/tools/env.sh "$PEER_ENV"
}
