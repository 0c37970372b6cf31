"""Random Llamas whose greedy continuation is known by construction (issue 26's speculation bench).

A random model's answer depends on its whole context, so a benchmark cannot plant text that it
will repeat, and a random draft model never agrees with a random target. These models fix both
while costing exactly what the plain random model costs: same shapes, same kernels, same bytes
(a zero weight is read and multiplied like any other).

The target (`write_target`, any untied Llama shape, e.g. SHAPES["8b"]): bench/gpu_model.py's
random model of the same seed, with
  - every `self_attn.o_proj.weight` and `mlp.down_proj.weight` zero: attention and MLP still run
    in full, but every layer adds 0 to the residual stream, so the last hidden state of token t is
    norm(embed[t]) whatever came before (every RMSNorm weight is 1, Llama's "ones");
  - the embedding's columns from `draft_hidden` on zero, and its first `draft_hidden` columns
    scaled to one norm a row (0.02 * sqrt(draft_hidden), about what was drawn);
  - lm_head[next(t)][:draft_hidden] = embed[t][:draft_hidden] for every text id t (the demo
    tokenizer's ids past its specials), where `next` is a single cycle through all the text ids in
    a seeded order (`successor_table`). The head's zeroed rows (specials, ids past the tokenizer's
    vocabulary: gpu_model's kind "head") stay zero.
So the greedy next token of t is argmax_s lm_head[s] . embed[t] = next(t) (the rows have one norm,
so a row's product with itself, |e|^2, beats every other's, |e|^2 cos; at 2,048 columns the
nearest other is at cos ~0.1, so bf16 rounding never decides), a function of the current token
alone, and the greedy continuation of any text from its last token t is next(t), next(next(t)),
...: it repeats after no fewer than 49,135 tokens, so prompt lookup finds in a prompt exactly
the copies a benchmark plants there. The greedy answer C to a prompt P is the cycle after P's last
token, and the greedy continuation of P + C + P is C again.

The draft (`write_draft`, e.g. Llama-3.2-1B's shape, untied so that its head differs from its
embedding; the decode cost of a tied and an untied 1B is the same): its hidden size h is the
target's `draft_hidden`, embed_D = embed_T[:, :h] and lm_head_D = lm_head_T[:, :h], its o_proj /
down_proj zero and norms 1 likewise, so its greedy next token is the target's for every id. For
`agreement` a < 1, a seeded share 1 - a of the text ids get fresh random embedding rows (of the
same norm): there the draft proposes some other token (that it is next(t) by chance is ~1 in 49k).
At batch 1 with drafts d1 = f_D(x), d2 = f_D(d1), ..., each draft is kept with probability a.

Directories hold a `predictable.json` (written after config.json) naming how they were made; a
directory whose config.json, tokenizer and predictable.json match is reused (`ensure_target`,
`ensure_draft`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from bench.gpu_model import INDEX_NAME, SHAPES, SPECIAL_IDS, tensor_specs, weights_bytes, write_random_llama

TARGET_SEED = 0  # the target's random tensors (write_random_llama's generator, as the plain random 8B)
DRAFT_SEED = 1  # the draft's own random tensors (attention and MLP inputs)
CYCLE_SEED = 26  # the order of the cycle of greedy next tokens
DISAGREE_SEED = 260  # which text ids the draft gets other embedding rows for, and those rows
MARKER = "predictable.json"
CONSTRUCTION = 1  # in every marker: a directory made by another construction is written again
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
ROW_STD = 0.02  # the random model's weight scale: embedding rows keep norm ROW_STD * sqrt(columns)
# A model directory holds a shape when its config.json (written last) has these values.
SAME_SHAPE = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings")  # fmt: skip


def text_ids(text_vocab: int) -> range:
    """The ids the cycle runs through: the demo tokenizer's, past its special tokens."""
    return range(len(SPECIAL_IDS), text_vocab)


def cycle_order(text_vocab: int, seed: int = CYCLE_SEED) -> list[int]:
    ids = list(text_ids(text_vocab))
    random.Random(seed).shuffle(ids)
    return ids


def successor_table(text_vocab: int, seed: int = CYCLE_SEED) -> list[int]:
    """next[t]: the target's greedy next token after text id t (-1 for the special ids)."""
    order = cycle_order(text_vocab, seed)
    table = [-1] * text_vocab
    for a, b in zip(order, order[1:] + order[:1]):
        table[a] = b
    return table


def chain(table: list[int], token: int, count: int) -> list[int]:
    """The target's greedy continuation of any text ending in `token`, `count` tokens long."""
    out = []
    for _ in range(count):
        token = table[token]
        out.append(token)
    return out


def target_shape(name: str) -> dict:
    shape = SHAPES[name]
    if shape["model_type"] != "llama" or shape["tie_word_embeddings"]:
        raise ValueError(f"a predictable target is an untied Llama; {name} is not")
    return shape


def draft_shape(name: str) -> dict:
    """SHAPES[name] untied (lm_head apart from the embedding table)."""
    if SHAPES[name]["model_type"] != "llama":
        raise ValueError(f"a predictable draft is a Llama; {name} is not")
    return dict(SHAPES[name], tie_word_embeddings=False)


def _unit_rows(table: torch.Tensor, columns: int) -> torch.Tensor:
    """Columns from `columns` on zero, the others scaled to norm ROW_STD * sqrt(columns) a row."""
    rows = table.float()
    rows[:, columns:] = 0
    rows[:, :columns] *= ROW_STD * columns**0.5 / rows[:, :columns].norm(dim=1, keepdim=True).clamp_min(1e-12)
    return rows.to(table.dtype)


def _check_norms(name: str, tensor: torch.Tensor) -> None:
    if name.endswith("norm.weight") and not torch.equal(tensor, torch.ones_like(tensor)):
        raise ValueError(f"{name} is not all ones: the residual stream would not be the embedding's")


def target_transform(draft_hidden: int, text_vocab: int, cycle_seed: int = CYCLE_SEED
                     ) -> Callable[[str, torch.Tensor], torch.Tensor]:  # fmt: skip
    """write_random_llama's `transform` for the target (the module docstring). The embedding is
    drawn before lm_head; its transformed first columns are kept for the head."""
    order = torch.tensor(cycle_order(text_vocab, cycle_seed))
    kept: dict[str, torch.Tensor] = {}

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        _check_norms(name, tensor)
        if name.endswith(ZEROED):
            return torch.zeros_like(tensor)
        if name == EMBED:
            table = _unit_rows(tensor, draft_hidden)
            kept["embed"] = table[:, :draft_hidden]
            return table
        if name == HEAD:
            head = tensor.clone()
            head[torch.roll(order, -1), :draft_hidden] = kept.pop("embed")[order]
            return head
        return tensor

    return transform


def read_columns(directory: Path, name: str, columns: int) -> torch.Tensor:
    """The first `columns` columns of tensor `name` in a model directory (one file or an index)."""
    index = directory / INDEX_NAME
    file = directory / (json.loads(index.read_text())["weight_map"][name] if index.exists() else "model.safetensors")
    with safe_open(str(file), "pt") as f:
        return f.get_slice(name)[:, :columns].contiguous()


def disagreeing_ids(text_vocab: int, agreement: float, seed: int = DISAGREE_SEED) -> torch.Tensor:
    """The seeded share 1 - agreement of the text ids where the draft gets a fresh embedding row."""
    ids = torch.tensor(text_ids(text_vocab))
    count = round((1.0 - agreement) * len(ids))
    return ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))[:count]].sort().values


def draft_transform(target_dir: Path, hidden: int, text_vocab: int, agreement: float,
                    seed: int = DISAGREE_SEED) -> Callable[[str, torch.Tensor], torch.Tensor]:  # fmt: skip
    """write_random_llama's `transform` for the draft: the target's embedding and head, first
    `hidden` columns, the embedding's rows of `disagreeing_ids` replaced by fresh random rows."""
    embed, head = read_columns(target_dir, EMBED, hidden), read_columns(target_dir, HEAD, hidden)
    chosen = disagreeing_ids(text_vocab, agreement, seed)
    fresh = torch.randn(len(chosen), hidden, generator=torch.Generator().manual_seed(seed + 1))
    embed[chosen] = _unit_rows(fresh, hidden).to(embed.dtype)

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        _check_norms(name, tensor)
        if name.endswith(ZEROED):
            return torch.zeros_like(tensor)
        if name == EMBED:
            return embed.to(tensor.dtype)
        if name == HEAD:
            return head.to(tensor.dtype)
        return tensor

    return transform


# -- directories ------------------------------------------------------------------------------
def _found(directory: Path, shape: dict, tokenizer_dir: Path, marker: dict) -> bool:
    """The directory holds a complete model of `shape`, the tokenizer's tokenizer.json and `marker`."""
    config, tokenizer, made = directory / "config.json", directory / "tokenizer.json", directory / MARKER
    if not (config.exists() and tokenizer.exists() and made.exists()):
        return False
    found = json.loads(config.read_text())
    return (all(found.get(k) == shape[k] for k in SAME_SHAPE)
            and tokenizer.read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()
            and json.loads(made.read_text()) == marker)  # fmt: skip


def _weights_stamp(directory: Path) -> list:
    """Size and modification time of the weights: a draft made from them is stale once they change."""
    return sorted([f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in directory.glob("*.safetensors"))


def _write(directory: Path, tokenizer_dir: Path, text_vocab: int, seed: int, shape: dict, device: str,
           dtype: torch.dtype, transform, marker: dict) -> float:  # fmt: skip
    started = time.perf_counter()
    (directory / MARKER).unlink(missing_ok=True)
    write_random_llama(directory, tokenizer_dir, text_vocab, seed=seed, shape=shape, device=device, dtype=dtype,
                       transform=transform)  # fmt: skip
    (directory / MARKER).write_text(json.dumps(marker, indent=1) + "\n")  # after config.json: complete
    return time.perf_counter() - started


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def ensure_target(directory: Path, tokenizer_dir: Path, text_vocab: int, shape_name: str = "8b",
                  draft_hidden: int = 2048, device: str | None = None, dtype: torch.dtype = torch.bfloat16,
                  seed: int = TARGET_SEED, cycle_seed: int = CYCLE_SEED) -> dict:  # fmt: skip
    """The predictable target of SHAPES[shape_name] in `directory`: found there or written."""
    shape = target_shape(shape_name)
    if not 0 < draft_hidden <= shape["hidden_size"] or text_vocab > shape["vocab_size"]:
        raise ValueError(f"draft_hidden {draft_hidden} / text_vocab {text_vocab} do not fit {shape_name}")
    marker = {"role": "target", "construction": CONSTRUCTION, "shape": shape_name, "draft_hidden": draft_hidden,
              "text_vocab": text_vocab, "seed": seed, "cycle_seed": cycle_seed, "dtype": str(dtype)}  # fmt: skip
    out = {"shape": shape_name, "dir": str(directory), "draft_hidden": draft_hidden,
           "parameters": sum(spec.numel for spec in tensor_specs(shape))}  # fmt: skip
    if _found(directory, shape, tokenizer_dir, marker):
        out["reused"] = True
    else:
        transform = target_transform(draft_hidden, text_vocab, cycle_seed)
        out["write_s"] = _write(directory, tokenizer_dir, text_vocab, seed, shape, device or _default_device(), dtype,
                                transform, marker)  # fmt: skip
    out["bytes"] = weights_bytes(directory)
    return out


def ensure_draft(directory: Path, target_dir: Path, tokenizer_dir: Path, text_vocab: int, shape_name: str = "1b",
                 agreement: float = 1.0, device: str | None = None, dtype: torch.dtype = torch.bfloat16,
                 seed: int = DRAFT_SEED, disagree_seed: int = DISAGREE_SEED) -> dict:  # fmt: skip
    """The draft of SHAPES[shape_name] (untied) for the predictable target in `target_dir`, agreeing
    with it on a share `agreement` of the text ids: found in `directory` or written."""
    shape = draft_shape(shape_name)
    target_marker = json.loads((target_dir / MARKER).read_text()) if (target_dir / MARKER).exists() else {}
    if target_marker.get("role") != "target":
        raise ValueError(f"{target_dir} holds no predictable target ({MARKER})")
    if target_marker["draft_hidden"] != shape["hidden_size"]:
        raise ValueError(f"the target in {target_dir} was written for a draft of hidden size "
                         f"{target_marker['draft_hidden']}, {shape_name} has {shape['hidden_size']}")  # fmt: skip
    target_config = json.loads((target_dir / "config.json").read_text())
    if target_config["vocab_size"] != shape["vocab_size"]:
        raise ValueError(f"{shape_name}'s vocabulary ({shape['vocab_size']}) is not the target's "
                         f"({target_config['vocab_size']})")  # fmt: skip
    if not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement {agreement} is not a share")
    marker = {"role": "draft", "construction": CONSTRUCTION, "shape": shape_name, "agreement": agreement, "seed": seed,
              "disagree_seed": disagree_seed, "dtype": str(dtype), "target": target_marker,
              "target_weights": _weights_stamp(target_dir)}  # fmt: skip
    out = {"shape": shape_name, "dir": str(directory), "agreement": agreement, "tied": False,
           "disagreeing_ids": len(disagreeing_ids(text_vocab, agreement, disagree_seed)),
           "text_ids": len(text_ids(text_vocab)),
           "parameters": sum(spec.numel for spec in tensor_specs(shape))}  # fmt: skip
    if _found(directory, shape, tokenizer_dir, marker):
        out["reused"] = True
    else:
        transform = draft_transform(target_dir, shape["hidden_size"], text_vocab, agreement, disagree_seed)
        out["write_s"] = _write(directory, tokenizer_dir, text_vocab, seed, shape, device or _default_device(), dtype,
                                transform, marker)  # fmt: skip
    out["bytes"] = weights_bytes(directory)
    return out
