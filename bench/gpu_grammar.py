"""Constrained decoding on an H200 (issue 22, Benchmarks, GPU): the random 8B, bf16, the full
stack over HTTP, unconstrained against constrained by JSON Schemas, in one run.

    PYTHONPATH=. python3 bench/gpu_grammar.py --tokenizer-dir DIR --router-binary BIN --out OUT

Measures, on one server at the shipped defaults (only `--num-shard 1`). The client keeps at
most the server's `max_concurrent_requests` (from /info) in flight, so the default admission
limit queues the mix in the client rather than refusing it with 429s:
(a) batch-1 decode, 257 new tokens from a 128-token prompt, three unconstrained and three
    constrained runs interleaved (BATCH1_SCHEMA: an object holding 48-64 strings of at most
    16 characters, so the answer is longer than 256 tokens); TPOT median, gaps p50/p99;
(b) the issue-3 mix (179 x 128/128 + 77 x 1024/512, all sent at once) unconstrained, then with
    every request constrained by one of MIX_SCHEMAS corpus schemas (the first that compile, in
    the order of a salted SHA-256 of their names), then unconstrained again with each request's
    max_new_tokens set to what its constrained twin produced (the same work, token for token);
    output tok/s, TPOT p50/p99, the router's step records, the shard's mask time from /metrics;
(c) validity: every corpus schema in tests/data/jsonschemabench that compiles, one request each
    (64-token prompt, 512 new tokens, all at once). Every constrained answer of (a)-(c) that
    ends with eos_token/stop_sequence is checked with json.loads and jsonschema (its draft,
    format checks on). Random logits: inside an unbounded string the closing quote is one of
    ~49k tokens, so many answers end with `length`; the share ending with stop is reported.
Every run draws fresh prompts of the same shapes, so no run gains from the prefix cache.
Writes OUT/gpu_grammar.json and prints a summary table.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import step_log  # noqa: E402
from bench.gpu_http_load import CLIENT_START_S, StreamResult, client_pool, clients_for, percentile, sse_data  # noqa: E402
from bench.gpu_vs_transformers import MIX, TEXT_VOCAB, Prompts, cpu_split, start_server  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "jsonschemabench"
SALT = "gpu-grammar-1"
MIX_SCHEMAS = 8
BATCH1_SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 16},
                             "minItems": 48, "maxItems": 64}},
    "required": ["items"],
    "additionalProperties": False,
}
STOPPED = ("eos_token", "stop_sequence")
MASK_METRIC = "textgen_shard_grammar_mask_duration_seconds"
COMPILE_METRIC = "textgen_grammar_compile_duration_seconds"


# -- streaming client with parameters and final text --------------------------------------------
@dataclass
class Answer(StreamResult):
    """A streamed answer's timings (StreamResult) with its text and how it ended."""

    text: str | None = None
    finish_reason: str | None = None


async def _one(client: httpx.AsyncClient, url: str, prompt: str, params: dict) -> Answer:
    body = {"inputs": prompt, "parameters": {"do_sample": False, **params}}
    answer = Answer(sent=time.perf_counter())
    try:
        async with client.stream("POST", f"{url}/generate_stream", json=body) as response:
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return answer
            async for data in sse_data(response):
                event = json.loads(data)
                if "error" in event:
                    answer.error = str(event["error"])[:300]
                    break
                answer.token_times.append(time.perf_counter())
                if event.get("generated_text") is not None:
                    answer.text = event["generated_text"]
                    answer.finish_reason = (event.get("details") or {}).get("finish_reason")
    except httpx.HTTPError as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    return answer


async def _all(url: str, requests: list[tuple[str, dict]], in_flight: int) -> list[Answer]:
    limits = httpx.Limits(max_connections=in_flight + 8, max_keepalive_connections=in_flight + 8)
    gate = asyncio.Semaphore(in_flight)

    async def one(client, prompt, params):
        async with gate:
            return await _one(client, url, prompt, params)

    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        return list(await asyncio.gather(*(one(client, p, q) for p, q in requests)))


def _part(job) -> tuple[list[Answer], float]:
    url, requests, start_at, in_flight = job
    time.sleep(max(0.0, start_at - time.perf_counter()))
    answers = asyncio.run(_all(url, requests, in_flight))
    return answers, time.perf_counter()


IN_FLIGHT = {"max": 128}  # the server's max_concurrent_requests, read from /info at start


def send(url: str, requests: list[tuple[str, dict]], processes: int = 1) -> tuple[list[Answer], float]:
    """Every request at once, up to the server's admission limit in flight, dealt round-robin
    to `processes` clients (gpu_http_load.streams, with parameters and the final text);
    answers in request order and the wall time."""
    if processes <= 1:
        start = time.perf_counter()
        answers = asyncio.run(_all(url, requests, IN_FLIGHT["max"]))
        return answers, time.perf_counter() - start
    parts = [requests[i::processes] for i in range(processes)]
    with client_pool(processes) as pool:
        start_at = time.perf_counter() + CLIENT_START_S
        share = max(1, IN_FLIGHT["max"] // processes)
        done = list(pool.map(_part, [(url, part, start_at, share) for part in parts]))
    answers: list[Answer] = [None] * len(requests)  # type: ignore[list-item]
    for i, (part, _) in enumerate(done):
        answers[i::processes] = part
    return answers, max(end for _, end in done) - start_at


# -- schemas, validation, metrics -----------------------------------------------------------------
def corpus() -> list[tuple[str, dict]]:
    files = sorted(CORPUS.glob("*.json"), key=lambda f: hashlib.sha256(f"{SALT}|{f.name}".encode()).hexdigest())
    out = []
    for f in files:
        try:
            out.append((f.name, json.loads(f.read_text())["schema"]))
        except (ValueError, KeyError):
            pass
    return out


def grammar(schema: dict) -> dict:
    return {"grammar": {"type": "json", "value": schema}}


def check(text: str, schema: dict) -> tuple[str, str | None]:
    """'valid', 'invalid' (first error) or 'unjudged' (the validator cannot take the schema)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return "invalid", f"not JSON: {exc}"
    try:
        from bench.json_validity import validator
    except ImportError:  # no jsonschema where it runs
        return "json_only", None
    try:
        error = next(iter(validator(schema).iter_errors(value)), None)
    except Exception as exc:  # SchemaError, unresolvable $ref, a pattern Python's re rejects
        return "unjudged", f"{type(exc).__name__}: {exc}"[:300]
    return ("valid", None) if error is None else ("invalid", error.message[:300])


def judge(answers: list[Answer], schemas: list[dict], names: list[str]) -> dict:
    counts: dict[str, int] = {}
    bad = []
    finish: dict[str, int] = {}
    for a, schema, name in zip(answers, schemas, names):
        reason = a.finish_reason or ("error" if a.error else "none")
        finish[reason] = finish.get(reason, 0) + 1
        if reason not in STOPPED:
            continue
        verdict, detail = check(a.text or "", schema)
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict == "invalid" and len(bad) < 10:
            bad.append({"schema": name, "error": detail, "text": (a.text or "")[:800]})
    stopped = sum(finish.get(r, 0) for r in STOPPED)
    judged = counts.get("valid", 0) + counts.get("invalid", 0)
    return {"answers": len(answers), "finish_reasons": finish, "stopped": stopped,
            "stop_share": stopped / len(answers) if answers else None, "verdicts": counts,
            "valid_share_of_judged": counts.get("valid", 0) / judged if judged else None,
            "invalid_examples": bad, "errors": [a.error for a in answers if a.error][:5]}  # fmt: skip


def histogram(url: str, name: str) -> dict:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        m = re.match(rf"{name}_(sum|count)(\{{[^}}]*\}})?\s+(\S+)", line)
        if m:
            out[m.group(1)] += float(m.group(3))
    return out


def delta(before: dict, after: dict) -> dict:
    s, c = after["sum"] - before["sum"], after["count"] - before["count"]
    return {"sum_s": s, "count": c, "mean_ms": 1e3 * s / c if c else None}


def stats(answers: list[Answer], wall: float) -> dict:
    tokens = sum(len(a.token_times) for a in answers)
    tpots = [a.tpot for a in answers if a.tpot]
    gaps = [g for a in answers for g in a.gaps]
    ttfts = [a.token_times[0] - a.sent for a in answers if a.token_times]
    return {"requests": len(answers), "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "tpot_p50_ms": 1e3 * percentile(tpots, 0.5) if tpots else None,
            "tpot_p99_ms": 1e3 * percentile(tpots, 0.99) if tpots else None,
            "itl_p50_ms": 1e3 * percentile(gaps, 0.5) if gaps else None,
            "itl_p99_ms": 1e3 * percentile(gaps, 0.99) if gaps else None,
            "ttft_p50_s": percentile(ttfts, 0.5) if ttfts else None,
            "error_count": sum(1 for a in answers if a.error),
            "errors": [a.error for a in answers if a.error][:5]}  # fmt: skip


def step_summary(args, log_start: int) -> dict:
    time.sleep(0.5)  # the last steps' records reach the log
    records = step_log.read(args.out / "textgen.log", log_start)
    summary = step_log.summary(records)
    if records:
        decode = [r for r in records if r.tokens == r.decodes]
        summary["decode_steps"] = len(decode)
        summary["decode_ran_ms_mean"] = sum(r.ran_us for r in decode) / 1e3 / len(decode) if decode else None
        summary["decode_device_ms_mean"] = sum(r.device_us for r in decode) / 1e3 / len(decode) if decode else None
        summary["all_ran_s"] = sum(r.ran_us for r in records) / 1e6
        summary["all_device_s"] = sum(r.device_us for r in records) / 1e6
    return summary


# -- phases ---------------------------------------------------------------------------------------
def phase_model(args) -> dict:
    from bench.gpu_model import write_random_llama

    if (args.model_dir / "config.json").exists():
        return {"reused": True}
    started = time.perf_counter()
    params = write_random_llama(args.model_dir, args.tokenizer_dir, TEXT_VOCAB)
    return {"parameters": params, "write_s": time.perf_counter() - started}


def measured_mix(args, url: str, requests: list[tuple[str, dict]]) -> tuple[list[Answer], dict]:
    log_start = (args.out / "textgen.log").stat().st_size
    mask0, compile0 = histogram(url, MASK_METRIC), histogram(url, COMPILE_METRIC)
    answers, wall = send(url, requests, processes=clients_for(len(requests)))
    result = stats(answers, wall)
    result["steps"] = step_summary(args, log_start)
    result["mask"] = delta(mask0, histogram(url, MASK_METRIC))
    result["compile"] = delta(compile0, histogram(url, COMPILE_METRIC))
    return answers, result


PARTIAL: dict = {}  # what phase_textgen measured so far, kept if a later part fails


def phase_textgen(args) -> dict:
    mix = MIX[:: args.mix_every]
    prompts = Prompts(args.tokenizer_dir)
    port = 18080
    process, startup_s = start_server(args, port, base_flags=[])
    url = f"http://127.0.0.1:{port}"
    result: dict = PARTIAL
    result["startup_s"] = startup_s
    info = httpx.get(f"{url}/info", timeout=10).json()
    # A few under the limit: a stream's last event reaches the client before the router has
    # released its permit, so a client at exactly the limit would see the odd 429.
    IN_FLIGHT["max"] = max(1, int(info["max_concurrent_requests"]) - 8)
    result["server_info"] = {k: info.get(k) for k in ("max_concurrent_requests", "max_batch_prefill_tokens",
                                                      "max_input_tokens", "max_total_tokens")}  # fmt: skip
    _, client_cpus = cpu_split(args.client_cpus)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
        result["client_cpus"] = sorted(client_cpus)
    checks: dict = {}
    try:
        # Which corpus schemas compile (a 400 is a refusal up front), one token each.
        schemas = corpus()
        probe, _ = send(url, [(prompts.text(16), {"max_new_tokens": 1, **grammar(s)}) for _, s in schemas],
                        processes=4)  # fmt: skip
        ok = [(n, s) for (n, s), a in zip(schemas, probe) if not a.error]
        refused = [(n, a.error) for (n, _), a in zip(schemas, probe) if a.error]
        result["corpus"] = {"schemas": len(schemas), "compiled": len(ok), "refused": len(refused),
                            "refused_examples": refused[:8]}  # fmt: skip
        mix_schemas = ok[:MIX_SCHEMAS]
        result["mix_schemas"] = [n for n, _ in mix_schemas]
        print(f"[corpus] {len(ok)}/{len(schemas)} compile; mix schemas {result['mix_schemas']}", flush=True)

        # Warm-up: every shape, free and constrained.
        send(url, [(prompts.text(16), {"max_new_tokens": 8})] * 4)
        send(url, [(prompts.text(n), {"max_new_tokens": 8}) for n, _ in mix[::16]])
        send(url, [(prompts.text(n), {"max_new_tokens": 8, **grammar(mix_schemas[i % len(mix_schemas)][1])})
                   for i, (n, _) in enumerate(mix[::16])])  # fmt: skip
        send(url, [(prompts.text(128), {"max_new_tokens": 16, **grammar(BATCH1_SCHEMA)})])

        # (a) batch 1, interleaved.
        batch1 = {"free": [], "constrained": []}
        b1_answers = []
        for _ in range(3):
            for kind in ("free", "constrained"):
                params = {"max_new_tokens": 257, **(grammar(BATCH1_SCHEMA) if kind == "constrained" else {})}
                mask0 = histogram(url, MASK_METRIC)
                (a,), _ = send(url, [(prompts.text(128), params)])
                row = {"tokens": len(a.token_times), "tpot_ms": 1e3 * a.tpot if a.tpot else None,
                       "itl_p50_ms": 1e3 * percentile(a.gaps, 0.5) if a.gaps else None,
                       "itl_p99_ms": 1e3 * percentile(a.gaps, 0.99) if a.gaps else None,
                       "finish_reason": a.finish_reason, "error": a.error}  # fmt: skip
                if kind == "constrained":
                    row["mask"] = delta(mask0, histogram(url, MASK_METRIC))
                    b1_answers.append(a)
                batch1[kind].append(row)
        for kind in ("free", "constrained"):
            tp = sorted(r["tpot_ms"] for r in batch1[kind] if r["tpot_ms"])
            batch1[f"{kind}_tpot_ms_median"] = tp[len(tp) // 2] if tp else None
        if batch1["free_tpot_ms_median"] and batch1["constrained_tpot_ms_median"]:
            batch1["tpot_ratio"] = batch1["constrained_tpot_ms_median"] / batch1["free_tpot_ms_median"]
        result["a_batch1"] = batch1
        checks["batch1"] = judge(b1_answers, [BATCH1_SCHEMA] * len(b1_answers), ["batch1"] * len(b1_answers))
        print(f"[a] {json.dumps({k: v for k, v in batch1.items() if not isinstance(v, list)})}", flush=True)

        # (b) the mix: free, constrained, free at the constrained lengths.
        free_req = [(prompts.text(n_in), {"max_new_tokens": n_out}) for n_in, n_out in mix]
        _, result["b_free"] = measured_mix(args, url, free_req)
        print(f"[b free] {json.dumps({k: v for k, v in result['b_free'].items() if k != 'steps'})}", flush=True)
        names = [mix_schemas[i % len(mix_schemas)][0] for i in range(len(mix))]
        picked = [mix_schemas[i % len(mix_schemas)][1] for i in range(len(mix))]
        con_req = [(prompts.text(n_in), {"max_new_tokens": n_out, **grammar(s)}) for (n_in, n_out), s in zip(mix, picked)]
        con_answers, result["b_constrained"] = measured_mix(args, url, con_req)
        print(f"[b constrained] {json.dumps({k: v for k, v in result['b_constrained'].items() if k != 'steps'})}", flush=True)
        checks["mix"] = judge(con_answers, picked, names)
        lengths = [max(1, len(a.token_times)) for a in con_answers]
        matched_req = [(prompts.text(n_in), {"max_new_tokens": n}) for (n_in, _), n in zip(mix, lengths)]
        _, result["b_free_matched"] = measured_mix(args, url, matched_req)
        print(f"[b matched] {json.dumps({k: v for k, v in result['b_free_matched'].items() if k != 'steps'})}", flush=True)
        c, f, m = result["b_constrained"], result["b_free"], result["b_free_matched"]
        result["b_ratios"] = {"tok_s_vs_free": c["tokens_per_s"] / f["tokens_per_s"],
                              "tok_s_vs_matched": c["tokens_per_s"] / m["tokens_per_s"],
                              "tpot_p50_vs_free": c["tpot_p50_ms"] / f["tpot_p50_ms"],
                              "tpot_p99_vs_free": c["tpot_p99_ms"] / f["tpot_p99_ms"]}  # fmt: skip

        # (c) validity over every compiling corpus schema.
        val_req = [(prompts.text(64), {"max_new_tokens": 512, **grammar(s)}) for _, s in ok]
        started = time.perf_counter()
        val_answers, wall = send(url, val_req, processes=clients_for(len(val_req)))
        result["c_validity_run"] = {"wall_s": time.perf_counter() - started,
                                    "output_tokens": sum(len(a.token_times) for a in val_answers)}  # fmt: skip
        checks["corpus"] = judge(val_answers, [s for _, s in ok], [n for n, _ in ok])
        result["metrics_grammar"] = [line for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
                                     if "grammar" in line and not line.startswith("#")][:80]  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=60)
    result["checks"] = checks
    all_stopped = sum(v["stopped"] for v in checks.values())
    all_valid = sum(v["verdicts"].get("valid", 0) for v in checks.values())
    all_invalid = sum(v["verdicts"].get("invalid", 0) for v in checks.values())
    result["validity"] = {"stopped": all_stopped, "valid": all_valid, "invalid": all_invalid,
                          "valid_share": all_valid / (all_valid + all_invalid) if all_valid + all_invalid else None}  # fmt: skip
    return result


def report(data: dict) -> str:
    t = data.get("textgen", {})
    rows = []
    a, r = t.get("a_batch1", {}), t.get("b_ratios", {})
    rows.append(("batch-1 TPOT free / constrained (ms)", f"{a.get('free_tpot_ms_median')} / {a.get('constrained_tpot_ms_median')}"))
    rows.append(("batch-1 TPOT ratio (bar <= 1.10)", a.get("tpot_ratio")))
    for k in ("b_free", "b_constrained", "b_free_matched"):
        b = t.get(k, {})
        rows.append((f"{k} tok/s, tokens, TPOT p50/p99 ms", f"{b.get('tokens_per_s')}, {b.get('output_tokens')}, "
                     f"{b.get('tpot_p50_ms')}/{b.get('tpot_p99_ms')}"))
    rows.append(("mix ratio vs free / vs matched (bar >= 0.90)", f"{r.get('tok_s_vs_free')} / {r.get('tok_s_vs_matched')}"))
    rows.append(("mask (constrained mix)", t.get("b_constrained", {}).get("mask")))
    rows.append(("validity", t.get("validity")))
    for k, v in t.get("checks", {}).items():
        rows.append((f"check {k}", {x: v[x] for x in ("answers", "finish_reasons", "stop_share", "verdicts")}))
    return "\n".join(f"{k}: {v}" for k, v in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, default=Path("router/target/release/textgen-router"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-bench"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama8b-random"))
    parser.add_argument("--client-cpus", type=int, default=6, help="cores kept for the HTTP clients (0: shared)")
    parser.add_argument("--server-flag", action="append", default=[], help="extra launcher flag (repeatable)")
    parser.add_argument("--mix-every", type=int, default=1, help="every n-th request of the mix (smoke tests)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.phase:
        started = time.perf_counter()
        try:
            data = globals()[f"phase_{args.phase}"](args)
            data["ok"] = True
        except Exception as exc:
            import traceback

            data = {**PARTIAL, "ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        data["phase_s"] = time.perf_counter() - started
        (args.work / f"{args.phase}.json").write_text(json.dumps(data, indent=1))
        return
    merged = {}
    for phase in ("model", "textgen"):
        subprocess.run([sys.executable, __file__, "--phase", phase, *sys.argv[1:]], check=False)
        path = args.work / f"{phase}.json"
        merged[phase] = json.loads(path.read_text()) if path.exists() else {"ok": False, "error": "no output"}
        print(f"[{phase}] ok={merged[phase].get('ok')} {merged[phase].get('error', '')}", flush=True)
    (args.out / "gpu_grammar.json").write_text(json.dumps(merged, indent=1))
    print(report(merged), flush=True)


if __name__ == "__main__":
    main()
