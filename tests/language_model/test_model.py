"""CausalTransformerLM: strict causality for every attention kind, shapes, parameters, generation."""

import pytest
import torch

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention
from kpca.language_model.model import CausalTransformerLM, sinusoidal_positions

RPC_ALL = AttentionSpec(kind="rpc", n_iter=2, layers="all")
SPECS = {
    "softmax": AttentionSpec(kind="softmax"),
    "symmetric": AttentionSpec(kind="symmetric"),
    "rpc_all": RPC_ALL,
    "rpc_block0_6iter": AttentionSpec(kind="rpc", n_iter=6, layers=[0]),
}


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


def test_gradients_of_position_t_do_not_reach_later_tokens_with_rpc_everywhere():
    model = tiny(RPC_ALL).double().eval()
    embedded = []
    model.embed.register_forward_hook(lambda module, args, out: embedded.append(out) or out.retain_grad())
    model(torch.randint(0, 50, (1, 24)))[0, 9].sum().backward()
    grad = embedded[0].grad[0]  # (N, C)
    assert grad[:10].abs().sum() > 0
    assert grad[10:].abs().sum() == 0


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
        ({"norm_position": "middle"}, "norm_position"),
        ({"positions": "rotary"}, "positions"),
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
