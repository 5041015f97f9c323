"""The project's Vision Transformers: timm's DeiT sizes with any attention, in timm's registry, and their weights.

Needs timm (the ``timm`` extra of kpca-attention) and is imported explicitly: ``import kpca.attention`` does not
import it. Importing it registers with timm, for each size ``tiny`` / ``small`` / ``base`` (DeiT's widths 192 /
384 / 768 with 3 / 6 / 12 heads, 12 blocks, patch 16, 224 px):

- ``symvit_<size>_patch16_224``: SymViT (symmetric attention in every block);
- ``rpc_symvit_<size>_patch16_224``: RPC-SymViT (PAP with n_iter 4, lambd 4 in block 0, as the paper's example);
- ``deit_scaled_s_<size>_patch16_224`` / ``deit_scaled_alpha_<size>_patch16_224``: the scaled-attention variants;
- ``deit_twicing_<size>_patch16_224``, ``deit_neutreno_<size>_patch16_224`` (lambda 0.6),
  ``deit_elliptical_<size>_patch16_224``: the robust family in the papers' blocks (``layers: all``; NeuTRENO and
  Elliptical in block 0 are plain softmax, and the later blocks get block 0's or the previous block's values);

one family per attention kind registered before this import, named and set by its registration
(:func:`kpca.attention.spec.register_attention_kind`'s ``vit_family`` and ``vit_defaults``); softmax's is timm's own
DeiT.

``timm.create_model(name, attention={"n_iter": 2, "layers": "all"}, ...)`` overrides the attention settings (any
:class:`~kpca.attention.AttentionSpec` field but ``kind``); :func:`create_vit` builds any size with any
AttentionSpec (softmax: timm's own ``deit_<size>_patch16_224``). Every model built here is built as timm builds
its ViTs (``build_model_with_cfg``) with :func:`checkpoint_filter_fn` as its ``pretrained_filter_fn``, and is a
:class:`~kpca.attention.vit_blocks.ValuePassingViT` (timm's ``VisionTransformer`` whose block loop passes earlier
blocks' values to the attention, per call; the same parameters) but softmax's, timm's own class; so
``pretrained=True`` converts DeiT, SymViT and RPC weights into the model's attention layout, e.g.
``timm.create_model("symvit_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file="deit.pth"))``.
:func:`load_vit_state_dict` does the same conversion for a state dict in hand and reports it (:class:`LoadReport`).
:class:`PixelViT` is the encoder set-up both image apps' models derive from (pixels in [0, 1], ``init_from``).

The registered models expect timm-normalised inputs (their ``pretrained_cfg`` mean / std).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, get_args

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import resample_abs_pos_embed
from timm.models import VisionTransformer, build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from kpca.attention.errors import AttentionOptionError
from kpca.attention.layout import attention_dim, convert_qkv_rows, has_symmetric_qkv, is_attention_layer, qkv_rows
from kpca.attention.spec import AttentionSpec, kinds, registered_kind
from kpca.attention.swap import swap_attention
from kpca.attention.vit_blocks import ValuePassingViT

logger = logging.getLogger(__name__)

Arch = Literal["deit_tiny", "deit_small", "deit_base"]
"""DeiT's sizes (Touvron et al. 2021), all with patch 16 at 224 px."""
ARCHS: dict[str, dict[str, int]] = {
    "deit_tiny": {"embed_dim": 192, "depth": 12, "num_heads": 3},
    "deit_small": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "deit_base": {"embed_dim": 768, "depth": 12, "num_heads": 12},
}
"""The dimensions of each :data:`Arch`, keyed by its name: the one size table of the project."""
if set(ARCHS) != set(get_args(Arch)):
    raise ImportError(f"kpca.attention.vit: ARCHS names {sorted(ARCHS)}, Arch {sorted(get_args(Arch))}; make them one")
PATCH_SIZE = 16
TIMM_DEIT = "deit"
"""The ViT family that timm registers itself (``deit_<size>_patch16_224``: softmax attention)."""
_QKV_SUFFIXES = (".qkv.weight", ".qkv.bias")


def model_name(arch: str, kind: str) -> str:
    """The timm name of the ``arch`` ViT with attention ``kind``: ``<its vit_family>_<size>_patch16_224``.

    ``deit_tiny_patch16_224`` (timm's own DeiT) for ``softmax``, ``rpc_symvit_tiny_patch16_224`` for ``rpc``, and
    so on: the prefix is the kind's registration's (``register_attention_kind(..., vit_family=...)``).

    Raises:
        ValueError: if ``kind`` is no registered attention kind.
    """
    return f"{registered_kind(kind).vit_family}_{arch.removeprefix('deit_')}_patch{PATCH_SIZE}_224"


def pretrained_cfg(**overrides) -> dict:
    """A timm pretrained cfg of the project's models: ImageNet normalisation, DeiT's evaluation transform."""
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": True, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0",
        **overrides,
    }  # fmt: skip


def create_vit(
    arch: Arch,
    attention: AttentionSpec = AttentionSpec(),  # noqa: B008 (frozen-like dataclass default)
    pretrained: bool = False,
    **kwargs,
) -> VisionTransformer:
    """A timm VisionTransformer of DeiT size ``arch`` with ``attention``, built as the registered models are.

    Args:
        arch: one of :data:`Arch`.
        attention: which attention, in which blocks (see :meth:`AttentionSpec.per_block`).
        pretrained: load the weights of the model's pretrained cfg (for ``softmax``: timm's DeiT release; give a
            file with ``pretrained_cfg_overlay=dict(file=...)``), converted by :func:`checkpoint_filter_fn`.
        **kwargs: timm ``VisionTransformer`` arguments (``num_classes``, ``img_size``, ``patch_size``,
            ``drop_path_rate``, ...; ``embed_dim``, ``depth``, ``num_heads`` override the size's) and timm builder
            arguments (``pretrained_cfg_overlay``, ``features_only``, ...). None values are dropped, as
            ``timm.create_model`` drops them.

    Raises:
        ValueError: if ``arch`` is not one of :data:`Arch` (names it and the sizes).
    """
    if arch not in ARCHS:
        allowed = ", ".join(repr(name) for name in ARCHS)
        raise AttentionOptionError(f"arch={arch!r} is not one of {allowed}; choose one of DeiT's sizes.")
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    name = model_name(arch, attention.kind)
    return _build_vit(name, attention, pretrained, **{**ARCHS[arch], "patch_size": PATCH_SIZE, **kwargs})


def check_vit_sizes(vit_kwargs: Mapping[str, object]) -> None:
    """Refuse ViT sizes that timm would take and fail on later (a division by zero, an assertion, a silent crop).

    Checks the ``img_size``, ``patch_size``, ``embed_dim``, ``depth``, ``num_heads`` and ``drop_path_rate`` given
    (None: the architecture's own).

    Raises:
        AttentionOptionError: naming the value, its range and a value that fits.
    """
    sizes = {name: vit_kwargs.get(name) for name in ("img_size", "patch_size", "embed_dim", "depth", "num_heads")}
    for name, size in sizes.items():
        if size is not None and size < 1:
            raise AttentionOptionError(f"{name}={size} must be 1 or more")
    img_size, patch_size = sizes["img_size"], sizes["patch_size"]
    if img_size is not None and patch_size is not None and img_size % patch_size:
        fits = max(patch_size, img_size // patch_size * patch_size)
        raise AttentionOptionError(
            f"img_size={img_size} is not a multiple of patch_size={patch_size}: the patch grid would leave the last "
            f"{img_size % patch_size} pixel rows and columns out; use a multiple, e.g. img_size={fits}"
        )
    width, heads = sizes["embed_dim"], sizes["num_heads"]
    if width is not None and heads is not None and width % heads:
        raise AttentionOptionError(f"embed_dim={width} is not divisible by num_heads={heads}; pick a divisor")
    rate = vit_kwargs.get("drop_path_rate")
    if rate is not None and not 0.0 <= rate < 1.0:
        raise AttentionOptionError(f"drop_path_rate={rate} must be in [0, 1) (DeiT: 0.1; 0 disables)")


class PixelViT(nn.Module):
    """A :func:`create_vit` ViT on pixel-space images in [0, 1]: the encoder set-up both image apps' models share.

    Holds the ViT as ``vit`` and its ``attention``; normalises [0, 1] images itself (:meth:`normalise`, with the
    non-persistent ``mean`` / ``std`` buffers), so that corruptions and attacks act on real pixels; and starts ``vit``
    from a checkpoint's weights (:meth:`init_vit`). ``kpca.vision_cls.model.ViTClassifier`` and
    ``kpca.segmentation.model.Segmenter`` derive from it.

    Args:
        arch: one of :data:`Arch`.
        attention: which attention, in which blocks.
        mean: per-channel mean used to normalise [0, 1] inputs.
        std: per-channel std used to normalise [0, 1] inputs.
        **vit_kwargs: timm ``VisionTransformer`` arguments, as :func:`create_vit` takes them.
    """

    def __init__(
        self,
        arch: Arch,
        attention: AttentionSpec,
        *,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
        **vit_kwargs,
    ) -> None:
        super().__init__()
        check_vit_sizes(vit_kwargs)
        self.vit = create_vit(arch, attention, **vit_kwargs)
        self.attention = attention
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)  # (1, C, 1, 1)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)  # (1, C, 1, 1)

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) pixel-space images in [0, 1], normalised for ``vit`` with ``mean`` and ``std``."""
        return (images - self.mean) / self.std

    def init_vit(
        self,
        init_from: str,
        state_dict: Mapping[str, torch.Tensor],
        *,
        strict: bool,
        skip_prefixes: tuple[str, ...] = (),
    ) -> LoadReport:
        """Start ``vit`` from ``state_dict``, the weights of the apps' ``init_from`` file, converted to its attention.

        See :func:`load_vit_state_dict`; the report and the error name the ``init_from`` and ``init_strict`` options.
        """
        return load_vit_state_dict(
            self.vit,
            state_dict,
            strict=strict,
            skip_prefixes=skip_prefixes,
            source=f"init_from={init_from!r}",
            strict_option="init_strict=false",
        )

    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay beyond biases and norms (timm's list for ``vit``)."""
        return {f"vit.{name}" for name in self.vit.no_weight_decay()}


def _build_vit(name: str, attention: AttentionSpec, pretrained: bool, **kwargs) -> VisionTransformer:
    """A VisionTransformer built by timm's ``build_model_with_cfg``, ``attention`` swapped in before weights load."""
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(
        partial(_vit_with_attention, attention),
        name,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg={"out_indices": out_indices, "feature_cls": "getter"},
        **kwargs,
    )


def _vit_with_attention(attention: AttentionSpec, **kwargs) -> VisionTransformer:
    """A randomly initialised ViT(**kwargs) whose blocks' attention is then ``attention``'s.

    Softmax is timm's own ``VisionTransformer``; every other kind a :class:`ValuePassingViT` (the same parameters
    and random draws), so that a kind reading earlier blocks' values gets them.
    """
    if attention.kind == "softmax":
        return VisionTransformer(**kwargs)
    vit = ValuePassingViT(**kwargs)
    swap_attention(vit, attention)
    return vit


def _registered_attention(name: str, kind: str, overrides: Mapping[str, object]) -> AttentionSpec:
    """The attention of timm's ``name``: its kind's registered ViT settings, with ``overrides`` (``attention=``)."""
    if "kind" in overrides and overrides["kind"] != kind:
        raise AttentionOptionError(
            f"{name} has attention kind {kind!r}; got attention={dict(overrides)!r}. Drop 'kind', or build "
            "another kind with kpca.attention.vit.create_vit"
        )
    return registered_kind(kind).vit_attention(**{key: value for key, value in overrides.items() if key != "kind"})


def _entrypoint(kind: str, arch: str):
    name = model_name(arch, kind)

    def create(pretrained: bool = False, **kwargs) -> VisionTransformer:
        attention = _registered_attention(name, kind, kwargs.pop("attention", None) or {})
        return _build_vit(name, attention, pretrained, **{**ARCHS[arch], "patch_size": PATCH_SIZE, **kwargs})

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"{name}: timm ViT of {arch}'s size with {kind} attention (kpca.attention.vit)."
    return create


_REGISTERED = [
    (kind, arch) for kind in kinds() if registered_kind(kind).vit_family != TIMM_DEIT for arch in ARCHS
]  # every registered kind's ViTs but timm's own DeiTs, each size
default_cfgs = generate_default_cfgs({model_name(arch, kind): pretrained_cfg() for kind, arch in _REGISTERED})
for _kind, _arch in _REGISTERED:
    register_model(_entrypoint(_kind, _arch))


@dataclass
class LoadReport:
    """What happened to each tensor when loading a state dict into a ViT."""

    source: str
    loaded: int = 0
    converted: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when every model tensor was found and fitted."""
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        lines = [f"loaded {self.loaded} tensors from {self.source}"]
        for title, items in (
            ("converted", self.converted),
            ("missing in the checkpoint", self.missing),
            ("unexpected in the checkpoint", self.unexpected),
            ("shape mismatch", self.mismatched),
            ("skipped on purpose", self.skipped),
        ):
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines.extend(f"  {item}" for item in items)
        return "\n".join(lines)


def load_vit_state_dict(
    vit: VisionTransformer,
    state_dict: Mapping[str, torch.Tensor],
    *,
    strict: bool = True,
    skip_prefixes: tuple[str, ...] = (),
    source: str = "a state dict",
    strict_option: str = "strict=False",
) -> LoadReport:
    """Load DeiT, SymViT, RPC or our own ViT weights (timm key names) into ``vit``, converting what fits.

    The qkv rows of each block take the layout of that block's attention (asymmetric -> symmetric keeps the K and V
    rows and drops Q; symmetric -> asymmetric initialises Q from K), and position embeddings are interpolated to the
    model's patch grid. With ``strict`` any missing, unexpected or mismatched tensor raises a ValueError holding
    the full report, before anything loads; otherwise those tensors are skipped and the report is logged.

    Args:
        vit: the timm VisionTransformer to load into.
        state_dict: the weights, with timm's key names (``blocks.0.attn.qkv.weight``).
        strict: raise on anything that does not fit.
        skip_prefixes: state dict keys the model lacks that start with one of these (e.g. a classifier head that a
            segmentation encoder lacks) are left out and listed as skipped.
        source: where the weights come from, for the report (e.g. the file).
        strict_option: how the caller's user turns ``strict`` off, named in the error (an app: its option).

    Returns:
        The :class:`LoadReport`.

    Raises:
        ValueError: with ``strict``, if the report is not clean.
    """
    fitted, report = _fit_state_dict(vit, state_dict, skip_prefixes, source)
    if strict and not report.clean:
        raise AttentionOptionError(f"{source} does not fit the model (set {strict_option} to skip these):\n{report}")
    vit.load_state_dict(fitted, strict=False)
    report.loaded = len(fitted)
    logger.info("%s", report)
    return report


def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor], model: VisionTransformer) -> dict[str, torch.Tensor]:
    """The timm ``pretrained_filter_fn`` of the models built here: ``state_dict`` fitted to ``model``.

    Unwraps ``{"model": ...}`` and ``{"state_dict": ...}`` as timm's ViT filter does, converts qkv rows to each
    block's attention layout and interpolates position embeddings (as :func:`load_vit_state_dict`), and logs what
    it converted. Tensors that do not fit pass unchanged, for timm's loader to adapt (a classifier head of another
    ``num_classes``) or reject.
    """
    state_dict = state_dict.get("model", state_dict)
    state_dict = state_dict.get("state_dict", state_dict)
    fitted, report = _fit_state_dict(model, state_dict, (), "pretrained weights")
    report.loaded = len(fitted)
    logger.info("%s", report)
    return {key: fitted.get(key, value) for key, value in state_dict.items()}


def _fit_state_dict(
    vit: VisionTransformer, state_dict: Mapping[str, torch.Tensor], skip_prefixes: tuple[str, ...], source: str
) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """The tensors of ``state_dict`` that fit ``vit`` (converted where needed), and the report of all of them."""
    target = vit.state_dict()
    report = LoadReport(source=source)
    fitted = {}
    for key, src in state_dict.items():
        if key not in target:
            (report.skipped if key.startswith(skip_prefixes) else report.unexpected).append(key)
            continue
        value, note = _fit(vit, key, src, target[key])
        if value is None:
            report.mismatched.append(note)
            continue
        if note:
            report.converted.append(note)
        fitted[key] = value.to(target[key].dtype)
    report.missing = [key for key in target if key not in state_dict]
    return fitted, report


def _fit(vit: VisionTransformer, key: str, src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """``src`` made to fit ``dst`` where a known conversion applies, and a note; (None, reason) otherwise."""
    if src.shape == dst.shape:
        return src, ""
    if key.endswith(_QKV_SUFFIXES):
        return _fit_qkv(vit.get_submodule(key.rsplit(".", 2)[0]), key, src, dst)
    if key == "pos_embed" and src.shape[-1] == dst.shape[-1]:
        prefix_tokens = 0 if getattr(vit, "no_embed_class", False) else vit.num_prefix_tokens
        resized = resample_abs_pos_embed(src, list(vit.patch_embed.grid_size), num_prefix_tokens=prefix_tokens)
        if resized.shape == dst.shape:
            return resized, f"pos_embed: interpolated {tuple(src.shape)} -> {tuple(dst.shape)}"
    return None, _mismatch(key, src, dst)


def _fit_qkv(attn: torch.nn.Module, key: str, src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """Checkpoint qkv rows in the layout of the attention layer ``attn`` that owns them, asked of the layer."""
    if not is_attention_layer(attn) or src.shape[1:] != dst.shape[1:]:
        return None, _mismatch(key, src, dst)
    attn_dim = attention_dim(attn)
    if src.shape[0] not in (qkv_rows(attn_dim, symmetric=True), qkv_rows(attn_dim, symmetric=False)):
        return None, _mismatch(key, src, dst)
    symmetric = has_symmetric_qkv(attn)
    note = (
        "K, V rows kept, Q dropped (asymmetric -> symmetric)"
        if symmetric
        else "Q initialised from K (symmetric -> asymmetric)"
    )
    return convert_qkv_rows(src, attn_dim, symmetric), f"{key}: {note}"


def _mismatch(key: str, src: torch.Tensor, dst: torch.Tensor) -> str:
    return f"{key}: checkpoint {tuple(src.shape)} vs model {tuple(dst.shape)}"
