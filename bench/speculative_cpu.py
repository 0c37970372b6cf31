"""Speculative decoding on the CPU, demo model, batch 1: the same requests against a server
without and with `--speculate`, one server at a time (two would share the two cores).

Workloads (greedy, through /v1/chat/completions as a chat client sends them):
- `edit`: rewrite a given passage with one small change (copy-heavy: what prompt lookup is for);
- `open`: short open-ended answers (little to look up: speculation must not cost much).

Reports output tokens/s per workload without and with drafts, their ratio, whether every text
is identical, and the acceptance counters. Usage:

    PYTHONPATH=. .venv/bin/python bench/speculative_cpu.py --out bench/results/speculative_cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))

from server import Server, metric, scrape_metrics  # noqa: E402

PASSAGES = [
    "The library opens at nine and closes at five. Visitors may borrow six books at a time, and "
    "children under twelve need a parent's card. The reading room on the second floor is quiet.",
    "Our team meets every Monday at ten to plan the week. Each person lists three goals, and on "
    "Friday we check which goals were met and which ones move to the next week.",
    "To bake the bread, mix the flour, water, salt and yeast, then knead the dough for ten "
    "minutes. Let it rise for an hour, shape it, and bake it at two hundred degrees for forty minutes.",
    "The train leaves the central station at seven in the morning and reaches the coast at noon. "
    "Tickets can be bought online or at the station, and bicycles travel free on weekdays.",
    "Water the tomato plants every evening in summer, and feed them once a week. Remove the small "
    "shoots between the stem and the branches so the plant puts its strength into the fruit.",
    "The museum has three halls: one for old maps, one for ships and one for paintings of the "
    "harbour. Guided tours start every hour, and the cafe on the ground floor sells cakes.",
]
EDITS = [("nine", "eight"), ("Monday", "Tuesday"), ("ten", "twelve"), ("seven", "six"),
         ("evening", "morning"), ("three", "four")]
OPEN = ["Give me three tips for sleeping well.", "What is a good name for a cat? Explain why.",
        "Describe a sunny day at the beach.", "How do plants grow?",
        "Why do people like music?", "Tell me about the moon."]


def workloads() -> dict[str, list[str]]:
    edit = [f"Rewrite the following text exactly as it is, but change the word \"{old}\" to "
            f"\"{new}\":\n\n{passage}" for passage, (old, new) in zip(PASSAGES, EDITS)]
    return {"edit": edit, "open": OPEN}


def ask(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> tuple[str, int, float]:
    body = {"model": "demo", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0}
    started = time.perf_counter()
    response = client.post(url + "/v1/chat/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    answer = response.json()
    return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"], elapsed


def run_server(flags: list[str], max_tokens: int) -> dict:
    server = Server(*flags)
    try:
        with httpx.Client() as client:
            ask(client, server.url, "Hello!", 8)  # warm-up
            before = scrape_metrics(server.url)
            results = {}
            for name, prompts in workloads().items():
                answers = [ask(client, server.url, p, max_tokens) for p in prompts]
                tokens = sum(a[1] for a in answers)
                seconds = sum(a[2] for a in answers)
                results[name] = {"texts": [a[0] for a in answers], "tokens": tokens,
                                 "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 2)}
            after = scrape_metrics(server.url)
        counters = {name: metric(after, name) - metric(before, name) for name in (
            "textgen_speculative_draft_tokens_total", "textgen_speculative_accepted_tokens_total")}
        return {"flags": flags, "workloads": results, "counters": counters}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the .json and .md")
    args = parser.parse_args()
    plain = run_server([], args.max_tokens)
    drafting = run_server(["--speculate", str(args.speculate)], args.max_tokens)
    rows = {}
    for name in workloads():
        off, on = plain["workloads"][name], drafting["workloads"][name]
        rows[name] = {"tok_s_off": off["tok_s"], "tok_s_on": on["tok_s"],
                      "speedup": round(on["tok_s"] / off["tok_s"], 3),
                      "identical_texts": sum(a == b for a, b in zip(off["texts"], on["texts"])),
                      "requests": len(off["texts"]), "tokens": on["tokens"]}
    drafted = drafting["counters"]["textgen_speculative_draft_tokens_total"]
    kept = drafting["counters"]["textgen_speculative_accepted_tokens_total"]
    summary = {"command": "PYTHONPATH=. .venv/bin/python bench/speculative_cpu.py " + " ".join(sys.argv[1:]),
               "speculate": args.speculate, "max_tokens": args.max_tokens, "rows": rows,
               "drafted": drafted, "kept": kept,
               "acceptance": round(kept / drafted, 3) if drafted else None,
               "runs": {"off": plain, "on": drafting}}
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = ["# Speculative decoding on the CPU (demo model, batch 1, greedy)", "",
             f"`{summary['command']}`; `--speculate {args.speculate}`, max_tokens {args.max_tokens}. "
             f"Drafted {drafted:.0f}, kept {kept:.0f} (acceptance {summary['acceptance']}).", "",
             "| workload | tok/s off | tok/s on | on / off | identical texts |", "|:--|--:|--:|--:|--:|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['tok_s_off']} | {row['tok_s_on']} | {row['speedup']} | "
                     f"{row['identical_texts']} / {row['requests']} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
