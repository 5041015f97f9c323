"""CausalTransformerLM: strict causality for every attention kind, shapes, parameters, generation."""

import pytest
import torch
from torch import nn

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention, swap_attention
from kpca.language_model.model import CausalTransformerLM, sinusoidal_positions
from tests.values_per_call import forwards_from_two_threads, held_tensors

RPC_ALL = AttentionSpec(kind="rpc", n_iter=2, layers="all")
SPECS = {
    "softmax": AttentionSpec(kind="softmax"),
    "symmetric": AttentionSpec(kind="symmetric"),
    "rpc_all": RPC_ALL,
    "rpc_block0_6iter": AttentionSpec(kind="rpc", n_iter=6, layers=[0]),
    "twicing": AttentionSpec(kind="twicing"),
    "neutreno": AttentionSpec(kind="neutreno", lambd=0.4),  # the papers' language setting
    "elliptical": AttentionSpec(kind="elliptical"),  # m at t: a prefix mean over tokens <= t
    "elliptical_last": AttentionSpec(kind="elliptical", layers=[2]),  # blocks 0, 1: softmax that hands its v on
}
ROBUST = ("twicing", "neutreno", "elliptical", "elliptical_last")


def tiny(attention: AttentionSpec = RPC_ALL, **kwargs) -> CausalTransformerLM:
    options = {"vocab_size": 50, "context": 24, "width": 32, "depth": 3, "num_heads": 4, "ffn_dim": 64, **kwargs}
    return CausalTransformerLM(attention=attention, **options)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("name", list(SPECS))
def test_logits_at_t_ignore_every_token_after_t(name: str, norm_position: str):
    model = tiny(SPECS[name], norm_position=norm_position).double().eval()
    tokens = torch.randint(0, 50, (2, 24))
    logits = model(tokens)
    for t in (0, 7, 22):
        changed = tokens.clone()
        changed[:, t + 1 :] = torch.randint(0, 50, (2, 23 - t))
        other = model(changed)
        torch.testing.assert_close(other[:, : t + 1], logits[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(other[:, t + 1 :], logits[:, t + 1 :])


@pytest.mark.parametrize("name", ROBUST)
def test_robust_kinds_leak_nothing_to_earlier_positions_bit_for_bit_and_keep_no_state(name: str):
    model = tiny(SPECS[name]).double().eval()
    tokens = torch.randint(0, 50, (2, 24))
    logits = model(tokens)
    assert held_tensors(model) == []  # the values one block reads from another lived in the forward's loop only
    for j in (1, 9, 23):
        changed = tokens.clone()
        changed[:, j] = (changed[:, j] + 1) % 50  # perturb token j only
        assert torch.equal(model(changed)[:, :j], logits[:, :j])
    assert model.state_dict().keys() == tiny(SPECS["softmax"]).state_dict().keys()


@pytest.mark.parametrize("name", ["neutreno", "elliptical"])
def test_two_threads_sharing_one_lm_with_different_batch_sizes_each_get_their_own_outputs(name: str):
    model = tiny(SPECS[name]).eval()
    inputs = [torch.randint(0, 50, (3, 24)), torch.randint(0, 50, (5, 17))]
    errors, wrong = forwards_from_two_threads(model, inputs, forwards=150)
    assert (errors, wrong) == ([], 0)


def test_gradients_of_position_t_do_not_reach_later_tokens_with_rpc_everywhere():
    model = tiny(RPC_ALL).double().eval()
    embedded = []
    model.embed.register_forward_hook(lambda module, args, out: embedded.append(out) or out.retain_grad())
    model(torch.randint(0, 50, (1, 24)))[0, 9].sum().backward()
    grad = embedded[0].grad[0]  # (N, C)
    assert grad[:10].abs().sum() > 0
    assert grad[10:].abs().sum() == 0


def test_the_authors_elliptical_lm_sees_later_tokens_and_ours_does_not():
    """``convention: reference``: the authors' WikiText-103 Elliptical (a whole-segment estimate, no 1/sqrt(D)); a
    later token changes earlier positions' logits. The default (``causal``) leaks nothing, bit for bit."""
    tokens = torch.randint(0, 50, (2, 24))
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 50
    for convention, leaks in (("causal", False), ("reference", True)):
        model = tiny(AttentionSpec(kind="elliptical", convention=convention)).double().eval()
        assert [block.attn.convention for block in model.blocks] == [convention] * 3
        assert torch.equal(model(changed)[:, :20], model(tokens)[:, :20]) is not leaks, convention


def test_neutreno_left_unset_takes_the_papers_language_lambd():
    """The LM builds with the language defaults: NeuTRENO's lambd 0.4 (0.6 is the images' setting)."""
    model = CausalTransformerLM(
        50, context=8, width=16, depth=3, num_heads=2, ffn_dim=32, attention=AttentionSpec(kind="neutreno")
    )
    assert [block.attn.lambd for block in model.blocks] == [0.4] * 3
    assert model.attention.lambd is None  # what was chosen is kept
    chosen = AttentionSpec(kind="neutreno", lambd=0.6)
    model = CausalTransformerLM(50, context=8, width=16, depth=2, num_heads=2, ffn_dim=32, attention=chosen)
    assert [block.attn.lambd for block in model.blocks] == [0.6] * 2


def test_shapes_tied_embeddings_and_dropout_only_in_training():
    model = tiny(dropout=0.5)
    tokens = torch.randint(0, 50, (3, 10))
    assert model(tokens).shape == (3, 10, 50)
    assert model.head.weight is model.embed.weight
    model.eval()
    torch.testing.assert_close(model(tokens), model(tokens))
    model.train()
    assert not torch.allclose(model(tokens), model(tokens))
    assert tiny(tie_embeddings=False).head.weight is not tiny(tie_embeddings=False).embed.weight


def test_blocks_get_the_spec_in_chosen_layers_and_the_baseline_elsewhere():
    model = tiny(AttentionSpec(kind="rpc", n_iter=6, layers=[0]))
    assert isinstance(model.blocks[0].attn, RPCAttention) and model.blocks[0].attn.n_iter == 6
    assert all(type(b.attn) is SoftmaxAttention and b.attn.symmetric for b in model.blocks[1:])
    assert all(b.attn.is_causal for b in model.blocks)
    model = tiny(AttentionSpec(kind="symmetric", layers=[1], backend="torch"))
    assert [type(b.attn) for b in model.blocks] == [SoftmaxAttention] * 3
    assert [b.attn.symmetric for b in model.blocks] == [False, True, False]
    assert all(b.attn.backend == "torch" for b in model.blocks)


def test_parameter_count_of_the_paper_model():
    vocab, width, depth, ffn = 32000, 128, 16, 2048
    per_block_symmetric = (width * 2 * width + 2 * width) + (width * width + width) + 2 * (2 * width)
    per_block_symmetric += (width * ffn + ffn) + (ffn * width + width)
    expected = vocab * width + depth * per_block_symmetric  # tied head, sinusoidal positions, post-LN (no final norm)
    symmetric = CausalTransformerLM(vocab, attention=AttentionSpec(kind="symmetric"))
    rpc = CausalTransformerLM(vocab, attention=AttentionSpec(kind="rpc", n_iter=2))
    softmax = CausalTransformerLM(vocab, attention=AttentionSpec(kind="softmax"))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(symmetric) == count(rpc) == expected
    assert count(softmax) == expected + depth * (width * width + width)
    rpc.load_state_dict(symmetric.state_dict())  # RPC adds no parameters: a symmetric checkpoint loads as is


def test_sinusoidal_positions_match_the_formula():
    table = sinusoidal_positions(5, 8)
    assert table[3, 2] == pytest.approx(torch.sin(torch.tensor(3 / 10000 ** (2 / 8))).item(), abs=1e-6)
    assert table[3, 3] == pytest.approx(torch.cos(torch.tensor(3 / 10000 ** (2 / 8))).item(), abs=1e-6)


def test_greedy_generation_is_the_argmax_continuation_within_the_context():
    model = tiny(context=8).eval()
    prompt = torch.randint(0, 50, (2, 5))
    out = model.generate(prompt, max_new_tokens=6)
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    tokens = prompt
    for _ in range(6):
        tokens = torch.cat([tokens, model(tokens[:, -8:])[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, tokens)
    assert torch.equal(model.generate(prompt, 6, top_k=1), out)


def test_top_k_sampling_is_seeded_and_stays_in_the_top_k():
    model = tiny().eval()
    prompt = torch.randint(0, 50, (4, 3))
    sample = lambda seed: model.generate(prompt, 5, top_k=3, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(sample(1), sample(1))
    out = sample(1)
    for step in range(5):
        top3 = model(out[:, : 3 + step])[:, -1].topk(3).indices
        assert (top3 == out[:, 3 + step, None]).any(-1).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"width": 30}, "divisible by num_heads"),
        ({"norm_position": "middle"}, "norm_position='middle' is not one of 'pre', 'post'"),
        ({"positions": "rotary"}, "positions='rotary' is not one of 'sinusoidal', 'learned'"),
        ({"output": "hierarchical"}, "output='hierarchical' is not one of 'softmax', 'adaptive'"),
        ({"vocab_size": 1}, "vocab_size"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_too_long_inputs_and_bad_generation_settings_are_refused():
    model = tiny(context=8)
    with pytest.raises(ValueError, match="more than the model's context 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="top_k"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 1, top_k=0)
    with pytest.raises(ValueError, match="prompt"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 1)


def test_attention_dropout_is_its_own_knob_and_off_by_default_as_the_authors():
    model = tiny(dropout=0.1)
    assert all(b.attn.attn_drop.p == 0.0 and b.attn.proj_drop.p == 0.1 for b in model.blocks)
    assert all(b.ffn.drop.p == 0.1 for b in model.blocks)
    tokens = torch.randint(0, 50, (2, 12))
    only_attention = tiny(AttentionSpec(kind="softmax"), dropout=0.0, attention_dropout=0.5).train()
    assert all(b.attn.attn_drop.p == 0.5 for b in only_attention.blocks)
    assert not torch.allclose(only_attention(tokens), only_attention(tokens))  # attention dropout alone acts
    no_dropout = tiny(AttentionSpec(kind="softmax"), dropout=0.0).train()
    torch.testing.assert_close(no_dropout(tokens), no_dropout(tokens), rtol=0, atol=0)


def test_relu_and_bias_free_attention_as_the_authors():
    model = tiny(activation="relu", attention_bias=False).double()
    assert all(b.attn.qkv.bias is None and b.attn.proj.bias is None for b in model.blocks)
    ffn = model.blocks[0].ffn.eval()
    x = torch.randn(2, 3, 32, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), ffn.fc2(torch.relu(ffn.fc1(x))))
    with pytest.raises(ValueError, match="activation='swish' is not one of 'gelu', 'relu'"):
        tiny(activation="swish")
    assert tiny().blocks[0].ffn.activation is torch.nn.functional.gelu  # the default


def test_log_probabilities_of_the_softmax_head_normalise_and_give_its_nll():
    model = tiny().double().eval()
    tokens, targets = torch.randint(0, 50, (2, 10)), torch.randint(0, 50, (2, 10))
    log_probs = model(tokens)  # (B, N, V)
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(2, 10, dtype=torch.float64))
    expected = -log_probs.gather(-1, targets[..., None]).squeeze(-1)  # (B, N)
    torch.testing.assert_close(model.token_nll(tokens, targets), expected.flatten())


def adaptive(**kwargs) -> CausalTransformerLM:
    return tiny(output="adaptive", adaptive_cutoffs=(10, 30), tie_embeddings=False, **kwargs).double().eval()


def test_adaptive_softmax_log_probabilities_normalise_and_its_loss_is_their_nll():
    model = adaptive()
    assert isinstance(model.head, nn.AdaptiveLogSoftmaxWithLoss) and model.head.div_value == 1.0
    assert model.head.cutoffs == [10, 30, 50] and model.head.head_bias
    tokens = torch.randint(0, 50, (3, 12))
    targets = torch.cat([torch.arange(0, 50, 2), torch.arange(1, 50, 5), torch.tensor([49])]).reshape(3, 12)
    log_probs = model(tokens)  # (B, N, V): every cluster is visited by the targets
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(3, 12, dtype=torch.float64))
    from_log_probs = -log_probs.gather(-1, targets[..., None]).squeeze(-1).flatten()  # (B * N,)
    nll = model.token_nll(tokens, targets)
    torch.testing.assert_close(nll, from_log_probs, rtol=1e-12, atol=1e-12)
    hidden = model.hidden(tokens).flatten(0, 1)
    torch.testing.assert_close(model.head(hidden, targets.flatten()).loss, from_log_probs.mean())
    scored = torch.zeros(3, 12, dtype=torch.bool)
    scored[:, -1] = True
    torch.testing.assert_close(model.token_nll(tokens, targets, scored), from_log_probs.reshape(3, 12)[:, -1])


def test_adaptive_softmax_generates_and_has_its_own_weights():
    model = adaptive()
    out = model.generate(torch.randint(0, 50, (2, 3)), max_new_tokens=4)
    assert out.shape == (2, 7)
    assert out[:, 3].tolist() == model(out[:, :3])[:, -1].argmax(-1).tolist()
    with pytest.raises(ValueError, match="tie_embeddings: false with output: adaptive"):
        tiny(output="adaptive", adaptive_cutoffs=(10, 30))


@pytest.mark.parametrize("cutoffs", [(20000, 40000, 200000), (30, 10), (0, 10), (10, 50), ()])
def test_adaptive_cutoffs_are_checked_against_the_vocabulary(cutoffs: tuple[int, ...]):
    with pytest.raises(ValueError, match=r"vocabulary of 50 words.*between 1 and vocab_size - 1 = 49.*\[4, 7, 37\]"):
        tiny(output="adaptive", adaptive_cutoffs=cutoffs, tie_embeddings=False)


def test_parameter_count_of_the_published_model_with_the_adaptive_softmax():
    vocab, width, depth, ffn = 267735, 128, 16, 2048
    per_block = (width * 2 * width) + (width * width) + 2 * (2 * width) + (width * ffn + ffn) + (ffn * width + width)
    head = width * (20000 + 3) + (20000 + 3)  # shortlist + 3 cluster logits, with bias
    tails = sum(width * width + width * size for size in (20000, 160000, 67735))  # div_value 1: C x C, then C x size
    model = CausalTransformerLM(
        vocab, attention=AttentionSpec(kind="symmetric"), output="adaptive", tie_embeddings=False,
        attention_bias=False, activation="relu",
    )  # fmt: skip
    assert sum(p.numel() for p in model.parameters()) == vocab * width + depth * per_block + head + tails


@pytest.mark.parametrize("spec", [AttentionSpec(kind="symmetric"), AttentionSpec(kind="rpc", n_iter=2, layers=[1])])
def test_attention_built_per_block_is_what_a_swap_gives_but_a_swap_would_draw_other_weights(spec: AttentionSpec):
    """Why the LM builds attention per block instead of swapping it as the ViTs do (CausalTransformerLM's docstring)."""
    torch.manual_seed(0)
    built = tiny(spec)
    torch.manual_seed(0)
    swapped = tiny(AttentionSpec(kind="softmax"))
    swap_attention(swapped, spec)
    assert [type(b.attn) for b in built.blocks] == [type(b.attn) for b in swapped.blocks]
    assert all(b.attn.is_causal for b in swapped.blocks)
    layout = {name: tensor.shape for name, tensor in built.state_dict().items()}
    assert layout == {name: tensor.shape for name, tensor in swapped.state_dict().items()}
    assert not torch.equal(built.blocks[1].attn.qkv.weight, swapped.blocks[1].attn.qkv.weight)
