"""On CUDA, a ViT whose RPC attention runs the Triton kernels compiles into one graph and matches eager.

test_compile.py compiles ``rpc_attention`` alone; here a whole timm ViT with RPC attention in every block, on the
``triton`` backend, so every PAP launch enters the graph as a ``kpca::`` custom op (``pap_first``, ``pap_step``,
``pap_mu``, registered in ``kpca.attention._triton.ops`` with fake implementations and autograd). Also
``torch.library.opcheck`` on the backward custom ops, whose fake implementations the compiled backward relies on
(test_triton_backend.py checks the forward ops). ``make test-gpu`` runs this file in its compile step.
"""

import pytest
import torch
from torch import nn

from kpca.attention import AttentionSpec

from .helpers import TRITON_DEVICES as DEVICES
from .helpers import require_triton

require_triton()
from kpca.attention._triton import ops  # noqa: E402 (after the triton check)
from kpca.attention.vit import create_vit  # noqa: E402 (needs timm, like the Triton ops imported first)

pytestmark = pytest.mark.triton

BATCH, IMAGE, CLASSES = 2, 32, 10
KPCA_OPS = {torch.ops.kpca.pap_first.default, torch.ops.kpca.pap_step.default, torch.ops.kpca.pap_mu.default}
# lambd 0.1 shrinks the keys of this freshly initialised model to a sparse part S with 10-20 % non-zero entries (1.0
# or more leaves S empty), so the soft threshold and its backward do work.
SPEC = AttentionSpec(kind="rpc", n_iter=3, lambd=0.1, backend="triton")
# float32, eps 1.2e-7: Inductor fuses the element-wise work around the kernels (layer norms, GELU, bias adds,
# residuals) and reorders its sums, so values move by a few ulps per op; the kernels themselves run the same
# launches as in eager. A lost term, mask or gradient moves the loss or a gradient by 1e-2 or more.
FLOAT32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def rpc_vit(device: str) -> nn.Module:
    """A 2-block ViT (width 32, 2 heads, 16 patches + class token) with RPC attention in both blocks."""
    torch.manual_seed(0)
    vit = create_vit("deit_tiny", SPEC, img_size=IMAGE, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                     num_classes=CLASSES)  # fmt: skip
    return vit.to(device)


def loss_and_grads(model: nn.Module, images: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """A weighted sum of the logits, and its gradients with respect to the images and every parameter."""
    images = images.clone().requires_grad_(True)  # (B, 3, H, W)
    loss = (model(images).float() * weights).sum()  # logits (B, classes)
    return [loss, *torch.autograd.grad(loss, [images, *model.parameters()])]


def relative_error(values: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """||values - reference|| / ||reference||, all tensors flattened into one vector, in float64."""
    value = torch.cat([v.detach().double().flatten() for v in values])
    expected = torch.cat([r.detach().double().flatten() for r in reference])
    return float((value - expected).norm() / expected.norm())


def inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images (B, 3, H, W) and logit weights (B, classes)."""
    return torch.randn(BATCH, 3, IMAGE, IMAGE, device=device), torch.randn(BATCH, CLASSES, device=device)


def assert_traces_into_one_graph_with_the_kpca_ops(device: str) -> None:
    torch._dynamo.reset()
    images, _ = inputs(device)
    explanation = torch._dynamo.explain(rpc_vit(device))(images)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    targets = {node.target for graph in explanation.graphs for node in graph.graph.nodes}
    assert targets >= KPCA_OPS, f"the graph lacks {KPCA_OPS - targets}: the Triton kernels are not in it"


def assert_shrinks_a_share_of_the_keys(device: str) -> None:
    """The model's sparse parts S are neither empty nor full, so the comparison covers both sides of the threshold."""
    model = rpc_vit(device)
    for block in model.blocks:
        block.attn.record_state = True
    model(inputs(device)[0])
    shares = [float(block.attn.last_state.nonzero_fraction[-1].mean()) for block in model.blocks]
    assert all(0.02 < share < 0.5 for share in shares), shares


def assert_compiled_matches_eager_in_float32(device: str) -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, (images, weights) = rpc_vit(device), inputs(device)
    eager = loss_and_grads(model, images, weights)
    compiled = loss_and_grads(torch.compile(model, fullgraph=True), images, weights)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # it did compile, in one graph
    for c, e in zip(compiled, eager, strict=True):
        torch.testing.assert_close(c, e, **FLOAT32_TOLERANCE)


def assert_compiled_bf16_autocast_within_twice_eager_error(device: str) -> None:
    """Under bf16 autocast (the apps' ``bf16-mixed``): flash-attn's rule against the float32 eager run.

    The compiled run's relative error (loss and every gradient, as one vector) is at most twice the eager bf16
    run's. Elementwise closeness would be the wrong test here: Inductor keeps fused intermediates in float32 where
    eager rounds each op to bf16, and keys that land on the other side of the threshold flip a gradient entry.
    """
    torch._dynamo.reset()
    model, (images, weights) = rpc_vit(device), inputs(device)
    reference = loss_and_grads(model, images, weights)
    compiled_model = torch.compile(model, fullgraph=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        eager = loss_and_grads(model, images, weights)
        compiled = loss_and_grads(compiled_model, images, weights)
    eager_error, compiled_error = relative_error(eager, reference), relative_error(compiled, reference)
    assert 0 < eager_error < 0.1, eager_error  # bf16 did round, and the eager run is sane
    assert compiled_error <= 2 * eager_error, (compiled_error, eager_error)


@pytest.mark.gpu
def test_rpc_vit_traces_into_one_graph_with_the_kpca_ops():
    assert_traces_into_one_graph_with_the_kpca_ops("cuda")


@pytest.mark.gpu
def test_the_test_model_shrinks_a_share_of_the_keys():
    assert_shrinks_a_share_of_the_keys("cuda")


@pytest.mark.gpu
def test_compiled_rpc_vit_matches_eager_forward_and_backward():
    assert_compiled_matches_eager_in_float32("cuda")


@pytest.mark.gpu
def test_compiled_rpc_vit_under_bf16_autocast_is_within_twice_the_eager_error():
    assert_compiled_bf16_autocast_within_twice_eager_error("cuda")


def _sign(k: torch.Tensor) -> torch.Tensor:
    """A saved int8 sign of K's shape (B, H, N, D): -1, 0 or 1."""
    return torch.randint(-1, 2, k.shape, dtype=torch.int8, device=k.device)


def _first_backward_args(k: torch.Tensor, per_row_tau: bool) -> tuple:
    """(sign, grad S, grad Kt, K's dtype, tau_div); per-row tau (causal) with grad S absent and bf16 keys."""
    if per_row_tau:
        return _sign(k), None, torch.randn_like(k), torch.bfloat16, 1
    return _sign(k), torch.randn_like(k), torch.randn_like(k), k.dtype, k.shape[2]


def _step_backward_args(k: torch.Tensor, per_row_tau: bool) -> tuple:
    """(sign, grad Z', grad S', grad Kt, K's and L's dtypes, tau_div, need grad Z); per-row tau without Z."""
    grads = [torch.randn_like(k) for _ in range(3)]
    if per_row_tau:
        return _sign(k), None, *grads[1:], torch.bfloat16, torch.float32, 1, False
    return _sign(k), *grads, k.dtype, k.dtype, k.shape[2], True


def _mu_backward_args(k: torch.Tensor, is_causal: bool) -> tuple:
    """(K, mask, mu, ||K||_1, grad mu, is_causal, eps): unmasked, or causal with a padding mask."""
    mask = torch.rand(k.shape[0], k.shape[2], device=k.device) > 0.7 if is_causal else None  # (B, N)
    mu, l1 = ops.pap_mu_op(k, mask, 8, is_causal, 1e-12)  # (B, H, 1, 1), or (B, H, N, 1) when causal
    return k, mask, mu, l1, torch.randn_like(mu), is_causal, 1e-12


BACKWARD_CASES = {
    "pap_first_backward": (ops.pap_first_backward_op, _first_backward_args, False),
    "pap_first_backward_per_row_tau": (ops.pap_first_backward_op, _first_backward_args, True),
    "pap_step_backward": (ops.pap_step_backward_op, _step_backward_args, False),
    "pap_step_backward_per_row_tau_no_z": (ops.pap_step_backward_op, _step_backward_args, True),
    "pap_mu_backward": (ops.pap_mu_backward_op, _mu_backward_args, False),
    "pap_mu_backward_causal_padded": (ops.pap_mu_backward_op, _mu_backward_args, True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_custom_ops_pass_opcheck(case, device):
    """Schema and fake (meta) implementation of each backward op, checked by torch.library.opcheck on real inputs."""
    op, make_args, variant = BACKWARD_CASES[case]
    k = torch.randn(2, 2, 5, 4, device=device)  # (B, H, N, D)
    torch.library.opcheck(op, make_args(k, variant))
