#!/usr/bin/env bash
# Issue 24 on the random Qwen3-30B-A3B (61 GB of bf16): textgen, then vLLM on the same model
# on WORKLOADS (default batch1, burst, both Poisson rates and the mix), the model written first
# where missing. ENGINES (default "textgen"; "vllm", "textgen vllm", or "" for none) are served
# in turn, vLLM into the earlier results (--resume) after the carry calls of .peer/c1, c2, c3;
# PEER=1 unpacks vLLM at the end of a textgen call that carries c3, for a next call of
# ENGINES=vllm. With WRITE_ONLY=1 the call only
# writes the model (no router needed, so it fits beside a .peer/c1 carry). OTHER=PATH (another
# revision's kernels/fused_moe.py) times the fused MoE kernels against it first
# (bench/gpu_moe_align.py, bench/gpu_fused_moe_ab.py).
# CHECKPOINT (gptq, awq or fp8-block; default none, bf16): the model written as a random
# checkpoint of that method, its experts packed (issue 25 on issue 24's models).
# Results: $OUT/moe.{json,md}; the servers' logs in $OUT/logs.tgz. Caps: MOE_S (300 an engine).
source "$(dirname "$0")/common.sh"
SHAPE=${SHAPE:-qwen3-30b-a3b}
RESULTS=/tmp/moe-out
MODEL_ARGS=(--shape "$SHAPE")
MODEL_DIR=/tmp/$SHAPE-random
if [ -n "${CHECKPOINT:-}" ]; then
  MODEL_ARGS+=(--checkpoint "$CHECKPOINT")
  MODEL_DIR=/tmp/$SHAPE-$CHECKPOINT-random
fi
serve() {  # ENGINE [flags]
  local engine=$1; shift
  stage "$engine" "${MOE_S:-300}" python3 bench/gpu_vs_vllm.py --tokenizer-dir "$TOKENIZER" --router-binary "$ROUTER" \
    --peer-env "$PEER_ENV" "${MODEL_ARGS[@]}" --out "$RESULTS" --engines "$engine" \
    --workloads "${WORKLOADS:-batch1,burst,poisson_8,poisson_32,mix}" "$@"
}
if [ -n "${OTHER:-}" ]; then
  stage moe_align 60 python3 bench/gpu_moe_align.py "$OUT/moe_align.json"
  stage moe_ab 90 python3 bench/gpu_fused_moe_ab.py "$OUT/fused_moe_ab.json" "$OTHER"
fi
if [ "${WRITE_ONLY:-0}" = 1 ] || { [ -n "${ENGINES-textgen}" ] && [ ! -e "$MODEL_DIR/config.json" ]; }; then
  stage write 240 python3 bench/gpu_vs_vllm.py --write-model --tokenizer-dir "$TOKENIZER" "${MODEL_ARGS[@]}" \
    --out "$RESULTS"
fi
[ "${WRITE_ONLY:-0}" = 1 ] && exit 0
for engine in ${ENGINES-textgen}; do
  if [ "$engine" = vllm ]; then
    [ -d /tmp/site/vllm ] || install_peer
    resume=(); [ -e "$RESULTS/gpu_vs_vllm.json" ] && resume=(--resume "$RESULTS/gpu_vs_vllm.json")
    serve vllm "${resume[@]}"
  else
    serve "$engine"
  fi
done
if [ "${PEER:-0}" = 1 ] && [ ! -d /tmp/site/vllm ]; then
  install_peer  # for the next call's ENGINES=vllm (the c3 carry is this call's)
fi
cp "$RESULTS/gpu_vs_vllm.json" "$OUT/moe.json" 2>/dev/null
cp "$RESULTS/gpu_vs_vllm.md" "$OUT/moe.md" 2>/dev/null
for log in "$RESULTS"/*.log; do [ -e "$log" ] && cp "$log" "$LOGS/$(basename "$log")"; done
tar -C "$LOGS" -czf "$OUT/logs.tgz" .
exit 0
