"""Host time of each decoder layer inside a real megatron-core step (`Layout.host_timing`).

The CPU wall time from a layer's forward pre-hook to its forward hook is the time the host took to issue that
layer's forward. Backward: a tensor hook on each layer's output fires when autograd has the gradient of that output
(the layer's backward starts), and the hook on its input when the layer's backward is done, so the backward of
layer i takes T(grad of input_i) - T(grad of output_i), on the autograd engine's thread. While the host runs ahead
of the GPU these are its issue times (the dense host floor, `costmodel.DenseHostFloor`); where the launch queue is
full the host waits on the GPU inside a launch and they grow to the GPU's pace.

The testbench times one layer from an empty queue (`testbench.measure`); this times the layers in the model, one
after another, as a step issues them: on one H100 lease the two differed by 55% (4.44 vs 2.86 ms Qwen3-0.6B training
forward, benchmarks/results/validation_h100_x1/host_diagnostics).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any


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

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        self.recording = False
        self.fwd_ms: list[list[float]] = [[] for _ in layers]
        self.bwd_ms: list[list[float]] = [[] for _ in layers]
        self._fwd_start: dict[int, float] = {}
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

    def _pre(self, index: int):
        import torch

        def hook(_module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
            if not self.recording:
                return
            hidden = _hidden_states(args, kwargs)
            if torch.is_grad_enabled() and isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                hidden.register_hook(self._grad_hook(index, "input"))
            self._fwd_start[index] = time.perf_counter()

        return hook

    def _post(self, index: int):
        import torch

        def hook(_module: Any, _args: tuple, output: Any) -> None:
            if not self.recording or index not in self._fwd_start:
                return
            self.fwd_ms[index].append((time.perf_counter() - self._fwd_start.pop(index)) * 1e3)
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
        }
