"""What a Triton kernel compiles to on sm_90: its PTX instructions counted by opcode.

No GPU needed: each case of tests/shard/test_kernels_compile.py compiles as a real launch
would (pointers, strides and sizes 16-divisible), with constexprs overridden on the command
line. The counts in bench/results/fp8_kv_decode_h200.md came from this, e.g. the shipped fp8
decode tile against the values read by words:

    python3 bench/ptx_census.py decode_attention_fp8 --set SPLITS=1
    python3 bench/ptx_census.py decode_attention_fp8_words
    python3 bench/ptx_census.py decode_attention --set SPLITS=1 --set BLOCK_N=128

Prints the total and the most frequent opcodes (`--top`); `--ptx FILE` also writes the PTX.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.shard.test_kernels_compile import CASES, compile_for_hopper  # noqa: E402

OPCODE = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.:]+)", re.M)


def census(ptx: str) -> Counter:
    """Instructions by opcode (with their type suffixes), labels and directives left out."""
    return Counter(match.group(1) for match in OPCODE.finditer(ptx) if not match.group(1).startswith("."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a constexpr override")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--ptx", type=Path)
    args = parser.parse_args()
    overrides = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--set takes NAME=VALUE, not {item!r}")
        try:
            overrides[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[name] = value  # a string constexpr such as V_LOAD=words_ptx
    module, kernel, constants, pointers = CASES[args.case]
    CASES[args.case] = (module, kernel, {**constants, **overrides}, pointers)
    compiled, _ = compile_for_hopper(args.case, aligned=True, num_warps=args.warps, num_stages=args.stages)
    ptx = compiled.asm["ptx"]
    if args.ptx:
        args.ptx.write_text(ptx)
    counts = census(ptx)
    print(f"{args.case}: {sum(counts.values())} instructions")
    for opcode, count in counts.most_common(args.top):
        print(f"{count:6d} {opcode}")


if __name__ == "__main__":
    main()
