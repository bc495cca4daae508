"""Read back what W&B wrote in offline mode: the records of ``run-<id>.wandb``.

Why a reader here: W&B 0.2x+ writes offline runs from its Go core and ships no Python
reader any more; ``wandb sync`` uploads the file as it is. The file is a LevelDB-style log
(32 KiB blocks, a 7-byte header per chunk, a ``:W&B`` file header) of protobuf ``Record``
messages, whose classes the package still ships (``wandb.proto.wandb_internal_pb2``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def chunks(data: bytes) -> Iterator[bytes]:
    """Each whole record's bytes, joined from its chunks."""
    if data[:4] != b":W&B":
        raise ValueError("not a W&B run file")
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # the block's tail is padding
            offset += room
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + HEADER])
        body = data[offset + HEADER:offset + HEADER + length]
        offset += HEADER + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
        else:  # zeros: the end of what was written
            return


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    for body in chunks(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(body)
        yield record


def read_run(folder: Path) -> dict[str, Any]:
    """{"id", "history": [{key: value}], "config": {key: value}, "files": [path],
    "artifact_files": [path inside an artifact]}."""
    (path,) = folder.glob("run-*.wandb")
    run: dict[str, Any] = {"id": None, "history": [], "config": {}, "files": [],
                           "artifact_files": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["id"] = record.run.run_id
            run["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
            run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "files":
            run["files"] += [f.path for f in record.files.files]
        elif kind == "artifact":
            run["artifact_files"] += [entry.path for entry in record.artifact.manifest.contents]
    return run
