"""`textgen-shard serve ...`: loads the model, binds `unix://{uds_path}-{rank}`, serves gRPC.

Every setting comes from the command line (docs/processes.md); the only exception is the
standard OTEL_* tracing variables, read once in `main` (shard_server/telemetry.py). The socket appears only once the model is loaded, so its existence means the
shard is ready for Health.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from .cuda_graphs import DEFAULT_SIZES as DEFAULT_GRAPH_SIZES
from .cuda_graphs import parse_sizes
from .mixed_graphs import MIXED_TOKEN_BUCKETS
from .distributed import init_parallel
from .draft_model import DraftModel, check_same_vocabulary
from .grammar import GrammarEngine
from .kernels.fp8_matmul import require_fp8_support
from .kv_cache import KV_CACHE_DTYPES, KVSpec
from .models.config import ModelConfig, UnsupportedModelError
from .models.quantization import QUANTIZE_FLAGS
from .models.registry import build_model
from .models.sharding import check_shardable, shard_heads
from .pb import generate_pb2_grpc as pb_grpc
from .runner import ModelRunner
from .service import ShardIdentity, ShardService, step_worker
from .telemetry import TraceSettings, TraceSettingsError, build_tracer
from .warmup import PoolSizing
from .weights import WeightsError, WeightStore, read_config

log = logging.getLogger("shard_server")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GIL_SWITCH_INTERVAL_S = 0.0005  # see main()


@dataclass(frozen=True)
class ServeConfig:
    model_path: Path
    uds_path: str
    rank: int = 0
    world_size: int = 1
    master_addr: str = "localhost"
    master_port: int = 29500
    dtype: str | None = None  # float32 on CPU, bfloat16 on CUDA
    device: str | None = None  # cuda when available
    kv_cache_tokens: int = 32768
    kv_cache_dtype: str | None = None  # the model dtype
    quantize: str | None = None  # "fp8": linear weights in fp8, quantized at load
    speculative_model: Path | None = None  # a draft model's directory: drafts come from it
    cuda_memory_fraction: float = 1.0
    attention: str | None = None  # triton on CUDA, reference elsewhere
    cuda_graphs: str = ",".join(map(str, DEFAULT_GRAPH_SIZES))
    cuda_graph_tokens: str = ",".join(map(str, MIXED_TOKEN_BUCKETS))
    block_size: int = 16
    json_output: bool = False
    otlp_endpoint: str | None = None
    otlp_service_name: str | None = None

    @property
    def socket_path(self) -> str:
        return f"{self.uds_path}-{self.rank}"

    def torch_device(self) -> torch.device:
        name = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if name == "cuda":
            return torch.device("cuda", self.rank % max(1, torch.cuda.device_count()))
        return torch.device(name)

    def attention_backend(self, device: torch.device) -> str:
        return self.attention or ("triton" if device.type == "cuda" else "reference")

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        return DTYPES[self.dtype or ("bfloat16" if device.type == "cuda" else "float32")]

    def kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return KV_CACHE_DTYPES[self.kv_cache_dtype] if self.kv_cache_dtype else model_dtype


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="textgen-shard", description="textgen model shard (gRPC over a unix socket)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="load a model and serve TextGenerationShard")
    d = ServeConfig(model_path=Path("."), uds_path="")
    serve.add_argument("--model-path", type=Path, required=True, help="local model directory")
    serve.add_argument("--uds-path", required=True, help="socket base; this shard binds BASE-RANK")
    serve.add_argument("--rank", type=int, default=d.rank)
    serve.add_argument("--world-size", type=int, default=d.world_size)
    serve.add_argument("--master-addr", default=d.master_addr)
    serve.add_argument("--master-port", type=int, default=d.master_port)
    serve.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="default: float32 on CPU, bfloat16 on CUDA"
    )
    serve.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    serve.add_argument(
        "--kv-cache-tokens", type=int, default=d.kv_cache_tokens, help="CPU KV pool size in tokens"
    )
    serve.add_argument(
        "--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES), default=None,
        help="store the KV cache in fp8 (half the memory of bf16); default: the model dtype",
    )  # fmt: skip
    serve.add_argument(
        "--quantize", choices=list(QUANTIZE_FLAGS), default=None,
        help="fp8: quantize the linear weights to fp8 (e4m3, a scale per output feature) at load; gptq, awq, "
        "marlin: name the checkpoint's own GPTQ/AWQ quantization (loaded without the flag too)",
    )
    serve.add_argument(
        "--speculative-model", type=Path, default=None,
        help="local directory of a draft model that shares the model's tokenizer: speculative drafts come from "
        "it instead of prompt lookup (the router's --speculate sets how many); default: none",
    )  # fmt: skip
    serve.add_argument("--cuda-memory-fraction", type=float, default=d.cuda_memory_fraction)
    serve.add_argument(
        "--attention", choices=["reference", "triton"], default=None, help="default: triton on CUDA, else reference"
    )
    serve.add_argument(
        "--cuda-graphs",
        default=d.cuda_graphs,
        help="decode batch sizes replayed from CUDA graphs, comma-separated; 0 disables (default: %(default)s)",
    )
    serve.add_argument(
        "--cuda-graph-tokens",
        default=d.cuda_graph_tokens,
        help="token counts of the CUDA graphs for steps with prompt chunks or verified drafts beside decodes, "
        "comma-separated; 0 disables (default: %(default)s)",
    )
    serve.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    serve.add_argument("--json-output", action="store_true")
    serve.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OTLP collector for traces; default OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    serve.add_argument(
        "--otlp-service-name", default=None, help="service name of the spans; default OTEL_SERVICE_NAME, else textgen-shard"
    )
    return parser


def parse_config(argv: list[str] | None = None) -> ServeConfig:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    args.pop("command")
    config = ServeConfig(**args)
    problems = []
    if config.kv_cache_tokens < config.block_size:
        problems.append("--kv-cache-tokens must hold at least one block")
    if not 0 < config.cuda_memory_fraction <= 1:
        problems.append("--cuda-memory-fraction must be in (0, 1]")
    for text, flag in ((config.cuda_graphs, "--cuda-graphs"), (config.cuda_graph_tokens, "--cuda-graph-tokens")):
        try:
            parse_sizes(text, flag)
        except ValueError as exc:
            problems.append(str(exc))
    if config.block_size < 1:
        problems.append("--block-size must be >= 1")
    if config.world_size < 1 or not 0 <= config.rank < config.world_size:
        problems.append("--rank must be in [0, --world-size)")
    if problems:
        parser.error("; ".join(problems))
    return config


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"level": record.levelname, "target": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(json_output: bool, rank: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    fmt = f"%(asctime)s %(levelname)s shard-{rank} %(name)s: %(message)s"
    handler.setFormatter(_JsonFormatter() if json_output else logging.Formatter(fmt))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # Python warnings go through the same handler, so --json-output covers them too.
    logging.captureWarnings(True)


def _read_model_config(model_path: Path, quantize: str | None, world_size: int) -> ModelConfig:
    try:
        model_config = ModelConfig.from_dict(read_config(model_path))
    except UnsupportedModelError as exc:  # name the file the reason is in
        raise UnsupportedModelError(f"{Path(model_path) / 'config.json'}: {exc}") from None
    model_config = model_config.with_quantize(quantize)
    check_shardable(model_config, world_size)  # fail before the rendezvous, naming the numbers
    return model_config


def _load_model(model_path: Path, model_config: ModelConfig, parallel, attention: str, dtype, device):
    with WeightStore(model_path) as store:
        model = build_model(model_config, store, parallel, attention, dtype, device)
        log.info(
            "rank %d/%d read %.1f MiB of %s's %.1f MiB (largest read %.1f MiB)",
            parallel.rank, parallel.world_size, store.bytes_read / 2**20, model_path, store.total_bytes() / 2**20,
            store.largest_read / 2**20,
        )  # fmt: skip
    return model


def _kv_spec(model_config: ModelConfig, parallel, config: ServeConfig, dtype: torch.dtype) -> KVSpec:
    return KVSpec(
        num_layers=model_config.num_hidden_layers,
        num_kv_heads=shard_heads(model_config, parallel).num_kv_heads,
        head_dim=model_config.head_dim,
        block_size=config.block_size,
        dtype=config.kv_dtype(dtype),
    )


def load_service(
    config: ServeConfig, trace: TraceSettings | None = None, worker: ThreadPoolExecutor | None = None
) -> ShardService:
    """Builds the model and its service; call it on `worker`, the thread that will run the steps."""
    device = config.torch_device()
    dtype = config.torch_dtype(device)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model_config = _read_model_config(config.model_path, config.quantize, config.world_size)
    draft_config = None
    if config.speculative_model is not None:  # its files are checked before any weight is read
        check_same_vocabulary(config.model_path, config.speculative_model)
        draft_config = _read_model_config(config.speculative_model, None, config.world_size)
    if model_config.quantize == "fp8":
        require_fp8_support(device)
    parallel = init_parallel(config.rank, config.world_size, config.master_addr, config.master_port, device)
    attention = config.attention_backend(device)
    model = _load_model(config.model_path, model_config, parallel, attention, dtype, device)
    drafter = None
    if draft_config is not None:
        draft = _load_model(config.speculative_model, draft_config, parallel, attention, dtype, device)
        drafter = DraftModel(draft, _kv_spec(draft_config, parallel, config, dtype), device, model_config.vocab_size)
    spec = _kv_spec(model_config, parallel, config, dtype)
    grammars = GrammarEngine.for_model_dir(config.model_path, model_config.vocab_size)  # tokenizer read lazily
    runner = ModelRunner(model, spec, device, grammars, drafter, parallel)
    identity = ShardIdentity(model_config.model_type, parallel, attention)
    sizing = PoolSizing(config.kv_cache_tokens, config.cuda_memory_fraction, parse_sizes(config.cuda_graphs),
                        parse_sizes(config.cuda_graph_tokens, "--cuda-graph-tokens"))  # fmt: skip
    log.info(
        "loaded %s (%s%s, %s; KV cache %s) from %s%s", model_config.model_type, dtype,
        f" with {model_config.quantize} weights" if model_config.quantize else "", device, spec.dtype, config.model_path,
        f", drafting with {draft_config.model_type} from {config.speculative_model}" if draft_config else "",
    )  # fmt: skip
    tracer = build_tracer(trace, config.rank, config.world_size)
    return ShardService(runner, identity, sizing, tracer, worker)


async def serve(config: ServeConfig, trace: TraceSettings | None = None) -> None:
    worker = step_worker(config.torch_device())
    service = await asyncio.get_running_loop().run_in_executor(worker, load_service, config, trace, worker)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    pb_grpc.add_TextGenerationShardServicer_to_server(service, server)
    socket = Path(config.socket_path)
    socket.unlink(missing_ok=True)  # a stale socket from a crashed run would block the bind
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    log.info("serving on unix://%s", socket)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.stop(grace=5)
    service.close()
    socket.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    setup_logging(config.json_output, config.rank)
    try:
        # The OTEL_* variables are read here, once, into typed settings.
        trace = TraceSettings.resolve(config.otlp_endpoint, config.otlp_service_name, os.environ)
    except TraceSettingsError as exc:
        log.error("%s", exc)
        return 2
    # Two threads share the GIL: the event loop (gRPC) and the step worker. A thread that wants
    # it waits until the holder blocks or the switch interval passes (5 ms by default): a step's
    # answer or the next step's request could sit that long while the worker prepares a step.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        asyncio.run(serve(config, trace))
    except (WeightsError, UnsupportedModelError) as exc:  # the model's files: the reason, no traceback
        log.error("cannot load the model: %s", exc)
        return 1
    except Exception:
        log.exception("shard failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
