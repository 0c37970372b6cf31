#!/usr/bin/env bash
# Here, before device calls: the router (x86-64 release build) and the demo tokenizer into
# .gpurun/, which git ignores (.git/info/exclude) and `run` carries. ROUTER_BINARY=.venv/bin/textgen-router
# takes the one `make install` built (the same release build) instead of building it again.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpurun/' .git/info/exclude 2>/dev/null || echo '/.gpurun/' >> .git/info/exclude
mkdir -p .gpurun/tokenizer
router=${ROUTER_BINARY:-router/target/release/textgen-router}
[ -n "${ROUTER_BINARY:-}" ] || (cd router && cargo build --release --quiet)
xz -T2 -c "$router" > .gpurun/textgen-router.xz
snapshot=$(.venv/bin/textgen-launcher download-demo-model | tail -1)
for name in tokenizer.json tokenizer_config.json generation_config.json; do
  cp "$snapshot/$name" .gpurun/tokenizer/
done
du -sh .gpurun/*
