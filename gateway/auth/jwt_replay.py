"""The replay cache: each credential (``sub``, ``jti``) is good for one handshake."""

from __future__ import annotations

import heapq
import threading
from collections import Counter

from gateway.auth.errors import CredentialRefused, RefusalReason

__all__ = ["JtiCache"]


class JtiCache:
    """The ``(identity, jti)`` pairs already accepted, until they expire.

    An entry is forgotten once its credential could no longer pass the
    expiry check anyway (``exp + leeway``), so forgetting it reopens nothing.

    Memory is bounded by ``max_entries`` (and each jti by
    :data:`gateway.auth.credentials.MAX_JTI_CHARS`). When the cache is full,
    expired entries go first (they always do: every call purges them). If it is still full of live
    entries, the new credential is refused with ``REPLAY_CACHE_FULL``
    instead of evicting a live entry. The trade-off: evicting a live jti
    would silently reopen a replay window for a still-valid token, under
    exactly the load an attacker can produce, whereas refusing fails closed
    and visibly. ``max_entries_per_identity`` keeps that refusal with the
    identity that floods: one compromised or runaway agent cannot lock out
    the others. Only credentials with a verified signature reach the cache,
    so filling it needs a real agent key.

    Capacity planning: an entry lives at most ``max_lifetime + 2 * leeway``
    (360 s by default), so ``max_entries_per_identity / 360`` is the
    sustained handshake rate one identity may keep up.

    The cache is per process. Behind several workers or replicas, a replay
    against another process is not caught; a shared store (Redis ``SET NX
    EX``) would close that gap. It is thread-safe.
    """

    def __init__(
        self, *, max_entries: int = 100_000, max_entries_per_identity: int | None = 10_000
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if max_entries_per_identity is not None and max_entries_per_identity < 1:
            raise ValueError("max_entries_per_identity must be at least 1 or None")
        self.max_entries = max_entries
        self.max_entries_per_identity = max_entries_per_identity
        self._forget_at: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, str, str]] = []
        self._per_identity: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._forget_at)

    def remember(self, identity: str, jti: str, *, forget_after: float, now: float) -> None:
        """Record ``(identity, jti)`` until ``forget_after``, or refuse it.

        Raises:
            CredentialRefused: ``REPLAYED`` if it is already recorded,
                ``REPLAY_CACHE_FULL`` if there is no room for it.
        """
        entry = (identity, jti)
        with self._lock:
            self._purge(now)
            if entry in self._forget_at:
                raise CredentialRefused(
                    RefusalReason.REPLAYED, "this jti was already used", identity=identity
                )
            cap = self.max_entries_per_identity
            if len(self._forget_at) >= self.max_entries or (
                cap is not None and self._per_identity[identity] >= cap
            ):
                raise CredentialRefused(
                    RefusalReason.REPLAY_CACHE_FULL,
                    "too many live credentials to track; retry later",
                    identity=identity,
                )
            self._forget_at[entry] = forget_after
            heapq.heappush(self._heap, (forget_after, identity, jti))
            self._per_identity[identity] += 1

    def _purge(self, now: float) -> None:
        # Each entry is pushed once (a replay is refused, not re-pushed), so
        # the heap and the dict always hold the same entries.
        while self._heap and self._heap[0][0] <= now:
            _, identity, jti = heapq.heappop(self._heap)
            del self._forget_at[(identity, jti)]
            self._per_identity[identity] -= 1
            if not self._per_identity[identity]:
                del self._per_identity[identity]
