#!/usr/bin/env bash
# Issue 25's block-wise fp8 bar on the random 8B: the bf16 model under `--quantize fp8`
# (per-channel weights, each row quantized at run time) as engine textgen[fp8], then a block-wise
# fp8 checkpoint of the same shape (128 x 128 blocks, DeepSeek / Qwen3-FP8 layout) served by
# textgen at its defaults, on WORKLOADS (default batch1,burst); the KV cache is bf16 in both. The
# report's "variant / textgen" column is per-channel over block-wise (the bar: at most 1 on
# throughput). Results: $OUT/block_fp8.{json,md}; the servers' logs in $OUT/logs.tgz. Caps:
# SERVE_S (200 a server).
source "$(dirname "$0")/common.sh"
serve() {  # NAME [flags]: results in /tmp/NAME-out
  local name=$1; shift
  stage "$name" "${SERVE_S:-200}" python3 bench/gpu_vs_vllm.py --tokenizer-dir "$TOKENIZER" --router-binary "$ROUTER" \
    --workloads "${WORKLOADS:-batch1,burst}" --out "/tmp/$name-out" "$@"
  for log in /tmp/$name-out/*.log; do [ -e "$log" ] && cp "$log" "$LOGS/${name}_$(basename "$log")"; done
}
serve per_channel --engines "" --textgen-variant "fp8=--quantize fp8"
serve block --checkpoint fp8-block --engines textgen --resume /tmp/per_channel-out/gpu_vs_vllm.json
cp /tmp/block-out/gpu_vs_vllm.json "$OUT/block_fp8.json" 2>/dev/null
cp /tmp/block-out/gpu_vs_vllm.md "$OUT/block_fp8.md" 2>/dev/null
tar -C "$LOGS" -czf "$OUT/logs.tgz" .
exit 0
