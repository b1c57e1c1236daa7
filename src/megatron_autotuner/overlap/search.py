"""Search: a bracketing (golden-section) search over a discrete axis, a per-slot search, and a lockstep
planner that tests one variant of every slot per measurement round.

All searches are generators: they `yield` a candidate and receive its cost (ms; `inf` = failed) by
`send`. That makes them deterministic given the costs, so a resumed sweep replays recorded costs and
continues where it stopped.

Bracketing search (discrete golden section): keep an index bracket [lo, hi] over the sorted values;
probe m1 = lo + round(0.382 (hi - lo)) and m2 = lo + round(0.618 (hi - lo)); if f(m1) <= f(m2) the
minimum of a unimodal f lies in [lo, m2], else in [m1, hi]; stop when hi - lo <= 2 and probe what
is left. The answer is the best point probed (robust to noise that reorders near-equal points).
About log_1.618(n) + 2 probes instead of n.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import replace
from typing import Any

from .candidates import SearchSpace, Slot
from .rules import UbVariant, te_default

Cost = float
Partial = dict[str, UbVariant]
SearchGen = Generator[Any, Cost, Any]

INV_PHI = (math.sqrt(5) - 1) / 2  # 0.618...


def bracket_search(
    values: Sequence[Any], evaluate: Callable[[Any], SearchGen]
) -> Generator[Any, Cost, tuple[Any, Cost]]:
    """Golden-section search over `values` (sorted); `evaluate(x)` is a generator returning f(x)."""
    if not values:
        raise ValueError("bracket_search needs at least one value")
    seen: dict[int, Cost] = {}

    def f(i: int) -> SearchGen:
        if i not in seen:
            seen[i] = yield from evaluate(values[i])
        return seen[i]

    lo, hi = 0, len(values) - 1
    while hi - lo > 2:
        m1 = lo + round((1 - INV_PHI) * (hi - lo))
        m2 = lo + round(INV_PHI * (hi - lo))
        if m2 <= m1:
            m2 = m1 + 1
        f1 = yield from f(m1)
        f2 = yield from f(m2)
        if f1 <= f2:
            hi = m2
        else:
            lo = m1
    for i in range(lo, hi + 1):
        yield from f(i)
    best = min(seen, key=lambda i: (seen[i], i))
    return values[best], seen[best]


def minimize(values: Sequence[Any], f: Callable[[Any], Cost]) -> tuple[Any, Cost, int]:
    """Run `bracket_search` with a plain function; returns (best value, its cost, number of probes)."""
    calls = 0

    def evaluate(x: Any) -> SearchGen:
        nonlocal calls
        calls += 1
        return f(x)
        yield  # pragma: no cover - makes this a generator

    gen = bracket_search(values, evaluate)
    try:
        next(gen)
    except StopIteration as stop:
        best, cost = stop.value
        return best, cost, calls
    raise RuntimeError("unreachable")  # evaluate never yields


def _key(partial: Partial) -> Hashable:
    return tuple(sorted(partial.items(), key=lambda kv: kv[0]))


def slot_search(slot: Slot, space: SearchSpace) -> Generator[Partial, Cost, tuple[Partial, Cost]]:
    """Search one slot; yields partial configs ({name: variant} for the slot's names). Returns the best.

    The first candidate is always TE's default for the slot; a later candidate replaces the incumbent
    only when it is faster by more than `space.noise_frac` (so ties keep TE's default).
    """
    cache: dict[Hashable, Cost] = {}

    def evaluate(partial: Partial) -> SearchGen:
        k = _key(partial)
        if k not in cache:
            cache[k] = yield dict(partial)
        return cache[k]

    best: Partial = {name: te_default(name, space.tp) for name in slot.names}
    best_cost = yield from evaluate(best)

    def consider(partial: Partial, cost: Cost) -> None:
        nonlocal best, best_cost
        if cost < best_cost * (1 - space.noise_frac):
            best, best_cost = dict(partial), cost

    for name in slot.names:  # stage 1: methods / structure, one name at a time
        for v in space.structural_variants(name):
            cand = {**best, name: v}
            consider(cand, (yield from evaluate(cand)))
    for name in slot.names:  # stage 2: bracketing search of num_sm for SM-driven methods
        v0 = best[name]
        if v0.method not in ("pipeline", "bulk"):
            continue
        domain = space.num_sm_domain(v0.cga_size or 1)
        if not domain:
            continue
        base = dict(best)

        def eval_sm(n: int, name: str = name, base: Partial = base) -> SearchGen:
            return evaluate({**base, name: replace(base[name], num_sm=n)})

        n_best, c_best = yield from bracket_search(domain, eval_sm)
        consider({**base, name: replace(base[name], num_sm=n_best)}, c_best)
    sm_names = [n for n in slot.names if best[n].method in ("pipeline", "bulk")]
    if sm_names and space.try_sm_margin:  # stage 3: set_sm_margin flipped
        cand = {**best, **{n: replace(best[n], set_sm_margin=not best[n].set_sm_margin) for n in sm_names}}
        consider(cand, (yield from evaluate(cand)))
    if sm_names:  # stage 4: cluster sizes that divide num_sm
        base = dict(best)
        for cga in space.cga_sizes:
            cand = {**base, **{n: replace(base[n], cga_size=cga) for n in sm_names}}
            if cand == base or not all(space.legal(n, cand[n]) for n in sm_names):
                continue
            consider(cand, (yield from evaluate(cand)))
    return best, best_cost


class LockstepPlanner:
    """Runs the searches of all slots together: each round holds one pending candidate of every live slot.

    `next_round()` gives the full cfg to measure (None when every search is done); `tell(costs, failed)`
    feeds back the cost of each slot. When a round with several new candidates fails, each of them is
    re-measured alone, so one bad variant does not sink the others.
    """

    def __init__(self, searches: dict[str, SearchGen], base: Partial) -> None:
        self._gens = searches
        self._base = dict(base)
        self._pending: dict[str, Partial | None] = {}
        self.results: dict[str, tuple[Partial, Cost]] = {}
        self._isolate: list[str] = []
        self._inflight: list[str] = []
        self.rounds = 0
        for key, gen in searches.items():
            self._advance(key, gen, None, first=True)

    def _advance(self, key: str, gen: SearchGen, cost: Cost | None, first: bool = False) -> None:
        try:
            self._pending[key] = next(gen) if first else gen.send(cost)
        except StopIteration as stop:
            self._pending[key] = None
            self.results[key] = stop.value

    def _cfg(self, keys: list[str]) -> Partial:
        cfg = dict(self._base)
        for res in self.results.values():
            cfg.update(res[0])
        for k in keys:
            cfg.update(self._pending[k] or {})
        return cfg

    def next_round(self) -> Partial | None:
        if self._isolate:
            self._inflight = [self._isolate[0]]
            return self._cfg(self._inflight)
        live = [k for k, p in self._pending.items() if p is not None]
        if not live:
            return None
        self._inflight = live
        return self._cfg(live)

    def tell(self, costs: dict[str, Cost], failed: bool = False) -> None:
        self.rounds += 1
        inflight, self._inflight = self._inflight, []
        if failed and len(inflight) > 1 and not self._isolate:
            self._isolate = list(inflight)
            return
        if self._isolate:
            self._isolate.pop(0)
        for k in inflight:
            cost = math.inf if failed else costs.get(k, math.inf)
            self._advance(k, self._gens[k], cost)

    @property
    def done(self) -> bool:
        return all(p is None for p in self._pending.values()) and not self._isolate

    def best_cfg(self) -> Partial:
        cfg = dict(self._base)
        for partial, _ in self.results.values():
            cfg.update(partial)
        return cfg


def plan_searches(slots: list[Slot], space: SearchSpace) -> tuple[LockstepPlanner, Partial]:
    """A planner over all slots, starting from TE's defaults for every name of the slots."""
    base = {name: te_default(name, space.tp) for s in slots for name in s.names}
    return LockstepPlanner({s.key: slot_search(s, space) for s in slots}, base), base
