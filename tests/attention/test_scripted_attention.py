"""The attention calls as TorchScript compiles them (the torch backend on plain ops) against the float64 reference.

The modules' attention calls (``kpca.attention._calls``) run the public functions eagerly; TorchScript compiles
only their scripting branch: ``masked_sdpa`` and ``_pap.pap_attention``, whose gradients are autograd's rather than
``PapFirst`` / ``PapStep``'s. These tests script the calls and hold that path to the reference, forward and backward,
as ``test_rpc_attention.py`` holds the eager path.
"""

import itertools

import pytest
import torch

from kpca.attention import _calls, rpc_attention
from kpca.attention.reference import rpc_attention_reference, softmax_attention_reference

from .helpers import make_kv, outputs_and_grads

# torch deprecates TorchScript (a DeprecationWarning in 2.11, a FutureWarning in 2.14); the tests check that the
# models still script, as timm's do.
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:`torch.jit.script` is deprecated:{category}")
    for category in ("DeprecationWarning", "FutureWarning")
]


_CALLS = 2 + torch._C._jit_get_num_profiled_runs()
"""Calls of a compiled function per check: the executor profiles the first, then runs an optimised graph, whose
autodiff once got clamp's bound gradient wrong (``_pap.shrink``): the checks cover both."""


@pytest.fixture(scope="module")
def scripted() -> dict[str, torch.jit.ScriptFunction]:
    """The calls compiled once for the module: compiling takes about a second each."""
    return {name: torch.jit.script(getattr(_calls, name)) for name in ("softmax_call", "rpc_call", "scaled_values")}


def _valid_rows(key_padding_mask, like):
    if key_padding_mask is None:
        return torch.ones_like(like)
    return (~key_padding_mask)[:, None, :, None].to(like.dtype).expand_as(like)


def _compare_rpc(scripted, n_iter, lambd, is_causal=False, convention="reference", b=2, h=3, n=7, d=4, **masks):
    k, v = make_kv(b, h, n, d)
    attn_mask, key_padding_mask = masks.get("attn_mask"), masks.get("key_padding_mask")
    width = h * d if convention == "reference" else d

    def compiled(k, v):
        out = scripted["rpc_call"](
            k, v, n_iter, lambd, convention, width, attn_mask, key_padding_mask, is_causal, 0.0, "auto"
        )
        return out * _valid_rows(key_padding_mask, out)

    def reference(k, v):
        return rpc_attention_reference(
            k, v, n_iter=n_iter, lambd=lambd, is_causal=is_causal, convention=convention, **masks
        )

    out_ref, grads_ref = outputs_and_grads(reference, k, v)
    for _ in range(_CALLS):
        out, grads = outputs_and_grads(compiled, k, v)
        torch.testing.assert_close(out, out_ref)
        for g, g_ref in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize(
    ("n_iter", "lambd", "is_causal", "convention"),
    list(itertools.product([1, 2, 4], [0.05, 0.5, 4.0], [False, True], ["reference", "pcp"])),
)
def test_scripted_rpc_matches_reference(scripted, n_iter, lambd, is_causal, convention):
    _compare_rpc(scripted, n_iter, lambd, is_causal, convention)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_scripted_rpc_matches_reference_with_masks_and_padding(scripted, kind, is_causal):
    n = 9
    allowed = torch.rand(3, 1, n, n) > 0.3
    allowed |= torch.eye(n, dtype=torch.bool)  # every query keeps at least itself
    mask = allowed if kind == "bool" else torch.randn(3, 3, n, n, dtype=torch.float64)
    padding = torch.zeros(3, n, dtype=torch.bool)
    padding[0, 6:] = True  # right padding
    padding[1, :2] = True  # left padding (a causal padded row has no valid key at all)
    _compare_rpc(scripted, 3, 0.3, is_causal, b=3, n=n, attn_mask=mask, key_padding_mask=padding)


def test_scripted_rpc_equals_the_eager_forward_to_the_bit(scripted):
    k, v = make_kv(2, 3, 16, 8, dtype=torch.float32, requires_grad=False)
    for is_causal, convention in itertools.product((False, True), ("reference", "pcp")):
        width = 24 if convention == "reference" else 8
        compiled = scripted["rpc_call"](k, v, 4, 0.5, convention, width, None, None, is_causal, 0.0, "torch")
        eager = rpc_attention(k, v, n_iter=4, lambd=0.5, is_causal=is_causal, convention=convention, backend="torch")
        assert torch.equal(compiled, eager), (is_causal, convention)


@pytest.mark.parametrize("is_causal", [False, True])
def test_scripted_softmax_matches_reference(scripted, is_causal):
    q, _ = make_kv(2, 3, 7, 4)
    k, v = make_kv(2, 3, 7, 4)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 5:] = True

    def compiled(q, k, v):
        out = scripted["softmax_call"](q, k, v, None, padding, is_causal, 0.0, "auto")
        return out * _valid_rows(padding, out)

    def reference(q, k, v):
        return softmax_attention_reference(q, k, v, key_padding_mask=padding, is_causal=is_causal)

    out_ref, grads_ref = outputs_and_grads(reference, q, k, v)
    for _ in range(_CALLS):
        out, grads = outputs_and_grads(compiled, q, k, v)
        torch.testing.assert_close(out, out_ref)
        for g, g_ref in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(g, g_ref)


def test_scripted_calls_refuse_triton_and_name_the_fix(scripted):
    k, v = make_kv(1, 2, 5, 4, dtype=torch.float32, requires_grad=False)
    with pytest.raises(torch.jit.Error, match="backend='triton' cannot run in a TorchScript model.*backend='torch'"):
        scripted["softmax_call"](k, k, v, None, None, False, 0.0, "triton")
    with pytest.raises(torch.jit.Error, match="backend='triton' cannot run in a TorchScript model"):
        scripted["rpc_call"](k, v, 2, 4.0, "reference", 8, None, None, False, 0.0, "triton")


def test_scripted_scaled_values_check_the_sequence_length(scripted):
    v = torch.randn(2, 3, 5, 4)
    s_matrix = torch.randn(3, 5, 5)
    torch.testing.assert_close(scripted["scaled_values"](v, s_matrix, False, None), v - s_matrix @ v)
    with pytest.raises(torch.jit.Error, match="built for num_tokens=5 but got N=4 tokens"):
        scripted["scaled_values"](v[:, :, :4], s_matrix, False, None)
    with pytest.raises(torch.jit.Error, match="cannot be causal or take a key_padding_mask"):
        scripted["scaled_values"](v, s_matrix, True, None)
