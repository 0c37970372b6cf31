"""Runs the router's streamed steps on the step worker, overlapping host work with the GPU.

The router keeps the next step queued on the shard (StepStream). When step N+1 is already
here while N runs on the GPU, the worker launches N+1 first — its inputs are prepared on the
host and its kernels queued behind N's — and only then waits for N's results and answers N.
The GPU goes from N to N+1 without waiting for the host. Without overlap (the CPU, where a
launch computes everything itself) each step is launched and completed in turn.

While a launched step runs and no next step is queued yet, the worker waits for whichever
comes first: the next step (launched at once, so it queues behind the running one) or the end
of the running step (answered, which is what lets the router send more). Waiting on the
running step alone would leave the GPU idle after it for the whole host launch of the next.

A step the runner must settle the running one for before it can plan (after a verification,
runner.py) settles it there, but answers it only once its own work is queued: writing and
sending the answer is host work the idle GPU would otherwise wait for.

Steps are answered in the order they were submitted; a step that fails is answered with its
exception, after the step launched before it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .pb import generate_pb2 as pb
from .runner import LaunchedStep, ModelRunner

log = logging.getLogger(__name__)

StepCallback = Callable[[pb.StepResponse | None, BaseException | None], None]
# How often the worker looks at the running step while it waits for the next one. A step
# finishing is seen at most this late; a step arriving is seen at once (it notifies).
POLL_S = 50e-6


@dataclass
class StreamedStep:
    request: pb.StepRequest
    # Called on the worker thread with the response or the exception, once.
    on_done: StepCallback


class StepPipeline:
    def __init__(self, runner: ModelRunner, worker: ThreadPoolExecutor, overlap: bool):
        self._runner = runner
        self._worker = worker
        self._overlap = overlap
        self._queue: deque[StreamedStep] = deque()
        self._lock = threading.Condition()
        self._draining = False  # a drain job is queued or running on the worker
        # Worker thread only: the step launched and not yet answered, and once settled, its
        # settled step or the exception settling raised.
        self._launched: tuple[StreamedStep, LaunchedStep] | None = None
        self._settled: tuple[LaunchedStep | None, BaseException | None] | None = None

    def submit(self, step: StreamedStep) -> None:
        """Queues a step (from any thread); the worker runs it after those submitted before."""
        with self._lock:
            self._queue.append(step)
            if self._draining:
                self._lock.notify()
                return
            self._draining = True
        self._worker.submit(self._drain)

    def _next(self) -> StreamedStep | None:
        """The next queued step; None when there is none. While a launched step runs, waits
        for the next step until the launched one is done. Ends the drain when idle."""
        with self._lock:
            while not self._queue and self._running():
                self._lock.wait(POLL_S)
            if self._queue:
                return self._queue.popleft()
            if self._launched is None:
                self._draining = False
            return None

    def _running(self) -> bool:
        """A launched step is still running on the device."""
        return self._launched is not None and not self._runner.finished(self._launched[1])

    def _drain(self) -> None:
        """Worker thread: runs queued steps until the queue is empty and every step answered.
        Other worker jobs (Warmup, ClearCache) run between drains, never inside one."""
        try:
            while True:
                step = self._next()
                if step is None:
                    if self._launched is None:
                        return
                    self._settle()  # it is done and nothing came to overlap with: answer it
                    continue
                if not self._overlap:
                    self._settle()
                try:
                    launched = self._runner.launch(step.request, settle=self._settle_only)
                except BaseException as exc:  # answered in order, after the step before it
                    self._settle()
                    step.on_done(None, exc)
                    continue
                self._settle()
                self._launched = (step, launched)
        except BaseException:  # a callback failed: never leave the pipeline stuck
            log.exception("the step pipeline stopped")
            with self._lock:
                self._draining = False
            raise

    def _settle_only(self) -> None:
        """Settles the launched step, if any, without answering it yet."""
        if self._launched is None or self._settled is not None:
            return
        try:
            self._settled = (self._runner.settle(self._launched[1]), None)
        except BaseException as exc:
            self._settled = (None, exc)

    def _settle(self) -> None:
        """Settles (unless done already) and answers the launched step, if any."""
        if self._launched is None:
            return
        self._settle_only()
        step = self._launched[0]
        settled, error = self._settled
        self._launched = self._settled = None
        if error is not None:
            step.on_done(None, error)
            return
        try:
            response = self._runner.answer(settled)
        except BaseException as exc:
            step.on_done(None, exc)
            return
        step.on_done(response, None)
