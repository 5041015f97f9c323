"""Segmenter and its mask-transformer head: shapes, attention per AttentionSpec, padding, init_from, decoder
dropout, and the head against mmseg's ``SegmenterMaskTransformerHead`` with copied weights."""

from pathlib import Path

import pytest
import torch

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention
from kpca.attention.vit import create_vit
from kpca.segmentation.model import MaskTransformerHead, Segmenter
from tests.attention.helpers import assert_vit_holds
from tests.values_per_call import forwards_from_two_threads, held_tensors

pytestmark = pytest.mark.mmseg

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "drop_path_rate": 0.0}
RPC = AttentionSpec(kind="rpc", n_iter=6, layers=[0])
SHALLOW = {"img_size": 32, "depth": 2, "drop_path_rate": 0.0}  # DeiT's width and heads, 2 blocks on 2 x 2 patches


def test_head_maps_patch_tokens_to_class_masks():
    head = MaskTransformerHead(in_dim=24, num_classes=5, dim=128)
    masks = head(torch.randn(2, 12, 24), grid=(3, 4))  # (B, N, E) tokens on a 3 x 4 grid
    assert masks.shape == (2, 5, 3, 4)
    assert len(head.blocks) == 2 and head.blocks[0].attn.num_heads == 2  # width // 64
    torch.testing.assert_close(masks.mean(1), torch.zeros(2, 3, 4), atol=1e-5, rtol=0)  # LayerNorm over classes


def test_head_with_rpc_attention_is_symmetric_and_trains():
    head = MaskTransformerHead(in_dim=16, num_classes=3, dim=64, num_heads=2, attention=RPC)
    first, second = (block.attn for block in head.blocks)
    assert isinstance(first, RPCAttention) and first.n_iter == 6 and first.symmetric
    assert isinstance(second, SoftmaxAttention) and second.symmetric  # RPC models are symmetric elsewhere
    assert first.qkv.out_features == 2 * 64  # K and V only
    tokens = torch.randn(2, 9, 16, requires_grad=True)
    head(tokens, grid=(3, 3)).square().sum().backward()
    assert torch.isfinite(tokens.grad).all() and tokens.grad.abs().sum() > 0


def mmseg_head_with_weights_of(head: MaskTransformerHead, in_dim: int) -> torch.nn.Module:
    """mmseg 1.2.2's SegmenterMaskTransformerHead holding ``head``'s weights (softmax or symmetric attention)."""
    from mmseg.models.decode_heads.segmenter_mask_head import SegmenterMaskTransformerHead

    dim, num_classes = head.cls_emb.shape[-1], head.num_classes
    heads = head.blocks[0].attn.num_heads
    oracle = SegmenterMaskTransformerHead(
        in_channels=in_dim, channels=dim, num_classes=num_classes, num_layers=len(head.blocks), num_heads=heads,
        embed_dims=dim, drop_path_rate=0.0,
    )  # fmt: skip
    with torch.no_grad():
        oracle.dec_proj.load_state_dict(head.proj_dec.state_dict())
        oracle.cls_emb.copy_(head.cls_emb)
        for layer, block in zip(oracle.layers, head.blocks, strict=True):
            layer.ln1.load_state_dict(block.norm1.state_dict())
            layer.ln2.load_state_dict(block.norm2.state_dict())
            weight, bias = block.attn.qkv.weight, block.attn.qkv.bias  # rows (Q, K, V) or, symmetric, (K, V)
            if weight.shape[0] == 2 * dim:  # symmetric attention is softmax attention with W_q = W_k
                weight, bias = torch.cat([weight[:dim], weight]), torch.cat([bias[:dim], bias])
            layer.attn.attn.in_proj_weight.copy_(weight)
            layer.attn.attn.in_proj_bias.copy_(bias)
            layer.attn.attn.out_proj.load_state_dict(block.attn.proj.state_dict())
            layer.ffn.layers[0][0].load_state_dict(block.mlp.fc1.state_dict())
            layer.ffn.layers[1].load_state_dict(block.mlp.fc2.state_dict())
        oracle.decoder_norm.load_state_dict(head.decoder_norm.state_dict())
        oracle.mask_norm.load_state_dict(head.mask_norm.state_dict())
        oracle.patch_proj.weight.copy_(head.proj_patch.T)  # ours: x @ P; Linear: x @ W.T
        oracle.classes_proj.weight.copy_(head.proj_classes.T)
    return oracle


@pytest.mark.filterwarnings("ignore:Fail to import ``MultiScaleDeformableAttention``:UserWarning")  # mmcv-lite
@pytest.mark.filterwarnings("ignore:``build_loss`` would be deprecated:UserWarning")  # mmseg's own head
@pytest.mark.filterwarnings("ignore:Default ``avg_non_ignore`` is False:UserWarning")  # its unused loss
@pytest.mark.parametrize("kind", ["softmax", "symmetric"])
def test_head_equals_mmsegs_segmenter_mask_transformer_head_with_the_same_weights(kind: str):
    torch.manual_seed(0)
    head = MaskTransformerHead(in_dim=24, num_classes=5, dim=64, num_heads=2, attention=AttentionSpec(kind=kind))
    with torch.no_grad():
        for name, param in head.named_parameters():  # every weight away from its init (LayerNorms included)
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
            else:
                param.normal_(0, 0.3)
    head = head.double().eval()
    oracle = mmseg_head_with_weights_of(head, in_dim=24).double().eval()
    tokens = torch.randn(2, 12, 24, dtype=torch.float64)  # (B, N, E) on a 3 x 4 grid, row-major
    expected = oracle([tokens.transpose(1, 2).reshape(2, 24, 3, 4)])  # mmseg takes (B, E, Gh, Gw) maps
    masks = head(tokens, grid=(3, 4))
    assert expected.shape == masks.shape == (2, 5, 3, 4)
    torch.testing.assert_close(masks, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_decoder_dropout_acts_in_train_mode_only(dropout: float):
    torch.manual_seed(0)
    net = Segmenter(num_classes=5, attention=RPC, decoder_dropout=dropout, **TINY)
    for block in net.decoder.blocks:  # block 0 RPC, block 1 symmetric: attention, projection and MLP
        drops = (block.attn.attn_drop, block.attn.proj_drop, block.mlp.drop1, block.mlp.drop2)
        assert [d.p for d in drops] == [dropout] * 4
    images = torch.rand(2, 3, 32, 32)  # (B, C, H, W)
    with torch.no_grad():
        train = [net(images), net(images)]
        net.eval()
        evaluation = [net(images), net(images)]
    assert torch.equal(train[0], train[1]) == (dropout == 0.0)  # the encoder has no dropout and no drop path here
    assert torch.equal(evaluation[0], evaluation[1])
    torch.manual_seed(0)
    undropped = Segmenter(num_classes=5, attention=RPC, decoder_dropout=0.0, **TINY).eval()  # the same init
    torch.testing.assert_close(evaluation[0], undropped(images), rtol=0, atol=0)


def test_segmenter_defaults_to_the_authors_decoder_dropout():
    assert Segmenter(num_classes=3, **TINY).decoder.blocks[0].mlp.drop1.p == 0.1


@pytest.mark.parametrize("size", [(32, 32), (40, 27)])
def test_segmenter_gives_logits_at_the_input_size(size: tuple[int, int]):
    net = Segmenter(num_classes=7, attention=RPC, **TINY).eval()
    images = torch.rand(2, 3, *size)  # (B, C, H, W), not always a multiple of the patch size
    logits = net(images)
    assert logits.shape == (2, 7, *size)
    assert net.forward_masks(torch.rand(1, 3, 32, 48)).shape == (1, 7, 4, 6)  # pos-embed interpolated to 4 x 6


def test_encoder_and_decoder_attention_follow_their_specs():
    net = Segmenter(num_classes=4, attention=RPC, decoder_attention=AttentionSpec(kind="symmetric"), **TINY)
    assert [type(b.attn).__name__ for b in net.vit.blocks] == ["RPCAttention", "SoftmaxAttention"]
    assert not any(isinstance(b.attn, RPCAttention) for b in net.decoder.blocks)
    assert Segmenter(num_classes=4, attention=RPC, **TINY).decoder_attention == RPC  # default: the encoder's
    assert net.decoder.blocks[0].attn.num_heads == 1 and net.decoder.cls_emb.shape == (1, 4, 32)


def test_unknown_arch_is_rejected():
    with pytest.raises(ValueError, match="arch='vit_huge' is not one of 'deit_tiny', 'deit_small', 'deit_base'"):
        Segmenter(arch="vit_huge", **TINY)


def test_init_from_a_classifier_checkpoint_skips_the_head_and_interpolates_pos_embed(tmp_path: Path):
    vit = create_vit("deit_tiny", AttentionSpec(kind="symmetric"), num_classes=10, **{**TINY, "img_size": 16})
    path = tmp_path / "classifier.ckpt"  # a vision-cls checkpoint: the classifier's ViT under net.vit.
    torch.save({"state_dict": {f"net.vit.{k}": v for k, v in vit.state_dict().items()}}, path)
    net = Segmenter(num_classes=5, attention=RPC, init_from=str(path), **TINY)  # 2 x 2 grid -> 4 x 4 grid
    torch.testing.assert_close(net.vit.blocks[0].attn.qkv.weight, vit.blocks[0].attn.qkv.weight)
    assert net.vit.pos_embed.shape == (1, 17, 32)
    with pytest.raises(ValueError, match="shape mismatch") as info:
        Segmenter(num_classes=5, init_from=str(path), **{**TINY, "embed_dim": 64})
    assert "skipped on purpose" in str(info.value) and "head.weight" in str(info.value)


@pytest.mark.parametrize(("arch", "width"), [("deit_tiny", 192), ("deit_small", 384), ("deit_base", 768)])
@pytest.mark.parametrize(
    ("source_kind", "encoder"),
    [("softmax", RPC), ("symmetric", AttentionSpec())],
    ids=["deit-to-rpc", "symvit-to-deit"],
)
def test_init_from_a_deit_or_symvit_file_at_deits_widths_fits_the_encoder(
    arch: str, width: int, source_kind: str, encoder: AttentionSpec, tmp_path: Path
):
    source = create_vit(arch, AttentionSpec(kind=source_kind), img_size=32, depth=2)  # DeiT or SymViT, with a head
    path = tmp_path / "classifier.pth"
    torch.save({"model": source.state_dict()}, path)
    net = Segmenter(arch, num_classes=3, attention=encoder, decoder_dim=64, init_from=str(path), **SHALLOW)
    rows = 2 * width if encoder.kind == "rpc" else 3 * width  # RPC: [K;V] from DeiT's [Q;K;V]; DeiT: Q from K
    assert [b.attn.qkv.out_features for b in net.vit.blocks] == [rows] * 2
    assert_vit_holds(net.vit, source.state_dict(), width)


@pytest.mark.parametrize("kind", ["twicing", "neutreno", "elliptical"])
def test_segmenter_with_a_robust_kind_trains_and_keeps_no_values(kind: str):
    spec = AttentionSpec(kind=kind)  # the decoder too: NeuTRENO's decoder block 1 reads decoder block 0's values
    model = Segmenter(num_classes=3, attention=spec, decoder_dropout=0.0, **TINY).train()  # Twicing: no dropout
    images = torch.rand(2, 3, 40, 36, requires_grad=True)
    logits = model(images)
    assert logits.shape == (2, 3, 40, 36)
    logits.square().mean().backward()
    assert torch.isfinite(images.grad).all() and images.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert held_tensors(model) == []  # the encoder's and the decoder's values lived in their loops only


@pytest.mark.parametrize("kind", ["neutreno", "elliptical"])
def test_two_threads_sharing_one_segmenter_with_different_batch_sizes_each_get_their_own_outputs(kind: str):
    spec = AttentionSpec(kind=kind)
    model = Segmenter(num_classes=3, attention=spec, decoder_attention=spec, **TINY).eval()
    inputs = [torch.rand(1, 3, 32, 32), torch.rand(3, 3, 40, 36)]
    errors, wrong = forwards_from_two_threads(model, inputs, forwards=150)
    assert (errors, wrong) == ([], 0)


def _elliptical_authors_decoder_state(in_dim: int, dim: int, classes: int, depth: int) -> dict[str, torch.Tensor]:
    """Random float64 weights in the layout of the Elliptical authors' ADE20K decoder.

    stefvk/Elliptical-Attention ``ADE20K/model/decoder.py`` (``MaskTransformer``) and ``model/blocks.py`` (its
    ``Block``: ``norm1``, ``attn.qkv`` = ``Linear(dim, 2 * dim)`` giving [K; V], ``attn.proj``, ``norm2``,
    ``mlp.fc1``, ``mlp.fc2``), as the keys and shapes of their ``state_dict``.
    """
    shapes: dict[str, tuple[int, ...]] = {
        "cls_emb": (1, classes, dim), "proj_dec.weight": (dim, in_dim), "proj_dec.bias": (dim,),
        "proj_patch": (dim, dim), "proj_classes": (dim, dim), "decoder_norm.weight": (dim,),
        "decoder_norm.bias": (dim,), "mask_norm.weight": (classes,), "mask_norm.bias": (classes,),
    }  # fmt: skip
    for i in range(depth):
        shapes |= {
            f"blocks.{i}.norm1.weight": (dim,), f"blocks.{i}.norm1.bias": (dim,),
            f"blocks.{i}.attn.qkv.weight": (2 * dim, dim), f"blocks.{i}.attn.qkv.bias": (2 * dim,),
            f"blocks.{i}.attn.proj.weight": (dim, dim), f"blocks.{i}.attn.proj.bias": (dim,),
            f"blocks.{i}.norm2.weight": (dim,), f"blocks.{i}.norm2.bias": (dim,),
            f"blocks.{i}.mlp.fc1.weight": (4 * dim, dim), f"blocks.{i}.mlp.fc1.bias": (4 * dim,),
            f"blocks.{i}.mlp.fc2.weight": (dim, 4 * dim), f"blocks.{i}.mlp.fc2.bias": (dim,),
        }  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    return {key: 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64) for key, shape in shapes.items()}


def _elliptical_authors_decoder(state: dict, tokens: torch.Tensor, grid: tuple[int, int], heads: int) -> torch.Tensor:
    """Their decoder's forward, restated in float64 from their files: symmetric softmax(K Kᵀ / sqrt(D)) V blocks."""
    norm = torch.nn.functional.layer_norm  # their nn.LayerNorm: eps 1e-5
    classes = state["cls_emb"].shape[1]
    x = tokens @ state["proj_dec.weight"].T + state["proj_dec.bias"]  # (B, N, C)
    x = torch.cat([x, state["cls_emb"].expand(x.shape[0], -1, -1)], dim=1)  # (B, N + K, C)
    b, n, c = x.shape
    for i in range(sum(key.endswith("attn.qkv.weight") for key in state)):
        p = {key.removeprefix(f"blocks.{i}."): value for key, value in state.items() if key.startswith(f"blocks.{i}.")}
        y = norm(x, (c,), p["norm1.weight"], p["norm1.bias"], 1e-5)
        kv = (
            (y @ p["attn.qkv.weight"].T + p["attn.qkv.bias"]).reshape(b, n, 2, heads, c // heads).permute(2, 0, 3, 1, 4)
        )
        k, v = kv[0], kv[1]  # (B, H, N, D) each
        attention = torch.softmax(k @ k.transpose(-2, -1) * (c // heads) ** -0.5, dim=-1)  # (B, H, N, N)
        y = (attention @ v).transpose(1, 2).reshape(b, n, c) @ p["attn.proj.weight"].T + p["attn.proj.bias"]
        x = x + y
        y = norm(x, (c,), p["norm2.weight"], p["norm2.bias"], 1e-5) @ p["mlp.fc1.weight"].T + p["mlp.fc1.bias"]
        x = x + torch.nn.functional.gelu(y) @ p["mlp.fc2.weight"].T + p["mlp.fc2.bias"]
    x = norm(x, (c,), state["decoder_norm.weight"], state["decoder_norm.bias"], 1e-5)
    patches = x[:, :-classes] @ state["proj_patch"]  # (B, N, C)
    cls = x[:, -classes:] @ state["proj_classes"]  # (B, K, C)
    patches, cls = patches / patches.norm(dim=-1, keepdim=True), cls / cls.norm(dim=-1, keepdim=True)
    masks = norm(patches @ cls.transpose(1, 2), (classes,), state["mask_norm.weight"], state["mask_norm.bias"], 1e-5)
    return masks.transpose(1, 2).reshape(b, classes, *grid)  # (B, K, Gh, Gw)


def test_the_elliptical_authors_decoder_weights_load_into_the_symmetric_decoder_and_compute_theirs():
    """The Elliptical Segmenter's decoder is symmetric, as its authors built it: their weights load, strictly, and
    give their forward; a softmax decoder (Segmenter's own) cannot take them."""
    in_dim, dim, classes, depth, heads, grid = 12, 16, 3, 2, 2, (2, 3)
    state = _elliptical_authors_decoder_state(in_dim, dim, classes, depth)
    symmetric = AttentionSpec(kind="symmetric", backend="torch")
    ours = MaskTransformerHead(in_dim, classes, dim, depth=depth, num_heads=heads, attention=symmetric).double().eval()
    ours.load_state_dict(state, strict=True)
    tokens = torch.randn(2, grid[0] * grid[1], in_dim, dtype=torch.float64)
    expected = _elliptical_authors_decoder(state, tokens, grid, heads)
    torch.testing.assert_close(ours(tokens, grid), expected, rtol=0, atol=1e-12)
    softmax = MaskTransformerHead(in_dim, classes, dim, depth=depth, num_heads=heads).double()
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks.0.attn.qkv.weight"):
        softmax.load_state_dict(state, strict=True)


def test_the_elliptical_segmenter_configs_have_the_authors_symmetric_decoder():
    import yaml

    configs = Path(__file__).resolve().parents[2] / "configs" / "segmentation"
    for name, encoder in (("elliptical", "elliptical"), ("softmax-symmetric-decoder", "softmax")):
        init = yaml.safe_load((configs / f"segmenter-tiny_{name}_8xb1-64e_ade20k-512.yaml").read_text())["model"]
        init = init["net"]["init_args"]
        assert (init["attention"]["kind"], init["decoder_attention"]["kind"]) == (encoder, "symmetric")
