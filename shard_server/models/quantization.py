"""Which quantized checkpoints textgen loads, from config.json's `quantization_config`.

Loaded:
- fp8 (e4m3) weights with one scale per tensor or per output channel and dynamic activations,
  the layout `--quantize fp8` produces at load, as written by compressed-tensors
  (`float-quantized` / `naive-quantized`, weights `strategy` tensor or channel), fbgemm_fp8
  (per-channel scales) and `quant_method: fp8` without `weight_block_size`. Their
  `weight_scale` tensors fill the per-row scales exactly; static `input_scale`s are not read
  (activations are quantized per token at run time).
- GPTQ (AutoGPTQ / GPTQModel): 4 or 8 bits, any group size (-1: one group), `desc_act` with
  `g_idx`, symmetric or not, zero points in the v1 format (`checkpoint_format: gptq`, stored
  zero minus one, AutoGPTQ's convention) or v2 (`gptq_v2`, stored as is).
- AWQ (AutoAWQ), `version: gemm`, 4 bits with zero points.
- compressed-tensors (llm-compressor) `pack-quantized` W4A16 / W8A16: int weights, strategy
  `group` or `channel`, symmetric or not, no activation quantization (`PackedScheme` with
  method "compressed-tensors": converted at load to the GPTQ/AWQ layout of `layers/int4.py`).
- compressed-tensors `int-quantized`: int8 weights, symmetric, one scale per output channel
  (or per tensor), with dynamic per-token int8 activations (W8A8) or none (W8A16)
  (`Int8Scheme`, `layers/quantized.py`).
- block-wise fp8: `quant_method: fp8` with `weight_block_size` [bn, bk] and `weight_scale_inv`
  [ceil(out/bn), ceil(in/bk)] (DeepSeek-V3, Qwen3-FP8), and compressed-tensors
  `float-quantized` with weights `strategy: block` (`weight_scale` in the same layout)
  (`BlockFp8Scheme`, `layers/quantized.py`: the block scales are kept, the reference product
  dequantizes them; activations stay unrounded).
These load for the dense families (llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3,
phi3) and, all but int8, for the MoE families (mixtral, qwen2_moe, qwen3_moe, olmoe), whose
routers may be left unquantized (and named as such): the weights stay quantized and
`layers/int4.py` / `layers/quantized.py` / `layers/packed_experts.py` do the product. Every
other method is refused by name.

`--quantize` takes TGI's values: `fp8` quantizes an unquantized checkpoint (and agrees with an
fp8 one); `gptq`, `awq` and `marlin` (the kernel TGI picks for both) only name what the
checkpoint declares, and a flag that disagrees with the checkpoint is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UnsupportedModelError
from .moe_config import MOE_FAMILY

_FLOAT_FORMATS = ("float-quantized", "naive-quantized")
# The dense families: Gemma's and Phi-3's decoder linears are Llama's modules (Phi-3's fused
# qkv_proj and gate_up_proj are read as each rank's output columns of the one tensor). int8
# (compressed-tensors int-quantized) weights load for these.
DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "phi3")
# GPTQ, AWQ and pack-quantized weights load for the MoE families too (their experts stacked,
# `layers/packed_experts.py`), and so do block-wise fp8 ones (the experts keep their block
# scales, kernels/expert_scales.py). Either way the fused MoE kernels apply them.
PACKED_FAMILIES = (*DENSE_FAMILIES, *MOE_FAMILY)
# An MoE router (and Qwen2-MoE's shared-expert gate): llm-compressor leaves them unquantized
# ("re:.*mlp.gate$"), and the MoE block reads them as stored.
ROUTER_NAMES = ("gate", "shared_expert_gate")
QUANTIZE_FLAGS = ("fp8", "gptq", "awq", "marlin")  # the --quantize values the shard takes


@dataclass(frozen=True)
class PackedScheme:
    """How a GPTQ, AWQ or compressed-tensors pack-quantized checkpoint packs each linear's integer weights."""

    method: str  # "gptq" | "awq" | "compressed-tensors" (pack-quantized)
    bits: int  # 4 (or 8 for GPTQ)
    group_size: int  # input rows per scale; -1: one group over all rows
    desc_act: bool = False  # GPTQ act-order: g_idx assigns rows to groups out of order
    zero_offset: int = 0  # added to each stored zero point: 1 for GPTQ's v1 format
    zero_points: bool = True  # compressed-tensors: asymmetric (weight_zero_point stored); else zero 2^(bits-1)

    @property
    def pack(self) -> int:
        """Values per int32."""
        return 32 // self.bits

    def groups(self, in_features: int) -> int:
        return 1 if self.group_size == -1 else -(-in_features // self.group_size)

    def describe(self) -> str:
        if self.method == "compressed-tensors":
            kind = "channel" if self.group_size == -1 else f"group size {self.group_size}"
            zeros = "asymmetric" if self.zero_points else "symmetric"
            order = ", actorder group" if self.desc_act else ""
            return f"compressed-tensors pack-quantized W{self.bits}A16, {kind}{order}, {zeros}"
        return f"{self.method} {self.bits}-bit, group size {self.group_size}"


@dataclass(frozen=True)
class Int8Scheme:
    """compressed-tensors `int-quantized`: int8 `weight` [out, in] and `weight_scale` per output
    channel (or one per tensor), symmetric; activations int8 per token, dynamic (W8A8), or not quantized."""

    activations: bool  # W8A8: each activation row is quantized to int8 (one scale per row) before the product
    method: str = "compressed-tensors"

    def describe(self) -> str:
        return f"compressed-tensors int-quantized W8A{8 if self.activations else 16}"


@dataclass(frozen=True)
class BlockFp8Scheme:
    """Block-wise fp8: e4m3 `weight` [out, in] with one float scale per [bn, bk] block in
    `scale_name` [ceil(out/bn), ceil(in/bk)]; weight = fp8 * scale (DeepSeek's `weight_scale_inv`
    is the dequantization multiplier despite its name)."""

    block: tuple[int, int]  # (bn output rows, bk input columns) per scale
    scale_name: str = "weight_scale_inv"  # compressed-tensors' block strategy: "weight_scale"
    method: str = "fp8"

    def describe(self) -> str:
        return f"block-wise fp8 ({self.block[0]}x{self.block[1]} blocks, {self.scale_name})"


QuantizedScheme = PackedScheme | Int8Scheme | BlockFp8Scheme


def checkpoint_quantization(raw: dict) -> str | None:
    """"fp8", "gptq", "awq" or "compressed-tensors" (its integer formats) for a loadable
    checkpoint, None for an unquantized one; raises for the rest."""
    config = raw.get("quantization_config")
    if not config:
        return None
    method = config.get("quant_method", "unknown")
    if method == "fbgemm_fp8":
        return "fp8"
    if method == "fp8":
        if config.get("weight_block_size") is not None:
            packed_scheme(raw)  # validates the block-wise scheme
        return "fp8"
    if method == "compressed-tensors":
        scheme = _check_compressed_tensors(config)
        if scheme is not None:
            packed_scheme(raw)  # validates the family and the ignore list
        return "compressed-tensors" if isinstance(scheme, (PackedScheme, Int8Scheme)) else "fp8"
    if method in ("gptq", "awq"):
        packed_scheme(raw)  # validates
        return method
    raise _refused(method, "fp8, gptq, awq and compressed-tensors checkpoints load")


def packed_scheme(raw: dict) -> QuantizedScheme | None:
    """How the decoder linears of a GPTQ, AWQ, compressed-tensors integer or block-wise fp8
    checkpoint are stored; None for any other checkpoint (unquantized, or fp8 per row: dense)."""
    config = raw.get("quantization_config") or {}
    method = config.get("quant_method")
    if method == "fp8" and config.get("weight_block_size") is not None:
        _check_family(raw, method, PACKED_FAMILIES)
        return _block_fp8(config)
    if method == "compressed-tensors":
        scheme = _check_compressed_tensors(config)
        if scheme is not None:
            int8 = isinstance(scheme, Int8Scheme)
            _check_family(raw, method, DENSE_FAMILIES if int8 else PACKED_FAMILIES)
            ignored = _unquantized_linears(raw, config.get("ignore"))
            if ignored:
                raise _refused(method, f"ignore {ignored} (unquantized decoder linears) is not loaded")
        return scheme
    if method not in ("gptq", "awq"):
        return None
    _check_family(raw, method, PACKED_FAMILIES)
    bits = config.get("bits", config.get("w_bit"))
    group_size = config.get("group_size", config.get("q_group_size", 128))
    if not isinstance(group_size, int) or (group_size <= 0 and group_size != -1):
        raise _refused(method, f"group_size {group_size!r} is not a positive integer or -1")
    if config.get("lm_head"):
        raise _refused(method, "a quantized lm_head (lm_head: true) is not loaded")
    skipped = _unquantized_linears(raw, config.get("modules_to_not_convert"))
    if skipped:
        raise _refused(method, f"modules_to_not_convert {skipped} (unquantized decoder linears) are not loaded")
    if method == "gptq":
        if bits not in (4, 8):
            raise _refused(method, f"{bits}-bit GPTQ is not loaded (4 and 8 bits are)")
        fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise _refused(method, f"checkpoint_format {fmt!r} is not loaded (gptq and gptq_v2 are)")
        return PackedScheme("gptq", bits, group_size, bool(config.get("desc_act", False)), 1 if fmt == "gptq" else 0)
    version = str(config.get("version") or config.get("format") or "gemm").lower()
    if version != "gemm":
        raise _refused(method, f"AWQ version {version!r} is not loaded (gemm is)")
    if bits != 4:
        raise _refused(method, f"{bits}-bit AWQ is not loaded (4 bits are)")
    if not config.get("zero_point", True):
        raise _refused(method, "AWQ without zero points (zero_point: false) is not loaded")
    return PackedScheme("awq", 4, group_size)


def served_quantization(checkpoint: str | None, flag: str | None) -> str | None:
    """What is served for a checkpoint declaring `checkpoint` under `--quantize flag`."""
    if flag is None or flag == checkpoint:
        return checkpoint
    if flag not in QUANTIZE_FLAGS:
        raise UnsupportedModelError(f"--quantize {flag} is not implemented (implemented: {', '.join(QUANTIZE_FLAGS)})")
    if flag == "fp8" and checkpoint is None:
        return "fp8"
    if flag == "marlin" and checkpoint in ("gptq", "awq"):
        return checkpoint  # TGI's Marlin kernels serve both formats
    declared = f"a {checkpoint} checkpoint" if checkpoint else "an unquantized checkpoint"
    needs = "a gptq or awq checkpoint" if flag == "marlin" else f"a {flag} checkpoint"
    if flag == "fp8":
        needs = "an unquantized (or fp8) checkpoint"
    raise UnsupportedModelError(f"--quantize {flag} needs {needs}, and this is {declared}; drop the flag or change it")


def _unquantized_linears(raw: dict, entries: list[str] | None) -> list[str]:
    """The entries of a list of modules left unquantized that name decoder linears: not the LM
    head, nor in an MoE model its routers, which the MoE block reads as stored anyway
    (llm-compressor's "re:.*mlp.gate$", AutoAWQ's "gate")."""
    moe = raw.get("model_type") in MOE_FAMILY
    return [m for m in entries or [] if "lm_head" not in m and not (moe and _names_router(m))]


def _names_router(entry: str) -> bool:
    """Whether an entry of such a list (a module name, or "re:" and a pattern) names only MoE
    routers: its last component is one of ROUTER_NAMES."""
    return re.split(r"\W", entry.removesuffix("$"))[-1] in ROUTER_NAMES


def _check_family(raw: dict, method: str, families: tuple[str, ...]) -> None:
    if raw.get("model_type") not in families:
        raise _refused(method, f"{method} weights load for {', '.join(families)}, not {raw.get('model_type')!r}")


def _block(value, what: str, method: str) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
        raise _refused(method, f"{what} {value!r} is not two positive integers [rows, columns]")
    return int(value[0]), int(value[1])


def _block_fp8(config: dict) -> BlockFp8Scheme:
    method = "fp8"
    block = _block(config.get("weight_block_size"), "weight_block_size", method)
    if str(config.get("fmt", "e4m3")).lower() != "e4m3":
        raise _refused(method, f"fmt {config.get('fmt')!r} is not loaded (e4m3 is)")
    if config.get("activation_scheme", "dynamic") != "dynamic":
        scheme = config.get("activation_scheme")
        raise _refused(method, f"activation_scheme {scheme!r} (static input scales) is not loaded")
    skipped = [m for m in (config.get("modules_to_not_convert") or []) + (config.get("ignored_layers") or [])
               if "lm_head" not in m]  # fmt: skip
    if skipped:
        raise _refused(method, f"modules_to_not_convert {skipped} (unquantized decoder linears) are not loaded")
    return BlockFp8Scheme(block)


def _check_compressed_tensors(config: dict) -> QuantizedScheme | None:
    """None for the per-row fp8 formats (dense layers); the scheme of an integer or block-fp8 one."""
    method, fmt = "compressed-tensors", config.get("format")
    groups = config.get("config_groups") or {}
    if (config.get("sparsity_config") or {}).get("format") not in (None, "dense"):
        raise _refused(method, f"sparsity_config format {config['sparsity_config'].get('format')!r} is not loaded")
    if fmt in _FLOAT_FORMATS:
        schemes = set()
        for name, group in groups.items():
            weights = group.get("weights") or {}
            kind = (weights.get("type"), weights.get("num_bits"), weights.get("strategy"))
            if kind[:2] != ("float", 8) or kind[2] not in ("tensor", "channel", "block"):
                raise _refused(method, f"group {name!r} has weights {kind}; fp8 per tensor, channel or block loads")
            activations = group.get("input_activations") or {}
            if activations and activations.get("type", "float") != "float":
                raise _refused(method, f"group {name!r} quantizes activations to {activations.get('type')}")
            if kind[2] == "block":
                if activations and not activations.get("dynamic", True):
                    raise _refused(method, f"group {name!r}: static input scales with block fp8 weights are not loaded")
                schemes.add(BlockFp8Scheme(_block(weights.get("block_structure"), f"group {name!r} block_structure",
                                                  method), "weight_scale"))  # fmt: skip
            else:
                schemes.add(None)
        if len(schemes) > 1:
            raise _refused(method, "config_groups mix block-wise and per-row fp8 weights")
        return schemes.pop()
    if fmt not in ("pack-quantized", "int-quantized"):
        raise _refused(method, f"format {fmt!r} is not loaded (float-quantized, naive-quantized, pack-quantized and "
                               "int-quantized are)")  # fmt: skip
    if not groups:
        raise _refused(method, f"{fmt} declares no config_groups: no quantization scheme")
    if len(groups) != 1:
        raise _refused(method, f"{len(groups)} config_groups ({', '.join(groups)}): one scheme for every linear loads")
    (name, group), = groups.items()
    weights, activations = group.get("weights") or {}, group.get("input_activations") or None
    where = f"{fmt} group {name!r}"
    if weights.get("type") != "int":
        raise _refused(method, f"{where} has {weights.get('type')!r} weights; {fmt} stores int weights")
    bits, strategy, symmetric = weights.get("num_bits"), weights.get("strategy"), weights.get("symmetric", True)
    if weights.get("dynamic"):
        raise _refused(method, f"{where}: dynamic weight quantization is not loaded")
    if fmt == "pack-quantized":
        if bits not in (4, 8):
            raise _refused(method, f"{where}: {bits}-bit weights are not loaded (4 and 8 bits are)")
        if activations:
            raise _refused(method, f"{where} quantizes activations ({activations.get('type')} "
                                   f"{activations.get('num_bits')}-bit): pack-quantized W{bits}A16 loads")  # fmt: skip
        actorder = weights.get("actorder")
        if actorder not in (None, False, "weight", "static", "group"):
            raise _refused(method, f"{where}: actorder {actorder!r} is not loaded (group, weight/static and none are)")
        if strategy == "channel":
            group_size = -1
        elif strategy == "group":
            group_size = weights.get("group_size")
            if not isinstance(group_size, int) or group_size <= 0:
                raise _refused(method, f"{where}: group_size {group_size!r} is not a positive integer")
        else:
            raise _refused(method, f"{where}: strategy {strategy!r} is not loaded (group and channel are)")
        # actorder "group": `weight_g_idx` assigns input columns to groups out of order (GPTQ's
        # desc_act); "weight"/"static" only reorders the solve and stores plain groups.
        return PackedScheme(method, bits, group_size, desc_act=actorder == "group" and group_size != -1,
                            zero_points=not symmetric)  # fmt: skip
    if bits != 8 or strategy not in ("channel", "tensor"):
        raise _refused(method, f"{where} has {bits}-bit {strategy!r} weights; int8 per channel or tensor loads")
    if not symmetric:
        raise _refused(method, f"{where}: asymmetric int8 weights are not loaded")
    if activations:
        kind = (activations.get("type"), activations.get("num_bits"), activations.get("strategy"))
        if kind != ("int", 8, "token") or not activations.get("dynamic", False):
            raise _refused(method, f"{where} quantizes activations as {kind} (dynamic: {activations.get('dynamic')}); "
                                   "dynamic int8 per token loads")  # fmt: skip
        if not activations.get("symmetric", True):
            raise _refused(method, f"{where}: asymmetric int8 activations are not loaded")
    return Int8Scheme(activations=bool(activations))


def _refused(method: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"the checkpoint is pre-quantized ({method!r}): {why}; serve a bf16/fp16 checkpoint, with "
        "--quantize fp8 for fp8 weights"
    )
