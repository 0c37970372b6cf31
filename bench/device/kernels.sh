#!/usr/bin/env bash
# PARTS (default "tests profiles"), each optional:
#   tests     the split-KV attention's CUDA tests (the in-kernel merge among them);
#   profiles  kernel profiles of the predictable 8B's batch-1 verification and decodes, with and
#             without MERGE_SPLITS_IN_KERNEL (the model written first if missing);
#   family    with FAMILY=phi3-medium (or another gpu_model shape): that family's served batch-1
#             tok/s (gpu_vs_vllm, textgen alone) and its batch-1 decode profiled both ways;
#   quantized the quantized kernels' CUDA tests (W4A16, block fp8 through Triton and cuBLASLt);
#   mixed     the mixed graphs' CUDA tests, then MIXED_CASES (decodes alone and beside a prompt)
#             profiled two ways: the mixed graphs' shipped split rule and 8 key ranges for every
#             step (bench/results/kernel_profile_mixed_splits_h100.md); MORE_TESTS: test files
#             run in the same stage (while the model is written);
#   block_mid block fp8 at decode batches of 32 and 64 rows: cuBLASLt against weight streaming
#             (bench/gpu_block_fp8.py's MID_ROWS_CANDIDATES), into $OUT/block_fp8_mid.json.
# Caps: TESTS_S (150), MODEL_S (240), PROFILE_S (100 a profile), FAMILY_S (150), QUANTIZED_S
# (120), BLOCK_MID_S (120).
source "$(dirname "$0")/common.sh"
PARTS=${PARTS:-tests profiles}
MODEL=${MODEL:-/tmp/llama8b-predictable}
CASES=${CASES:-verify_b1_ctx1024 decode_b1_ctx1024 decode_b8_ctx512}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
profile() {  # NAME MODEL_DIR CASES... [--merge-in-kernel]
  local name=$1 model=$2; shift 2
  stage "$name" "${PROFILE_S:-100}" python3 bench/gpu_kernel_profile.py "$model" "$OUT/$name.json" "$@"
}
MIXED_CASES=${MIXED_CASES:-decode_b32_ctx400 mixed_b32_ctx400_plus_64 decode_b64_ctx600 \
  mixed_b64_ctx600_plus_300 mixed_b64_ctx600_plus_700 decode_b200_ctx400 mixed_b200_ctx400_plus_256}
if wants profiles || wants mixed; then  # the 16 GB model is written while the tests run (gpu_speculation's model child)
  python3 bench/gpu_speculation.py --write-models --tokenizer-dir "$TOKENIZER" --router-binary /bin/true \
    --out /tmp/spec-models --servers off --model-dir "$MODEL" > "$LOGS/model.log" 2>&1 &
  writer=$!
fi
if wants tests; then
  stage tests "${TESTS_S:-150}" python3 -m pytest -q -x -p no:cacheprovider tests/shard/test_triton_attention.py -k "${TESTS_K:-gpu_split or head_norms}"
fi
if wants profiles; then
  timeout "${MODEL_S:-240}" tail --pid=$writer -f /dev/null || kill $writer  # past the cap: stop writing
  wait $writer; echo "model rc=$?" >> "$LOGS/model.log"
  profile profile_split "$MODEL" $CASES
  profile profile_merged "$MODEL" $CASES --merge-in-kernel
fi
if wants mixed; then
  stage mixed_tests "${TESTS_S:-150}" python3 -m pytest -q -x -p no:cacheprovider tests/shard/test_mixed_graphs.py \
    ${MORE_TESTS:-}
  timeout "${MODEL_S:-240}" tail --pid=$writer -f /dev/null || kill $writer
  wait $writer
  profile mixed_shipped "$MODEL" $MIXED_CASES
  profile mixed_split8 "$MODEL" $MIXED_CASES --mixed-splits 8
fi
if wants family; then
  family_dir=/tmp/$FAMILY-random
  stage "${FAMILY}_batch1" "${FAMILY_S:-150}" python3 bench/gpu_vs_vllm.py --tokenizer-dir "$TOKENIZER" \
    --router-binary "$ROUTER" --out /tmp/family-out --engines textgen --workloads batch1 --shape "$FAMILY" \
    --model-dir "$family_dir"
  cp /tmp/family-out/gpu_vs_vllm.json "$OUT/${FAMILY}_batch1.json"
  profile "${FAMILY}_split" "$family_dir" decode_b1_ctx256
  profile "${FAMILY}_merged" "$family_dir" decode_b1_ctx256 --merge-in-kernel
fi
if wants quantized; then
  stage quantized "${QUANTIZED_S:-120}" python3 -m pytest -q -p no:cacheprovider tests/shard/test_block_fp8_cublas.py \
    tests/shard/test_w4a16.py tests/shard/test_quantized_formats.py -k "gpu or cuda or block"
fi
if wants block_mid; then
  stage block_mid "${BLOCK_MID_S:-120}" python3 bench/gpu_block_fp8.py "$OUT/block_fp8_mid.json" --rows 32,64
fi
exit 0
