"""One process, or one rank of a `torchrun` job: which rank this is, its device, and the few collectives we use."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            torch_dist.barrier()

    def gather(self, value) -> list:
        """Every rank's `value` (picklable), in rank order."""
        if self.world_size == 1:
            return [value]
        values = [None] * self.world_size
        torch_dist.all_gather_object(values, value)
        return values

    def sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch_dist.all_reduce(t)
        return float(t.item())


def init_distributed() -> Distributed:
    """Read `torchrun`'s environment (gloo on CPU, nccl on GPU); one process when it is absent."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if world_size > 1 and not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = torch_dist.get_rank() if world_size > 1 else 0
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return Distributed(rank, world_size, device)


class _GatherWithGrad(torch.autograd.Function):
    """Every rank's (N, ...) tensor, stacked in rank order (W N, ...). Backward: the gradients that every rank's
    loss sends to this rank's rows, summed (an all-reduce, which gloo has, rather than a reduce-scatter)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        ctx.rows = rank_rows(len(tensor))
        return _all_gather(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        torch_dist.all_reduce(grad)
        return grad[ctx.rows]


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """(N, ...) on each rank -> (world_size x N, ...), rank 0's rows first, the same N on every rank. Gradients
    flow back to the rank each row came from; outside `torchrun`, the tensor itself."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()) or torch_dist.get_world_size() == 1:
        return tensor
    return _GatherWithGrad.apply(tensor) if tensor.requires_grad else _all_gather(tensor)


def _all_gather(tensor: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(torch_dist.get_world_size())]
    torch_dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def rank_rows(n: int) -> slice:
    """This rank's rows of a `gather_rows` result of n rows a rank."""
    rank = torch_dist.get_rank() if torch_dist.is_available() and torch_dist.is_initialized() else 0
    return slice(rank * n, (rank + 1) * n)


def average_gradients(parameters) -> None:
    """Average the parameters' gradients over the ranks in one all-reduce: what DDP does, for a model whose backward
    DDP cannot hook (gradient caching runs several backward passes in one step)."""
    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch_dist.all_reduce(flat)
    flat /= torch_dist.get_world_size()
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
