"""Caps kept in this gateway process: open event streams per account and per API key, and stored provider
callbacks per provider (a token bucket).

Both guard what this process spends (its database pool, its memory), so they are counted where that is
spent. With N gateway replicas behind a balancer, one account may hold up to N times the stream cap in
total, each replica still protected.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable


class StreamsFull(Exception):
    def __init__(self, scope: str, limit: int):
        super().__init__(f"{limit} event streams are open for this {scope}")
        self.scope = scope
        self.limit = limit


class StreamSlots:
    """Open event streams by account and by key."""

    def __init__(self, per_account: int, per_key: int):
        self.per_account = per_account
        self.per_key = per_key
        self._accounts: Counter[str] = Counter()
        self._keys: Counter[str] = Counter()

    def open(self, account_id: str) -> int:
        return self._accounts[account_id]

    def take(self, account_id: str, key_id: str) -> None:
        """One slot for the life of a stream; StreamsFull when the account or the key has none left."""
        if self._keys[key_id] >= self.per_key:
            raise StreamsFull("API key", self.per_key)
        if self._accounts[account_id] >= self.per_account:
            raise StreamsFull("account", self.per_account)
        self._accounts[account_id] += 1
        self._keys[key_id] += 1

    def give_back(self, account_id: str, key_id: str) -> None:
        self._drop(self._accounts, account_id)
        self._drop(self._keys, key_id)

    @staticmethod
    def _drop(counts: Counter[str], name: str) -> None:
        counts[name] -= 1
        if counts[name] <= 0:
            del counts[name]  # an idle account holds no memory here


class Bucket:
    """A token bucket: `rate_per_s` on average, `burst` at once after a quiet spell."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> int:
        """Spend a token: 0 when there was one, else the whole seconds until there will be (never 0)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0
        return max(1, math.ceil((1 - self._tokens) / self.rate_per_s))
