"""Reading client frames: our PlainFrameReader against websockets' public sans-I/O API.

The Uvicorn fast path (gateway/transports/coalescing.py) reads plain messages
with gateway.transports.plain_frames instead of websockets' ServerProtocol.
This measures both on the same bytes, in one process, alternating: masked
binary frames (the broker's traffic: one Command each), several per read as a
pipelining client sends them. Per message, each reader returns the payload;
websockets also builds a Frame and its event list, as Uvicorn's stock protocol
has it do.

    $ .venv/bin/python bench/frames.py [--messages 20000] [--size 100] [--per-read 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from websockets.protocol import State
from websockets.server import ServerProtocol

from gateway.transports.plain_frames import PlainFrameReader


def masked_frame(payload: bytes) -> bytes:
    size = len(payload)
    head = bytes([0x82, 0x80 | size]) if size < 126 else bytes([0x82, 0xFE]) + size.to_bytes(2)
    key = os.urandom(4)
    keys = (key * (size // 4 + 1))[:size]
    return head + key + (int.from_bytes(payload) ^ int.from_bytes(keys)).to_bytes(size)


def ours(reads: list[bytes]) -> int:
    reader = PlainFrameReader(max_size=1 << 20)
    count = 0
    for data in reads:
        reader.feed(data)
        while (event := reader.next_event()) is not None:
            count += len(event[1]) > 0
    return count


def websockets_public(reads: list[bytes]) -> int:
    protocol = ServerProtocol(state=State.OPEN, max_size=1 << 20)
    count = 0
    for data in reads:
        protocol.receive_data(data)
        for frame in protocol.events_received():
            count += len(frame.data) > 0  # type: ignore[union-attr]  # frames only, once OPEN
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--per-read", type=int, default=10, help="frames per read")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    frames = [masked_frame(os.urandom(args.size)) for _ in range(args.messages)]
    reads = [b"".join(frames[i : i + args.per_read]) for i in range(0, len(frames), args.per_read)]
    samples: dict[str, list[float]] = {"plain_frames": [], "websockets": []}
    for _ in range(args.repeats):
        for name, read in (("plain_frames", ours), ("websockets", websockets_public)):
            start = time.process_time()
            assert read(reads) == args.messages
            samples[name].append((time.process_time() - start) / args.messages * 1e6)
    for name, values in samples.items():
        print(f"{name:13} {statistics.median(values):6.2f} us/message (median of {args.repeats})")
    ratios = [w / p for p, w in zip(samples["plain_frames"], samples["websockets"], strict=True)]
    print(f"websockets / plain_frames: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
