"""The benchmark client: streams dealt over several processes come back in request order."""

import json
import multiprocessing
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.gpu_http_load import StreamResult, client_pool, streams, timeline


class FakeStream(BaseHTTPRequestHandler):
    """Answers /generate_stream with one SSE event per requested token."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = body["parameters"]["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(count):
            self.wfile.write(f'data:{{"token": {{"id": {i}}}, "prompt": "{body["inputs"]}"}}\n\n'.encode())
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_streams_over_several_client_processes_keep_request_order():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        requests = [(f"p{i}", 1 + i % 5) for i in range(11)]
        results, wall = streams(url, requests, processes=3)
    finally:
        server.shutdown()
    assert [len(r.token_times) for r in results] == [n for _, n in requests]
    assert all(r.error is None for r in results)
    assert 0 < wall < 60
    sent = [r.sent for r in results]
    assert max(sent) - min(sent) < 2.0  # the processes start together


def test_timeline_places_tokens_and_wall_time_from_the_first_send():
    results = [StreamResult(sent=10.0, token_times=[10.5, 11.0]), StreamResult(sent=10.2, token_times=[10.4, 12.0]),
               StreamResult(sent=10.1, error="HTTP 422: ...")]  # fmt: skip
    got = timeline(results, wall=2.3)
    assert abs(got["sends_spread_s"] - 0.2) < 1e-9
    assert abs(got["first_token_s"] - 0.4) < 1e-9 and abs(got["last_token_s"] - 2.0) < 1e-9
    assert abs(got["outside_tokens_s"] - 0.3) < 1e-9 and got["wall_s"] == 2.3
    assert timeline([StreamResult(sent=1.0, error="refused")], wall=0.5) == {"sends_spread_s": 0.0, "wall_s": 0.5}


def test_sse_events_split_at_line_feeds_only():
    """JSON leaves U+2028 and U+0085 unescaped in strings; an event holding one is one event."""
    import asyncio

    import httpx

    from bench.gpu_http_load import sse_data

    payloads = ['{"token": {"text": "a\u2028b\x85c"}}', '{"token": {"text": "d"}}']
    body = "".join(f"data:{p}\r\n\r\n" for p in payloads).encode()

    async def read() -> list[str]:
        chunks = [body[i : i + 7] for i in range(0, len(body), 7)]  # events cut across chunks

        async def stream():
            for chunk in chunks:
                yield chunk

        response = httpx.Response(200, content=stream())
        return [data async for data in sse_data(response)]

    assert asyncio.run(read()) == payloads


def test_a_client_pool_has_every_process_started_before_the_common_start_is_fixed():
    # A pool spawns its processes as tasks come; one that was still importing when the start
    # passed would send late and count its own start in TTFT.
    before = {child.pid for child in multiprocessing.active_children()}
    with client_pool(3) as pool:
        started = {child.pid for child in multiprocessing.active_children()} - before
        assert len(started) == 3
        assert set(pool.map(_pid, range(6))) <= started


def _pid(_: int) -> int:
    return os.getpid()
