#!/usr/bin/env bash
# Issue 26 on the predictable 8B: SERVERS (default off,on; vllm added with PEER=1, after
# .peer/tools/install.sh) on WORKLOADS (default batch1,burst64). Results and the plan go to
# $OUT as each server finishes; SPEC_S caps the whole run (default 540).
source "$(dirname "$0")/common.sh"
SERVERS=${SERVERS:-off,on}
peer=()
if [ "${PEER:-0}" = 1 ]; then
  bash .peer/tools/install.sh > "$OUT/peer_install.log" 2>&1 || { cat "$OUT/peer_install.log"; exit 3; }
  SERVERS=$SERVERS,vllm
  peer=(--peer-env .peer/tools/env.sh)
fi
[ -d /tmp/spec-keep ] && cp /tmp/spec-keep/gpu_speculation_plan.json "$OUT/" 2>/dev/null
stage speculation "${SPEC_S:-540}" python3 bench/gpu_speculation.py --tokenizer-dir "$TOKENIZER" \
  --router-binary "$ROUTER" --out "$OUT" --servers "$SERVERS" --workloads "${WORKLOADS:-batch1,burst64}" "${peer[@]}"
mkdir -p /tmp/spec-keep && cp "$OUT"/gpu_speculation_plan.json /tmp/spec-keep/ 2>/dev/null
# The servers' logs join logs.tgz, leaving room in $OUT for a later script's files.
mv "$OUT"/*.log "$LOGS"/ 2>/dev/null; tar -C "$LOGS" -czf "$OUT/logs.tgz" .
exit 0
