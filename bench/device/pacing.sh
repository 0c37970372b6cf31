#!/usr/bin/env bash
# Issue 23: prefill pacing (`--prefill-pacing-slack`) against the shipped default, textgen alone
# on the random 8B, under Poisson arrivals and the burst (gpu_vs_vllm's variants: one run each,
# the rows apart), then where a lone request's TTFT goes (bench/gpu_ttft_split.py).
# SLACKS ("0.1 0.25"): the variants; WORKLOADS ("poisson_32,poisson_8,burst"); PARTS ("ab split").
# Caps: PACING_S (420), SPLIT_S (150).
source "$(dirname "$0")/common.sh"
PARTS=${PARTS:-ab split}
MODEL=/tmp/llama8b-random
wants() { [[ " $PARTS " == *" $1 "* ]]; }
if wants ab; then
  variants=()
  for slack in ${SLACKS:-0.1 0.25}; do variants+=(--textgen-variant "slack$slack=--prefill-pacing-slack $slack"); done
  stage pacing "${PACING_S:-420}" python3 bench/gpu_vs_vllm.py --tokenizer-dir "$TOKENIZER" --router-binary "$ROUTER" \
    --out /tmp/pacing --model-dir "$MODEL" --engines textgen "${variants[@]}" \
    --workloads "${WORKLOADS:-poisson_32,poisson_8,burst}"
  cp /tmp/pacing/gpu_vs_vllm.json "$OUT/pacing.json"
fi
if wants split; then
  stage ttft_split "${SPLIT_S:-150}" python3 bench/gpu_ttft_split.py "$MODEL" "$ROUTER" /tmp/ttft --tokenizer-dir "$TOKENIZER"
  cp /tmp/ttft/ttft_split.json "$OUT/"
fi
exit 0
