"""The engine-neutral load client (bench/peer_load.py): workloads are seeded and shaped as
documented, and the client counts tokens from usage, holds an admission cap and keeps order."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench import peer_load


class FakeCompletions(BaseHTTPRequestHandler):
    """/v1/completions streamed as an OpenAI server does: a chunk per token (its text is the
    prompt's length, to check order), a usage chunk, `[DONE]`; 429 above `cap` open at once."""

    cap = 2
    open_now = 0
    most_open = 0
    lock = threading.Lock()
    arrivals: list[tuple[str, float]] = []  # (method and path, when), in arrival order

    def do_GET(self):
        type(self).arrivals.append((f"GET {self.path}", time.perf_counter()))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        cls.arrivals.append((f"POST {self.path}", time.perf_counter()))
        with cls.lock:
            if cls.open_now >= cls.cap:
                self.send_response(429)
                self.end_headers()
                return
            cls.open_now += 1
            cls.most_open = max(cls.most_open, cls.open_now)
        done = False
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(body["max_tokens"]):
                chunk = {"choices": [{"index": 0, "text": str(len(body["prompt"]))}], "usage": None}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.01)
            # Closed before the client can read the end: it may send its next request at once
            # (a real server frees the slot before its last event, too).
            with cls.lock:
                cls.open_now -= 1
            done = True
            usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        finally:
            if not done:
                with cls.lock:
                    cls.open_now -= 1
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_a_capped_burst_is_served_in_order_without_429s():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        requests = [peer_load.Request(list(range(n)), 3) for n in range(1, 9)]
        outcomes, wall = peer_load.run(f"http://127.0.0.1:{server.server_port}", requests, processes=2,
                                       max_in_flight=FakeCompletions.cap)  # fmt: skip
    finally:
        server.shutdown()
    assert [o.error for o in outcomes] == [None] * 8
    assert [o.completion_tokens for o in outcomes] == [3] * 8
    assert all(len(o.chunk_times) == 3 and o.tpot is not None and o.tpot > 0 for o in outcomes)
    assert FakeCompletions.most_open <= FakeCompletions.cap
    stats = peer_load.summary(outcomes, wall)
    assert stats["output_tokens"] == 24 and stats["errors"] == 0
    assert stats["ttft_ms"]["p50"] <= stats["e2e_ms"]["p50"]


def test_each_client_process_warms_up_before_the_clock_starts():
    """A fresh process's first request pays httpx's first use (~20 ms): each client sends one
    GET /health before any measured request, so no lone request's TTFT counts it."""
    FakeCompletions.arrivals = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        requests = [peer_load.Request([1, 2, 3], 2, at=0.05 * i) for i in range(4)]
        outcomes, _ = peer_load.run(f"http://127.0.0.1:{server.server_port}", requests, processes=2,
                                    max_in_flight=2)  # fmt: skip
    finally:
        server.shutdown()
    assert [o.error for o in outcomes] == [None] * 4
    kinds = [what for what, _ in FakeCompletions.arrivals]
    assert kinds.count("GET /health") == 2 and kinds.count("POST /v1/completions") == 4
    first_post = min(when for what, when in FakeCompletions.arrivals if what.startswith("POST"))
    assert all(when < first_post for what, when in FakeCompletions.arrivals if what.startswith("GET"))
    # Every measured request left at its scheduled time or after, never before (the warm-up is off the clock).
    assert all(o.chunk_times[0] >= o.scheduled for o in outcomes)


def test_workloads_are_seeded_and_clipped():
    a = peer_load.sharegpt_like(200, 49152, seed=3)
    assert a == peer_load.sharegpt_like(200, 49152, seed=3)
    assert a != peer_load.sharegpt_like(200, 49152, seed=4)
    assert all(8 <= len(r.prompt) <= 2048 and 8 <= r.max_tokens <= 1024 for r in a)
    assert all(256 <= t < 49152 for r in a for t in r.prompt)
    schedule = peer_load.poisson_schedule(32, 20.0, seed=5)
    assert 0.8 * 640 < len(schedule) < 1.2 * 640 and schedule == sorted(schedule) and schedule[-1] < 20.0
    shared = peer_load.shared_prefix(4, 100, 5, 7, 49152, seed=6)
    assert len({tuple(r.prompt[:100]) for r in shared}) == 1 and len({tuple(r.prompt) for r in shared}) == 4
    assert sorted(len(r.prompt) for r in peer_load.fixed([(3, 1), (5, 2)], 49152, seed=7)) == [3, 5]


def test_report_keeps_variants_apart_from_the_defaults_comparison():
    from bench.gpu_vs_vllm import report

    def run(tok_s):
        return {"output_tok_s": tok_s, "tpot_ms": {"p50": 10.0}}

    results = {"textgen": {"ready_s": 3.0, "burst": run(100.0)}, "vllm": {"burst": run(200.0)},
               "textgen[c1024]": {"flags": ["--max-concurrent-requests", "1024"], "burst": run(150.0)}}
    text = report(results)
    defaults, _, variant = text.partition("Variant")
    assert "| burst | output tok/s | 100.0 | 200.0 | 0.500 |" in defaults
    assert "--max-concurrent-requests 1024" in variant
    assert "| burst | output tok/s | 150.0 | 100.0 | 200.0 | 1.500 | 0.750 |" in variant


def test_report_gives_batch1_as_a_share_of_the_roofline_of_the_bytes_a_token_reads():
    from bench import gpu_model
    from bench.gpu_vs_vllm import batch1_roofline_shares, report

    moe = gpu_model.QWEN3_30B_A3B
    active = gpu_model.active_params_per_token(moe)
    # 8 of 128 experts a token: about a tenth of the 30.5B parameters, attention and lm_head included.
    assert 2.9e9 < active < 3.2e9 < sum(spec.numel for spec in gpu_model.tensor_specs(moe)) / 9
    model = {"shape": "qwen3-30b-a3b", "active_bytes_per_token": 2 * active, "copy_bytes_per_s": 4e12}
    ceiling = 4e12 / (2 * active)
    results = {"model": model, "textgen": {"batch1": {"output_tok_s": 0.5 * ceiling}},
               "vllm": {"batch1": {"output_tok_s": 0.25 * ceiling}}}
    shares = batch1_roofline_shares(results)
    assert abs(shares["textgen"] - 0.5) < 1e-9 and abs(shares["vllm"] - 0.25) < 1e-9
    assert "roofline: textgen 0.50, vllm 0.25" in report(results)
    assert batch1_roofline_shares({"textgen": {"batch1": {"output_tok_s": 1.0}}}) == {}  # no model figures
