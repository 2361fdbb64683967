"""allocate_state: gradients and AdamW moments made before the first step and kept, with the steps lazy state takes."""

import torch

from unmask.train.optim import allocate_state, make_optimizer


class UsedAndUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(4, 4)  # as a pooler that a bi-encoder never calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x).square().mean()


def train(preallocate: bool, steps: int = 3):
    torch.manual_seed(0)
    model = UsedAndUnused()
    optimizer = make_optimizer(model, learning_rate=1e-2, weight_decay=0.1)
    settle = allocate_state(optimizer) if preallocate else None
    gradient = model.used.weight.grad
    for _ in range(steps):
        model(torch.randn(16, 8)).backward()
        if settle is not None:
            settle()
            settle = None
        optimizer.step()
        optimizer.zero_grad(set_to_none=not preallocate)
    if preallocate:  # the same tensor from before the first step to the last
        assert model.used.weight.grad is gradient and not gradient.any()
    return model, optimizer


def test_allocated_state_takes_the_same_steps_as_lazy_state():
    lazy_model, lazy_optimizer = train(preallocate=False)
    model, optimizer = train(preallocate=True)
    torch.testing.assert_close(model.state_dict(), lazy_model.state_dict(), rtol=0, atol=0)
    torch.testing.assert_close(optimizer.state_dict(), lazy_optimizer.state_dict(), rtol=0, atol=0)


def test_a_parameter_without_gradient_is_left_alone():
    torch.manual_seed(0)
    initial = UsedAndUnused().unused.weight.detach().clone()
    model, optimizer = train(preallocate=True)
    assert model.unused.weight.grad is None and model.unused.weight not in optimizer.state
    torch.testing.assert_close(model.unused.weight.detach(), initial, rtol=0, atol=0)  # no weight decay


def test_a_resumed_state_is_kept():
    model, optimizer = train(preallocate=False)
    saved = optimizer.state[model.used.weight]["exp_avg"].clone()
    allocate_state(optimizer)
    torch.testing.assert_close(optimizer.state[model.used.weight]["exp_avg"], saved, rtol=0, atol=0)
