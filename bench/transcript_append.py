"""Transcript appends on one long session: requests, bytes and time per append, early against
late, on S3 (moto) and on the local folder store.

The goal: an append costs the same for the 10,000th message of a session as for the 10th, in
requests and bytes (`storage.transcripts`: one segment object per append, no read).

For each backend it appends `--messages` messages to one session in batches of `--batch` (a
turn appends the user's message and the answer together), every message `--chars` characters
of content, and meters every append on its own (appends run one after another):

- S3: moto in server mode, a process of its own on a free loopback port, fake credentials.
  Every HTTP request the store sends (retries included) is counted: botocore's by boto3 event
  hooks on the store's client, the segments' signed PUTs by aiohttp's trace hooks: requests
  by operation, request bytes (header lines and the body) and response bytes (header lines
  and Content-Length), so the request line and TCP framing are not included;
- local: a temporary folder; the process's write and read system calls and bytes from
  `/proc/self/io` (Linux only), all threads included. The fsyncs, renames and directory
  operations are system calls that it does not count; the meter's own reads of
  `/proc/self/io` are in the figures, and measured alone as `meter_overhead`;
- both: milliseconds per append (the awaited `append_lines`).

It reports the mean per append over an early window (appends `--early-start` to
`--early-start + --window - 1`) and over the last `--window` appends, the late/early ratios,
and ms p50/p95. Then it reads the whole transcript back once (`read_transcript`), checks that
every line is there in order, and reports that read's time (and on S3 its requests).

Run it:

    .venv/bin/python bench/transcript_append.py
    .venv/bin/python bench/transcript_append.py --messages 2000 --backends s3

One JSON object goes to stdout, progress to stderr. The exit code is 1 when the goal is not met
(a late append sends more requests or more than 1% more bytes than an early one), 2 when the
benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import boto3
from benchkit import BenchError, progress, run_and_print_json
from processes import BUCKET, REGION, create_bucket, moto_server, use_fake_aws_credentials

from errors import StorageError
from storage.local_transcripts import LocalTranscriptStore
from storage.s3_transcripts import S3TranscriptStore
from storage.transcripts import SessionRef, TranscriptLine, TranscriptStore, parse_transcript

REF = SessionRef("acme", "alice", "bench-session")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
BYTES_TOLERANCE = 1.01
PROGRESS_EVERY = 1000  # appends


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The command line, validated."""

    messages: int
    batch: int
    chars: int
    window: int
    early_start: int
    backends: tuple[str, ...]


Metrics = dict[str, float]


# --- what is measured ---------------------------------------------------------------------


class RequestMeter:
    """Counts what an S3 store sends and receives: boto3's requests from its event hooks, the
    segments' signed PUTs (`storage.s3_put`, aiohttp) from aiohttp's trace hooks (`trace`)."""

    def __init__(self) -> None:
        self.operations: Counter[str] = Counter()
        self.request_bytes = 0
        self.response_bytes = 0
        self.trace = aiohttp.TraceConfig()
        self.trace.on_request_headers_sent.append(self._http_sent)
        self.trace.on_request_chunk_sent.append(self._http_chunk)
        self.trace.on_request_end.append(self._http_received)

    def attach(self, boto_session: boto3.session.Session) -> None:
        """Count every request of the S3 clients made from `boto_session` from now on
        (botocore's retries each count)."""
        boto_session.events.register("before-send.s3", self._sent)
        boto_session.events.register("response-received.s3", self._received)

    def _sent(self, request: Any, event_name: str, **_: Any) -> None:
        self.operations[event_name.rsplit(".", 1)[-1]] += 1
        self.request_bytes += _header_bytes(request.headers)
        self.request_bytes += int(request.headers.get("Content-Length", 0) or 0)

    def _received(self, response_dict: dict[str, Any] | None = None, **_: Any) -> None:
        if response_dict is None:  # no answer (a connection error): nothing was received
            return
        headers = response_dict.get("headers", {})
        self.response_bytes += _header_bytes(headers)
        self.response_bytes += int(headers.get("content-length", 0) or 0)

    async def _http_sent(self, _session: Any, _context: Any, params: Any) -> None:
        # The signed path sends segments' PUTs and nothing else.
        self.operations["PutObject" if params.method == "PUT" else params.method] += 1
        self.request_bytes += _header_bytes(params.headers)

    async def _http_chunk(self, _session: Any, _context: Any, params: Any) -> None:
        self.request_bytes += len(params.chunk)

    async def _http_received(self, _session: Any, _context: Any, params: Any) -> None:
        headers = params.response.headers
        self.response_bytes += _header_bytes(headers)
        self.response_bytes += int(headers.get("Content-Length", 0) or 0)

    def snapshot(self) -> Metrics:
        """The totals so far."""
        return {
            "requests": float(sum(self.operations.values())),
            "request_bytes": float(self.request_bytes),
            "response_bytes": float(self.response_bytes),
            **{f"op_{name}": float(count) for name, count in self.operations.items()},
        }


def _header_bytes(headers: Any) -> int:
    """The size of the header lines as sent: `Name: value\\r\\n` each."""
    return sum(len(str(name)) + len(_text(value)) + 4 for name, value in headers.items())


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def process_io() -> Metrics:
    """This process's system-call I/O so far (all threads), from `/proc/self/io`."""
    try:
        text = Path("/proc/self/io").read_text(encoding="ascii")
    except OSError:
        return {}
    fields = dict(line.split(": ") for line in text.splitlines())
    return {
        "write_syscalls": float(fields["syscw"]),
        "bytes_written": float(fields["wchar"]),
        "read_syscalls": float(fields["syscr"]),
        "bytes_read": float(fields["rchar"]),
    }


def meter_overhead(rounds: int = 50) -> Metrics:
    """What measuring nothing shows: the meter's own reads of `/proc/self/io`."""
    deltas: list[Metrics] = []
    for _ in range(rounds):
        before, after = process_io(), process_io()
        deltas.append({name: after[name] - before[name] for name in after})
    names = deltas[0].keys() if deltas else []
    return {name: round(statistics.fmean(d[name] for d in deltas), 1) for name in names}


def turn(first_seq: int, size: int, chars: int) -> list[TranscriptLine]:
    """`size` messages from `first_seq` on, alternately the user's and the assistant's; every
    line has the same length whatever its sequence number, so appends can be compared."""
    return [
        TranscriptLine(
            msg_id=f"m{seq:010d}",
            role="user" if (seq - first_seq) % 2 == 0 else "assistant",
            channel="web",
            thread_id=None,
            content="x" * chars,
            timestamp=T0,
            tokens=chars // 4,
        )
        for seq in range(first_seq, first_seq + size)
    ]


async def append_all(
    store: TranscriptStore, settings: BenchSettings, meter: Callable[[], Metrics], label: str
) -> list[Metrics]:
    """Append every batch in order; what each append cost."""
    costs = []
    for first_seq in range(1, settings.messages + 1, settings.batch):
        size = min(settings.batch, settings.messages - first_seq + 1)
        lines = turn(first_seq, size, settings.chars)
        before = meter()
        started = time.perf_counter()
        await store.append_lines(REF, lines, first_seq=first_seq)
        elapsed = time.perf_counter() - started
        after = meter()
        cost = {name: after[name] - before.get(name, 0.0) for name in after}
        costs.append({"ms": elapsed * 1000, **cost})
        if len(costs) % PROGRESS_EVERY == 0:
            progress(f"{label}: {len(costs)} appends ({first_seq + size - 1} messages)")
    return costs


async def read_back(store: TranscriptStore, settings: BenchSettings) -> float:
    """Read the whole transcript once and check it; the milliseconds it took."""
    started = time.perf_counter()
    data = await store.read_transcript(REF)
    elapsed = time.perf_counter() - started
    lines = parse_transcript(data)
    expected = [f"m{seq:010d}" for seq in range(1, settings.messages + 1)]
    if [line.msg_id for line in lines] != expected:
        raise BenchError(f"the transcript read back has {len(lines)} lines, not 1..N in order")
    return elapsed * 1000


# --- summaries ----------------------------------------------------------------------------


def window(costs: Sequence[Metrics], first: int, count: int) -> dict[str, Any]:
    """Means per append over `costs[first:first + count]`, and the ms percentiles."""
    chosen = costs[first : first + count]
    names = sorted({name for cost in chosen for name in cost})
    summary: dict[str, Any] = {"appends": [first + 1, first + len(chosen)]}
    for name in names:
        summary[name] = round(statistics.fmean(cost.get(name, 0.0) for cost in chosen), 3)
    ms = sorted(cost["ms"] for cost in chosen)
    summary["ms_p50"] = round(ms[len(ms) // 2], 3)
    summary["ms_p95"] = round(ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))], 3)
    return summary


def compare(
    costs: Sequence[Metrics], settings: BenchSettings, keys: Sequence[str]
) -> dict[str, Any]:
    """The early and late windows, and late/early for `keys` and ms."""
    early = window(costs, settings.early_start - 1, settings.window)
    late = window(costs, len(costs) - settings.window, settings.window)
    ratios = {}
    for name in [*keys, "ms"]:
        if early.get(name):
            ratios[name] = round(late.get(name, 0.0) / early[name], 3)
    return {"early": early, "late": late, "late_over_early": ratios}


def goal_met(result: dict[str, Any], request_key: str | None, byte_keys: Sequence[str]) -> bool:
    """Late appends send no more requests, and at most 1% more bytes, than early ones."""
    early, late = result["early"], result["late"]
    if request_key is not None and late.get(request_key, 0) > early.get(request_key, 0):
        return False
    return all(late.get(k, 0) <= early.get(k, 0) * BYTES_TOLERANCE for k in byte_keys)


# --- the backends -------------------------------------------------------------------------


async def run_s3(settings: BenchSettings, workdir: Path) -> dict[str, Any]:
    """Appends to S3 on moto, metered per request."""
    use_fake_aws_credentials()
    with moto_server(workdir) as moto:
        url = moto.url
        boto_session = boto3.session.Session(region_name=REGION)
        # Through the metered session: it resolves its credentials now, not in the first
        # measured request (which would then carry a longer User-Agent).
        create_bucket(url, boto_session)
        meter = RequestMeter()
        meter.attach(boto_session)
        store = S3TranscriptStore(
            BUCKET, endpoint_url=url, boto_session=boto_session, http_trace_configs=[meter.trace]
        )
        try:
            progress(f"s3: appending {settings.messages} messages on moto at {url}")
            costs = await append_all(store, settings, meter.snapshot, "s3")
            before = meter.snapshot()
            read_ms = await read_back(store, settings)
            read_requests = meter.snapshot()["requests"] - before["requests"]
        finally:
            await store.close()
    keys = ["requests", "request_bytes", "response_bytes"]
    result = compare(costs, settings, keys)
    result["read_transcript"] = {
        "ms": round(read_ms, 1),
        "requests": int(read_requests),
        "segments": len(costs),
    }
    result["goal_met"] = goal_met(result, "requests", ["request_bytes", "response_bytes"])
    return result


async def run_local(settings: BenchSettings, workdir: Path) -> dict[str, Any]:
    """Appends to the local folder store, metered by the process's system-call I/O."""
    store = LocalTranscriptStore(workdir / "transcripts")
    progress(f"local: appending {settings.messages} messages under {workdir}")
    costs = await append_all(store, settings, process_io, "local")
    read_ms = await read_back(store, settings)
    keys = ["write_syscalls", "bytes_written", "read_syscalls", "bytes_read"]
    result = compare(costs, settings, keys)
    result["read_transcript"] = {"ms": round(read_ms, 1), "segments": len(costs)}
    result["meter_overhead"] = meter_overhead()
    if not process_io():
        result["note"] = "/proc/self/io is not available: only time was measured"
        result["goal_met"] = None
    else:
        result["goal_met"] = goal_met(result, "write_syscalls", ["bytes_written"])
    return result


async def run(settings: BenchSettings) -> dict[str, Any]:
    """Every backend asked for, one after the other."""
    result: dict[str, Any] = {
        "settings": {
            "messages": settings.messages,
            "batch": settings.batch,
            "chars": settings.chars,
            "window": settings.window,
            "early_start": settings.early_start,
            "appends": -(-settings.messages // settings.batch),
        },
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    with tempfile.TemporaryDirectory(prefix="gateway-transcripts-") as folder:
        for backend in settings.backends:
            workdir = Path(folder) / backend
            workdir.mkdir()
            runner = run_s3 if backend == "s3" else run_local
            result[backend] = await runner(settings, workdir)
    return result


def parse_settings(argv: Sequence[str] | None) -> BenchSettings:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Transcript appends on one long session: requests, bytes, ms per append."
    )
    parser.add_argument("--messages", type=int, default=10_000, help="messages (10000)")
    parser.add_argument("--batch", type=int, default=2, help="messages per append (2: a turn)")
    parser.add_argument("--chars", type=int, default=300, help="characters per message (300)")
    parser.add_argument("--window", type=int, default=50, help="appends per window (50)")
    parser.add_argument(
        "--early-start", type=int, default=10, help="first append of the early window (10)"
    )
    parser.add_argument("--backends", default="s3,local", help="comma-separated: s3, local (both)")
    args = parser.parse_args(argv)
    backends = tuple(name.strip() for name in args.backends.split(",") if name.strip())
    if not backends or set(backends) - {"s3", "local"}:
        parser.error("--backends: s3, local or both")
    if min(args.messages, args.batch, args.window, args.early_start) < 1 or args.chars < 0:
        parser.error("--messages, --batch, --window and --early-start must be positive")
    appends = -(-args.messages // args.batch)
    if args.early_start - 1 + args.window > appends - args.window:
        parser.error(
            f"{appends} appends are too few for an early window at {args.early_start} and a "
            f"late window of {args.window} that do not overlap: raise --messages"
        )
    return BenchSettings(
        messages=args.messages,
        batch=args.batch,
        chars=args.chars,
        window=args.window,
        early_start=args.early_start,
        backends=backends,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures as JSON."""
    settings = parse_settings(argv)

    def verdict(result: dict[str, Any]) -> int:
        met = [result[backend]["goal_met"] for backend in settings.backends]
        return 1 if False in met else 0

    return run_and_print_json(
        lambda: asyncio.run(run(settings)), verdict, could_not_run=(BenchError, StorageError)
    )


if __name__ == "__main__":
    sys.exit(main())
