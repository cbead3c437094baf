"""`FileReader`: `read_file` run in a child process, so that a hostile file can neither hang
the gateway (a parser stuck in a loop is killed at the time limit) nor exhaust its memory
(the child's address space is capped), and extraction never holds the event loop.

The child is started once and reused (starting one costs far more than reading a typical
file); a child that timed out, ran out of memory or died is killed, and the next read starts
a new one. One file is read at a time per reader: extraction is CPU work, and the gateway's
two cores are better spent on turns than on a second parser.

`multiprocessing.Pool` is not used: terminating it while a large task sits in its queue can
block forever, and a worker that dies while unpickling a task leaves its result unanswered.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from sessions.files.kinds import sniff
from sessions.files.limits import FileText, ReadLimits

MEMORY_LIMIT_BYTES = 2 * 1024 * 1024 * 1024
FILES_PER_CHILD = 200  # the child is replaced now and then, so no parser's leak accumulates
OUT_OF_MEMORY = "it needs too much memory to read"


def _serve(connection: Connection, memory_limit: int) -> None:
    """The child: read files sent over the pipe until it closes (or memory runs out)."""
    # The parsers are imported here, in the child only: the gateway process never needs them.
    from sessions.files.extract import read_file  # noqa: PLC0415

    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        except MemoryError:
            connection.send(None)  # the file itself did not fit
            return
        data, name, declared_type, limits = request
        try:
            connection.send(read_file(data, name, declared_type, limits))
        except MemoryError:
            del data, request
            connection.send(None)
            return  # a process that ran out of memory is not trusted with the next file


class FileReader:
    """Reads files in a child process, one at a time, with a time limit per file."""

    def __init__(
        self, limits: ReadLimits | None = None, *, memory_limit: int = MEMORY_LIMIT_BYTES
    ) -> None:
        self.limits = limits or ReadLimits()
        self.memory_limit = memory_limit
        self._child: tuple[BaseProcess, Connection] | None = None
        self._served = 0
        self._lock = asyncio.Lock()

    async def read(self, data: bytes, name: str = "", declared_type: str = "") -> FileText:
        """The file's text, or the problem ("it took too long to read", …)."""
        async with self._lock:
            problem = await asyncio.to_thread(self._exchange, data, name, declared_type)
        if isinstance(problem, FileText):
            return problem
        found = sniff(data, name, declared_type)
        return FileText(found.kind, found.media_type, problem=problem)

    def close(self) -> None:
        """Stop the child (the next read starts a new one)."""
        if self._child is not None:
            process, connection = self._child
            self._child = None
            connection.close()
            process.kill()
            process.join()

    def _exchange(self, data: bytes, name: str, declared_type: str) -> FileText | str:
        """In a worker thread: send the file, wait for its text within the time limit."""
        if self._child is None or not self._child[0].is_alive():
            self.close()
            self._start()
        assert self._child is not None
        _process, connection = self._child
        try:
            connection.send((data, name, declared_type, self.limits))
            if not connection.poll(self.limits.seconds):
                self.close()
                return "it took too long to read"
            answer = connection.recv()
        except (EOFError, OSError):
            self.close()  # the child died: out of memory while receiving, or killed
            return OUT_OF_MEMORY
        if answer is None:
            self.close()
            return OUT_OF_MEMORY
        self._served += 1
        if self._served >= FILES_PER_CHILD:
            self.close()
        return answer  # type: ignore[no-any-return]

    def _start(self) -> None:
        # Spawned, not forked: a fork of a process with an event loop and driver threads
        # may inherit locks held by threads that do not exist in the child.
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve, args=(child, self.memory_limit), name="file-reader", daemon=True
        )
        process.start()
        child.close()
        self._child = (process, parent)
        self._served = 0
