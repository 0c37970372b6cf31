#!/usr/bin/env bash
# The split-KV attention's CUDA tests (the in-kernel merge among them), then the kernel profile
# of a batch-1 verification and decodes, with and without MERGE_SPLITS_IN_KERNEL.
# Caps: TESTS_S (150), MODEL_S (240), PROFILE_S (100 each).
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-/tmp/llama8b-predictable}
CASES=${CASES:-verify_b1_ctx1024 decode_b1_ctx1024 decode_b8_ctx512}
# The 16 GB model is written while the tests run (bench/gpu_speculation.py's model child).
python3 bench/gpu_speculation.py --write-models --tokenizer-dir "$TOKENIZER" --router-binary /bin/true \
  --out /tmp/spec-models --servers off --model-dir "$MODEL" > "$OUT/model.log" 2>&1 &
writer=$!
stage tests "${TESTS_S:-150}" python3 -m pytest -q -x -p no:cacheprovider tests/shard/test_triton_attention.py -k gpu_split
timeout "${MODEL_S:-240}" tail --pid=$writer -f /dev/null; wait $writer; echo "model rc=$?" >> "$OUT/model.log"
stage profile_split "${PROFILE_S:-100}" python3 bench/gpu_kernel_profile.py "$MODEL" "$OUT/profile_split.json" $CASES
stage profile_merged "${PROFILE_S:-100}" python3 bench/gpu_kernel_profile.py "$MODEL" "$OUT/profile_merged.json" \
  --merge-in-kernel $CASES
