"""JSON Schema conformance and speed of a grammar engine, by the MaskBench method.

For every schema of the JSONSchemaBench/MaskBench corpus: compile it (or see it refused up
front), then feed each test instance token by token, checking at every step that the token
is allowed by the computed mask. A valid instance must be accepted to the end (EOS allowed);
an invalid one must be rejected before its end. Each schema runs in a worker process under a
time limit, so a crash or a hang is counted instead of ending the run.

    .venv/bin/python bench/grammar_conformance.py --tokenizer PATH/tokenizer.json \
        --corpus ../shared/data/jsonschemabench.tar.xz --engine llguidance

JSON Schemas are compiled with the options of router/src/grammar/json_options.json (the
router's single source), so what passes here is what the server enforces.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import re
import statistics
import sys
import tarfile
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
OPTIONS_PATH = REPO / "router" / "src" / "grammar" / "json_options.json"
SHARED_CORPUS = REPO.parent / "shared" / "data" / "jsonschemabench.tar.xz"
STATUSES = ("passing", "compile_error", "validation_error", "validation_error_order",
            "invalidation_error", "crash", "timeout", "no_tests")


def collection_of(name: str) -> str:
    """Sub-collection of a corpus file: the prefix before '---' (BFCL_* and JME_* have none)."""
    if "---" in name:
        return name.split("---", 1)[0]
    return re.sub(r"_\d+\.json$", "", name)


def serialise(value: Any, options: dict) -> str:
    # The same separators the grammar enforces; ensure_ascii=False as MaskBench does.
    return json.dumps(value, ensure_ascii=False,
                      separators=(options["item_separator"], options["key_separator"]))


# ---------------------------------------------------------------- property order

def _resolve(schema: Any, root: Any) -> Any:
    """Follow local $refs ('#/...'), enough to find property order."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) \
            and schema["$ref"].startswith("#") and seen < 32:
        node = root
        for part in schema["$ref"][1:].split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return schema
        schema, seen = node, seen + 1
    return schema


def _properties(schema: Any, root: Any, depth: int = 0) -> dict:
    """Declared properties in declaration order, including those of allOf/anyOf/oneOf."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict) or depth > 8:
        return {}
    props = dict(schema.get("properties") or {}) if isinstance(
        schema.get("properties"), dict) else {}
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            for name, sub_schema in _properties(sub, root, depth + 1).items():
                props.setdefault(name, sub_schema)
    return props


def schema_order(value: Any, schema: Any, root: Any) -> Any:
    """The instance with object keys in the schema's `properties` order (others after)."""
    schema = _resolve(schema, root)
    if isinstance(value, dict):
        props = _properties(schema, root)
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: schema_order(value[k], props.get(k, {}), root) for k in keys}
    if isinstance(value, list) and isinstance(schema, dict):
        items = schema.get("prefixItems") or schema.get("items")
        if isinstance(items, list):
            return [schema_order(v, items[i] if i < len(items) else {}, root)
                    for i, v in enumerate(value)]
        return [schema_order(v, items or {}, root) for v in value]
    return value


# ---------------------------------------------------------------- engines

class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, tokenizer_path: str, options: dict, eos: int):
        import llguidance
        import numpy as np
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self.ll = llguidance
        self.version = llguidance.__version__
        self.options = options
        self.tokenizer = llguidance.LLTokenizer(tokenizer_path, eos_token=eos)
        self.eos = eos
        self.bitmask = allocate_token_bitmask(1, self.tokenizer.vocab_size)
        self.fill = fill_next_token_bitmask
        self.np = np

    def compile(self, schema: Any) -> tuple[Any, str | None]:
        try:
            grammar = self.ll.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), overrides=self.options)
        except (ValueError, TypeError) as exc:
            return None, str(exc)
        matcher = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            return None, matcher.get_error()
        return matcher, None

    def start(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def allowed(self, matcher: Any, token: int) -> tuple[bool, tuple[int, int]]:
        """Whether the computed mask allows `token`, and the mask's wall and CPU time in ns.

        CPU time (this thread) leaves out preemption, which a shared 2-core machine has.
        """
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        self.fill(matcher, self.bitmask, 0)
        dt = (time.perf_counter_ns() - t0, time.thread_time_ns() - c0)
        word = int(self.bitmask[0, token >> 5]) & 0xFFFFFFFF
        return bool((word >> (token & 31)) & 1), dt

    def consume(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)

    def accepting(self, matcher: Any) -> bool:
        return matcher.is_accepting()


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, tokenizer_path: str, options: dict, eos: int, strict: bool):
        import torch
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        torch.set_num_threads(1)
        self.xgr = xgr
        self.version = importlib.metadata.version("xgrammar")
        self.options = options
        self.strict = strict
        hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path)
        self.eos = eos
        info = xgr.TokenizerInfo.from_huggingface(hf, stop_token_ids=[self.eos])
        # Single thread, like llguidance, and no cache across schemas.
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema: Any) -> tuple[Any, str | None]:
        try:
            compiled = self.compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=self.options["whitespace_flexible"],
                separators=(self.options["item_separator"], self.options["key_separator"]),
                strict_mode=self.strict)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError for refusals
            return None, f"{type(exc).__name__}: {exc}"
        return compiled, None

    def start(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def allowed(self, matcher: Any, token: int) -> tuple[bool, tuple[int, int]]:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        matcher.fill_next_token_bitmask(self.bitmask, 0)
        dt = (time.perf_counter_ns() - t0, time.thread_time_ns() - c0)
        word = int(self.bitmask[0, token >> 5]) & 0xFFFFFFFF
        return bool((word >> (token & 31)) & 1), dt

    def consume(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)

    def accepting(self, matcher: Any) -> bool:
        return matcher.is_terminated()


# ---------------------------------------------------------------- one schema

def run_instance(engine, compiled, tokens: list[int], mask_ns: list) -> str | None:
    """None if the engine accepts the whole token sequence and then EOS; else why not."""
    matcher = engine.start(compiled)
    for i, token in enumerate(tokens):
        ok, dt = engine.allowed(matcher, token)
        mask_ns.append(dt)
        if not ok:
            return f"token {i} not in mask"
        if not engine.consume(matcher, token):
            return f"token {i} in mask but not consumed"
    ok, dt = engine.allowed(matcher, engine.eos)
    mask_ns.append(dt)
    if not ok:
        return "EOS not in mask at the end"
    if not engine.consume(matcher, engine.eos) or not engine.accepting(matcher):
        return "not accepting at the end"
    return None


def run_schema(engine, hf_tok, path: str) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    name = Path(path).name
    result: dict[str, Any] = {"file": name, "collection": collection_of(name)}
    t0, c0 = time.perf_counter(), time.thread_time()
    compiled, error = engine.compile(data["schema"])
    result["compile_s"] = time.perf_counter() - t0
    result["compile_cpu_s"] = time.thread_time() - c0
    if error is not None:
        result.update(status="compile_error", error=error[:300])
        return result
    tests = data.get("tests") or []
    if not tests:
        result["status"] = "no_tests"
        return result
    mask_ns: list[int] = []
    failures = []
    for idx, test in enumerate(tests):
        text = serialise(test["data"], engine.options)
        why = run_instance(engine, compiled, hf_tok.encode(text, add_special_tokens=False).ids,
                           mask_ns)
        if test["valid"] and why is not None:
            # Engines keep the schema's property order: retry in that order, and count a
            # pass after reordering apart from a real validation error.
            ordered = serialise(schema_order(test["data"], data["schema"], data["schema"]),
                                engine.options)
            again = run_instance(engine, compiled,
                                 hf_tok.encode(ordered, add_special_tokens=False).ids, [])
            kind = "validation_error" if again is not None or ordered == text \
                else "validation_error_order"
            failures.append({"test": idx, "kind": kind, "why": why})
        elif not test["valid"] and why is None:
            failures.append({"test": idx, "kind": "invalidation_error"})
    kinds = {f["kind"] for f in failures}
    for status in ("invalidation_error", "validation_error", "validation_error_order"):
        if status in kinds:
            result["status"] = status
            break
    else:
        result["status"] = "passing"
    if failures:
        result["failures"] = failures[:5]
    result["tokens"] = len(mask_ns)
    result["mask_ns"] = mask_ns
    return result


def worker(conn, args) -> None:
    # Imports happen here, in the worker, so the parent stays light and crash-free.
    from tokenizers import Tokenizer

    options = json.loads(Path(args.options).read_text())
    if args.engine == "llguidance":
        engine = LLGuidanceEngine(args.tokenizer, options, args.eos_token)
    else:
        engine = XGrammarEngine(args.tokenizer, options, args.eos_token, args.xgr_strict)
    hf_tok = Tokenizer.from_file(args.tokenizer)
    conn.send({"ready": engine.version})
    while True:
        try:
            path = conn.recv()
        except EOFError:  # the parent is gone
            return
        if path is None:
            return
        if isinstance(path, tuple):  # ("compile", path): the quiet pass times the compile only
            conn.send(time_compile(engine, path[1]))
            continue
        try:
            conn.send(run_schema(engine, hf_tok, path))
        except Exception as exc:  # an engine that raises mid-schema counts as a crash
            conn.send({"status": "crash", "error": f"{type(exc).__name__}: {exc}"[:300]})


def time_compile(engine, path: str) -> float:
    """CPU seconds of one compile, on this thread."""
    schema = json.loads(Path(path).read_text(encoding="utf-8"))["schema"]
    c0 = time.thread_time()
    engine.compile(schema)
    return time.thread_time() - c0


# ---------------------------------------------------------------- pool with guards

class Slot:
    def __init__(self, ctx, args):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker, args=(child, args), daemon=True)
        self.proc.start()
        child.close()
        self.version = self.parent.recv()["ready"]
        self.path: str | None = None
        self.deadline = 0.0

    def submit(self, path: str, timeout: float) -> None:
        self.path, self.deadline = path, time.monotonic() + timeout
        self.parent.send(path)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()


def per_schema_line(result: dict) -> str:
    row = {k: round(v, 6) if k.startswith("compile") else v
           for k, v in result.items() if k != "mask_ns"}
    return json.dumps(row, ensure_ascii=False) + "\n"


def quiet_compile_pass(files: list[str], args) -> list[float]:
    """Compile CPU ms of each file again, one worker and nothing else running. The pool's
    own figures are taken with every core busy, where a 2-vCPU machine's threads share one
    physical core and each runs at about half speed; a server compiles on an otherwise
    idle core far more often. Only schemas that compiled in the pool come here."""
    slot = Slot(mp.get_context("spawn"), args)
    try:
        times = []
        for path in files:
            slot.parent.send(("compile", path))
            times.append(slot.parent.recv() * 1000)
        slot.parent.send(None)
        return times
    finally:
        if slot.proc.is_alive():
            slot.kill()


def run_pool(files: list[str], args, sink) -> tuple[list[dict], str]:
    ctx = mp.get_context("spawn")
    slots = [Slot(ctx, args) for _ in range(args.jobs)]
    try:
        return _drive(slots, files, args, sink, ctx)
    finally:
        for slot in slots:
            if slot.proc.is_alive():
                slot.kill()


def _drive(slots: list, files: list[str], args, sink, ctx) -> tuple[list[dict], str]:
    version = slots[0].version
    pending, results = list(reversed(files)), []
    for slot in slots:
        if pending:
            slot.submit(pending.pop(), args.timeout)
    started = time.monotonic()
    while any(s.path for s in slots):
        busy = [s for s in slots if s.path]
        next_deadline = min(s.deadline for s in busy) - time.monotonic()
        ready = wait([s.parent for s in busy] + [s.proc.sentinel for s in busy],
                     timeout=min(1.0, max(0.0, next_deadline)))
        for i, slot in enumerate(slots):
            if not slot.path:
                continue
            outcome = None
            if slot.parent in ready:
                try:
                    outcome = slot.parent.recv()
                except EOFError:
                    outcome = None
            if outcome is not None and time.monotonic() > slot.deadline:
                outcome = {"status": "timeout", "limit_s": args.timeout}  # done, but too late
            elif outcome is None and (slot.proc.sentinel in ready or not slot.proc.is_alive()):
                outcome = {"status": "crash", "exitcode": slot.proc.exitcode}
            elif outcome is None and time.monotonic() > slot.deadline:
                outcome = {"status": "timeout", "limit_s": args.timeout}
            if outcome is None:
                continue
            name = Path(slot.path).name
            outcome.setdefault("file", name)
            outcome.setdefault("collection", collection_of(name))
            results.append(outcome)
            if sink:  # written as they come, so an interrupted run still leaves its rows
                sink.write(per_schema_line(outcome))
                sink.flush()
            if outcome["status"] in ("crash", "timeout"):
                slot.kill()
                slots[i] = slot = Slot(ctx, args)
            slot.path = None
            if pending:
                slot.submit(pending.pop(), args.timeout)
            if len(results) % 250 == 0:
                print(f"{len(results)}/{len(files)} in {time.monotonic() - started:.0f}s",
                      file=sys.stderr, flush=True)
    for slot in slots:
        slot.parent.send(None)
        slot.proc.join(timeout=5)
    return results, version


# ---------------------------------------------------------------- corpus and report

def corpus_files(corpus: Path, tmp: str) -> list[str]:
    if corpus.is_file():  # a tarball, as in ../shared/data
        with tarfile.open(corpus) as tar:
            tar.extractall(tmp, filter="data")
        corpus = Path(tmp)
    return sorted(str(p) for p in corpus.rglob("*.json"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stats(values: list[float]) -> dict:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values, default=float("nan")),
            "mean": statistics.fmean(values) if values else float("nan")}


def summarise(results: list[dict], engine: str, version: str, args) -> dict:
    counts = {s: sum(r["status"] == s for r in results) for s in STATUSES}
    mask_us = [w / 1000 for r in results for w, _ in r.get("mask_ns", [])]
    mask_cpu_us = [c / 1000 for r in results for _, c in r.get("mask_ns", [])]
    ok = [r for r in results if r["status"] not in ("compile_error", "crash", "timeout")]
    compiled = [r["compile_s"] * 1000 for r in ok]
    compiled_cpu = [r["compile_cpu_s"] * 1000 for r in ok]
    by_collection: dict[str, dict[str, int]] = {}
    for r in results:
        row = by_collection.setdefault(r["collection"], {s: 0 for s in STATUSES})
        row[r["status"]] += 1
    return {
        "engine": engine, "version": version,
        "machine": f"{platform.node()}: {cpu_name()}, "
                   f"{os.cpu_count()} cores, {args.jobs} worker(s), one thread each",
        "json_options": json.loads(Path(args.options).read_text()),
        "xgrammar_strict_mode": args.xgr_strict if engine == "xgrammar" else None,
        "timeout_s": args.timeout, "schemas": len(results), "counts": counts,
        # As MaskBench counts: a schema that compiles and has no tests passes.
        "pass_rate": (counts["passing"] + counts["no_tests"]) / max(1, len(results)),
        "pass_rate_with_tests": counts["passing"] / max(1, len(results) - counts["no_tests"]),
        "tokens": len(mask_us),
        "mask_us": stats(mask_us), "mask_cpu_us": stats(mask_cpu_us),
        "compile_ms": stats(compiled), "compile_cpu_ms": stats(compiled_cpu),
        "load_average": os.getloadavg(),
        "by_collection": by_collection,
    }


def triple(key: str, summary: dict) -> str:
    v = summary[key]
    return f"{v['p50']:.1f} / {v['p99']:.1f} / {v['max']:.0f} |"


def markdown(summary: dict) -> str:
    c = summary["counts"]
    lines = [f"# Grammar conformance: {summary['engine']} {summary['version']}", "",
             f"Machine: {summary['machine']}. Per-schema time limit {summary['timeout_s']} s.",
             f"Schemas: {summary['schemas']} of the corpus's {summary['corpus_schemas']}"
             + (f" (every {summary['every']}th in file-name order)." if summary["every"] > 1
                else "."),
             f"JSON compile options: `{json.dumps(summary['json_options'])}`.", "",
             "| metric | value |", "|:--|--:|",
             f"| schemas | {summary['schemas']} |",
             f"| passing (MaskBench count: compiled, no test failed) | "
             f"{c['passing'] + c['no_tests']} ({100 * summary['pass_rate']:.1f} %) |",
             f"| of which with tests / without tests | {c['passing']} / {c['no_tests']} |",
             f"| pass rate among schemas with tests | "
             f"{100 * summary['pass_rate_with_tests']:.1f} % |"]
    lines += [f"| {s.replace('_', ' ')} | {c[s]} |" for s in STATUSES[1:-1]]
    lines += [f"| tokens masked | {summary['tokens']} |",
              "| mask µs/token p50 / p99 / max, wall | " + triple("mask_us", summary),
              "| mask µs/token p50 / p99 / max, CPU | " + triple("mask_cpu_us", summary),
              "| compile ms p50 / p99 / max, wall | " + triple("compile_ms", summary),
              "| compile ms p50 / p99 / max, CPU | " + triple("compile_cpu_ms", summary),
              "| compile ms p50 / p99 / max, CPU, one worker alone | "
              + triple("compile_cpu_ms_alone", summary),
              f"| load average at the end (1/5/15 min) | "
              f"{' / '.join(f'{x:.1f}' for x in summary['load_average'])} |", "",
              "| collection | " + " | ".join(s.replace("_", " ") for s in STATUSES) + " |",
              "|:--|" + "--:|" * len(STATUSES)]
    for name, row in sorted(summary["by_collection"].items()):
        lines.append(f"| {name} | " + " | ".join(str(row[s]) for s in STATUSES) + " |")
    return "\n".join(lines) + "\n"


def update_quiet_compile(args) -> None:
    """The quiet compile pass alone, over the schemas an earlier full run (its --per-schema rows)
    compiled; its row of the --out summary (and the .md) is replaced. The pool's figures stay
    those of that run: a full run keeps both cores busy for hours."""
    if not (args.per_schema and args.out):
        raise SystemExit("--quiet-compile-only needs --per-schema (an earlier run's rows) and --out")
    rows = [json.loads(line) for line in args.per_schema.read_text().splitlines() if line.strip()]
    compiled = {r["file"] for r in rows if r["status"] not in ("compile_error", "crash", "timeout")}
    summary = json.loads(args.out.read_text())
    summary.setdefault("corpus_schemas", summary["schemas"])  # runs before these keys: the whole corpus
    summary.setdefault("every", 1)
    with tempfile.TemporaryDirectory() as tmp:
        files = sorted(f for f in corpus_files(args.corpus, tmp) if Path(f).name in compiled)
        load_before = os.getloadavg()
        quiet_ms = quiet_compile_pass(files, args)
    summary["compile_cpu_ms_alone"] = stats(quiet_ms)
    summary["compile_alone_run"] = {"schemas": len(quiet_ms), "load_average_before": load_before,
                                    "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name()}
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(summary))
    print(markdown(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path,
                        default=SHARED_CORPUS if SHARED_CORPUS.exists() else None,
                        help="folder of corpus .json files, or the .tar.xz (default: "
                             "../shared/data/jsonschemabench.tar.xz when present)")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json of the model")
    parser.add_argument("--engine", choices=("llguidance", "xgrammar"), default="llguidance")
    parser.add_argument("--xgr-strict", action="store_true",
                        help="xgrammar strict_mode (no additional properties unless "
                             "declared); off by default, to follow JSON Schema")
    parser.add_argument("--eos-token", type=int,
                        help="EOS token id (default: eos_token_id of the generation_config.json "
                             "next to the tokenizer)")
    parser.add_argument("--options", default=str(OPTIONS_PATH), help="json_options.json")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per schema")
    parser.add_argument("--every", type=int, default=1,
                        help="every Nth schema in file-name order (a sample spread over "
                             "the sub-collections, for slow engines)")
    parser.add_argument("--limit", type=int, default=0, help="first N schemas only")
    parser.add_argument("--out", type=Path, help="summary JSON (a .md table is written next)")
    parser.add_argument("--per-schema", type=Path, help="JSON lines, one result per schema")
    parser.add_argument("--quiet-compile-only", action="store_true",
                        help="rerun only the quiet compile pass, over the schemas that compiled in "
                             "--per-schema's earlier rows, and update --out's summary with it")
    args = parser.parse_args()
    if args.corpus is None:
        parser.error("--corpus is required (../shared/data is not here)")
    if args.eos_token is None:
        # The model's EOS, not the tokenizer's first special token (<|endoftext|> here).
        config = Path(args.tokenizer).with_name("generation_config.json")
        if not config.is_file():
            parser.error("--eos-token is required (no generation_config.json found)")
        eos = json.loads(config.read_text())["eos_token_id"]
        args.eos_token = eos[0] if isinstance(eos, list) else eos

    if args.quiet_compile_only:
        update_quiet_compile(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        files = corpus_files(args.corpus, tmp)
        total = len(files)
        files = files[::args.every]
        if args.limit:
            files = files[:args.limit]
        sink = open(args.per_schema, "w") if args.per_schema else None
        try:
            results, version = run_pool(files, args, sink)
        finally:
            if sink:
                sink.close()
        by_name = {Path(f).name: f for f in files}
        compiled = [by_name[r["file"]] for r in results
                    if r["status"] not in ("compile_error", "crash", "timeout")]
        quiet_ms = quiet_compile_pass(sorted(compiled), args)
    results.sort(key=lambda r: r["file"])
    summary = summarise(results, args.engine, version, args)
    summary["compile_cpu_ms_alone"] = stats(quiet_ms)
    summary["corpus_schemas"], summary["every"] = total, args.every
    if args.per_schema:  # rewrite in file order
        args.per_schema.write_text("".join(per_schema_line(r) for r in results))
    text = markdown(summary)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
