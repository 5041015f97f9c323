"""AttentionSpec, the one serialisable object with which apps and configs choose attention, and the attention kinds.

Each kind is registered once, with :func:`register_attention_kind` on its builder, in one dict keyed by kind: its
builder, the kind of the blocks outside ``AttentionSpec.layers``, the ``AttentionSpec`` settings it reads (with its
defaults), and its ViTs in timm's registry (their name prefix and default settings, which :mod:`kpca.attention.vit`
reads). ``AttentionSpec.kind``'s choices are that dict's keys
(:func:`kinds`), read each time a parser asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Literal

from torch import nn

from kpca.attention._backend import Backend, check_backend
from kpca.attention._checks import Convention, check_pap_args
from kpca.attention.errors import OptionError
from kpca.attention.modules import (
    AlphaAsymAttention,
    EllipticalAttention,
    NeuTRENOAttention,
    RPCAttention,
    ScaledAttention,
    SoftmaxAttention,
    TwicingAttention,
)
from kpca.attention.robust import _check_lambd

Builder = Callable[..., nn.Module]
"""``build(spec, dim, num_heads, **options)``: the module of a kind, for an :class:`AttentionSpec` and timm
``Attention``'s keywords (``kpca.attention.modules.AttentionOptions``)."""

PAP_LAMBD = 4.0
"""``AttentionSpec.lambd`` of the kinds that take every setting when it is left None: PAP's sparsity weight."""
KIND_SETTINGS = ("n_iter", "lambd", "convention", "num_tokens")
"""The ``AttentionSpec`` fields that only some kinds read (``kind``, ``layers`` and ``backend`` are every kind's)."""


@dataclass(frozen=True)
class RegisteredKind:
    """An attention kind in the registry.

    Attributes:
        name: the ``AttentionSpec.kind`` value.
        build: its :data:`Builder`.
        others: the kind of the blocks outside ``AttentionSpec.layers`` (``rpc``: ``symmetric``), or None to leave
            them as they are.
        vit_family: the timm name prefix of its ViTs (``rpc_symvit`` -> ``rpc_symvit_tiny_patch16_224``).
        vit_defaults: the ``AttentionSpec`` settings of its ViTs in timm's registry, besides ``kind``.
        settings: the :data:`KIND_SETTINGS` it reads, each with its default for a field left None; the others must
            stay at the field's default. None: it takes every setting (the kinds registered before the rule:
            softmax, symmetric, rpc, the scaled kinds; a config switched between them by ``kind`` alone parses).
    """

    name: str
    build: Builder
    others: str | None
    vit_family: str
    vit_defaults: Mapping[str, Any]
    settings: Mapping[str, Any] | None = None

    def vit_attention(self, **overrides: Any) -> AttentionSpec:
        """The attention of this kind's ViTs in timm's registry: its :attr:`vit_defaults`, then ``overrides``."""
        return AttentionSpec(kind=self.name, **{**self.vit_defaults, **overrides})


_REGISTRY: dict[str, RegisteredKind] = {}
"""Every attention kind, keyed by name, in registration order."""


def kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order: the choices of ``AttentionSpec.kind``."""
    return tuple(_REGISTRY)


def register_attention_kind(
    name: str,
    *,
    others: str | None = None,
    vit_family: str | None = None,
    vit_defaults: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Callable[[Builder], Builder]:
    """Register an attention kind: decorate its :data:`Builder` with this.

    ``AttentionSpec(kind=name)`` then builds with it, :func:`kinds` lists it (a kind registered before a LightningCLI
    parser is built is one of the parser's choices for ``attention.kind``), and :mod:`kpca.attention.vit` builds its
    ViTs (``create_vit``) and, for a kind registered before that module is imported, registers them in timm.

    Args:
        name: the kind, a Python identifier (``AttentionSpec.kind``, ``--model.attention.kind=<name>``).
        others: a registered kind that the blocks outside ``AttentionSpec.layers`` get, or None to leave them as
            they are (see :meth:`AttentionSpec.per_block`).
        vit_family: the timm name prefix of its ViTs, ``<vit_family>_<size>_patch16_224``; None: ``deit_<name>``.
        vit_defaults: the ``AttentionSpec`` settings of its ViTs in timm's registry, besides ``kind`` (``rpc``:
            ``{"n_iter": 4, "lambd": 4.0, "layers": [0]}``; None: AttentionSpec's defaults);
            ``timm.create_model(..., attention={...})`` overrides them.
        settings: the ``AttentionSpec`` fields of :data:`KIND_SETTINGS` that the kind reads, each with its default
            for a field left None (``neutreno``: ``{"lambd": 0.6}``); ``AttentionSpec`` refuses any other of them
            set away from the field's default. None: the kind takes every setting unchecked, ``lambd`` None
            meaning PAP's 4.0 (the kinds registered before this rule).

    Raises:
        ValueError: if ``name`` is no identifier or is registered already, ``others`` is not registered, or
            ``vit_family`` is another kind's; ``AttentionSpec``'s own error if ``vit_defaults`` are no valid settings.
    """

    def register(build: Builder) -> Builder:
        if not isinstance(name, str) or not name.isidentifier():
            raise OptionError(f"an attention kind's name must be a Python identifier, got {name!r}")
        if name in _REGISTRY:
            raise OptionError(
                f"attention kind {name!r} is registered already (by {_REGISTRY[name].build.__qualname__})"
            )
        if others is not None and others not in _REGISTRY:
            raise OptionError(
                f"others={others!r} for kind {name!r} is no registered kind; register it first: {kinds()}"
            )
        family = f"deit_{name}" if vit_family is None else vit_family
        owner = next((entry.name for entry in _REGISTRY.values() if entry.vit_family == family), None)
        if owner is not None:
            raise OptionError(f"vit_family={family!r} for kind {name!r} names the ViTs of kind {owner!r}; pick another")
        unknown = sorted(set(settings or {}) - set(KIND_SETTINGS))
        if unknown:
            raise OptionError(f"settings {unknown} for kind {name!r} are no kind settings; choose from {KIND_SETTINGS}")
        read = None if settings is None else MappingProxyType(dict(settings))
        entry = RegisteredKind(name, build, others, family, MappingProxyType(dict(vit_defaults or {})), read)
        _REGISTRY[name] = entry
        try:
            entry.vit_attention()  # its ViTs' default settings make a valid AttentionSpec
        except (TypeError, ValueError):
            del _REGISTRY[name]
            raise
        return build

    return register


def registered_kind(name: str) -> RegisteredKind:
    """The registry entry of kind ``name``.

    Raises:
        ValueError: naming the registered kinds, if ``name`` is not one.
    """
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        raise OptionError(
            f"AttentionSpec.kind must be one of {kinds()}, got {name!r}; a new kind is registered with "
            "kpca.attention.register_attention_kind"
        )
    return entry


@dataclass
class AttentionSpec:
    """Which attention a transformer uses, and in which blocks.

    Usable as a LightningCLI / jsonargparse argument type, e.g. in YAML::

        attention:
          kind: rpc
          n_iter: 4
          layers: [0]

    Args:
        kind: one of :func:`kinds`: ``softmax`` (asymmetric, DeiT), ``symmetric`` (SymViT), ``rpc``
            (RPC-SymViT), the paper's scaled-attention variants of asymmetric attention ``scaled_s``
            (``A (I − S) V``, a learnable H x N x N ``S`` per layer, init 0) and ``scaled_alpha``
            (``A (I − α softmax(K Kᵀ/√D)) V``, a learnable scalar α per layer, init 0), or a kind registered
            with :func:`register_attention_kind`.
            The robust family: ``twicing`` (``(2A - A²) V``), ``neutreno`` (``A V + lambd (V_1 - V)``, V_1 the
            first block's values) and ``elliptical`` (queries rescaled by the previous block's value change).
        n_iter: PAP attention evaluations per RPC layer (>= 1); used by ``rpc`` only.
        lambd: the kind's weight: PAP's sparsity weight for ``rpc`` (> 0, finite; None: 4.0), NeuTRENO's fidelity
            weight for ``neutreno`` (>= 0; None: 0.6, the papers' vision setting; 0.4 for language). Left None for
            ``twicing`` and ``elliptical``.
        layers: ``"all"`` or a list of block indices that get ``kind``. The other blocks get the kind's
            registered ``others``: with ``rpc`` they are symmetric softmax (an RPC model is a SymViT with PAP in
            chosen blocks); with ``neutreno`` and ``elliptical`` our softmax attention (it hands its values on);
            the other built-in kinds leave them as they are (see :meth:`per_block`). NeuTRENO and Elliptical in
            block 0 are plain softmax attention (there is no earlier block), so ``"all"`` is the papers' blocks
            2 to the last.
        convention: ``reference`` (the authors' mu and threshold) or ``pcp`` (textbook PCP); ``rpc`` only.
        backend: ``auto``, ``torch`` or ``triton`` (see ``kpca.attention.set_backend``).
        num_tokens: N for ``scaled_s`` (its S is N x N); None lets ``swap_attention`` read it from a timm
            ViT (patches + prefix tokens).

    A setting that the kind does not read (its registration's ``settings``) must stay at its default: e.g.
    ``AttentionSpec(kind="twicing", lambd=0.6)`` raises, naming the setting. The kinds registered before that rule
    (softmax, symmetric, rpc, the scaled kinds) take every setting, as before.
    """  # noqa: D214, D405 (the YAML key ``attention:`` above is no docstring section)

    kind: Literal[kinds()] = "softmax"  # the registered kinds when a parser reads the type: LightningCLI's choices
    n_iter: int = 4
    lambd: float | None = None
    layers: Literal["all"] | list[int] = "all"
    convention: Convention = "reference"
    backend: Backend = "auto"
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        entry = registered_kind(self.kind)
        if entry.settings is None:
            self.lambd = PAP_LAMBD if self.lambd is None else self.lambd
            check_pap_args(self.n_iter, self.lambd, self.convention, None)
        else:
            self._resolve_settings(entry)
        check_backend(self.backend)
        if self.num_tokens is not None and (
            isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1
        ):
            raise OptionError(f"AttentionSpec.num_tokens must be a positive int or None, got {self.num_tokens!r}")
        if self.layers != "all":
            layers = self.layers
            if isinstance(layers, (str, int)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers
            ):
                raise OptionError(f"AttentionSpec.layers must be 'all' or a list of block indices, got {layers!r}")
            if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
                raise OptionError(f"AttentionSpec.layers must hold distinct non-negative indices, got {list(layers)}")

    def _resolve_settings(self, entry: RegisteredKind) -> None:
        """Fill the settings ``entry``'s kind reads from its defaults; refuse the others set away from theirs."""
        defaults = {f.name: f.default for f in fields(self) if f.name in KIND_SETTINGS}
        for name in KIND_SETTINGS:
            value = getattr(self, name)
            if name in entry.settings:
                if value is None:
                    setattr(self, name, entry.settings[name])
            elif value != defaults[name]:
                reads = ", ".join(entry.settings) or "no setting beyond kind, layers and backend"
                raise OptionError(
                    f"AttentionSpec.{name}={value!r} does not apply to kind {self.kind!r} (it reads {reads}); "
                    f"remove {name} (leave it at {defaults[name]!r})"
                )
        if "lambd" in entry.settings:
            _check_lambd(self.lambd)

    def block_indices(self, depth: int) -> list[int]:
        """The indices of the blocks that get ``kind`` in a model of ``depth`` blocks."""
        if self.layers == "all":
            return list(range(depth))
        too_big = [i for i in self.layers if i >= depth]
        if too_big:
            raise OptionError(f"AttentionSpec.layers {too_big} out of range for a model with {depth} blocks")
        return sorted(self.layers)

    def per_block(self, depth: int) -> list[AttentionSpec | None]:
        """The attention of each of ``depth`` blocks, as ``swap_attention`` and the apps apply it.

        Args:
            depth: number of blocks in the model.

        Returns:
            One entry per block: this spec for the blocks :meth:`block_indices` selects; for the
            others, a spec of the kind's registered ``others`` on the same backend (``rpc``: symmetric, as an RPC
            model is a SymViT with PAP in chosen blocks), or None where it has none, meaning "leave that block's
            attention as it is".

        Raises:
            ValueError: if ``layers`` names a block index >= ``depth``.
        """
        chosen = set(self.block_indices(depth))
        others = registered_kind(self.kind).others
        rest = None if others is None else AttentionSpec(kind=others, backend=self.backend)
        return [self if i in chosen else rest for i in range(depth)]

    def build(self, dim: int, num_heads: int = 8, **kwargs) -> nn.Module:
        """Build the attention module of ``kind`` (its registered builder) with timm ``Attention`` keywords.

        Raises:
            ValueError: for ``scaled_s`` without ``num_tokens``.
        """
        return registered_kind(self.kind).build(self, dim, num_heads, **kwargs)


@register_attention_kind("softmax", vit_family="deit")  # timm's own DeiT: timm registers deit_<size>_patch16_224
def _softmax(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return SoftmaxAttention(dim, num_heads, backend=spec.backend, **kwargs)


@register_attention_kind("symmetric", vit_family="symvit")
def _symmetric(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return SoftmaxAttention(dim, num_heads, symmetric=True, backend=spec.backend, **kwargs)


@register_attention_kind(
    "rpc", others="symmetric", vit_family="rpc_symvit", vit_defaults={"n_iter": 4, "lambd": 4.0, "layers": [0]}
)  # RPC-SymViT: PAP in block 0 (the paper's example), symmetric attention elsewhere
def _rpc(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return RPCAttention(
        dim, num_heads, n_iter=spec.n_iter, lambd=spec.lambd, convention=spec.convention, backend=spec.backend, **kwargs
    )


@register_attention_kind("scaled_s")
def _scaled_s(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    if spec.num_tokens is None:
        raise OptionError(
            "AttentionSpec(kind='scaled_s') needs num_tokens (N, the sequence length) to build S; set it, "
            "or let swap_attention read it from a timm ViT"
        )
    return ScaledAttention(dim, num_heads, num_tokens=spec.num_tokens, backend=spec.backend, **kwargs)


@register_attention_kind("scaled_alpha")
def _scaled_alpha(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return AlphaAsymAttention(dim, num_heads, backend=spec.backend, **kwargs)


@register_attention_kind("twicing", settings={})  # all blocks (the papers' ImageNet model; the LM: its last two)
def _twicing(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return TwicingAttention(dim, num_heads, backend=spec.backend, **kwargs)


@register_attention_kind("neutreno", others="softmax", settings={"lambd": 0.6})
def _neutreno(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return NeuTRENOAttention(dim, num_heads, lambd=spec.lambd, backend=spec.backend, **kwargs)


@register_attention_kind("elliptical", others="softmax", settings={})
def _elliptical(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return EllipticalAttention(dim, num_heads, backend=spec.backend, **kwargs)
