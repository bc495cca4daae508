"""The messages between a launcher and its warm starter, over one Unix socket.

Why a module of its own: the launcher (:mod:`.warm`) and the starter process
(:mod:`.starter`) are two ends of one protocol; each end imports this and nothing of the
other, so the launcher still never imports torch.

Launcher to starter: a rank to start, as an 8-byte header (payload length, descriptor
count) that carries the rank's descriptors (its stdout and stderr pipes, an inherited
socket) as ``SCM_RIGHTS``, then the JSON payload. Starter to launcher: one JSON object a
line (``ready``, ``failed``, ``started``, ``ended``). A closed socket on either side means
that side is gone.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from scalerun import variables

HEADER = struct.Struct("!II")
"""Payload length and descriptor count."""
MAX_FDS = 8
CONTROL_FD = variables.STARTER_FD


def send_request(sock: socket.socket, payload: dict[str, Any], fds: list[int]) -> None:
    """One request with its descriptors, whole."""
    body = json.dumps(payload).encode()
    socket.send_fds(sock, [HEADER.pack(len(body), len(fds))], fds)
    sock.sendall(body)


def receive_request(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next request and its descriptors (inheritable, the caller's to close), or None
    when the launcher closed its end."""
    head, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    if not head:
        return None
    head += _exactly(sock, HEADER.size - len(head))
    length, count = HEADER.unpack(head)
    if len(fds) != count:
        raise OSError(f"expected {count} descriptors with the request, got {len(fds)}")
    return json.loads(_exactly(sock, length)), fds


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the launcher closed the socket in the middle of a request")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive_line(sock: socket.socket) -> dict[str, Any]:
    """The next one-line JSON answer (an :func:`event`, or a standby's reply); OSError
    where the other side closed first, ValueError where the line is not JSON."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the other side closed the socket before its answer")
        data += chunk
    return json.loads(data)


def event(kind: str, **fields: Any) -> bytes:
    """One starter-to-launcher line."""
    return (json.dumps({"event": kind, **fields}) + "\n").encode()
