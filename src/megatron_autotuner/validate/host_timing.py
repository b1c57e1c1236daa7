"""Host time of each decoder layer inside a real megatron-core step (`Layout.host_timing`).

The CPU wall time from a layer's forward pre-hook to its forward hook is the time the host took to issue that
layer's forward. Backward: a tensor hook on each layer's output fires when autograd has the gradient of that output
(the layer's backward starts), and the hook on its input when the layer's backward is done, so the backward of
layer i takes T(grad of input_i) - T(grad of output_i), on the autograd engine's thread. While the host runs ahead
of the GPU these are its issue times (the dense host floor, `costmodel.DenseHostFloor`); where the launch queue is
full the host waits on the GPU inside a launch and they grow to the GPU's pace.

Under Megatron's all-to-all overlap (`--overlap-moe-expert-parallel-comm`) no layer's forward runs: megatron-core's
combined 1F1B step calls `TransformerLayerSchedulePlan.run(f_layer, b_layer, ...)` once per layer, the forward of one
micro-batch with the backward of another (megatron/core/models/common/model_chunk_schedule_plan.py, 0.16 and 0.19).
`CombinedLayerHostTimer` times those calls instead, by kind (both passes, forward alone, backward alone). Both timers
also count the host's time blocked in `torch.cuda.Event.synchronize` within what they time (`SyncClock`): the
dropless dispatcher waits there for its token counts (`MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`), so
wall less blocked is what the host spent issuing.

The testbench times one layer from an empty queue (`testbench.measure`); this times the layers in the model, one
after another, as a step issues them: on one H100 lease the two differed by 55% (4.44 vs 2.86 ms Qwen3-0.6B training
forward, benchmarks/results/validation_h100_x1/host_diagnostics).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any


class SyncClock:
    """Seconds the host spent inside `torch.cuda.Event.synchronize` since `install()` (the class method wrapped;
    `uninstall()` restores it). Syncs inside C++ (`.item()`, a pageable copy) are not seen."""

    def __init__(self) -> None:
        self.blocked_s = 0.0
        self._original = None

    def install(self) -> None:
        import torch

        if self._original is not None:
            return
        original = torch.cuda.Event.synchronize
        clock = self

        def synchronize(event: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(event)
            finally:
                clock.blocked_s += time.perf_counter() - t

        self._original = original
        torch.cuda.Event.synchronize = synchronize

    def uninstall(self) -> None:
        import torch

        if self._original is not None:
            torch.cuda.Event.synchronize = self._original
            self._original = None


def decoder_layers(chunks: Iterable[Any]) -> list[Any]:
    """The megatron-core TransformerLayer modules of the model chunks, in order."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layers = []
    for chunk in chunks:
        layers.extend(m for m in chunk.modules() if isinstance(m, TransformerLayer))
    return layers


def _hidden_states(args: tuple, kwargs: dict[str, Any]) -> Any:
    return kwargs.get("hidden_states", args[0] if args else None)


def _first_tensor(output: Any) -> Any:
    return output[0] if isinstance(output, tuple | list) else output


class LayerHostTimer:
    """Per-layer host times of the steps after `start()`: forward always, backward where autograd runs. `summary()`
    gives their medians over layers and steps; `remove()` takes the hooks off."""

    def __init__(self, layers: list[Any], clock: SyncClock | None = None) -> None:
        self.layers = layers
        self.recording = False
        self.clock = clock
        self.fwd_ms: list[list[float]] = [[] for _ in layers]
        self.bwd_ms: list[list[float]] = [[] for _ in layers]
        self.fwd_blocked_ms: list[float] = []
        self._fwd_start: dict[int, float] = {}
        self._blocked_at: dict[int, float] = {}
        self._grad_at: dict[tuple[int, str], float] = {}
        self._handles = []
        for index, layer in enumerate(layers):
            self._handles.append(layer.register_forward_pre_hook(self._pre(index), with_kwargs=True))
            self._handles.append(layer.register_forward_hook(self._post(index)))

    def start(self) -> None:
        self.recording = True

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.clock is not None:
            self.clock.uninstall()

    def _pre(self, index: int):
        import torch

        def hook(_module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
            if not self.recording:
                return
            hidden = _hidden_states(args, kwargs)
            if torch.is_grad_enabled() and isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                hidden.register_hook(self._grad_hook(index, "input"))
            if self.clock is not None:
                self._blocked_at[index] = self.clock.blocked_s
            self._fwd_start[index] = time.perf_counter()

        return hook

    def _post(self, index: int):
        import torch

        def hook(_module: Any, _args: tuple, output: Any) -> None:
            if not self.recording or index not in self._fwd_start:
                return
            self.fwd_ms[index].append((time.perf_counter() - self._fwd_start.pop(index)) * 1e3)
            if self.clock is not None and index in self._blocked_at:
                self.fwd_blocked_ms.append((self.clock.blocked_s - self._blocked_at.pop(index)) * 1e3)
            out = _first_tensor(output)
            if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._grad_hook(index, "output"))

        return hook

    def _grad_hook(self, index: int, which: str):
        def hook(_grad: Any) -> None:
            now = time.perf_counter()
            if which == "output":
                self._grad_at[(index, "output")] = now
                return
            started = self._grad_at.pop((index, "output"), None)
            if started is not None:
                self.bwd_ms[index].append((now - started) * 1e3)

        return hook

    def summary(self) -> dict[str, Any] | None:
        """{"fwd_ms", "bwd_ms"}: medians over every layer and step (None where not timed), the per-layer medians,
        and how many layers and samples. None when nothing was timed."""
        fwd = [v for per in self.fwd_ms for v in per]
        if not fwd:
            return None
        bwd = [v for per in self.bwd_ms for v in per]
        return {
            "fwd_ms": statistics.median(fwd),
            "bwd_ms": statistics.median(bwd) if bwd else None,
            "fwd_ms_by_layer": [statistics.median(per) if per else None for per in self.fwd_ms],
            "bwd_ms_by_layer": [statistics.median(per) if per else None for per in self.bwd_ms],
            "layers": len(self.layers),
            "samples": len(fwd),
            # of the forward's wall time, the median blocked in an event's synchronize (None without a clock)
            "fwd_blocked_ms": statistics.median(self.fwd_blocked_ms) if self.fwd_blocked_ms else None,
        }


class CombinedLayerHostTimer:
    """Host wall time of each call of megatron-core's combined 1F1B layer step (`TransformerLayerSchedulePlan.run`,
    wrapped on the class while installed) in the steps after `start()`, by kind: "pair" (the forward of one
    micro-batch with the backward of another), "fwd" and "bwd" (a warm-up forward or cool-down backward alone),
    with the time blocked in event syncs within each (`SyncClock`). `remove()` restores the class."""

    KINDS = ("pair", "fwd", "bwd")

    def __init__(self, plan_class: Any, clock: SyncClock) -> None:
        self.plan_class = plan_class
        self.clock = clock
        self.recording = False
        self.wall_ms: dict[str, list[float]] = {k: [] for k in self.KINDS}
        self.blocked_ms: dict[str, list[float]] = {k: [] for k in self.KINDS}
        self._original = plan_class.__dict__["run"]
        run = self._original.__func__
        timer = self

        def timed_run(f_layer: Any, b_layer: Any, *args: Any, **kwargs: Any) -> Any:
            if not timer.recording or (f_layer is None and b_layer is None):
                return run(f_layer, b_layer, *args, **kwargs)
            kind = "pair" if f_layer is not None and b_layer is not None else ("fwd" if b_layer is None else "bwd")
            blocked, t = timer.clock.blocked_s, time.perf_counter()
            try:
                return run(f_layer, b_layer, *args, **kwargs)
            finally:
                timer.wall_ms[kind].append((time.perf_counter() - t) * 1e3)
                timer.blocked_ms[kind].append((timer.clock.blocked_s - blocked) * 1e3)

        plan_class.run = staticmethod(timed_run)

    def start(self) -> None:
        self.recording = True

    def remove(self) -> None:
        if self._original is not None:
            self.plan_class.run = self._original
            self._original = None
        self.clock.uninstall()

    def summary(self) -> dict[str, Any] | None:
        """{"pair_ms", "pair_blocked_ms", "fwd_ms", ...}: medians per kind (None where that kind never ran), and
        how many calls of each. None when nothing was timed."""
        if not any(self.wall_ms.values()):
            return None
        out: dict[str, Any] = {"combined": True}
        for kind in self.KINDS:
            wall, blocked = self.wall_ms[kind], self.blocked_ms[kind]
            out[f"{kind}_ms"] = statistics.median(wall) if wall else None
            out[f"{kind}_blocked_ms"] = statistics.median(blocked) if blocked else None
            out[f"{kind}_calls"] = len(wall)
        return out


def layer_host_timer(chunks: list[Any], combined: bool) -> LayerHostTimer | CombinedLayerHostTimer:
    """The timer a step's layers need: the combined step's (`combined`: the all-to-all overlap) or each layer's, with
    a `SyncClock` installed; the timer's `remove()` uninstalls it."""
    clock = SyncClock()
    clock.install()
    if combined:
        from megatron.core.models.common.model_chunk_schedule_plan import TransformerLayerSchedulePlan

        return CombinedLayerHostTimer(TransformerLayerSchedulePlan, clock)
    return LayerHostTimer(decoder_layers(chunks), clock)
