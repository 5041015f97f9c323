"""Small builders shared by the attention tests."""

import torch


def make_kv(b=2, h=3, n=7, d=4, dtype=torch.float64, requires_grad=True, scale=1.0):
    """Random (B, H, N, D) keys and values."""
    k = (scale * torch.randn(b, h, n, d, dtype=dtype)).requires_grad_(requires_grad)
    v = torch.randn(b, h, n, d, dtype=dtype).requires_grad_(requires_grad)
    return k, v


def outputs_and_grads(fn, *inputs):
    """fn(*inputs) and the gradients of a non-trivial scalar of it w.r.t. the inputs."""
    out = fn(*inputs)
    weights = torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weights).sum() + out.square().sum(), inputs)
    return out, grads
