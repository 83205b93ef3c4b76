"""Which models stay loaded: the model pool's policy as plain bookkeeping (no processes, no clock of its
own), so it is tested alone. A model is resident from the moment its load starts; it counts against
--max-loaded-models and the memory budget (--max-loaded-memory) until it is unloaded. Room is made by
unloading the least recently used idle models, never one with requests in flight (a loading model counts
as busy). An idle model expires `keep_alive` seconds after its last request ended (Ollama's rule)."""

import math
from dataclasses import dataclass

from pagedserve.errors import CapacityError, InvalidRequestError
from pagedserve.utils import format_bytes


@dataclass(frozen=True)
class ResidencyLimits:
    max_loaded_models: int  # 0: no limit
    memory_budget_bytes: int  # 0: no limit


@dataclass
class Resident:
    name: str
    size_bytes: int
    keep_alive_s: float  # the last request's (math.inf: forever)
    last_used: float
    in_flight: int = 0  # requests being served, and the load itself
    expires_at: float | None = None  # None while busy

    @property
    def busy(self) -> bool:
        return self.in_flight > 0


class ResidencyPolicy:
    """Not thread-safe: the pool calls it from its event loop."""

    def __init__(self, limits: ResidencyLimits) -> None:
        self.limits = limits
        self.residents: dict[str, Resident] = {}

    def admit(self, name: str, size_bytes: int, keep_alive_s: float, now: float) -> list[str]:
        """Make `name` resident (busy: its load is under way) and return the idle models to unload first
        for it to fit, least recently used first (already removed here). Raises InvalidRequestError (507)
        when it cannot fit the memory budget even alone, CapacityError (503) when only busy models could
        make room."""
        budget = self.limits.memory_budget_bytes
        if budget and size_bytes > budget:
            raise InvalidRequestError(
                f"The model `{name}` needs {format_bytes(size_bytes)} (its weights, KV cache and swap space), "
                f"more than the memory budget of {format_bytes(budget)} alone (--max-loaded-memory): raise "
                "the budget, or lower --kv-cache-memory and --swap-space.",
                param="model",
                status_code=507,
            )
        victims: list[str] = []
        idle = sorted((r for r in self.residents.values() if not r.busy), key=lambda r: r.last_used)
        while not self._fits(size_bytes, victims):
            if not idle:
                raise CapacityError(
                    f"Cannot load `{name}`: the models loaded now are all serving requests and no more fit "
                    f"(--max-loaded-models {self.limits.max_loaded_models or 'unlimited'}, "
                    f"--max-loaded-memory {format_bytes(budget) if budget else 'unlimited'}); retry.",
                    retry_after_s=5.0,
                )
            victims.append(idle.pop(0).name)
        for victim in victims:
            del self.residents[victim]
        self.residents[name] = Resident(name, size_bytes, keep_alive_s, now, in_flight=1)
        return victims

    def _fits(self, size_bytes: int, leaving: list[str]) -> bool:
        staying = [r for r in self.residents.values() if r.name not in leaving]
        max_models, budget = self.limits.max_loaded_models, self.limits.memory_budget_bytes
        if max_models and len(staying) + 1 > max_models:
            return False
        return not budget or sum(r.size_bytes for r in staying) + size_bytes <= budget

    def begin(self, name: str, keep_alive_s: float, now: float) -> None:
        """A request for a resident model starts: it is busy, and `keep_alive_s` replaces its keep-alive."""
        resident = self.residents[name]
        resident.in_flight += 1
        resident.keep_alive_s = keep_alive_s
        resident.last_used, resident.expires_at = now, None

    def end(self, name: str, now: float) -> None:
        """A request (or the load) ended; an idle model's keep-alive starts now."""
        resident = self.residents.get(name)
        if resident is None:  # NOTE: unloaded meanwhile (its process died)
            return
        resident.in_flight -= 1
        resident.last_used = now
        if not resident.busy:
            resident.expires_at = now + resident.keep_alive_s

    def expired(self, now: float) -> list[str]:
        """The idle models whose keep-alive has run out, removed here for the caller to unload."""
        names = [r.name for r in self.residents.values() if r.expires_at is not None and r.expires_at <= now]
        for name in names:
            del self.residents[name]
        return names

    def next_expiry(self) -> float:
        """When the next idle model expires (math.inf: none will)."""
        return min(
            (r.expires_at for r in self.residents.values() if r.expires_at is not None), default=math.inf
        )

    def remove(self, name: str) -> None:
        """Forget `name` (its load failed, or its process died)."""
        self.residents.pop(name, None)
