"""Random-weight models in their families' Hub layouts, and a device's two ceilings.

Shapes (SHAPES): LLAMA3_8B (one 16 GB file, as the 8B benches expect), LLAMA3_70B (141 GB in
bf16, streamed into ~20 GB shards plus model.safetensors.index.json, so at most one shard is
ever in host memory), LLAMA32_1B (meta-llama/Llama-3.2-1B: 2.47 GB, tied embeddings; untied,
the 8B's draft model in bench/gpu_speculation.py), QWEN3_30B_A3B (61 GB of Qwen3-MoE: 128
experts, 8 a token), MIXTRAL_8X7B (93.4 GB in ~20 GB shards: 8 experts, 2 a token), GEMMA2_9B (google/gemma-2-9b: 18.5 GB, tied embeddings, four norms a
layer), PHI3_MEDIUM (microsoft/Phi-3-medium-4k-instruct: 27.9 GB in 2 shards, fused qkv_proj and
gate_up_proj) and TINY / TINY_1B / TINY_DRAFT / TINY_MOE / TINY_MIXTRAL / TINY_GEMMA2 / TINY_PHI3
(a few MB, for CPU tests of the harnesses).
LAYOUTS says how each family names and stores a layer's tensors.

The weights are random, so greedy decoding could pick tokens the demo tokenizer cannot
decode (ids >= its vocabulary) or its special tokens (EOS would end a benchmark request
early): those rows of lm_head are zero, so their logit is 0 and never the maximum (all
~49k random logits of the other rows would have to be negative). With tied embeddings (Gemma,
Llama 3.2 1B: tensor_specs draws the embedding table as the head) the embedding table is the LM
head, so its rows are the ones zeroed: a special id is never the greedy pick, and the benchmark
prompts hold none (peer_load draws ids from 256 up; one that does come in embeds to zeros, which
RMSNorm maps to zeros, not NaN); Gemma's final soft-cap (tanh) keeps the order, so a zeroed
row's logit stays 0 and never wins.
bos/eos ids are the demo tokenizer's (1, 2) in every shape, not the Hub model's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

LLAMA3_8B = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
LLAMA3_70B = dict(LLAMA3_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8)  # fmt: skip
# meta-llama/Llama-3.2-1B's config (bos/eos the demo tokenizer's, 8,192 positions like the 8B):
# 1.24B parameters, tied embeddings; the 8B's draft model in issue 26's speculation benchmark.
LLAMA32_1B = dict(LLAMA3_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, tie_word_embeddings=True)  # fmt: skip
# The demo tokenizer's 49,152 ids need a vocabulary at least that large; the rest is tiny.
TINY = dict(LLAMA3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=49152)  # fmt: skip
# The 1B's tied Llama, tiny: a vocabulary past the demo tokenizer's, so some rows are zeroed for that.
TINY_1B = dict(LLAMA32_1B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=49408)  # fmt: skip
# A draft for TINY (bench/predictable_model.py's CPU runs): half its hidden size, its vocabulary.
TINY_DRAFT = dict(TINY, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
# Qwen3-30B-A3B (issue 24's MoE benchmark): 48 layers of 128 experts, 8 routed a token; 61 GB.
QWEN3_30B_A3B = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
    attention_bias=False,
    router_aux_loss_coef=0.001,
    output_router_logits=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
TINY_MOE = dict(QWEN3_30B_A3B, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                vocab_size=49152)  # fmt: skip
# google/gemma-2-9b's config (its bos/eos swapped for the demo tokenizer's): 9.24B parameters.
GEMMA2_9B = dict(
    architectures=["Gemma2ForCausalLM"],
    model_type="gemma2",
    hidden_size=3584,
    intermediate_size=14336,
    num_hidden_layers=42,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    vocab_size=256000,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    sliding_window=4096,
    query_pre_attn_scalar=256,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    hidden_act="gelu_pytorch_tanh",  # the Hub file names both (vLLM reads both)
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    attention_bias=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
# Tiny: the window shorter than a test prompt, query_pre_attn_scalar other than head_dim, soft-caps
# near the scores' range; a vocabulary past the demo tokenizer's, so some rows are zeroed for that.
TINY_GEMMA2 = dict(GEMMA2_9B, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=49408, sliding_window=8, query_pre_attn_scalar=24,
                   attn_logit_softcapping=4.0, final_logit_softcapping=6.0)  # fmt: skip
# microsoft/Phi-3-medium-4k-instruct's config (bos/eos the demo tokenizer's): 13.96B parameters.
# No head_dim in the Hub file (hidden / heads = 128). Its 32,064-id vocabulary is smaller than the
# demo tokenizer's: prompts must draw ids below it (gpu_vs_vllm: prompt_vocab).
PHI3_MEDIUM = dict(
    architectures=["Phi3ForCausalLM"],
    model_type="phi3",
    hidden_size=5120,
    intermediate_size=17920,
    num_hidden_layers=40,
    num_attention_heads=40,
    num_key_value_heads=10,
    vocab_size=32064,
    max_position_embeddings=4096,
    original_max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling=None,
    sliding_window=2047,
    hidden_act="silu",
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
# mistralai/Mixtral-8x7B-v0.1's config (bos/eos the demo tokenizer's): 46.70B parameters, 93.4 GB
# in bf16, more than the one-GPU machine's 64 GiB disk (gpu_vs_vllm --spill-dir). 8 experts of
# the dense MLP's size, 2 a token; no head_dim (hidden / heads = 128), no sliding window.
MIXTRAL_8X7B = dict(
    architectures=["MixtralForCausalLM"],
    model_type="mixtral",
    hidden_size=4096,
    intermediate_size=14336,
    num_local_experts=8,
    num_experts_per_tok=2,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=32768,
    rms_norm_eps=1e-5,
    rope_theta=1000000.0,
    sliding_window=None,
    tie_word_embeddings=False,
    hidden_act="silu",
    router_aux_loss_coef=0.02,
    output_router_logits=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
TINY_MIXTRAL = dict(MIXTRAL_8X7B, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)  # fmt: skip
TINY_PHI3 = dict(PHI3_MEDIUM, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, sliding_window=8)  # fmt: skip
SHAPES = {"8b": LLAMA3_8B, "70b": LLAMA3_70B, "1b": LLAMA32_1B, "tiny": TINY, "tiny-1b": TINY_1B,
          "tiny-draft": TINY_DRAFT, "qwen3-30b-a3b": QWEN3_30B_A3B, "tiny-moe": TINY_MOE, "gemma2-9b": GEMMA2_9B,
          "tiny-gemma2": TINY_GEMMA2, "phi3-medium": PHI3_MEDIUM, "tiny-phi3": TINY_PHI3,
          "mixtral-8x7b": MIXTRAL_8X7B, "tiny-mixtral": TINY_MIXTRAL}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
SPECIAL_IDS = range(17)  # the demo tokenizer's special tokens
INDEX_NAME = "model.safetensors.index.json"
# The 8B (16.06 GB) stays one model.safetensors; the 70B becomes 8 shards.
DEFAULT_MAX_SHARD_BYTES = 20 * 10**9
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class Layout:
    """How a family's Hub checkpoint names and stores a layer (tied embeddings: the config's flag)."""

    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    qk_norms: bool = False  # Qwen3: per-head self_attn.q_norm / k_norm
    fused: bool = False  # Phi-3: one qkv_proj (q, k, v rows) and one gate_up_proj (gate, up rows)
    # Gemma's RMSNorm scales by (1 + w): "offsets" are small random w (a zero would hide a missing + 1).
    norm_kind: str = "ones"
    # MoE: the block holding the router (`gate`) and the experts, and each expert's gate, up and
    # down projections (Mixtral: block_sparse_moe, w1 / w3 / w2).
    moe_block: str = "mlp"
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")


GEMMA_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
LAYOUTS = {
    "llama": Layout(),
    "qwen3_moe": Layout(qk_norms=True),
    "gemma2": Layout(norms=GEMMA_NORMS, norm_kind="offsets"),
    "phi3": Layout(fused=True),
    "mixtral": Layout(moe_block="block_sparse_moe", expert_names=("w1", "w3", "w2")),
}


def layout(cfg: dict) -> Layout:
    if cfg["model_type"] not in LAYOUTS:
        raise ValueError(f"no checkpoint layout for model_type {cfg['model_type']!r} (known: {', '.join(LAYOUTS)})")
    return LAYOUTS[cfg["model_type"]]


def head_dim(cfg: dict) -> int:
    """The config's head_dim, or hidden / heads where it names none (Phi-3)."""
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _attention_shapes(cfg: dict, fused: bool) -> dict[str, tuple[int, int]]:
    h, d = cfg["hidden_size"], head_dim(cfg)
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    if fused:
        return {"self_attn.qkv_proj.weight": (q + 2 * kv, h), "self_attn.o_proj.weight": (h, q)}
    return {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q)}  # fmt: skip


def experts(cfg: dict) -> tuple[int, int, int] | None:
    """An MoE config's (experts, experts a token, an expert's intermediate size); None if dense."""
    count = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not count:
        return None
    return count, cfg["num_experts_per_tok"], cfg.get("moe_intermediate_size", cfg["intermediate_size"])


def _mlp_shapes(cfg: dict, fused: bool) -> dict[str, tuple[int, int]]:
    """A dense MLP, or an MoE block's router and experts (Qwen3-MoE's or Mixtral's names)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    moe = experts(cfg)
    if moe is None:
        if fused:
            return {"mlp.gate_up_proj.weight": (2 * i, h), "mlp.down_proj.weight": (h, i)}
        return {"mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}
    count, _, m = moe
    block, (gate, up, down) = layout(cfg).moe_block, layout(cfg).expert_names
    shapes = {f"{block}.gate.weight": (count, h)}
    for e in range(count):
        shapes |= {f"{block}.experts.{e}.{gate}.weight": (m, h), f"{block}.experts.{e}.{up}.weight": (m, h),
                   f"{block}.experts.{e}.{down}.weight": (h, m)}  # fmt: skip
    return shapes


def _layer_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """A layer's random matrices, in the Hub's names and draw order: attention, then the MLP."""
    fused = layout(cfg).fused
    return _attention_shapes(cfg, fused) | _mlp_shapes(cfg, fused)


def _layer_norms(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    family = layout(cfg)
    norms = [(f"{name}.weight", (cfg["hidden_size"],)) for name in family.norms]
    if family.qk_norms:  # per-head q/k norms
        norms += [("self_attn.q_norm.weight", (head_dim(cfg),)), ("self_attn.k_norm.weight", (head_dim(cfg),))]
    return norms


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    # "normal", "ones", "offsets" (Gemma's norms: small, about 0) or "head" (normal with the
    # unusable rows zeroed: lm_head, or a tied embedding table); a 4-bit checkpoint's
    # "words" (random int32 of 8 values), "zeros" (int32 of 8 zero points), "scales" (fp16)
    # and "g_idx" (each input's group); a block-wise fp8 checkpoint's "fp8" weights and their
    # "block_scales" (float32)
    kind: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def nbytes(self, element_bytes: int) -> int:
        """Bytes stored: the model dtype's, or the packed tensors' own."""
        return self.numel * {"words": 4, "zeros": 4, "g_idx": 4, "scales": 2, "fp8": 1,
                             "block_scales": 4}.get(self.kind, element_bytes)  # fmt: skip


# Random 4-bit checkpoints (issue 25's benchmarks), as GPTQ (v1, symmetric) and AutoAWQ (GEMM)
# store them: groups of 128 inputs, one fp16 scale per group and output.
GROUP_SIZE = 128
QUANTIZATION_CONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP_SIZE, "desc_act": False, "sym": True,
             "checkpoint_format": "gptq"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP_SIZE, "zero_point": True, "version": "gemm"},
    # DeepSeek-V3 / Qwen3-FP8 style: e4m3 weights, one scale per 128 x 128 block.
    "fp8-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
}  # fmt: skip
FP8_BLOCK = 128
# Zero points of 8 (the middle of 0..15), eight to a word: GPTQ v1 stores each minus one.
ZERO_WORDS = {"gptq": 0x77777777, "awq": 0x88888888 - (1 << 32)}


# Quantized checkpoints are written for Llama and, experts packed and routers unquantized (as
# GPTQModel / AutoAWQ leave them), the MoE layouts.
QUANTIZED_LAYOUTS = ("llama", "qwen3_moe", "mixtral")


def _packed_specs(prefix: str, out: int, depth: int, checkpoint: str) -> list[TensorSpec]:
    """The tensors of one [out, depth] linear in a 4-bit or block-wise fp8 checkpoint."""
    if checkpoint == "fp8-block":
        blocks = (-(-out // FP8_BLOCK), -(-depth // FP8_BLOCK))
        return [TensorSpec(prefix + ".weight", (out, depth), "fp8"),
                TensorSpec(prefix + ".weight_scale_inv", blocks, "block_scales")]  # fmt: skip
    groups = -(-depth // GROUP_SIZE)  # a last, shorter group (a tiny shape: one group of fewer rows)
    words = (depth // 8, out) if checkpoint == "gptq" else (depth, out // 8)
    specs = [TensorSpec(prefix + ".qweight", words, "words"), TensorSpec(prefix + ".qzeros", (groups, out // 8), "zeros"),
             TensorSpec(prefix + ".scales", (groups, out), "scales")]  # fmt: skip
    return specs + ([TensorSpec(prefix + ".g_idx", (depth,), "g_idx")] if checkpoint == "gptq" else [])


def tensor_specs(cfg: dict, checkpoint: str | None = None) -> list[TensorSpec]:
    """Every tensor in the order its random values are drawn (which fixes the weights); with
    `checkpoint` ("gptq", "awq" or "fp8-block") the decoder's linears in that format. Tied
    embeddings: no lm_head, the embedding table is drawn as the head."""
    if checkpoint is not None and cfg["model_type"] not in QUANTIZED_LAYOUTS:
        raise ValueError(f"quantized checkpoints are written for {', '.join(QUANTIZED_LAYOUTS)} only")
    h, vocab, tied = cfg["hidden_size"], cfg["vocab_size"], cfg["tie_word_embeddings"]
    norm_kind = layout(cfg).norm_kind
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, h), "head" if tied else "normal"),
             TensorSpec("model.norm.weight", (h,), norm_kind)]  # fmt: skip
    if not tied:
        specs.append(TensorSpec("lm_head.weight", (vocab, h), "head"))
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for name, shape in _layer_shapes(cfg).items():
            if checkpoint is None or name.endswith(".gate.weight"):  # an MoE router stays unquantized
                specs.append(TensorSpec(prefix + name, shape, "normal"))
            else:
                specs += _packed_specs(prefix + name.removesuffix(".weight"), *shape, checkpoint)
        specs += [TensorSpec(prefix + name, shape, norm_kind) for name, shape in _layer_norms(cfg)]
    return specs


def active_params_per_token(cfg: dict) -> int:
    """Parameters one decoded token reads: every attention and norm weight, the routers, the
    experts it is routed to (or the dense MLP), the LM head (a tied embedding table counts once,
    as the head), the final norm and its own embedding row."""
    per_layer, layer = 0, _layer_shapes(cfg)
    for name, shape in layer.items():
        numel = shape[0] * shape[1]
        if ".experts." in name:
            count, top_k, _ = experts(cfg)
            numel = numel * top_k // count  # the routed share
        per_layer += numel
    per_layer += sum(shape[0] for _, shape in _layer_norms(cfg))
    head = cfg["vocab_size"] * cfg["hidden_size"]
    return per_layer * cfg["num_hidden_layers"] + head + 2 * cfg["hidden_size"]


def decode_bytes_per_token(cfg: dict, checkpoint: str | None = None, element_bytes: int = 2) -> int:
    """Bytes one decoded token reads from the weights: `active_params_per_token` in the model
    dtype, or, for a quantized (untied) checkpoint, every stored tensor but the embedding table
    (one row) and, of an MoE model's experts, the routed share."""
    if checkpoint is None:
        return element_bytes * active_params_per_token(cfg)
    stored = 0
    for spec in tensor_specs(cfg, checkpoint):
        count = experts(cfg) if ".experts." in spec.name else None
        stored += spec.nbytes(element_bytes) * (count[1] / count[0] if count else 1)
    return int(stored) - (cfg["vocab_size"] - 1) * cfg["hidden_size"] * element_bytes


def plan_shards(specs: list[TensorSpec], element_bytes: int, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive groups of at most max_shard_bytes (a bigger tensor gets a shard alone)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec.nbytes(element_bytes)
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def shard_file_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


@dataclass(frozen=True)
class Spill:
    """Where shards go once `budget_bytes` of them sit in the model directory: a second
    filesystem (a disk too small for the whole model), linked back into the directory."""

    directory: Path
    budget_bytes: int


def add_spill_options(parser) -> None:
    """--spill-dir / --disk-budget-gb on a benchmark's argparse parser (read by `spill_from`)."""
    parser.add_argument("--spill-dir", type=Path, help="weight shards past --disk-budget-gb are written here")
    parser.add_argument("--disk-budget-gb", type=float, help="bytes of shards kept in the model directory")


def spill_from(args, parser) -> Spill | None:
    """The Spill those options ask for (None without them); a parser error if only one is given."""
    if (args.spill_dir is None) != (args.disk_budget_gb is None):
        parser.error("--spill-dir and --disk-budget-gb go together")
    return None if args.spill_dir is None else Spill(args.spill_dir, int(args.disk_budget_gb * 1e9))


def write_random_llama(directory: Path, tokenizer_dir: Path, text_vocab: int, seed: int = 0,
                       shape: dict = LLAMA3_8B, device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, spill: Spill | None = None,
                       checkpoint: str | None = None,
                       transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> int:  # fmt: skip
    """Writes config, weights and tokenizer of any SHAPES entry in its family's layout (LAYOUTS);
    returns the parameter count (of the unpacked model).
    `checkpoint` "gptq" / "awq" / "fp8-block": the decoder's linears as a random checkpoint of that method.
    `transform(name, tensor)`: each tensor, drawn (on the host, in draw order), is replaced by
    what it returns (same shape and dtype) before it is saved; the draws themselves are unchanged,
    so every tensor it passes through is the plain random model's (bench/predictable_model.py).

    Shard by shard: one shard's tensors are drawn on `device`, moved to the host, saved and
    freed before the next. With more than one shard, model.safetensors.index.json maps every
    tensor to its file (the Hugging Face layout)."""
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device).manual_seed(seed)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    specs = tensor_specs(shape, checkpoint)
    shards = plan_shards(specs, element_bytes, max_shard_bytes)
    names = shard_file_names(len(shards))
    (directory / "config.json").unlink(missing_ok=True)  # written last: marks a complete model
    for old in directory.glob("*.safetensors"):  # a stale shard would be loaded too
        old.unlink()

    def draw(spec: TensorSpec) -> torch.Tensor:
        if spec.kind == "ones":
            return torch.ones(spec.shape).to(dtype)
        if spec.kind == "offsets":  # Gemma's (1 + w): scales of about 0.9 to 1.1
            return (torch.randn(spec.shape, generator=gen, device=device) * 0.05).to(dtype).cpu()
        if spec.kind == "words":
            return torch.randint(-(1 << 31), 1 << 31, spec.shape, generator=gen, device=device, dtype=torch.int64).to(
                torch.int32).cpu()  # fmt: skip
        if spec.kind == "zeros":
            return torch.full(spec.shape, ZERO_WORDS[checkpoint], dtype=torch.int32)
        if spec.kind == "scales":  # values of (q - 8) * scale spread about as the dense weights' 0.02
            return (torch.rand(spec.shape, generator=gen, device=device) * 0.004 + 0.002).half().cpu()
        if spec.kind == "g_idx":
            return (torch.arange(spec.shape[0]) // GROUP_SIZE).to(torch.int32)
        if spec.kind == "fp8":  # times block scales of ~0.01: weights spread about as the dense 0.02
            return torch.randn(spec.shape, generator=gen, device=device).mul(2).clamp(-448, 448).to(
                torch.float8_e4m3fn).cpu()  # fmt: skip
        if spec.kind == "block_scales":
            return (torch.rand(spec.shape, generator=gen, device=device) * 0.01 + 0.005).cpu()
        tensor = (torch.randn(spec.shape, generator=gen, device=device) * 0.02).to(dtype)
        if spec.kind == "head":
            tensor[text_vocab:] = 0
            tensor[list(SPECIAL_IDS)] = 0
        return tensor.cpu().contiguous()

    def drawn(spec: TensorSpec) -> torch.Tensor:
        tensor = draw(spec)
        if transform is None:
            return tensor
        out = transform(spec.name, tensor)
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError(f"transform changed {spec.name}: {tuple(tensor.shape)} {tensor.dtype} -> "
                             f"{tuple(out.shape)} {out.dtype}")  # fmt: skip
        return out.contiguous()

    weight_map, kept = {}, 0
    for shard, file_name in zip(shards, names):
        tensors = {spec.name: drawn(spec) for spec in shard}
        nbytes = sum(spec.nbytes(element_bytes) for spec in shard)
        target = directory / file_name
        if spill is not None and kept + nbytes > spill.budget_bytes:
            spill.directory.mkdir(parents=True, exist_ok=True)
            target = spill.directory / file_name
            (directory / file_name).symlink_to(target.resolve())
        else:
            kept += nbytes
        save_file(tensors, str(target), metadata={"format": "pt"})
        del tensors
        weight_map.update({spec.name: file_name for spec in shard})
    if len(shards) > 1:
        total = sum(spec.nbytes(element_bytes) for spec in specs)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / INDEX_NAME).write_text(json.dumps(index, indent=1))
    else:
        (directory / INDEX_NAME).unlink(missing_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, directory / name)
    config = dict(shape, torch_dtype=DTYPE_NAMES[dtype])
    if checkpoint is not None:
        config["quantization_config"] = QUANTIZATION_CONFIGS[checkpoint]
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return sum(spec.numel for spec in tensor_specs(shape))


def weights_bytes(directory: Path) -> int:
    """Bytes of every safetensors file in a model directory (headers included; links followed)."""
    return sum(f.stat().st_size for f in Path(directory).glob("*.safetensors"))


def _time_ms(fn, warmup: int = 3, repeat: int = 10, device: str = "cuda") -> float:
    """Median milliseconds of fn: CUDA events on the GPU, the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device != "cuda":
        for _ in range(repeat):
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
        return sorted(times)[len(times) // 2]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth_bytes_per_s(size_bytes: int = 4 << 30, device: str = "cuda") -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randn(size_bytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), device=device)
    return 2 * size_bytes / (ms / 1e3)


def bf16_matmul_flops_per_s(n: int = 8192, device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> float:
    """Square matmul rate (named for its default dtype; the CPU harness passes its own)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = _time_ms(lambda: a @ b, device=device)
    return 2 * n**3 / (ms / 1e3)
