"""The `TextGenerationShard` gRPC servicer.

Steps run one at a time on a dedicated worker thread, so the event loop keeps answering
Health while a forward pass runs. The router drives steps through `StepStream`: each step goes
to the step pipeline (step_pipeline.py) the moment it arrives, so the worker goes from step N
straight to step N+1 while N's answer travels back. Errors never take the process down: a bad request becomes
INVALID_ARGUMENT, a Step before Warmup FAILED_PRECONDITION, anything else INTERNAL, each with
a message that says what went wrong.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import torch

from .distributed import ParallelContext
from .layers.rotary import long_rope_prompt_tokens
from .pb import generate_pb2 as pb
from .pb import generate_pb2_grpc as pb_grpc
from .requests import InvalidStepError
from .runner import ModelRunner, NotWarmedUpError
from .step_pipeline import StepPipeline, StreamedStep
from .telemetry import StepTiming, StepTracer
from .warmup import PoolSizing, warmup

log = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class ShardIdentity:
    model_type: str
    parallel: ParallelContext
    attention_backend: str


def _select_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)


def step_worker(device: torch.device) -> ThreadPoolExecutor:
    """The one thread for every torch call of the shard: loading, warmup and steps.

    One thread means one OpenMP team. Loading on the main thread made a second team, and
    libgomp, once its threads outnumber the CPUs, stops spinning at barriers: every parallel
    region then ended in a futex sleep (hundreds per step), ~15 % of a CPU step. The current
    CUDA device is per thread too: the worker selects this rank's GPU itself, or graph
    capture and Triton launches on rank > 0 would go to GPU 0's stream.
    """
    return ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="shard-step", initializer=_select_device, initargs=(device,)
    )


class ShardService(pb_grpc.TextGenerationShardServicer):
    def __init__(
        self,
        runner: ModelRunner,
        identity: ShardIdentity,
        sizing: PoolSizing,
        tracer: StepTracer | None = None,
        worker: ThreadPoolExecutor | None = None,
    ):
        self.runner = runner
        self.identity = identity
        self.sizing = sizing
        self.tracer = tracer
        self._worker = worker or step_worker(runner.device)
        self._lock = asyncio.Lock()
        # Overlap only pays on a GPU: on the CPU a launch is the whole computation.
        self._pipeline = StepPipeline(runner, self._worker, overlap=runner.device.type == "cuda")

    async def _run(self, context, what: str, fn, *args):
        """Runs fn on the step worker, one call at a time."""
        async with self._lock:
            return await self._guarded(context, what, self._on_worker(fn, *args))

    def _on_worker(self, fn, *args) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def _guarded(self, context, what: str, pending: Awaitable):
        """Awaits work running off the event loop and maps its failures to gRPC status codes."""
        try:
            return await pending
        except InvalidStepError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {exc}")
        except NotWarmedUpError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{what}: {exc}")
        except Exception as exc:  # the shard must survive any single bad call
            log.exception("%s failed", what)
            await context.abort(grpc.StatusCode.INTERNAL, f"{what} failed: {type(exc).__name__}: {exc}")

    async def Info(self, request, context):
        runner, cfg = self.runner, self.runner.config
        return pb.InfoResponse(
            model_type=self.identity.model_type,
            dtype=_DTYPE_NAMES.get(runner.dtype, str(runner.dtype)),
            device_type=runner.device.type,
            block_size=runner.block_size,
            vocab_size=cfg.vocab_size,
            max_position_embeddings=cfg.max_position_embeddings,
            rank=self.identity.parallel.rank,
            world_size=self.identity.parallel.world_size,
            attention_backend=self.identity.attention_backend,
            long_rope_prompt_tokens=long_rope_prompt_tokens(cfg.rope_scaling),
        )

    async def Health(self, request, context):
        """Liveness, answered without waiting behind a step. On the CPU the event loop
        answers itself: a thread hop to run a one-element op proved nothing about the device
        and cost extra GIL hand-offs, each of which waits out a native call (a grammar
        compile) that holds the GIL on the step worker. On a GPU a tiny round trip on a side
        stream of its own checks the device without queueing behind the step's kernels."""
        if self.runner.device.type != "cuda":
            return pb.HealthResponse()

        def probe() -> None:
            stream = self._health_stream()
            with torch.cuda.stream(stream):
                (torch.ones(1, device=self.runner.device) + 1).cpu()

        # Not behind the step lock: the default pool answers while a step runs.
        pending = asyncio.get_running_loop().run_in_executor(None, probe)
        await self._guarded(context, "Health", pending)
        return pb.HealthResponse()

    def _health_stream(self):
        """A non-blocking stream (not ordered after the step's default stream), made once."""
        stream = getattr(self, "_health_cuda_stream", None)
        if stream is None:
            torch.cuda.set_device(self.runner.device)
            stream = self._health_cuda_stream = torch.cuda.Stream(device=self.runner.device)
        return stream

    async def Warmup(self, request, context):
        if request.max_batch_prefill_tokens < 1 or request.max_batch_size < 1:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "Warmup: max_batch_prefill_tokens and max_batch_size must be >= 1",
            )
        report = await self._run(
            context,
            "Warmup",
            warmup,
            self.runner,
            request.max_batch_prefill_tokens,
            request.max_batch_size,
            self.sizing,
        )
        log.info(
            "warmup done: %d blocks of %d tokens in %d ms (its step: %d tokens in %d ms)",
            report.num_blocks, self.runner.block_size, report.warmup_ms, report.step_tokens, report.step_us // 1000,
        )  # fmt: skip
        return pb.WarmupResponse(
            num_blocks=report.num_blocks, block_size=self.runner.block_size, warmup_ms=report.warmup_ms,
            step_us=report.step_us, step_tokens=report.step_tokens,
        )  # fmt: skip

    async def ClearCache(self, request, context):
        await self._run(context, "ClearCache", self.runner.clear)
        return pb.ClearCacheResponse()

    async def Step(self, request, context):
        record = self._step_recorder(request, context.invocation_metadata())

        def job() -> pb.StepResponse:
            try:
                response = self.runner.step(request)
            except BaseException as exc:
                if record is not None:
                    record(None, exc)
                raise
            if record is not None:
                record(response, None)
            return response

        return await self._run(context, f"Step {request.step_id}", job)

    async def StepStream(self, request_iterator, context):
        """Answers steps in the order they arrive. Each step goes to the step pipeline as soon
        as it is read, not when the previous answer has been sent, so the worker always has
        the next step at hand. A failed step ends the stream with its status."""
        loop = asyncio.get_running_loop()
        queued: asyncio.Queue = asyncio.Queue()

        async def receive() -> None:
            try:
                async for request in request_iterator:
                    answer = loop.create_future()
                    queued.put_nowait((request.step_id, answer))
                    self._pipeline.submit(self._streamed(request, context, loop, answer))
            finally:
                queued.put_nowait(None)

        receiver = asyncio.create_task(receive())
        try:
            while (item := await queued.get()) is not None:
                step_id, answer = item
                yield await self._guarded(context, f"Step {step_id}", answer)
        finally:
            receiver.cancel()

    def _streamed(self, request, context, loop, answer: asyncio.Future) -> StreamedStep:
        record = self._step_recorder(request, context.invocation_metadata())

        def resolve(response, error) -> None:
            if answer.done():  # the stream is gone
                return
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(response)

        def on_done(response, error) -> None:  # on the worker thread
            if record is not None:
                record(response, error)
            try:
                loop.call_soon_threadsafe(resolve, response, error)
            except RuntimeError:  # the event loop closed (shutdown): nobody waits for this answer
                pass

        return StreamedStep(request, on_done)

    def _step_recorder(self, request, metadata) -> Callable | None:
        """Records the shard's spans of a step the router traces; None when it is not traced."""
        parent = self._trace_parent(request, metadata)
        if parent is None:
            return None
        received_ns = time.time_ns()

        def record(response, error) -> None:
            timing = None
            if response is not None:
                timing = StepTiming(received_ns, time.time_ns(), response.forward_ns, response.sample_ns)
            message = None if error is None else f"{type(error).__name__}: {error}"
            self.tracer.record_step(parent, request.step_id, len(request.sequences), timing, message)

        return record

    def _trace_parent(self, request, metadata):
        """The router's step span: in the request (streamed steps) or in the call's metadata."""
        if self.tracer is None:
            return None
        if request.trace_context:
            return self.tracer.parent_of(request.trace_context.items())
        return self.tracer.parent_of(metadata)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        if self.tracer is not None:
            self.tracer.shutdown()
