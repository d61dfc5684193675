"""Run batches of sandbox jobs with a cap on how many run at once.

Classes: :class:`ExecutorPool`.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from tqdm.auto import tqdm

from wmrl_envs.sandbox.base import ExecutionResult, Executor, Job

__all__ = ["ExecutorPool"]


class ExecutorPool:
    """Submit :class:`Job` s to any :class:`Executor`, at most ``max_concurrent`` at a time.

    Runs are subprocess- or container-bound, so threads suffice; the executor must be
    thread-safe (both built-in backends are).

    Args:
        executor: the backend every job runs on.
        max_concurrent: most runs in flight at once (>= 1).
        progress: show a tqdm bar in :meth:`map`.

    >>> from wmrl_envs.sandbox import LocalExecutor
    >>> with ExecutorPool(LocalExecutor(), max_concurrent=2) as pool:
    ...     results = pool.map([Job("print(1)"), Job("raise SystemExit(3)")])
    >>> [r.status for r in results]
    ['ok', 'error']
    """

    def __init__(self, executor: Executor, max_concurrent: int = 2, *, progress: bool = False):
        if not isinstance(executor, Executor):
            raise TypeError(f"executor must implement Executor.run, got {type(executor).__name__}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an int >= 1, got {max_concurrent!r}")
        self.executor = executor
        self.max_concurrent = max_concurrent
        self.progress = progress
        self._threads = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="wmrl-sandbox")

    def submit(self, job: Job) -> Future[ExecutionResult]:
        """Queue one job; the future resolves to its :class:`ExecutionResult`."""
        if not isinstance(job, Job):
            raise TypeError(f"ExecutorPool.submit expects a Job, got {type(job).__name__}")
        return self._threads.submit(
            self.executor.run, job.script, inputs=job.inputs, outputs=job.outputs, limits=job.limits
        )

    def map(self, jobs: Iterable[Job]) -> list[ExecutionResult]:
        """Run all jobs; results in job order. Re-raises the first job that raised (bad input)."""
        futures = [self.submit(job) for job in jobs]
        bar = tqdm(total=len(futures), desc="sandbox runs", disable=not self.progress)
        try:
            for future in futures:
                future.add_done_callback(lambda _: bar.update(1))
            return [future.result() for future in futures]
        finally:
            bar.close()

    def close(self, wait: bool = True) -> None:
        """Stop accepting jobs; with ``wait``, block until queued ones finish."""
        self._threads.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> ExecutorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
