"""Types of the optional C accelerator (asbp/_speedups.c)."""

from asbp.header import HeaderValue

def decode_fast(
    frame: bytes,
    max_frame_bytes: int,
    max_header_bytes: int,
    max_keys: int,
    max_list_items: int,
    /,
) -> tuple[dict[str, HeaderValue], bytes] | None: ...
