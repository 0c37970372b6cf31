"""Stands in for textgen-router: answers GET /health and drains on SIGTERM.

FAKE_ROUTER_UNHEALTHY_AFTER makes /health answer 503 that many seconds after start (a shard
failed a step). FAKE_ARGV_DIR records argv; FAKE_EVENTS_FILE gets "drain-start"/"drain-end" lines so tests
can check the router finished before the shards were stopped.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--hostname", required=True)
parser.add_argument("--port", type=int, required=True)
args, _ = parser.parse_known_args()

if os.environ.get("FAKE_ARGV_DIR"):
    with open(os.path.join(os.environ["FAKE_ARGV_DIR"], "router.json"), "w") as f:
        json.dump(sys.argv[1:], f)


def event(name):
    if os.environ.get("FAKE_EVENTS_FILE"):
        with open(os.environ["FAKE_EVENTS_FILE"], "a") as f:
            f.write(f"{name} {time.time()}\n")


STARTED = time.monotonic()
UNHEALTHY_AFTER = float(os.environ.get("FAKE_ROUTER_UNHEALTHY_AFTER", "inf"))


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        healthy = time.monotonic() - STARTED < UNHEALTHY_AFTER
        self.send_response((200 if healthy else 503) if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *_):
        pass


server = ThreadingHTTPServer((args.hostname, args.port), Health)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
threading.Thread(target=server.serve_forever, daemon=True).start()
print("router listening", file=sys.stderr, flush=True)
stop.wait()
event("drain-start")
time.sleep(float(os.environ.get("FAKE_ROUTER_DRAIN_SECONDS", "0.3")))
event("drain-end")
server.shutdown()
print("router drained", file=sys.stderr, flush=True)
