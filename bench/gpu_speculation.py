"""Speculative decoding on one H200 (issue 26): the random 8B (bf16), textgen without
speculation ("off"), with `--speculate 4` (prompt lookup, "on") and with `--speculate 4
--speculative-model DRAFT` (a random draft model, by default Llama-3.2-1B-shaped: "draft"), on
prompts that contain the model's own greedy continuation.

For each seed prompt P (random token ids as text), a server without speculation answers P
greedily with C (token ids); the measured prompt is then P + C + P (ids), so prompt lookup finds P's end followed by C,
and drafts C again. How often the model really continues with C after the second P (its
output depends on everything before) is the acceptance rate, measured and reported. Workloads:
batch 1 (three prompts one at a time), and bursts of 64 and 256 such prompts at once
(`--workloads` picks some of batch1, burst64, burst256; default all). Every server runs at its
defaults apart from `--speculate` and `--speculative-model`, on the same requests.

The draft server (issue 26: "a draft-model run at the 8B shape with a 1B-shaped draft,
reporting the time split between draft and verify"): the router's per-step records
(bench/step_log.py, the log filter start_server sets) give, for each workload, the steps that
drafted and how their time split: the host time the draft model took (`draft_us`: its catch-up
over the tokens since the sequence's last draft, the whole prompt at its first, then one forward
a further draft) against the rest of those steps (`ran_us - draft_us`: the verifying forward,
sampling, the router's turn). With random weights the 1B draft's proposals are rarely the 8B's
tokens, so acceptance is near 0 and the router backs off after each fruitless verification (a
pause of plain decodes that doubles, up to 64): the run measures the cost split of drafting, not
a speedup. Bursts of 64 and 256 draft only in steps of at most 8 decodes (the router's
MAX_DRAFTING_DECODES), so hardly at all.

Models: the 8B in --model-dir (16.06 GB) and the draft in --draft-dir (the 1B: 2.47 GB), found
there or written with the same tokenizer by a child process (this one never holds GPU memory
while the servers run). Every server's log is kept as OUT/textgen_<server>.log. The whole run
(two model writes, four server starts, three measured passes) is meant to fit one 600 s call;
`--draft-shape none` leaves the draft server out.

    PYTHONPATH=. python3 bench/gpu_speculation.py --tokenizer-dir T --router-binary R --out OUT \\
        [--draft-shape 1b] [--draft-dir /tmp/llama1b-random] [--workloads batch1,burst64,burst256]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peer_load, step_log  # noqa: E402
from bench.gpu_http_load import clients_for  # noqa: E402
from bench.gpu_vs_transformers import TEXT_VOCAB, phase_model, start_server  # noqa: E402
from bench.gpu_vs_vllm import _log_size, stop  # noqa: E402

PROMPT_TOKENS = 128
COUNTER_NAMES = ("textgen_speculative_draft_tokens_total", "textgen_speculative_accepted_tokens_total")
WORKLOADS = ("batch1", "burst64", "burst256")
# A model directory holds the draft shape when its config.json (written last) has these values.
SAME_SHAPE = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings")  # fmt: skip
DRAFT_SEED = 1  # the target's weights are drawn from seed 0
SERVER_START_S = 300.0


def continuation(url: str, prompt: str, tokens: int) -> list[int]:
    """The server's greedy answer to `prompt`, as token ids (TGI's /generate with details)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": tokens, "details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return [token["id"] for token in response.json()["details"]["tokens"]]


def self_copy_prompts(url: str, tokenizer, count: int, answer: int, seed: int) -> list[list[int]]:
    """P + C + P for `count` seeded prompts P (random ids as text, encoded as the server encodes
    it), C the server's greedy answer to P as token ids: the model's own continuation of P."""
    rng = random.Random(seed)
    texts = [tokenizer.decode(peer_load.random_ids(rng, PROMPT_TOKENS, TEXT_VOCAB)) for _ in range(count)]
    with ThreadPoolExecutor(min(count, 64)) as pool:
        answers = list(pool.map(lambda t: continuation(url, t, answer), texts))
    prompts = []
    for text, answer_ids in zip(texts, answers):
        p = tokenizer.encode(text, add_special_tokens=False).ids
        prompts.append(p + answer_ids + p)
    return prompts


def make_plan(url: str, tokenizer, names: list[str]) -> tuple[dict[str, list[list[peer_load.Request]]], dict]:
    """The measured requests of the workloads `names` (prompts from the server at `url`), and
    their prompts' lengths. Burst 64's prompts are burst 256's first 64 (the same seed)."""
    plan, lengths = {}, {}
    if "batch1" in names:
        single = self_copy_prompts(url, tokenizer, 3, 512, seed=40)
        plan["batch1"] = [[peer_load.Request(p, 512)] for p in single]
        lengths["batch1"] = [len(p) for p in single]
    bursts = [n for n in names if n.startswith("burst")]
    if bursts:
        many = self_copy_prompts(url, tokenizer, max(int(n.removeprefix("burst")) for n in bursts), 256, seed=41)
        lengths["burst_mean"] = sum(map(len, many)) / len(many)
        for name in bursts:
            plan[name] = [[peer_load.Request(p, 256) for p in many[: int(name.removeprefix("burst"))]]]
    return {name: plan[name] for name in names}, lengths


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = dict.fromkeys(COUNTER_NAMES, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values


def draft_split(records: list[step_log.StepRecord]) -> dict:
    """How the steps that drafted (draft_us or drafted above 0) spent their time: the draft
    model's host time (`draft_s`) against the rest of their wall time (`verify_and_rest_s`:
    ran_us - draft_us, the verifying forward, sampling and the router), their count and means;
    beside them the median plain decode step (no prefill, no drafts allowed), for scale."""
    drafting = [r for r in records if r.draft_us > 0 or r.drafted > 0]
    draft_us = sum(r.draft_us for r in drafting)
    rest_us = sum(r.ran_us for r in drafting) - draft_us
    plain = sorted(r.ran_us for r in records if r.prefill_tokens == 0 and r.drafts == 0)
    n = len(drafting)
    return {"steps": len(records), "drafting_steps": n, "drafted": sum(r.drafted for r in drafting),
            "draft_s": draft_us / 1e6, "verify_and_rest_s": rest_us / 1e6,
            "draft_share": draft_us / (draft_us + rest_us) if draft_us + rest_us > 0 else 0.0,
            "mean_draft_ms": draft_us / n / 1e3 if n else 0.0,
            "mean_verify_and_rest_ms": rest_us / n / 1e3 if n else 0.0,
            "plain_decode_median_ms": plain[len(plain) // 2] / 1e3 if plain else 0.0}  # fmt: skip


def measure(args, url: str, plan: dict[str, list[list[peer_load.Request]]]) -> dict:
    """Each workload's median run (output tok/s), the drafts verified and kept over all its runs
    (the router's counters), and its runs' step records: summary and draft_split."""
    results = {}
    for name, runs in plan.items():
        before, log_start = counters(url), _log_size(args, "textgen")
        summaries = []
        for requests in runs:
            outcomes, wall = peer_load.run(url, requests, clients_for(len(requests)), len(requests))
            summaries.append(peer_load.summary(outcomes, wall))
        after = counters(url)
        summaries.sort(key=lambda s: s["output_tok_s"])
        picked = dict(summaries[len(summaries) // 2])  # the median run
        picked["drafted"], picked["kept"] = (after[n] - before[n] for n in COUNTER_NAMES)
        picked["acceptance"] = picked["kept"] / picked["drafted"] if picked["drafted"] else 0.0
        if log_start is not None:
            time.sleep(0.5)  # the last steps' records reach the log
            records = step_log.read(args.out / "textgen.log", log_start)
            picked["split"] = draft_split(records)
            picked["steps"] = step_log.summary(records)
        results[name] = picked
        print(f"  {name}: {picked['output_tok_s']:.1f} tok/s, drafted {picked['drafted']:.0f}, "
              f"kept {picked['kept']:.0f}, split {json.dumps(picked.get('split'))}", flush=True)  # fmt: skip
    return results


# -- models -----------------------------------------------------------------------------------
def draft_model(args, device: str = "cuda") -> dict:
    """The draft of `--draft-shape` in --draft-dir: found there (its config.json, written last,
    has the shape and its tokenizer.json is --tokenizer-dir's) or written."""
    from bench.gpu_model import SHAPES, tensor_specs, weights_bytes, write_random_llama

    shape = SHAPES[args.draft_shape]
    out = {"shape": args.draft_shape, "dir": str(args.draft_dir),
           "parameters": sum(spec.numel for spec in tensor_specs(shape))}  # fmt: skip
    config, tokenizer = args.draft_dir / "config.json", args.draft_dir / "tokenizer.json"
    found = json.loads(config.read_text()) if config.exists() else {}
    same_tokenizer = tokenizer.exists() and tokenizer.read_bytes() == (args.tokenizer_dir / "tokenizer.json").read_bytes()
    if all(found.get(k) == shape[k] for k in SAME_SHAPE) and same_tokenizer:
        out["reused"] = True
    else:
        started = time.perf_counter()
        write_random_llama(args.draft_dir, args.tokenizer_dir, TEXT_VOCAB, seed=DRAFT_SEED, shape=shape, device=device)
        out["write_s"] = time.perf_counter() - started
    out["bytes"] = weights_bytes(args.draft_dir)
    return out


def write_models(args) -> dict:
    """The target (gpu_vs_transformers.phase_model) and, unless `--draft-shape none`, the draft."""
    models = {"model": phase_model(args)}
    if args.draft_shape != "none":
        models["draft"] = draft_model(args)
    return models


# -- report -----------------------------------------------------------------------------------
def report(results: dict, names: list[str]) -> str:
    """Markdown: off against prompt lookup; then off against the draft model, with the split of
    the drafting steps' time. A server that failed is named, not tabled."""
    lines = []
    for key in ("off", "on", "draft"):
        if "error" in results.get(key, {}):
            lines += [f"Server `{key}` failed: {results[key]['error']}", ""]
    lines += ["| workload | tok/s off | tok/s on | on / off | drafted | kept | acceptance |",
              "|:--|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for name in names:
        off, on = results.get("off", {}).get(name), results.get("on", {}).get(name)
        if off is None or on is None:
            continue
        lines.append(f"| {name} | {off['output_tok_s']:.1f} | {on['output_tok_s']:.1f} | "
                     f"{_ratio(on, off)} | {on['drafted']:.0f} | {on['kept']:.0f} | {_acceptance(on):.3f} |")  # fmt: skip
    if "draft" not in results or "error" in results["draft"]:
        return "\n".join(lines) + "\n"
    model = results.get("draft_model") or {}
    lines += ["", f"Draft model (`--speculative-model`, shape {model.get('shape', '?')}); the time of the steps that "
              "drafted: the draft model's (draft) against the rest (verify + rest: ran_us - draft_us); "
              "plain decode: the median decode step without drafts.", "",
              "| workload | tok/s off | tok/s draft | draft / off | drafted | kept | acceptance | drafting steps "
              "| draft s | verify + rest s | draft share | draft ms / step | verify + rest ms / step "
              "| plain decode ms |", "|:--|" + "--:|" * 13]  # fmt: skip
    for name in names:
        off, draft = results.get("off", {}).get(name), results["draft"].get(name)
        if draft is None:
            continue
        split = draft.get("split", {})
        lines.append(f"| {name} | {_fmt(off, 'output_tok_s')} | {draft['output_tok_s']:.1f} | {_ratio(draft, off)} | "
                     f"{draft['drafted']:.0f} | {draft['kept']:.0f} | {_acceptance(draft):.3f} | "
                     f"{split.get('drafting_steps', 0)} | {split.get('draft_s', 0.0):.3f} | "
                     f"{split.get('verify_and_rest_s', 0.0):.3f} | {split.get('draft_share', 0.0):.3f} | "
                     f"{split.get('mean_draft_ms', 0.0):.2f} | {split.get('mean_verify_and_rest_ms', 0.0):.2f} | "
                     f"{split.get('plain_decode_median_ms', 0.0):.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _acceptance(run: dict) -> float:
    return run["kept"] / run["drafted"] if run["drafted"] else 0.0


def _ratio(run: dict, base: dict | None) -> str:
    return f"{run['output_tok_s'] / base['output_tok_s']:.3f}" if base and base.get("output_tok_s") else "-"


def _fmt(run: dict | None, key: str) -> str:
    return f"{run[key]:.1f}" if run and key in run else "-"


def servers(args) -> list[tuple[str, list[str]]]:
    """(name, launcher flags) in start order: the prompts' server, then the measured ones."""
    spec = ["--speculate", str(args.speculate)]
    out = [("prompts", []), ("off", []), ("on", spec)]
    if args.draft_shape != "none":
        out.append(("draft", [*spec, "--speculative-model", str(args.draft_dir)]))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.gpu_model import SHAPES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-bench"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama8b-random"))
    parser.add_argument("--client-cpus", type=int, default=6)
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--draft-shape", default="1b", choices=[*SHAPES, "none"],
                        help="the draft model's shape (bench/gpu_model.py SHAPES); none: no draft server")
    parser.add_argument("--draft-dir", type=Path, default=Path("/tmp/llama1b-random"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of "
                        + ", ".join(WORKLOADS))  # fmt: skip
    parser.add_argument("--write-models", action="store_true", help=argparse.SUPPRESS)  # internal: the child
    args = parser.parse_args(argv)
    if unknown := set(args.workloads.split(",")) - set(WORKLOADS):
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))} (known: {', '.join(WORKLOADS)})")
    args.workload_names = [n for n in WORKLOADS if n in args.workloads.split(",")]  # in WORKLOADS' order
    return args


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.write_models:  # in a child, so this process never holds GPU memory the servers need
        (args.work / "speculation_models.json").write_text(json.dumps(write_models(args)))
        return
    started = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--write-models", *sys.argv[1:]], check=True)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.tokenizer_dir / "tokenizer.json"))
    models = json.loads((args.work / "speculation_models.json").read_text())
    results: dict = {"model": models["model"], "draft_model": models.get("draft"), "speculate": args.speculate,
                     "models_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    url = "http://127.0.0.1:3500"
    plan: dict[str, list[list[peer_load.Request]]] = {}
    # The prompts come from a server of their own: the measured servers start with an empty
    # prefix cache (P + C would be cached on the server that answered P).
    for key, flags in servers(args):
        args.server_flag = flags
        server_started = time.perf_counter()
        try:
            process, ready_s = start_server(args, 3500, timeout_s=SERVER_START_S, base_flags=[])
            try:
                if key == "prompts":
                    plan, results["prompt_tokens"] = make_plan(url, tokenizer, args.workload_names)
                    results["prompts_s"] = round(time.perf_counter() - server_started - ready_s, 1)
                else:
                    print(f"[{key}] {' '.join(flags) or 'no speculation'}", flush=True)
                    results[key] = {"flags": flags, "ready_s": ready_s, **measure(args, url, plan)}
            finally:
                stop(process)
        except Exception as exc:  # a measured server's failure leaves the others' figures
            if key == "prompts":
                raise
            results[key] = {"flags": flags, "error": f"{type(exc).__name__}: {exc}"}
            print(f"[{key}] failed: {results[key]['error']}", flush=True)
        finally:
            log = args.out / "textgen.log"
            if log.exists():  # the next start_server truncates it
                log.replace(args.out / f"textgen_{key}.log")
            results.setdefault("server_s", {})[key] = round(time.perf_counter() - server_started, 1)
            results["total_s"] = round(time.perf_counter() - started, 1)
            (args.out / "gpu_speculation.json").write_text(json.dumps(results, indent=1) + "\n")
    text = report(results, list(plan))
    (args.out / "gpu_speculation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
