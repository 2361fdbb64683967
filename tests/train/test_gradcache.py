"""Gradient caching's memory order: the last mini-batch, computed once with its graph, is backpropagated (and its
activations freed) before any other mini-batch is replayed; the gradient is the uncached one."""

from __future__ import annotations

import torch

from unmask.train import gradcache


def test_the_kept_mini_batch_backpropagates_before_the_replays(monkeypatch):
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    events, replaying = [], []

    def embed(input_ids, attention_mask):
        hidden = first(input_ids.float())  # (rows, 4): the deepest activation of the graph
        if torch.is_grad_enabled():
            name = "replayed" if replaying else "kept"
            hidden.register_hook(lambda grad: events.append(name))
        return second(torch.relu(hidden))

    replay_backward = gradcache._Replay.backward

    def logged(ctx, grad):
        replaying.append(True)
        events.append("replay")
        return replay_backward(ctx, grad)

    monkeypatch.setattr(gradcache._Replay, "backward", staticmethod(logged))
    input_ids, attention_mask = torch.randn(12, 4), torch.ones(12, 4, dtype=torch.long)
    assert len(gradcache.token_chunks(attention_mask, 16)) == 3  # 4 rows of 4 tokens each
    (gradcache.cached_embeddings(embed, input_ids, attention_mask, 16, keep_last=True) ** 2).sum().backward()
    assert events == ["kept", "replay", "replayed", "replayed"]
    cached = [p.grad.clone() for p in (*first.parameters(), *second.parameters())]
    for p in (*first.parameters(), *second.parameters()):
        p.grad = None
    (embed(input_ids, attention_mask) ** 2).sum().backward()
    for grad, p in zip(cached, (*first.parameters(), *second.parameters())):
        assert torch.allclose(grad, p.grad, atol=1e-6)
