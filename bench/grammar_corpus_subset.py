"""Pick the curated JSON Schema subset committed as tests/data/jsonschemabench/.

Input: the shared corpus (folder or .tar.xz) and the per-schema results of
bench/grammar_conformance.py with llguidance (--per-schema). Only schemas that passed there
(compiled, every valid instance accepted, every invalid one rejected, at least one test) are
eligible, and only files up to --max-file-bytes, so the subset stays small. Each
sub-collection (file-name prefix before '---'; BFCL's seven splits count as one source) gets a
share of --count proportional to the square root of its number of eligible files, at least
--min-per-collection, so small collections are not drowned by Github_*. A collection with no
file under the size cap (Github_ultra) gets its smallest passing files. Within a collection,
files are taken in the order of a seeded hash of their names: the pick is deterministic and
favours no name. Files are copied byte for byte.

    .venv/bin/python bench/grammar_corpus_subset.py --corpus ../shared/data/jsonschemabench.tar.xz \
        --results bench/results/grammar_conformance_cpu_llguidance.jsonl --out tests/data/jsonschemabench
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grammar_conformance import collection_of, corpus_files  # noqa: E402


def group_of(name: str) -> str:
    """Quota group: the sub-collection, with BFCL's seven splits as one source."""
    collection = collection_of(name)
    return "BFCL" if collection.startswith("BFCL_") else collection


def shares(sizes: dict[str, int], count: int, minimum: int) -> dict[str, int]:
    """Per-collection quota: sqrt-proportional, at least `minimum`, never more than there is."""
    weights = {name: math.sqrt(n) for name, n in sizes.items()}
    total = sum(weights.values())
    quota = {name: min(sizes[name], max(minimum, round(count * w / total)))
             for name, w in weights.items()}
    # Trim the largest quotas (or grow the ones with room) until the total is `count`.
    while sum(quota.values()) > count:
        name = max(quota, key=lambda k: (quota[k], k))
        quota[name] -= 1
    while sum(quota.values()) < count:
        room = [k for k in quota if quota[k] < sizes[k]]
        if not room:
            break
        quota[min(room, key=lambda k: (quota[k] / weights[k], k))] += 1
    return quota


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="folder or .tar.xz")
    parser.add_argument("--results", type=Path, required=True,
                        help="per-schema JSON lines of grammar_conformance.py (llguidance)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--max-file-bytes", type=int, default=12_000)
    parser.add_argument("--max-total-bytes", type=int, default=2_000_000)
    parser.add_argument("--min-per-collection", type=int, default=3)
    parser.add_argument("--seed", default="textgen-grammar-subset-1")
    args = parser.parse_args()

    passing = {r["file"] for r in map(json.loads, args.results.read_text().splitlines())
               if r["status"] == "passing"}
    with tempfile.TemporaryDirectory() as tmp:
        passed: dict[str, list[Path]] = defaultdict(list)
        for path in map(Path, corpus_files(args.corpus, tmp)):
            if path.name in passing:
                passed[group_of(path.name)].append(path)
        eligible = {}
        for name, paths in passed.items():
            small = [p for p in paths if p.stat().st_size <= args.max_file_bytes]
            if len(small) < args.min_per_collection:
                # A collection of only big schemas (Github_ultra) still gets its smallest few.
                small = sorted(paths, key=lambda p: p.stat().st_size)[:args.min_per_collection]
            eligible[name] = small
        quota = shares({k: len(v) for k, v in eligible.items()}, args.count,
                       args.min_per_collection)
        chosen = []
        for name, paths in sorted(eligible.items()):
            paths.sort(key=lambda p: hashlib.sha256(f"{args.seed}:{p.name}".encode()).digest())
            chosen += paths[:quota[name]]
        total = sum(p.stat().st_size for p in chosen)
        if total > args.max_total_bytes:
            raise SystemExit(f"{total} bytes is over --max-total-bytes; lower --max-file-bytes")
        args.out.mkdir(parents=True, exist_ok=True)
        for old in args.out.glob("*.json"):
            old.unlink()
        for path in chosen:
            shutil.copyfile(path, args.out / path.name)
    print(f"{len(chosen)} schemas, {total} bytes")
    for name in sorted(quota):
        print(f"  {name}: {quota[name]} of {len(eligible[name])} eligible")


if __name__ == "__main__":
    main()
