"""The data-only wire format between the grader, the trusted checker and the sandbox (standard library only).

Messages are JSON objects, one per line. Python values travel as tagged JSON so that tuples, sets and dicts with
non-string keys survive: ``None``/bool/int/float/str/list are JSON itself; ``{"tuple": [...]}``, ``{"set": [...]}``,
``{"frozenset": [...]}``, ``{"dict": [[k, v], ...]}``, ``{"complex": [re, im]}`` and ``{"bytes": "<latin-1>"}`` are the
rest. `decode` only ever builds these plain types: a message from the sandbox can carry values, never behaviour.

Reading is bounded before any parsing: bytes per message, then values and characters per string (counted on the raw
text), then nesting depth; where the peer is untrusted and the reader has no deadline, nothing the peer chose is hashed.
"""

import json
import os
import select
import time
from json.decoder import scanstring

_CONTAINERS = {"tuple": tuple, "set": set, "frozenset": frozenset}
MAX_DEPTH = 100


class WireError(Exception):
    """A peer sent something that is not a well-formed message within the limits (the case fails, nothing else)."""


def encode(value):
    """Plain Python data -> JSON-able tagged form; anything else (objects, functions, subclasses) raises TypeError."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(v) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is bytes:
        return {"bytes": value.decode("latin-1")}
    raise TypeError(f"cannot pass a {kind.__name__} between the sandbox and the checker (plain data only)")


def decode(data, *, hashing: bool = True, depth: int = MAX_DEPTH):
    """Tagged JSON -> plain Python data; a malformed tree, or one deeper than ``depth``, raises WireError.

    ``hashing=False`` refuses sets, frozensets and dicts with non-string keys instead of building them: hashing
    values the peer chose (ints, tuples: deterministic hashes) can be made quadratic. Strings hash with a per-process
    random key, so string-keyed dicts (all that JSON can expect) are still built."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if depth <= 0:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    if kind is list:
        return [decode(v, hashing=hashing, depth=depth - 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise WireError("malformed value")
    ((tag, body),) = data.items()
    sub = {"hashing": hashing, "depth": depth - 1}
    if not hashing and (tag in ("set", "frozenset") or (tag == "dict" and _non_string_key(body))):
        raise WireError(f"a {tag} (of non-string keys) never equals JSON data: not decoded")
    try:
        if tag in _CONTAINERS and type(body) is list:
            return _CONTAINERS[tag](decode(v, **sub) for v in body)
        if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            return {decode(k, **sub): decode(v, **sub) for k, v in body}
        if tag == "complex" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
            return complex(*body)
        if tag == "bytes" and type(body) is str:
            return body.encode("latin-1")
    except (TypeError, UnicodeError) as exc:  # unhashable set element or dict key, non-latin-1 bytes
        raise WireError(f"malformed {tag}: {exc}") from None
    raise WireError(f"unknown value tag {tag!r}")


def _non_string_key(body) -> bool:
    return type(body) is not list or any(type(p) is not list or not p or type(p[0]) is not str for p in body)


def count_values(text: str, limit: int, max_chars: int | None = None) -> int:
    """An upper bound on the values in JSON ``text`` (one per string and per ``[``, ``{`` or ``,`` outside strings),
    computed without parsing: at most ``limit`` + 1 steps, each a C-level count or string scan. WireError past
    ``limit``, on an unterminated string, or on a string that decodes to over ``max_chars`` characters."""
    nodes, pos, size = 1, 0, len(text)
    while True:
        quote = text.find('"', pos)
        end = size if quote < 0 else quote
        nodes += text.count("[", pos, end) + text.count("{", pos, end) + text.count(",", pos, end)
        if nodes > limit:
            raise WireError(f"message over {limit} values")
        if quote < 0:
            return nodes
        try:
            string, pos = scanstring(text, quote + 1)
        except ValueError:
            raise WireError("malformed message: bad string") from None
        if max_chars is not None and len(string) > max_chars:
            raise WireError(f"string over {max_chars} characters")
        nodes += 1


def send(fd: int, message: dict, deadline: float | None = None) -> None:
    """Write one message line; on a non-blocking pipe, TimeoutError if the reader stops reading past ``deadline``."""
    view = memoryview((json.dumps(message) + "\n").encode())
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if wait == 0.0:
                raise TimeoutError("timeout") from None
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll(None if wait is None else int(wait * 1000) + 1)


class Reader:
    """Reads message lines from a non-blocking pipe with a deadline, a per-message byte cap and (for an untrusted
    peer) caps on values per message and characters per string; never blocks past the deadline, never parses past a
    cap. The writer's caps do not count: the peer may write its own lines."""

    def __init__(self, fd: int, max_bytes: int, max_values: int | None = None, max_chars: int | None = None):
        os.set_blocking(fd, False)
        self.fd, self.max_bytes, self.max_values, self.max_chars = fd, max_bytes, max_values, max_chars
        self.buf, self.scanned = bytearray(), 0
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def read(self, deadline: float | None) -> dict:
        """The next message; TimeoutError past ``deadline`` (monotonic), WireError on EOF, garbage or a cap."""
        while True:
            end = self.buf.find(b"\n", self.scanned)
            self.scanned = len(self.buf) if end < 0 else 0
            if end > self.max_bytes or (end < 0 and len(self.buf) > self.max_bytes):
                raise WireError(f"message over {self.max_bytes} bytes")
            if end >= 0:
                try:
                    text = self._take_line(end)
                    if self.max_values is not None or self.max_chars is not None:  # len + 1 bounds the values
                        count_values(text, self.max_values or len(text) + 1, self.max_chars)
                    message = json.loads(text)
                except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
                    raise WireError(f"malformed message: {type(exc).__name__}") from None
                if type(message) is not dict:
                    raise WireError("malformed message: not an object")
                return message
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if wait == 0.0:
                raise TimeoutError("timeout")
            if not self.poller.poll(None if wait is None else int(wait * 1000) + 1):
                continue
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                raise WireError("peer closed the channel")
            self.buf += chunk

    def _take_line(self, end: int) -> str:
        """Decode the buffer's first ``end`` bytes in place (no copy of the line) and drop them with their newline;
        an emptied buffer is released, so a large message costs its buffer only until it is decoded."""
        view = memoryview(self.buf)
        try:
            return str(view[:end], "utf-8")
        finally:
            view.release()
            del self.buf[: end + 1]
            if not self.buf:
                self.buf = bytearray()
