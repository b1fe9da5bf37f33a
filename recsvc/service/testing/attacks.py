"""Attacks through the real channel, for the availability tests and ``scripts/bench/attack.py``:
raw HTTP/2 streams no gRPC client would send, and a process of heavy-draw attackers."""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

import grpc


class RawStreams:
    """gRPC calls as raw HTTP/2 frames on one TCP connection (stdlib only): for what a gRPC client
    never sends, e.g. a message that trickles in a few bytes at a time. Headers are sent as HPACK
    literals; the server's answers are not decoded, only which streams it has ended
    (:meth:`closed`: a frame with END_STREAM, or RST_STREAM)."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.sendall(self.PREFACE + _frame(4, 0, 0, b""))  # our SETTINGS: the defaults
        self._next = 1
        self._ended: set[int] = set()
        self.ended_at: dict[int, float] = {}  # stream id → time.monotonic() when its end was read
        self._buffer = b""

    def open(self, method: str, metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """Sends a call's HEADERS only (no message yet); returns its stream id."""
        sid, self._next = self._next, self._next + 2
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        block = b"".join(b"\x00" + _hpack_string(k) + _hpack_string(v) for k, v in headers)
        self.sock.sendall(_frame(1, 0x4, sid, block))  # HEADERS, END_HEADERS
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        """Sends ``data`` (part of a length-prefixed message, see :func:`grpc_frame`) on stream ``sid``."""
        self.sock.sendall(_frame(0, 0x1 if end else 0, sid, data))

    def closed(self, wait: float) -> set[int]:
        """Reads for ``wait`` seconds (answering SETTINGS and PING); the streams the server ended."""
        return self.until_closed(None, wait)

    def until_closed(self, ids: set[int] | None, within: float) -> set[int]:
        """Reads until the server has ended every stream of ``ids`` (``None``: never) or ``within``
        seconds have passed; the streams it ended. A stream's end time in :attr:`ended_at` is when
        it was read, never before the server sent it: a lower bound on how long the stream lived."""
        deadline = time.monotonic() + within
        while (ids is None or not ids <= self._ended) and (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            self._buffer += data
            while len(self._buffer) >= 9:
                length = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) < 9 + length:
                    break
                kind, flags = self._buffer[3], self._buffer[4]
                sid = int.from_bytes(self._buffer[5:9], "big") & 0x7FFFFFFF
                payload, self._buffer = self._buffer[9 : 9 + length], self._buffer[9 + length :]
                if kind == 4 and not flags & 0x1:  # SETTINGS: acknowledge
                    self.sock.sendall(_frame(4, 0x1, 0, b""))
                elif kind == 6 and not flags & 0x1:  # PING: answer
                    self.sock.sendall(_frame(6, 0x1, 0, payload))
                elif kind == 3 or (kind in (0, 1) and flags & 0x1):  # RST_STREAM, or END_STREAM
                    self._ended.add(sid)
                    self.ended_at.setdefault(sid, time.monotonic())
        return set(self._ended)

    def close(self) -> None:
        self.sock.close()


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def _hpack_string(text: str) -> bytes:
    """An HPACK string literal, not Huffman-coded: its length (a 7-bit-prefix integer), then the bytes."""
    raw = text.encode()
    n, out = len(raw), bytearray()
    if n < 127:
        out.append(n)
    else:
        out.append(127)
        n -= 127
        while n >= 128:
            out.append(n % 128 + 128)
            n //= 128
        out.append(n)
    return bytes(out) + raw


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: uncompressed flag, 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", 0, len(message)) + message


def heavy_attack(
    target: str,
    tokens: list[str],
    seconds: float,
    backoff: float,
    k: int,
    cands: list[tuple[str, float]],
    results: Any,
    stop: Any = None,
    refused: Any = None,
    deadline: float = 60.0,
) -> None:
    """Run in a process of its own (spawn): one thread per token sends `rs` at the γ floor with
    ``k`` and ε = 1e-3 over ``cands`` for user ``<token>`` (a `user:<token>` credential), back to
    back, for ``seconds`` or until the event ``stop`` is set, pausing ``backoff`` seconds after a
    refusal; sets the event ``refused`` at the first RESOURCE_EXHAUSTED (the heavy queue is full);
    puts ``{token: {status name: count}}`` on ``results`` once every call has ended (each has a
    ``deadline`` of that many seconds). A refusal's status name is followed by the flag its message
    names (``RESOURCE_EXHAUSTED --heavy-queue``)."""
    import re
    import threading
    from collections import Counter

    from recsvc.service.client import Client

    os.nice(19)  # the attackers' own CPU (their clients) would be on other hosts: only the server's is measured
    end = time.monotonic() + seconds
    out: dict[str, Counter[str]] = {t: Counter() for t in tokens}

    def attack(token: str) -> None:
        with Client(target, token=token, retries=0, timeout=deadline) as c:
            while time.monotonic() < end and not (stop is not None and stop.is_set()):
                try:
                    c.select(token, cands, mechanism="rs", epsilon=1e-3, k=k, gamma=1e-6)
                    out[token]["OK"] += 1
                except grpc.RpcError as exc:
                    flag = re.search(r"--[a-z-]+", exc.details() or "")
                    out[token][exc.code().name + (f" {flag.group(0)}" if flag else "")] += 1
                    if refused is not None and exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                        refused.set()
                    time.sleep(backoff)

    threads = [threading.Thread(target=attack, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put({t: dict(c) for t, c in out.items()})
