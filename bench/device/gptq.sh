#!/usr/bin/env bash
# Issue 25 on the random 8B: a GPTQ checkpoint (4 bits, group 128) and the bf16 model, served by
# textgen, and the GPTQ one by vLLM too (PEER=1, after the carry calls of .peer/c1 and c2), on
# WORKLOADS (default batch1,burst). With WRITE_ONLY=1 the call only writes both models (no router
# needed, so it fits beside a .peer/c1 carry). Results: $OUT/gptq.{json,md} and bf16.{json,md};
# the servers' logs in $OUT/logs.tgz. Caps: GPTQ_S (180 a server).
source "$(dirname "$0")/common.sh"
bench() {  # NAME OUT_DIR [flags]
  local name=$1 out=$2; shift 2
  stage "$name" "${GPTQ_S:-180}" python3 bench/gpu_vs_vllm.py --tokenizer-dir "$TOKENIZER" --router-binary "$ROUTER" \
    --peer-env "$PEER_ENV" --workloads "${WORKLOADS:-batch1,burst}" --out "$out" "$@"
}
if [ "${WRITE_ONLY:-0}" = 1 ]; then
  for checkpoint in "" "--checkpoint gptq"; do
    stage "write${checkpoint:+_gptq}" 240 python3 bench/gpu_vs_vllm.py --write-model --tokenizer-dir "$TOKENIZER" \
      --out /tmp/gptq-bench $checkpoint
  done
  exit 0
fi
bench textgen_gptq /tmp/gptq-out --checkpoint gptq --engines textgen
if [ "${PEER:-0}" = 1 ]; then
  install_peer
  bench vllm_gptq /tmp/gptq-out --checkpoint gptq --engines vllm --resume /tmp/gptq-out/gpu_vs_vllm.json
fi
bench textgen_bf16 /tmp/bf16-out --engines textgen
for name in gptq bf16; do
  cp /tmp/$name-out/gpu_vs_vllm.json "$OUT/$name.json" 2>/dev/null
  cp /tmp/$name-out/gpu_vs_vllm.md "$OUT/$name.md" 2>/dev/null
  for log in /tmp/$name-out/*.log; do [ -e "$log" ] && cp "$log" "$LOGS/${name}_$(basename "$log")"; done
done
tar -C "$LOGS" -czf "$OUT/logs.tgz" .
exit 0
