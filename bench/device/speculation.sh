#!/usr/bin/env bash
# Issue 26 on the predictable 8B: SERVERS (default off,on; "on off": one run each, in that
# order) on WORKLOADS (default batch1,burst64).
# With PEER=1 (after the carry calls of .peer/c1 and c2) vLLM is installed and measured first,
# since its figures are the ones a cut-short call would otherwise lose. Results and the plan go
# to $OUT as each server finishes; SPEC_S caps each run of the benchmark (default 540).
source "$(dirname "$0")/common.sh"
speculation() {  # NAME SERVERS [extra flags]
  local name=$1 servers=$2; shift 2
  stage "$name" "${SPEC_S:-540}" python3 bench/gpu_speculation.py --tokenizer-dir "$TOKENIZER" \
    --router-binary "$ROUTER" --out "$OUT" --servers "$servers" --workloads "${WORKLOADS:-batch1,burst64}" "$@"
}
while pgrep -f -- --write-models > /dev/null; do sleep 2; done  # a model still being written (kernels.sh)
[ -d /tmp/spec-keep ] && cp /tmp/spec-keep/gpu_speculation_plan.json "$OUT/" 2>/dev/null
if [ "${PEER:-0}" = 1 ]; then
  install_peer
  speculation speculation_vllm vllm --peer-env "$PEER_ENV"
fi
for servers in ${SERVERS:-off,on}; do
  speculation "speculation_${servers//,/_}" "$servers"
done
mkdir -p /tmp/spec-keep && cp "$OUT"/gpu_speculation_plan.json /tmp/spec-keep/ 2>/dev/null
# The servers' logs join logs.tgz, leaving room in $OUT for a later script's files.
mv "$OUT"/*.log "$LOGS"/ 2>/dev/null; tar -C "$LOGS" -czf "$OUT/logs.tgz" .
exit 0
