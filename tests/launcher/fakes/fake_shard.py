"""Stands in for textgen-shard: serves gRPC Health on {uds}-{rank}.

Behaviour comes from the environment: FAKE_SHARD_CRASH_RANK makes that rank fail while
"loading"; FAKE_SHARD_CRASH_AFTER_READY_RANK makes it die after binding;
FAKE_SHARD_HANG_AFTER_READY_RANK makes it stop answering Health (alive but stuck) a second
after binding; FAKE_SHARD_BUSY_AFTER_READY_RANK makes it miss Health while it burns CPU, as a
shard whose step worker holds the GIL in a long native call (a grammar compile); FAKE_ARGV_DIR records each argv as JSON (and the shard's NCCL_NVLS_ENABLE);
FAKE_EVENTS_FILE gets a line when SIGTERM arrives.
"""

import signal
import threading

# First, before the slow imports: the launcher may stop this shard the moment another rank
# fails to load, and a SIGTERM that found no handler would end it without its stop event.
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent import futures  # noqa: E402

import grpc  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("command")
parser.add_argument("--model-path", required=True)
parser.add_argument("--uds-path", required=True)
parser.add_argument("--rank", type=int, required=True)
parser.add_argument("--world-size", type=int, required=True)
args, _ = parser.parse_known_args()

if os.environ.get("FAKE_ARGV_DIR"):
    with open(os.path.join(os.environ["FAKE_ARGV_DIR"], f"shard-{args.rank}.json"), "w") as f:
        json.dump(sys.argv[1:], f)
    with open(os.path.join(os.environ["FAKE_ARGV_DIR"], f"shard-{args.rank}-nvls.txt"), "w") as f:
        f.write(os.environ.get("NCCL_NVLS_ENABLE", "unset"))

if os.environ.get("FAKE_SHARD_CRASH_RANK") == str(args.rank):
    print("loading weights...", file=sys.stderr)
    print("RuntimeError: weights are corrupt", file=sys.stderr, flush=True)
    sys.exit(3)

stuck = threading.Event()


def health(request, context):
    if stuck.is_set():
        context.abort(grpc.StatusCode.UNAVAILABLE, "stuck")
    return b""


server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
handler = grpc.method_handlers_generic_handler(
    "textgen.shard.v1.TextGenerationShard",
    {"Health": grpc.unary_unary_rpc_method_handler(health)})
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port(f"unix://{args.uds_path}-{args.rank}")
server.start()
print(f"shard {args.rank} serving", file=sys.stderr, flush=True)

if os.environ.get("FAKE_SHARD_CRASH_AFTER_READY_RANK") == str(args.rank):
    time.sleep(1.0)
    print("CUDA error: an illegal memory access", file=sys.stderr, flush=True)
    os._exit(7)

if os.environ.get("FAKE_SHARD_HANG_AFTER_READY_RANK") == str(args.rank):
    time.sleep(1.0)
    print("stuck in a collective", file=sys.stderr, flush=True)
    stuck.set()

if os.environ.get("FAKE_SHARD_BUSY_AFTER_READY_RANK") == str(args.rank):
    time.sleep(1.0)
    print("compiling a grammar", file=sys.stderr, flush=True)
    stuck.set()

    def burn() -> None:
        while not stop.is_set():
            sum(range(100_000))

    threading.Thread(target=burn, daemon=True).start()

# Timed waits: Python runs a signal's handler only on the main thread, and an untimed
# wait there is not woken when the kernel hands SIGTERM to a gRPC thread (as it may just
# after a SIGCONT). The real shard reads signals through asyncio's wakeup fd instead.
while not stop.wait(0.05):
    pass
if os.environ.get("FAKE_EVENTS_FILE"):
    with open(os.environ["FAKE_EVENTS_FILE"], "a") as f:
        f.write(f"shard-{args.rank}-stop {time.time()}\n")
server.stop(0)
print(f"shard {args.rank} stopped", file=sys.stderr, flush=True)
