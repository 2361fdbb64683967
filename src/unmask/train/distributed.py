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
