"""A Spark job that is an Application-Agent: queries over the bus, answers in parts.

::

    spark = session("analytics-agent")
    agent = SparkApplicationAgent(
        spark, "analytics", credentials, ["wss://broker-a/tube"],
        tables={"events": spark.read.parquet("/data/events")},
    )

    @agent.respondent("analytics.top_pages")
    def top_pages(spark: SparkSession, request: Request) -> DataFrame:
        return spark.table("pages").orderBy("hits", ascending=False).limit(10)

    agent.run()  # until SIGINT/SIGTERM or agent.close()

Theory of operation
-------------------
The agent is an :class:`~agents.agent.ApplicationAgent` on an asyncio loop
(:meth:`SparkApplicationAgent.run` in the calling thread,
:meth:`~SparkApplicationAgent.start` in a background thread, or
:meth:`~SparkApplicationAgent.serve` on a loop of your own). Spark calls block
for as long as a job runs, so none of them runs on the loop: every request's
Spark work (building the DataFrame, counting it, fetching each part's rows)
goes to a pool of ``workers`` threads, and the loop only sends parts and keeps
the Tubes alive. Each request's jobs run in a Spark job group of their own,
cancelled when the request is (the agent shutting down past its timeout).

It serves ``analytics.query`` (the JSON query language of
``agents.spark.query``, over the tables it was given) and any Spark
Respondents added with :meth:`~SparkApplicationAgent.respondent`: plain
functions ``(spark, request) -> DataFrame | rows`` run in the pool.

Every answer is a stream (``agents.spark.parts`` has the format): the agent
first counts the result, up to ``max_rows + 1`` rows, which fixes ``t``, the
number of parts, then fetches rows with ``DataFrame.toLocalIterator()`` one
part at a time, so the driver holds one Spark partition and one part, never
the whole result, and a part is only fetched once the previous one is on its
way. A result over ``max_rows`` is cut to ``max_rows`` rows and says so
(``truncated``). Should the data change between the count and the fetch so
that fewer rows come than were counted, the answer ends in fault 2107; rows
beyond the count are left out (the count is the snapshot ``t`` announced).
The count is a second pass over the data: the price of announcing ``t`` up
front without holding the result in the driver (``cache()`` a table that many
queries read). A request without ``u`` is not run at all: nothing could match
its parts to it.

Faults: a bad query, or a :class:`QueryError` from a Spark Respondent, is that
error's code (1201 for a malformed query) with its message; a part larger than
``max_part_bytes`` is fault 1101; any other failure is fault 2107 with a fixed
message (the traceback goes to the log). The agent keeps serving after each.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import signal
import ssl as ssl_module
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

from pyspark.sql import DataFrame, SparkSession

from agents.agent import ApplicationAgent
from agents.backoff import Backoff
from agents.credentials import AgentCredentialSource
from agents.errors import AgentError
from agents.respondent import Request
from agents.spark.parts import MIME_TYPE, ColumnInfo, encode_part, json_row
from agents.spark.query import Query, QueryError
from asbp import Command, FaultCode
from asbp.grammar import KiB

__all__ = [
    "QUERY",
    "SparkApplicationAgent",
    "SparkHandler",
    "SparkResult",
    "TableSource",
]

#: The Command-Name of the built-in query Respondent.
QUERY: Final = "analytics.query"

#: What a Spark Respondent returns: a DataFrame, or rows (pyspark Rows or mappings).
SparkResult: TypeAlias = DataFrame | Iterable[Any]
#: A Spark Respondent: ``def handler(spark, request) -> SparkResult``, run in a worker thread.
SparkHandler: TypeAlias = Callable[[SparkSession, Request], SparkResult]
#: A table ``analytics.query`` may read: a DataFrame, or the name of a table or view.
TableSource: TypeAlias = DataFrame | str

_S = TypeVar("_S", bound=SparkHandler)
_T = TypeVar("_T")


@dataclass(slots=True)
class _Prepared:
    """A counted result, ready to be fetched part by part."""

    columns: tuple[ColumnInfo, ...]
    rows: Iterator[Any]
    row_count: int
    truncated: bool
    total: int

    def close(self) -> None:
        close = getattr(self.rows, "close", None)
        if close is not None:
            close()  # for toLocalIterator: tells the JVM to stop serving partitions


class SparkApplicationAgent:
    """An Application-Agent whose Respondents run Spark jobs and answer in parts.

    Args:
        spark: the job's SparkSession (the agent never stops it).
        identity: the agent's identity; must match ``credentials``.
        credentials: mints a credential for every connection attempt.
        urls: the brokers' Tube endpoints, one Tube each.
        ssl: TLS context for ``wss://`` URLs.
        tables: what ``analytics.query`` may read, by the name queries use.
        query_name: the Command-Name of the query Respondent; None to not
            serve one.
        rows_per_part: rows in each part of an answer.
        max_rows: rows in an answer at most; a larger result is cut short and
            marked ``truncated``.
        max_part_bytes: the largest part body sent; keep it under the
            brokers' frame limit (256 KiB by default) less a header.
        workers: requests whose Spark work runs at once.
        max_concurrency: requests taken at once (the rest wait at the broker).
        backoff: delays between reconnect attempts.
        timeout: seconds for handshakes and broker acknowledgements.
        close_timeout: seconds :meth:`close` lets requests in progress finish
            before their Spark jobs are cancelled.
        logger: where to log; ``asbp.spark.agent`` by default.

    Raises:
        ValueError: a limit below 1, or what ``ApplicationAgent`` refuses.
    """

    def __init__(
        self,
        spark: SparkSession,
        identity: str,
        credentials: AgentCredentialSource,
        urls: Sequence[str],
        *,
        ssl: ssl_module.SSLContext | None = None,
        tables: Mapping[str, TableSource] | None = None,
        query_name: str | None = QUERY,
        rows_per_part: int = 500,
        max_rows: int = 100_000,
        max_part_bytes: int = 250 * KiB,
        workers: int = 2,
        max_concurrency: int = 32,
        backoff: Backoff | None = None,
        timeout: float = 10.0,
        close_timeout: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        for name, value in (
            ("rows_per_part", rows_per_part),
            ("max_rows", max_rows),
            ("max_part_bytes", max_part_bytes),
            ("workers", workers),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1")
        if isinstance(urls, str) or not urls:
            raise ValueError("urls must be a non-empty sequence of broker Tube URLs")
        if identity != credentials.identity:
            raise ValueError(
                f"identity {identity!r} does not match the credentials' {credentials.identity!r}"
            )
        self.spark = spark
        self.identity = identity
        self.rows_per_part = rows_per_part
        self.max_rows = max_rows
        self.max_part_bytes = max_part_bytes
        self._credentials = credentials
        self._urls = list(urls)
        self._agent_options: dict[str, Any] = {
            "ssl": ssl,
            "backoff": backoff,
            "max_concurrency": max_concurrency,
            "timeout": timeout,
        }
        self._close_timeout = close_timeout
        self._log = logger or logging.getLogger("asbp.spark.agent")
        self._tables: dict[str, TableSource] = dict(tables or {})
        self._handlers: dict[str, SparkHandler] = {}
        self._query_name = query_name
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"asbp-spark-{identity}")
        # Set once serve() runs: the loop, the agent and the stop signal live there.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agent: ApplicationAgent | None = None
        self._stop: asyncio.Event | None = None
        self._serving = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closing = False

    def __repr__(self) -> str:
        return f"<SparkApplicationAgent {self.identity!r}>"

    # -- what it serves ------------------------------------------------------

    def add_table(self, name: str, source: TableSource) -> None:
        """Let ``analytics.query`` read ``source`` as ``name`` (replacing any such table).

        A name (``str``) is looked up in Spark's catalog at each query, so a
        view replaced later is picked up.
        """
        self._tables[name] = source

    @property
    def tables(self) -> frozenset[str]:
        """The names ``analytics.query`` accepts for ``table``."""
        return frozenset(self._tables)

    def respondent(self, name: str) -> Callable[[_S], _S]:
        """Decorator: serve ``name`` with a Spark handler.

        The handler runs in a worker thread with the SparkSession and the
        :class:`~agents.respondent.Request` (read ``request.body`` and the
        other attributes; it answers by returning, not by calling the
        request's async methods). It returns a DataFrame or an iterable of
        Rows or mappings, which is sent back in parts; it may raise
        :class:`QueryError` to answer with that fault.

        Raises:
            ValueError: ``name`` is already served or not a valid name.
        """

        def decorate(handler: _S) -> _S:
            self.add_respondent(name, handler)
            return handler

        return decorate

    def add_respondent(self, name: str, handler: SparkHandler) -> None:
        """Serve ``name`` with ``handler``; see :meth:`respondent`.

        Raises:
            ValueError: ``name`` is already served or not a valid name.
        """
        if name in self._handlers or name == self._query_name:
            raise ValueError(f"{name!r} is already served")
        loop, agent = self._loop, self._agent
        if agent is not None and loop is not None:
            if self._on_agent_thread():
                agent.add_respondent(name, self._respondent_for(handler))
            else:
                # Register on the agent's own loop, and wait for its verdict.
                async def add() -> None:
                    agent.add_respondent(name, self._respondent_for(handler))

                asyncio.run_coroutine_threadsafe(add(), loop).result()
        self._handlers[name] = handler

    # -- life cycle ----------------------------------------------------------

    @property
    def application_agent(self) -> ApplicationAgent:
        """The underlying ApplicationAgent (its ``tubes``, ``state``...), once serving.

        Raises:
            AgentError: not serving yet.
        """
        if self._agent is None:
            raise AgentError("the agent is not serving yet")
        return self._agent

    async def serve(self) -> None:
        """Serve on the running loop until :meth:`close` (or cancellation), then shut down.

        Raises:
            AgentError: already serving, or closed.
        """
        if self._loop is not None or self._closing:
            raise AgentError("a SparkApplicationAgent serves once")
        loop = asyncio.get_running_loop()
        agent = ApplicationAgent(
            self.identity, self._credentials, self._urls, logger=self._log, **self._agent_options
        )
        if self._query_name is not None:
            agent.add_respondent(self._query_name, self._answer_query)
        for name, handler in self._handlers.items():
            agent.add_respondent(name, self._respondent_for(handler))
        stop = asyncio.Event()
        self._loop, self._agent, self._stop = loop, agent, stop
        self._serving.set()
        try:
            await agent.start()
            try:
                await stop.wait()
            finally:
                await agent.close(self._close_timeout)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._done.set()

    def start(self) -> None:
        """Serve in a background thread with its own loop; returns once it runs.

        Use :meth:`wait_registered` to wait for the brokers, :meth:`close` to stop.

        Raises:
            AgentError: already started, or the agent failed to start.
        """
        if self._thread is not None or self._loop is not None:
            raise AgentError("a SparkApplicationAgent serves once")
        self._thread = threading.Thread(
            target=self._run_thread, name=f"asbp-spark-agent {self.identity}", daemon=True
        )
        self._thread.start()
        self._serving.wait()
        if self._error is not None:
            raise AgentError("the agent failed to start") from self._error

    def wait_registered(self, timeout: float | None = None) -> None:
        """Block until every Tube is open with every Respondent registered.

        Raises:
            AgentError: not serving, or closing.
            TimeoutError: not within ``timeout`` seconds.
        """
        agent, loop = self.application_agent, self._loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(agent.wait_registered(timeout), loop).result()

    def run(self) -> None:
        """Serve in this thread until :meth:`close`, SIGINT or SIGTERM; then shut down."""

        async def serve_until_signalled() -> None:
            loop = asyncio.get_running_loop()
            if threading.current_thread() is threading.main_thread():
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, self._request_stop)
            await self.serve()

        asyncio.run(serve_until_signalled())

    def close(self, timeout: float | None = None) -> None:
        """Stop serving: unregister, let requests in progress finish, close the Tubes.

        Safe to call from any thread and more than once. From a thread other
        than the agent's, it returns once the agent has shut down.

        Args:
            timeout: seconds for requests in progress (default: ``close_timeout``);
                their Spark jobs are cancelled after that.
        """
        if timeout is not None:
            self._close_timeout = timeout
        self._closing = True
        self._request_stop()
        if self._loop is None:
            self._pool.shutdown(wait=False)
            return
        if self._on_agent_thread():
            return
        self._done.wait()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> SparkApplicationAgent:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run_thread(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as exc:
            self._error = exc
            self._log.exception("agent %s: stopped by an error", self.identity)
        finally:
            self._serving.set()
            self._done.set()

    def _request_stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is None or stop is None:
            return
        if self._on_agent_thread():
            stop.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stop.set)

    def _on_agent_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    # -- answering -----------------------------------------------------------

    def _respondent_for(self, handler: SparkHandler) -> Callable[[Request], Awaitable[None]]:
        async def respond(request: Request) -> None:
            await self._respond(request, lambda: handler(self.spark, request))

        return respond

    async def _answer_query(self, request: Request) -> None:
        try:
            query = Query.parse(request.body)
        except QueryError as exc:
            await self._fault(request, exc.code, exc.message)
            return
        await self._respond(request, lambda: query.apply(self._table(query.table)))

    def _table(self, name: str) -> DataFrame:
        source = self._tables.get(name)
        if source is None:
            raise QueryError(f"no table {name!r}; this agent serves {sorted(self._tables)}")
        if isinstance(source, str):
            return self.spark.table(source)
        return source

    async def _respond(self, request: Request, produce: Callable[[], SparkResult]) -> None:
        """Run ``produce`` in the pool and stream its rows to the requester."""
        if request.command_id is None:
            # Its parts could not be matched to it: not worth a Spark job.
            self._log.info("agent %s: ignored %r: it has no 'u'", self.identity, request)
            return
        group = f"asbp-{uuid.uuid4().hex}"
        started = time.monotonic()
        prepared: _Prepared | None = None
        try:
            prepared = await self._in_pool(group, self._prepare, group, request, produce)
            await request.stream(self._parts(group, prepared), total=prepared.total)
        except QueryError as exc:
            await self._fault(request, exc.code, exc.message)
        except AgentError as exc:  # the Tube closed: nobody to answer any more
            self._log.info("agent %s: could not answer %r: %s", self.identity, request, exc)
        except Exception:
            self._log.exception("agent %s: the Spark work for %r failed", self.identity, request)
            message = f"the Spark work for {request.name!r} failed"
            await self._fault(request, FaultCode.RESPONDENT_FAILED, message)
        else:
            self._log.info(
                "agent %s: answered %r with %d rows in %d parts in %.3f s",
                self.identity,
                request,
                prepared.row_count,
                prepared.total,
                time.monotonic() - started,
            )
        finally:
            if prepared is not None:
                with contextlib.suppress(Exception):  # only the iterator's clean-up
                    await self._in_pool(group, prepared.close)

    async def _fault(self, request: Request, code: int, message: str) -> None:
        if request.command_id is None or not request.answerable:
            return
        try:
            await request.fault(code, message)
        except AgentError as exc:
            self._log.info("agent %s: could not answer %r: %s", self.identity, request, exc)

    async def _in_pool(self, group: str, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` in the Spark pool; cancelling it cancels the request's Spark jobs."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, work, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The thread cannot be stopped, but its Spark jobs can; then let it
            # return, so nothing else touches the request's iterator meanwhile.
            self.spark.sparkContext.cancelJobGroup(group)
            await asyncio.wait({future}, timeout=self._close_timeout)
            if future.done() and not future.cancelled():
                future.exception()  # expected (the job was cancelled); seen, not logged
            raise

    def _prepare(
        self, group: str, request: Request, produce: Callable[[], SparkResult]
    ) -> _Prepared:
        """In a worker thread: build the result, count it, open its row iterator."""
        context = self.spark.sparkContext
        # Not the Channel-Identifier: it is the key to an HTTP Channel's mailbox.
        context.setJobGroup(group, f"asbp {request.name} u={request.command_id}", True)
        result = produce()
        if isinstance(result, DataFrame):
            columns = tuple(ColumnInfo(f.name, f.dataType.simpleString()) for f in result.schema)
            counted = result.limit(self.max_rows + 1).count()
            row_count = min(counted, self.max_rows)
            # toLocalIterator fetches one partition at a time, when asked for it.
            rows: Iterator[Any] = result.toLocalIterator() if row_count else iter(())
        elif isinstance(result, Iterable) and not isinstance(result, str | bytes | Mapping):
            source = iter(result)
            try:
                kept = list(itertools.islice(source, self.max_rows + 1))
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
            counted = len(kept)
            row_count = min(counted, self.max_rows)
            first = json_row(kept[0]) if kept else {}
            columns = tuple(ColumnInfo(name) for name in first)
            rows = iter(kept)
        else:
            raise TypeError(f"a Spark Respondent returned {type(result).__name__}")
        total = max(1, math.ceil(row_count / self.rows_per_part))
        return _Prepared(columns, rows, row_count, counted > row_count, total)

    async def _parts(self, group: str, prepared: _Prepared) -> AsyncIterator[Command]:
        """The parts, each fetched in the pool only once the one before is sent."""
        bodies = self._bodies(prepared)
        while (body := await self._in_pool(group, next, bodies, None)) is not None:
            yield Command({"e": "UTF-8", "m": MIME_TYPE}, body)

    def _bodies(self, prepared: _Prepared) -> Iterator[bytes]:
        """In worker threads: one JSON body per part (see ``agents.spark.parts``)."""
        rows = itertools.islice(prepared.rows, prepared.row_count)
        position = 0
        taken = 0
        while position < prepared.total:
            batch = [json_row(row) for row in itertools.islice(rows, self.rows_per_part)]
            taken += len(batch)
            last = position + 1 == prepared.total
            if taken < (prepared.row_count if last else (position + 1) * self.rows_per_part):
                raise QueryError(
                    f"the data changed while it was read: {prepared.row_count} rows were "
                    f"counted, {taken} came; ask again",
                    FaultCode.RESPONDENT_FAILED,
                )
            position += 1
            first = position == 1
            body = encode_part(
                batch,
                columns=prepared.columns if first else None,
                row_count=prepared.row_count,
                truncated=prepared.truncated,
            )
            if len(body) > self.max_part_bytes:
                raise QueryError(
                    f"part {position} would be {len(body)} bytes, over this agent's limit of "
                    f"{self.max_part_bytes}; ask for fewer columns or rows",
                    FaultCode.INVALID_MESSAGE_SIZE,
                )
            yield body


if __name__ == "__main__":  # python -m agents.spark.agent, spark-submit agents/spark/agent.py
    from agents.spark.agent_cli import run

    raise SystemExit(run())
