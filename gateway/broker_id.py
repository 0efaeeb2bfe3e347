"""The Broker-Identifier ``b``: configured, or created once and kept in ``data_dir``.

A broker that restarts must come back as the same broker: Channels and agents that
saw ``b`` before the restart recognise it after, and the Redis engine keys its state
by it. So when ``broker_id`` is not configured, the first start writes a fresh UUID to
``data_dir/broker-id`` and every later start reads it back.

Creating the file is atomic and never clobbers: the UUID goes to a temporary file in
the same directory, is flushed to disk, then hard-linked into place. ``os.link`` fails
if the name exists, so two brokers racing on one ``data_dir`` both end up with the
winner's identifier, and a crash leaves either no file or a complete one, never a
torn one. Filesystems without hard links fall back to ``os.replace``, which is atomic
but lets the last of two racing writers win.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Final

from gateway.config.checks import BROKER_ID_PATTERN
from gateway.config.errors import ConfigError
from gateway.config.model import GatewayConfig

__all__ = ["BROKER_ID_FILE", "broker_identity"]

#: The file in ``data_dir`` that holds the generated Broker-Identifier.
BROKER_ID_FILE: Final = "broker-id"


def broker_identity(config: GatewayConfig) -> str:
    """Return ``config.broker_id``, else the one stored in ``data_dir``, creating it once.

    ``data_dir`` is created owner-only (0700) if it does not exist; an existing
    directory keeps its mode.

    Raises:
        ConfigError: ``data_dir`` cannot be created or read, or its ``broker-id`` file
            does not hold a valid identifier (delete it to get a new one, or set
            ``broker_id``).
    """
    if config.broker_id is not None:
        return config.broker_id
    data_dir = config.data_dir
    path = data_dir / BROKER_ID_FILE
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        stored = _read(path)
        if stored is None:
            stored = _create(path)
    except OSError as exc:
        detail = exc.strerror or str(exc)
        raise ConfigError(f"cannot keep the broker identity in {str(path)!r}: {detail}") from exc
    if not BROKER_ID_PATTERN.fullmatch(stored):
        raise ConfigError(
            f"{str(path)!r} does not hold a valid broker id ({stored[:40]!r}); "
            "delete the file to create a new one, or set broker_id"
        )
    return stored


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None


def _create(path: Path) -> str:
    broker_id = uuid.uuid4().hex
    temporary = path.with_name(f".{path.name}.{broker_id}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(fd, "w", encoding="ascii") as stream:
            stream.write(broker_id + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            # Another broker got there first; its identifier is the one to use.
            existing = _read(path)
            if existing is not None:
                return existing
            os.replace(temporary, path)  # it was deleted again in between: take the name
        except OSError:
            os.replace(temporary, path)  # no hard links here (some network filesystems)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    _fsync_directory(path.parent)
    return broker_id


def _fsync_directory(directory: Path) -> None:
    # Makes the new directory entry durable, so a power cut cannot lose the identity.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
