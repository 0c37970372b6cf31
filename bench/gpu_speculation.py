"""Speculative decoding on one H200 (issue 26): a predictable 8B-shaped Llama (bf16,
bench/predictable_model.py) served by textgen without speculation ("off"), with `--speculate 4`
(prompt lookup, "on"), with `--speculate 4 --speculative-model DRAFT` (a predictable
Llama-3.2-1B-shaped draft, "draft"), and by vLLM 0.26.0 with its n-gram speculation ("vllm",
with `--peer-env`), on the same requests, at a known acceptance.

The model: the random 8B of bench/gpu_model.py (the same seed's tensors as /tmp/llama8b-random)
with every o_proj and down_proj zero (every layer adds 0 to the residual stream, every norm
weight is 1), and an embedding and LM head built so that the greedy next token of token t is
next(t), one seeded cycle through all 49,135 text ids: the greedy continuation depends on the last
token alone and never repeats within a request. Why the comparison is fair: the shapes, the
kernels and the bytes read a token are the plain random 8B's (zeros are read and multiplied like
any weight; no engine looks at the values), every server runs the same checkpoint on the same
requests, and what speculation can gain is fixed by the prompts alone, the same for every engine.
Only what the model answers is known, not how fast an engine computes it.

How acceptance is controlled (`--acceptance a`, default 0.96: kept / drafted about 0.9, the
acceptance rate issue 26's batch-1 bar names): for each seed prompt P (random
token ids as text) a textgen server without speculation answers P greedily with C (token ids:
next(P's last token), next of that, ...; checked against the construction, reported as
`answers_as_constructed`). The measured prompt is P + C' + P, where C' is C with a seeded share
1 - a of its tokens replaced by other random text ids. After the second P the model answers C
again, so prompt lookup (textgen's and vLLM's) finds P's end followed by C' and drafts from C':
each draft is right where C' kept C's token, a share a. The draft model agrees with the target's
next token on a share a of the token ids (the rest have other embedding rows), so its drafts are
kept at the same per-token rate. Kept / drafted (the servers' counters) is lower than a: a
rejected draft also discards the drafts after it in its window (for i.i.d. replacements about
(a + a^2 + ... + a^k) / k; 0.77 for a = 0.9, k = 4), and after a replaced token prompt lookup
finds no n-gram for a few tokens. The report gives the nominal a, that expectation and the
measured share.

Workloads: batch 1 (three prompts one at a time, 512 new tokens), and bursts of 64 and 256 such
prompts at once (256 new tokens; `--workloads` picks some of batch1, burst64, burst256). Every
server gets a short warm-up, then the same requests. Every textgen server runs at its defaults
apart from `--speculate` and `--speculative-model`; vLLM at its defaults apart from
`--speculative-config {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
"prompt_lookup_min": 2}` (textgen's lookup: n-grams of 4 down to 2).

The draft server (issue 26: "a draft-model run at the 8B shape with a 1B-shaped draft,
reporting the time split between draft and verify"): the router's per-step records
(bench/step_log.py, the log filter start_server sets) give, for each workload, the steps that
drafted and how their time split: the host time the draft model took (`draft_us`: its catch-up
over the tokens since the sequence's last draft, the whole prompt at its first, then one forward
a further draft) against the rest of those steps (`ran_us - draft_us`: the verifying forward,
sampling, the router's turn). Bursts of 64 and 256 draft only in steps of at most 8 decodes (the
router's MAX_DRAFTING_DECODES), so hardly at all; vLLM drafts at every batch size.

Models: the target in --model-dir (default /tmp/llama8b-predictable, 16.06 GB) and the draft in
--draft-dir (default /tmp/llama1b-predictable, 3.0 GB untied), found there (predictable_model's
reuse check) or written with the same tokenizer by a child process (this one never holds GPU
memory while the servers run); the draft only when the draft server runs. Disk: 19.1 GB, plus
vLLM's unpacked bundle. Every measured server's log is kept as OUT/textgen_<server>.log (vLLM's:
OUT/vllm.log; the prompts server's only if it fails): with the results, the report and the plan,
at most 7 files in OUT. Results go to OUT/gpu_speculation.json after every server, merged into
what an earlier run left there (same --acceptance and --speculate), and the plan (the measured
prompts) to OUT/gpu_speculation_plan.json: a later run that finds it there (same model,
acceptance and workloads) measures the same prompts without a prompts server.

One call (textgen router in R, vLLM unpacked; about 7 minutes on the H200, so only where vLLM is
unpacked already and the call has the time):

    PYTHONPATH=. python3 bench/gpu_speculation.py --tokenizer-dir T --router-binary R --out OUT \\
        --peer-env .peer/tools/env.sh

or two (each well inside 600 s): textgen's three servers, then vLLM on the first call's plan,
merged into the first call's results (copy its OUT/gpu_speculation*.json into the second's OUT):

    PYTHONPATH=. python3 bench/gpu_speculation.py --tokenizer-dir T --router-binary R --out OUT \\
        --servers off,on,draft
    cp FIRST/gpu_speculation.json FIRST/gpu_speculation_plan.json OUT/
    PYTHONPATH=. python3 bench/gpu_speculation.py --tokenizer-dir T --router-binary R --out OUT \\
        --servers vllm --peer-env .peer/tools/env.sh

Other options: [--acceptance 0.96] [--draft-shape 1b|none] [--workloads batch1,burst64,burst256]
[--shape 8b] [--model-dir D] [--draft-dir D].
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

from bench import peer_load, predictable_model, step_log  # noqa: E402
from bench.gpu_http_load import clients_for  # noqa: E402
from bench.gpu_vs_transformers import TEXT_VOCAB, start_server  # noqa: E402
from bench.gpu_vs_vllm import _log_size, start_vllm, stop  # noqa: E402

PROMPT_TOKENS = 128
COUNTER_NAMES = ("textgen_speculative_draft_tokens_total", "textgen_speculative_accepted_tokens_total")
VLLM_COUNTER_NAMES = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")
WORKLOADS = ("batch1", "burst64", "burst256")
SERVERS = ("off", "on", "draft", "vllm")
TEXTGEN_PORT, VLLM_PORT = 3500, 8400
SERVER_START_S = 300.0
PLAN_SEEDS = {"batch1": 40, "bursts": 41}  # the prompts' seeds (burst 64's are burst 256's first 64)
ANSWER_TOKENS = {"batch1": 512, "bursts": 256}
# Issue 26's bars: textgen on / off, and textgen on / vLLM n-gram.
BARS_ON_OFF = {"batch1": 2.5, "burst64": 1.0, "burst256": 1.0}
BARS_ON_VLLM = {"batch1": 1.1, "burst64": 1.0}


def continuation(url: str, prompt: str, tokens: int) -> list[int]:
    """The server's greedy answer to `prompt`, as token ids (TGI's /generate with details)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": tokens, "details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return [token["id"] for token in response.json()["details"]["tokens"]]


def planted(answer: list[int], acceptance: float, rng: random.Random, vocab: int) -> list[int]:
    """`answer` with a share 1 - acceptance of its tokens (seeded positions) replaced by other
    random text ids: what prompt lookup will draft from."""
    out = list(answer)
    for i in rng.sample(range(len(out)), round((1.0 - acceptance) * len(out))):
        while (other := rng.randrange(256, vocab)) == answer[i]:
            pass
        out[i] = other
    return out


def self_copy_prompts(url: str, tokenizer, count: int, answer: int, seed: int, acceptance: float,
                      table: list[int] | None = None) -> tuple[list[list[int]], dict]:  # fmt: skip
    """P + C' + P for `count` seeded prompts P (random ids as text, encoded as the server encodes
    it), C the server's greedy answer to P as token ids, C' it with a share 1 - acceptance of its
    tokens replaced; and how many of C's tokens are the construction's (`table`: next(t))."""
    rng = random.Random(seed)
    texts = [tokenizer.decode(peer_load.random_ids(rng, PROMPT_TOKENS, TEXT_VOCAB)) for _ in range(count)]
    with ThreadPoolExecutor(min(count, 64)) as pool:
        answers = list(pool.map(lambda t: continuation(url, t, answer), texts))
    prompts, stats = [], {"answer_tokens": 0, "as_constructed": 0, "replaced": 0}
    for text, answer_ids in zip(texts, answers):
        p = tokenizer.encode(text, add_special_tokens=False).ids
        copy = planted(answer_ids, acceptance, rng, TEXT_VOCAB)
        prompts.append(p + copy + p)
        stats["answer_tokens"] += len(answer_ids)
        stats["replaced"] += sum(a != b for a, b in zip(answer_ids, copy))
        if table is not None:
            constructed = predictable_model.chain(table, p[-1], len(answer_ids))
            stats["as_constructed"] += sum(a == b for a, b in zip(answer_ids, constructed))
    return prompts, stats


def make_plan(url: str, tokenizer, names: list[str], acceptance: float, table: list[int] | None = None) -> dict:
    """The measured prompts of the workloads `names` (from the server at `url`), their answer
    lengths, and the prompts' statistics: a JSON-able plan (`requests` makes it requests)."""
    workloads, stats = {}, {"answer_tokens": 0, "as_constructed": 0, "replaced": 0}

    def add(part: dict) -> None:
        for key in stats:
            stats[key] += part[key]

    if "batch1" in names:
        single, part = self_copy_prompts(url, tokenizer, 3, ANSWER_TOKENS["batch1"], PLAN_SEEDS["batch1"], acceptance,
                                         table)  # fmt: skip
        add(part)
        workloads["batch1"] = {"runs": [[p] for p in single], "max_tokens": ANSWER_TOKENS["batch1"]}
    bursts = [n for n in names if n.startswith("burst")]
    if bursts:
        count = max(int(n.removeprefix("burst")) for n in bursts)
        many, part = self_copy_prompts(url, tokenizer, count, ANSWER_TOKENS["bursts"], PLAN_SEEDS["bursts"], acceptance,
                                       table)  # fmt: skip
        add(part)
        for name in bursts:
            workloads[name] = {"runs": [many[: int(name.removeprefix("burst"))]], "max_tokens": ANSWER_TOKENS["bursts"]}
    lengths = {name: sorted({len(p) for run in w["runs"] for p in run}) for name, w in workloads.items()}
    stats["answers_as_constructed"] = stats["as_constructed"] / stats["answer_tokens"] if table is not None else None
    stats["replaced_share"] = stats["replaced"] / stats["answer_tokens"] if stats["answer_tokens"] else 0.0
    return {"acceptance": acceptance, "workloads": {n: workloads[n] for n in names}, "prompt_lengths": lengths,
            "stats": stats}  # fmt: skip


def requests(plan: dict) -> dict[str, list[list[peer_load.Request]]]:
    return {name: [[peer_load.Request(p, w["max_tokens"]) for p in run] for run in w["runs"]]
            for name, w in plan["workloads"].items()}  # fmt: skip


def load_plan(path: Path, names: list[str], acceptance: float, model: dict) -> dict | None:
    """The plan saved at `path`, if it was made for the same target, acceptance and workloads."""
    if not path.exists():
        return None
    plan = json.loads(path.read_text())
    same = (plan.get("acceptance") == acceptance and plan.get("model") == model
            and set(names) <= set(plan.get("workloads", {})))  # fmt: skip
    return dict(plan, workloads={n: plan["workloads"][n] for n in names}) if same else None


def counters(url: str, names: tuple[str, str] = COUNTER_NAMES) -> dict[str, float]:
    """The Prometheus counters `names` (summed over their labels: vLLM labels its counters)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
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


def warm_up(url: str) -> None:
    """Two short requests on prompts of their own (no prefix-cache hit for the measured ones), so
    no measurement pays a server's first use."""
    rng = random.Random(99)
    warm = [peer_load.Request(peer_load.random_ids(rng, 64, TEXT_VOCAB), 16) for _ in range(2)]
    peer_load.run(url, warm, 1, len(warm))


def measure(args, url: str, plan: dict[str, list[list[peer_load.Request]]], engine: str = "textgen") -> dict:
    """Each workload's median run (output tok/s), the drafts verified and kept over all its runs
    (the server's counters), and for textgen its runs' step records: summary and draft_split."""
    names = VLLM_COUNTER_NAMES if engine == "vllm" else COUNTER_NAMES
    warm_up(url)
    results = {}
    for name, runs in plan.items():
        before, log_start = counters(url, names), _log_size(args, engine)
        summaries = []
        for requests_ in runs:
            outcomes, wall = peer_load.run(url, requests_, clients_for(len(requests_)), len(requests_))
            summaries.append(peer_load.summary(outcomes, wall))
        after = counters(url, names)
        summaries.sort(key=lambda s: s["output_tok_s"])
        picked = dict(summaries[len(summaries) // 2])  # the median run
        picked["drafted"], picked["kept"] = (after[n] - before[n] for n in names)
        picked["acceptance"] = _acceptance(picked)
        if log_start is not None:
            time.sleep(0.5)  # the last steps' records reach the log
            records = step_log.read(args.out / "textgen.log", log_start)
            picked["split"] = draft_split(records)
            picked["steps"] = step_log.summary(records)
        results[name] = picked
        print(f"  {name}: {picked['output_tok_s']:.1f} tok/s, errors {picked['errors']}, "
              f"drafted {picked['drafted']:.0f}, kept {picked['kept']:.0f}, split {json.dumps(picked.get('split'))}",
              flush=True)  # fmt: skip
    return results


# -- models -----------------------------------------------------------------------------------
def write_models(args, device: str | None = None) -> dict:
    """The predictable target (its embedding's columns past the draft's hidden size zero; half
    its own with `--draft-shape none`) and, when the draft server runs, the draft, agreeing with
    it on a share --acceptance of the token ids (bench/predictable_model.py)."""
    from bench.gpu_model import SHAPES

    draft_hidden = SHAPES[args.draft_shape if args.draft_shape != "none" else args.shape]["hidden_size"]
    if args.draft_shape == "none":
        draft_hidden //= 2
    models = {"model": predictable_model.ensure_target(args.model_dir, args.tokenizer_dir, TEXT_VOCAB, args.shape,
                                                       draft_hidden, device=device)}  # fmt: skip
    if "draft" in args.server_names:
        models["draft"] = predictable_model.ensure_draft(args.draft_dir, args.model_dir, args.tokenizer_dir, TEXT_VOCAB,
                                                         args.draft_shape, args.acceptance, device=device)  # fmt: skip
    return models


def model_identity(args) -> dict:
    """What the plan's answers depend on: the target's construction (its predictable.json)."""
    return json.loads((args.model_dir / predictable_model.MARKER).read_text())


# -- report -----------------------------------------------------------------------------------
def expected_kept_share(acceptance: float, k: int) -> float:
    """Kept / drafted for windows of k drafts each right with probability `acceptance`,
    independently (a rejected draft discards the rest of its window)."""
    return sum(acceptance**i for i in range(1, k + 1)) / k


def report(results: dict, names: list[str]) -> str:
    """Markdown: off against prompt lookup; the draft model, with the split of the drafting
    steps' time; textgen's prompt lookup against vLLM's n-gram speculation; the bars. A server
    that failed or was skipped is named, not tabled."""
    a, k = results.get("acceptance"), results.get("speculate", 4)
    lines = []
    if a is not None:
        lines += [f"Nominal acceptance {a:.2f} a draft (k = {k}): expected kept / drafted "
                  f"{expected_kept_share(a, k):.3f} for independent drafts; measured beside it.", ""]  # fmt: skip
    if stats := (results.get("prompts") or {}).get("stats"):
        if stats.get("answers_as_constructed") is not None:
            lines += [f"Prompts server: {stats['answers_as_constructed']:.4f} of its answers' tokens are the "
                      f"construction's; {stats['replaced_share']:.3f} of C replaced in C'.", ""]  # fmt: skip
    for key in SERVERS:
        entry = results.get(key, {})
        if "error" in entry:
            lines += [f"Server `{key}` failed: {entry['error']}", ""]
        elif "skipped" in entry:
            lines += [f"Server `{key}` skipped: {entry['skipped']}", ""]
        for name in names:
            if (run := entry.get(name)) and run.get("errors"):
                lines += [f"Server `{key}`, {name}: {run['errors']} of {run['requests']} requests failed "
                          f"({'; '.join(run.get('first_errors', []))})", ""]  # fmt: skip
    lines += ["| workload | tok/s off | tok/s on | on / off | drafted | kept | kept / drafted |",
              "|:--|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for name in names:
        off, on = results.get("off", {}).get(name), results.get("on", {}).get(name)
        if off is None or on is None:
            continue
        lines.append(f"| {name} | {off['output_tok_s']:.1f} | {on['output_tok_s']:.1f} | "
                     f"{_ratio(on, off)} | {on['drafted']:.0f} | {on['kept']:.0f} | {_acceptance(on):.3f} |")  # fmt: skip
    if _ran(results, "draft"):
        model = results.get("draft_model") or {}
        lines += ["", f"Draft model (`--speculative-model`, shape {model.get('shape', '?')}, agreeing with the model "
                  f"on {model.get('agreement', float('nan')):.2f} of the token ids); the time of the steps that "
                  "drafted: the draft model's (draft) against the rest (verify + rest: ran_us - draft_us); "
                  "plain decode: the median decode step without drafts.", "",
                  "| workload | tok/s off | tok/s draft | draft / off | drafted | kept | kept / drafted | drafting steps "
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
    if _ran(results, "vllm"):
        lines += ["", "vLLM with n-gram speculation (`--speculative-config`, the same k and n-grams) against textgen "
                  "with prompt lookup (on):", "",
                  "| workload | tok/s vLLM ngram | tok/s textgen on | on / vLLM | vLLM drafted | vLLM kept "
                  "| vLLM kept / drafted |", "|:--|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
        for name in names:
            peer, on = results["vllm"].get(name), results.get("on", {}).get(name)
            if peer is None:
                continue
            lines.append(f"| {name} | {peer['output_tok_s']:.1f} | {_fmt(on, 'output_tok_s')} | "
                         f"{_ratio(on, peer) if on else '-'} | {peer['drafted']:.0f} | {peer['kept']:.0f} | "
                         f"{_acceptance(peer):.3f} |")  # fmt: skip
    if bars := bar_rows(results, names):
        lines += ["", "| bar | measured | needed | met |", "|:--|--:|--:|:--|"]
        lines += [f"| {label} | {value:.3f} | {need:.1f} | {'yes' if value >= need else 'no'} |"
                  for label, value, need in bars]  # fmt: skip
    return "\n".join(lines) + "\n"


def bar_rows(results: dict, names: list[str]) -> list[tuple[str, float, float]]:
    """(label, measured ratio, bar) for the bars that this run's results can answer."""
    rows = []
    for name in names:
        on = results.get("on", {}).get(name)
        for base_key, bars, label in (("off", BARS_ON_OFF, "on / off"), ("vllm", BARS_ON_VLLM, "on / vLLM ngram")):
            base = results.get(base_key, {}).get(name)
            if name in bars and on and base and base.get("output_tok_s"):
                rows.append((f"{name} {label}", on["output_tok_s"] / base["output_tok_s"], bars[name]))
    return rows


def _ran(results: dict, key: str) -> bool:
    entry = results.get(key)
    return isinstance(entry, dict) and "error" not in entry and "skipped" not in entry


def _acceptance(run: dict) -> float:
    return run["kept"] / run["drafted"] if run["drafted"] else 0.0


def _ratio(run: dict, base: dict | None) -> str:
    return f"{run['output_tok_s'] / base['output_tok_s']:.3f}" if base and base.get("output_tok_s") else "-"


def _fmt(run: dict | None, key: str) -> str:
    return f"{run[key]:.1f}" if run and key in run else "-"


def vllm_flags(args) -> list[str]:
    """vLLM's n-gram speculation, textgen's prompt lookup's k and n-gram sizes (4 down to 2)."""
    config = {"method": "ngram", "num_speculative_tokens": args.speculate, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2}  # fmt: skip
    return ["--speculative-config", json.dumps(config)]


def servers(args) -> list[tuple[str, list[str]]]:
    """(name, flags) of the measured servers in start order: textgen's launcher flags, vLLM's."""
    spec = ["--speculate", str(args.speculate)]
    flags = {"off": [], "on": spec, "draft": [*spec, "--speculative-model", str(args.draft_dir)],
             "vllm": vllm_flags(args)}  # fmt: skip
    return [(name, flags[name]) for name in args.server_names]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.gpu_model import SHAPES

    targets = [n for n, s in SHAPES.items() if s["model_type"] == "llama" and not s["tie_word_embeddings"]]
    drafts = [n for n, s in SHAPES.items() if s["model_type"] == "llama"]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-bench"))
    parser.add_argument("--shape", default="8b", choices=targets, help="the predictable target's shape")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama8b-predictable"))
    parser.add_argument("--client-cpus", type=int, default=6)
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--acceptance", type=float, default=0.96,
                        help="share of the planted copy's tokens that are the model's (and of the token ids the "
                        "draft model agrees on)")  # fmt: skip
    parser.add_argument("--draft-shape", default="1b", choices=[*drafts, "none"],
                        help="the draft model's shape (bench/gpu_model.py SHAPES, untied); none: no draft server")
    parser.add_argument("--draft-dir", type=Path, default=Path("/tmp/llama1b-predictable"))
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma-separated subset of "
                        + ", ".join(SERVERS) + " (vllm needs --peer-env)")  # fmt: skip
    parser.add_argument("--peer-env", type=Path, default=None, help="vLLM's environment script (gpu_vs_vllm.py)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of "
                        + ", ".join(WORKLOADS))  # fmt: skip
    parser.add_argument("--write-models", action="store_true", help=argparse.SUPPRESS)  # internal: the child
    args = parser.parse_args(argv)
    if unknown := set(args.workloads.split(",")) - set(WORKLOADS):
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))} (known: {', '.join(WORKLOADS)})")
    if unknown := set(args.servers.split(",")) - set(SERVERS):
        parser.error(f"unknown servers: {', '.join(sorted(unknown))} (known: {', '.join(SERVERS)})")
    if not 0.0 <= args.acceptance <= 1.0:
        parser.error(f"--acceptance {args.acceptance} is not a share")
    args.workload_names = [n for n in WORKLOADS if n in args.workloads.split(",")]  # in WORKLOADS' order
    args.server_names = [n for n in SERVERS if n in args.servers.split(",")
                         and not (n == "draft" and args.draft_shape == "none")]  # fmt: skip
    return args


def load_results(args) -> dict:
    """What an earlier run left in OUT/gpu_speculation.json, to merge this run's servers into."""
    path = args.out / "gpu_speculation.json"
    if not path.exists():
        return {}
    results = json.loads(path.read_text())
    for key, mine in (("acceptance", args.acceptance), ("speculate", args.speculate)):
        if results.get(key, mine) != mine:
            raise SystemExit(f"{path} holds a run with {key} {results[key]}, this one has {mine}: "
                             "another --out, or move that file away")  # fmt: skip
    return results


def save(args, results: dict) -> None:
    (args.out / "gpu_speculation.json").write_text(json.dumps(results, indent=1) + "\n")


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.write_models:  # in a child, so this process never holds GPU memory the servers need
        (args.work / "speculation_models.json").write_text(json.dumps(write_models(args)))
        return
    started = time.perf_counter()
    results = load_results(args)
    subprocess.run([sys.executable, __file__, "--write-models", *sys.argv[1:]], check=True)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.tokenizer_dir / "tokenizer.json"))
    models = json.loads((args.work / "speculation_models.json").read_text())
    results |= {"model": models["model"], "acceptance": args.acceptance, "speculate": args.speculate,
                "models_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    if "draft" in models:
        results["draft_model"] = models["draft"]
    identity = model_identity(args)
    plan_path = args.out / "gpu_speculation_plan.json"
    plan = load_plan(plan_path, args.workload_names, args.acceptance, identity)
    if plan is None:
        # The prompts come from a server of their own: the measured servers start with an empty
        # prefix cache (P + C would be cached on the server that answered P).
        server_started = time.perf_counter()
        args.server_flag = []
        try:
            process, ready_s = start_server(args, TEXTGEN_PORT, timeout_s=SERVER_START_S, base_flags=[])
            try:
                table = predictable_model.successor_table(TEXT_VOCAB, identity["cycle_seed"])
                plan = make_plan(f"http://127.0.0.1:{TEXTGEN_PORT}", tokenizer, args.workload_names, args.acceptance,
                                 table)  # fmt: skip
                plan["model"] = identity
            finally:
                stop(process)
        except BaseException:
            _keep_log(args, "prompts")  # only a failed prompts server's log is kept (OUT's files are few)
            raise
        (args.out / "textgen.log").unlink(missing_ok=True)
        plan_path.write_text(json.dumps(plan) + "\n")
        results["prompts"] = {"stats": plan["stats"], "prompt_lengths": plan["prompt_lengths"], "ready_s": ready_s,
                              "s": round(time.perf_counter() - server_started, 1)}  # fmt: skip
        print(f"[prompts] {json.dumps(results['prompts']['stats'])}", flush=True)
    else:
        print(f"[prompts] reusing {plan_path}", flush=True)
        results.setdefault("prompts", {"stats": plan["stats"], "prompt_lengths": plan["prompt_lengths"]})
    measured = requests(plan)
    for key, flags in servers(args):
        server_started = time.perf_counter()
        if key == "vllm" and args.peer_env is None:
            results[key] = {"skipped": "no --peer-env"}
            print("[vllm] skipped: no --peer-env", flush=True)
            save(args, results)
            continue
        print(f"[{key}] {' '.join(flags) or 'no speculation'}", flush=True)
        try:
            if key == "vllm":
                args.precision_flags = {"vllm": flags}  # start_vllm appends them to vLLM's command
                process, ready_s = start_vllm(args, VLLM_PORT)
                url = f"http://127.0.0.1:{VLLM_PORT}"
            else:
                args.server_flag = flags
                process, ready_s = start_server(args, TEXTGEN_PORT, timeout_s=SERVER_START_S, base_flags=[])
                url = f"http://127.0.0.1:{TEXTGEN_PORT}"
            try:
                results[key] = {"flags": flags, "ready_s": ready_s,
                                **measure(args, url, measured, "vllm" if key == "vllm" else "textgen")}  # fmt: skip
            finally:
                stop(process)
        except Exception as exc:  # a measured server's failure leaves the others' figures
            results[key] = {"flags": flags, "error": f"{type(exc).__name__}: {exc}"}
            print(f"[{key}] failed: {results[key]['error']}", flush=True)
        finally:
            if key != "vllm":
                _keep_log(args, key)
            results.setdefault("server_s", {})[key] = round(time.perf_counter() - server_started, 1)
            results["total_s"] = round(time.perf_counter() - started, 1)
            save(args, results)
    text = report(results, args.workload_names)
    (args.out / "gpu_speculation.md").write_text(text)
    print(text)


def _keep_log(args, key: str) -> None:
    log = args.out / "textgen.log"
    if log.exists():  # the next start_server truncates it
        log.replace(args.out / f"textgen_{key}.log")


if __name__ == "__main__":
    main()
