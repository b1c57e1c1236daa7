"""Column- and row-parallel linear layers (sequence parallel) over torch symmetric memory or NCCL.

Column op, input shard x [T/t, b, h], weight W [o/t, h]:
  fwd  y = AG(x) W^T                 fused: torch.ops.symm_mem.fused_all_gather_matmul(x, [W^T], 0, group)
  bwd  dx = RS(dy W), dW = dy^T AG(x) fused: torch.ops.symm_mem.fused_matmul_reduce_scatter(dy, W, "sum", 0, group)
Row op, input x [T, b, i/t], weight W [h, i/t]:
  fwd  y = RS(x W^T)                  fused: fused_matmul_reduce_scatter(x, W^T, "sum", 0, group)
  bwd  dx = AG(dy) W, dW = AG(dy)^T x fused: fused_all_gather_matmul(dy, [W], 0, group)
Unfused (`fused=False`): the same with all_gather_into_tensor / reduce_scatter_tensor (NCCL) and matmuls.
"""

from __future__ import annotations

from typing import Any


def _ag(x, group):
    import torch
    import torch.distributed as dist

    out = torch.empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _rs(x, group):
    import torch
    import torch.distributed as dist

    out = torch.empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


def _ag_mm(x, w_t, group, group_name, fused):
    """(AG(x), AG(x) @ w_t) over the first dim; x 2-D."""
    import torch

    if fused:
        ag, outs = torch.ops.symm_mem.fused_all_gather_matmul(x, [w_t], 0, group_name)
        return ag, outs[0]
    ag = _ag(x, group)
    return ag, ag @ w_t


def _mm_rs(a, b, group, group_name, fused):
    import torch

    if fused:
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)
    return _rs(a @ b, group)


def _make_fns():
    import torch

    class _Column(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, group, group_name, fused):
            s = x.shape
            x2 = x.reshape(-1, s[-1])
            ag, y = _ag_mm(x2, w.t(), group, group_name, fused)
            ctx.save_for_backward(ag, w)
            ctx.meta = (group, group_name, fused, s)
            return y.view(-1, *s[1:-1], w.shape[0])

        @staticmethod
        def backward(ctx, dy):
            ag, w = ctx.saved_tensors
            group, group_name, fused, s = ctx.meta
            dy2 = dy.reshape(-1, dy.shape[-1])
            dx = _mm_rs(dy2, w, group, group_name, fused)
            dw = dy2.t() @ ag
            return dx.view(s), dw, None, None, None

    class _Row(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, group, group_name, fused):
            s = x.shape
            x2 = x.reshape(-1, s[-1])
            y = _mm_rs(x2, w.t(), group, group_name, fused)
            ctx.save_for_backward(x2, w)
            ctx.meta = (group, group_name, fused, s)
            return y.view(-1, *s[1:-1], w.shape[0])

        @staticmethod
        def backward(ctx, dy):
            x2, w = ctx.saved_tensors
            group, group_name, fused, s = ctx.meta
            dy2 = dy.reshape(-1, dy.shape[-1])
            ag, dx = _ag_mm(dy2, w, group, group_name, fused)
            dw = ag.t() @ x2
            return dx.view(s), dw, None, None, None

    return _Column, _Row


_FNS: tuple[Any, Any] | None = None


def _fns():
    global _FNS
    if _FNS is None:
        _FNS = _make_fns()
    return _FNS


def column_fn(x, w, group, group_name: str, fused: bool):
    return _fns()[0].apply(x, w, group, group_name, fused)


def row_fn(x, w, group, group_name: str, fused: bool):
    return _fns()[1].apply(x, w, group, group_name, fused)
