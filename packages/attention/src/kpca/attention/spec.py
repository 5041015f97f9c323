"""AttentionSpec, the one serialisable object with which apps and configs choose attention, and the attention kinds.

Each kind is registered once, with :func:`register_attention_kind` on its builder, in one dict keyed by kind: its
builder, the kind of the blocks outside ``AttentionSpec.layers``, the ``AttentionSpec`` settings it reads (with its
defaults), and its ViTs in timm's registry (their name prefix and default settings, which :mod:`kpca.attention.vit`
reads). ``AttentionSpec.kind``'s choices are that dict's keys
(:func:`kinds`), read each time a parser asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType, SimpleNamespace
from typing import Any, Literal, get_args

from torch import nn

from kpca.attention._backend import Backend, check_backend
from kpca.attention._checks import Convention, EllipticalConvention, check_elliptical_convention, check_pap_args
from kpca.attention.errors import AttentionOptionError
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
"""``build(spec, dim, num_heads, **options)``: the module of a kind, for an :class:`AttentionSpec` whose settings are
resolved (:meth:`AttentionSpec.resolved`: every setting the kind reads has a value) and timm ``Attention``'s keywords
(``kpca.attention.modules.AttentionOptions``)."""

KIND_SETTINGS = ("n_iter", "lambd", "convention", "num_tokens")
"""The ``AttentionSpec`` fields that only some kinds read (``kind``, ``layers`` and ``backend`` are every kind's)."""
Task = Literal["vision", "language"]
"""What a model does with its attention: a kind's default may depend on it (NeuTRENO's ``lambd``: 0.6 for images,
0.4 for language). ``vision``: classification and segmentation; ``language``: the causal language model."""
TASKS: tuple[str, ...] = get_args(Task)
SAVED_DEFAULTS: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {"n_iter": (4,), "lambd": (4.0,), "convention": ("reference",), "num_tokens": ()}
)
"""The values that configs and checkpoints saved before each kind owned its settings hold for the settings their kind
does not read (the fields' former defaults, ``lambd`` PAP's resolved 4.0): :func:`upgrade_saved_attention` drops
them, so those runs still load."""


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
        settings: the :data:`KIND_SETTINGS` it reads, each with its default (used where the spec leaves it None);
            a spec of this kind refuses the others.
        task_settings: the defaults that differ by :data:`Task` (``neutreno``: ``{"language": {"lambd": 0.4}}``).
        check: checks the kind's settings, filled in for a task (raises ValueError naming the bad value), or None.
    """

    name: str
    build: Builder
    others: str | None
    vit_family: str
    vit_defaults: Mapping[str, Any]
    settings: Mapping[str, Any]
    task_settings: Mapping[str, Mapping[str, Any]]
    check: Callable[[Any], None] | None = None

    def defaults(self, task: str = "vision") -> dict[str, Any]:
        """The default of each setting this kind reads, for ``task``."""
        if task not in TASKS:
            raise AttentionOptionError(f"task must be one of {TASKS}, got {task!r}")
        return {**self.settings, **self.task_settings.get(task, {})}

    def vit_attention(self, **overrides: Any) -> AttentionSpec:
        """The attention of this kind's ViTs in timm's registry: its :attr:`vit_defaults`, then ``overrides``."""
        return AttentionSpec(kind=self.name, **{**self.vit_defaults, **overrides})


_REGISTRY: dict[str, RegisteredKind] = {}
"""Every attention kind, keyed by name, in registration order."""


def kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order: the choices of ``AttentionSpec.kind``."""
    return tuple(_REGISTRY)


def kinds_reading(setting: str) -> tuple[str, ...]:
    """The registered kinds that read ``setting`` (one of :data:`KIND_SETTINGS`)."""
    return tuple(name for name, entry in _REGISTRY.items() if setting in entry.settings)


def register_attention_kind(
    name: str,
    *,
    others: str | None = None,
    vit_family: str | None = None,
    vit_defaults: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    task_settings: Mapping[str, Mapping[str, Any]] | None = None,
    check: Callable[[Any], None] | None = None,
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
        settings: the fields of :data:`KIND_SETTINGS` that the kind reads, each with its default (``neutreno``:
            ``{"lambd": 0.6}``); None or ``{}``: it reads none. A spec of the kind refuses the others.
        task_settings: defaults that differ by :data:`Task`, e.g. ``{"language": {"lambd": 0.4}}``; their names
            must be in ``settings``.
        check: called, for each task, with the spec's fields as attributes and every setting the kind reads filled
            in (a spec's own ``__post_init__`` runs it); raises ValueError naming a bad value.

    Raises:
        ValueError: if ``name`` is no identifier or is registered already, ``others`` is not registered,
            ``vit_family`` is another kind's, or a setting is no kind setting; ``AttentionSpec``'s own error if
            ``vit_defaults`` are no valid settings.
    """

    def register(build: Builder) -> Builder:
        if not isinstance(name, str) or not name.isidentifier():
            raise AttentionOptionError(f"an attention kind's name must be a Python identifier, got {name!r}")
        if name in _REGISTRY:
            raise AttentionOptionError(
                f"attention kind {name!r} is registered already (by {_REGISTRY[name].build.__qualname__})"
            )
        if others is not None and others not in _REGISTRY:
            raise AttentionOptionError(
                f"others={others!r} for kind {name!r} is no registered kind; register it first: {kinds()}"
            )
        family = f"deit_{name}" if vit_family is None else vit_family
        owner = next((entry.name for entry in _REGISTRY.values() if entry.vit_family == family), None)
        if owner is not None:
            raise AttentionOptionError(
                f"vit_family={family!r} for kind {name!r} names the ViTs of kind {owner!r}; pick another"
            )
        read = dict(settings or {})
        unknown = sorted(set(read) - set(KIND_SETTINGS))
        if unknown:
            raise AttentionOptionError(
                f"settings {unknown} for kind {name!r} are no kind settings; choose from {KIND_SETTINGS}"
            )
        by_task = {task: MappingProxyType(dict(values)) for task, values in (task_settings or {}).items()}
        stray = sorted({f"{task}.{key}" for task, values in by_task.items() for key in values if key not in read})
        if set(by_task) - set(TASKS) or stray:
            raise AttentionOptionError(
                f"task_settings for kind {name!r} must be keyed by a task of {TASKS} and name settings of its "
                f"settings {tuple(read)}, got {dict(task_settings or {})!r}"
            )
        entry = RegisteredKind(
            name,
            build,
            others,
            family,
            MappingProxyType(dict(vit_defaults or {})),
            MappingProxyType(read),
            MappingProxyType(by_task),
            check,
        )
        _REGISTRY[name] = entry
        try:
            for task in TASKS:  # its defaults, and its ViTs' default settings, make valid specs
                AttentionSpec(kind=name).resolved(task)
            entry.vit_attention()
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
        raise AttentionOptionError(
            f"AttentionSpec.kind must be one of {kinds()}, got {name!r}; a new kind is registered with "
            "kpca.attention.register_attention_kind"
        )
    return entry


def unread_settings_text(kind: str, setting: str) -> str:
    """Why ``setting`` does not apply to ``kind``, in words: what the kind reads, and which kinds read the setting."""
    reads = ", ".join(registered_kind(kind).settings) or "no setting beyond kind, layers and backend"
    readers = ", ".join(kinds_reading(setting)) or "no registered kind"
    return f"{setting} does not apply to kind {kind!r} (it reads {reads}; {setting} is read by {readers})"


READ_SINCE: Mapping[str, tuple[str, ...]] = MappingProxyType({"elliptical": ("convention",)})
"""Settings a kind reads now that it did not read when every kind held every setting: a save from then holds them at
the former default, which chose nothing (an Elliptical run of then holds ``convention: reference``: it ran ours)."""


def upgrade_saved_attention(attention: Mapping[str, Any]) -> dict[str, Any]:
    """A saved attention group (a run's ``config.yaml``, a checkpoint's hyper-parameters) as an AttentionSpec takes it.

    Configs and checkpoints saved before each kind owned its settings hold every setting (a save of today holds the
    ones its kind does not read as None): the ones their kind does not read at the former defaults
    (:data:`SAVED_DEFAULTS`), and those of :data:`READ_SINCE` too. Those are set to None; everything else is kept as
    saved (an unknown kind too, for the parser to refuse by name).
    """
    upgraded = dict(attention)
    entry = _REGISTRY.get(upgraded.get("kind")) if isinstance(upgraded.get("kind"), str) else None
    if entry is None:
        return upgraded
    from_before = any(name not in entry.settings and upgraded.get(name) is not None for name in KIND_SETTINGS)
    for name in KIND_SETTINGS:
        formerly_unread = from_before and name in READ_SINCE.get(entry.name, ())
        if (name not in entry.settings or formerly_unread) and upgraded.get(name) in SAVED_DEFAULTS[name]:
            upgraded[name] = None
    return upgraded


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
        n_iter: PAP attention evaluations per RPC layer (>= 1); ``rpc`` only (None: 4).
        lambd: the kind's weight: PAP's sparsity weight for ``rpc`` (> 0, finite; None: 4.0), NeuTRENO's fidelity
            weight for ``neutreno`` (>= 0; None: 0.6 for images, 0.4 for language, the papers' settings).
        layers: ``"all"`` or a list of block indices that get ``kind``. The other blocks get the kind's
            registered ``others``: with ``rpc`` they are symmetric softmax (an RPC model is a SymViT with PAP in
            chosen blocks); with ``neutreno`` and ``elliptical`` our softmax attention (it hands its values on);
            the other built-in kinds leave them as they are (see :meth:`per_block`). NeuTRENO and Elliptical in
            block 0 are plain softmax attention (there is no earlier block), so ``"all"`` is the papers' blocks
            2 to the last.
        convention: ``rpc``: ``reference`` (the authors' mu and threshold) or ``pcp`` (textbook PCP), None:
            ``reference``. ``elliptical``: ``causal`` (ours, strictly causal in a causal model) or ``reference`` (the
            authors' code: in the LM a whole-segment estimate that sees later tokens, no 1/sqrt(D)), None: ``causal``.
        backend: ``auto``, ``torch`` or ``triton`` (see ``kpca.attention.set_backend``).
        num_tokens: N for ``scaled_s`` (its S is N x N); None lets ``swap_attention`` read it from a timm
            ViT (patches + prefix tokens).

    Each kind reads only its own settings (its registration's ``settings``): a setting left None takes the kind's
    default when the module is built (:meth:`resolved`), and is never written back, so a saved config shows what
    was chosen. A setting that the kind does not read raises, naming it and the kinds that read it:
    ``AttentionSpec(kind="twicing", lambd=0.6)``.
    """  # noqa: D214, D405 (the YAML key ``attention:`` above is no docstring section)

    kind: Literal[kinds()] = "softmax"  # the registered kinds when a parser reads the type: LightningCLI's choices
    n_iter: int | None = None
    lambd: float | None = None
    layers: Literal["all"] | list[int] = "all"
    convention: Convention | EllipticalConvention | None = None
    backend: Backend = "auto"
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        entry = registered_kind(self.kind)
        for name in KIND_SETTINGS:
            value = getattr(self, name)
            if name not in entry.settings and value is not None:
                raise AttentionOptionError(
                    f"AttentionSpec.{name}={value!r}: {unread_settings_text(self.kind, name)}; leave {name} unset"
                )
        check_backend(self.backend)
        if self.num_tokens is not None and (
            isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1
        ):
            raise AttentionOptionError(
                f"AttentionSpec.num_tokens must be a positive int or None, got {self.num_tokens!r}"
            )
        if self.layers != "all":
            layers = self.layers
            if isinstance(layers, (str, int)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers
            ):
                raise AttentionOptionError(
                    f"AttentionSpec.layers must be 'all' or a list of block indices, got {layers!r}"
                )
            if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
                raise AttentionOptionError(
                    f"AttentionSpec.layers must hold distinct non-negative indices, got {list(layers)}"
                )
        if entry.check is not None:
            for task in TASKS:
                entry.check(self._filled(entry, task))

    def _filled(self, entry: RegisteredKind, task: str) -> SimpleNamespace:
        """This spec's fields with the kind's defaults for ``task`` in the settings left None (no new spec)."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        for name, default in entry.defaults(task).items():
            if values[name] is None:
                values[name] = default
        return SimpleNamespace(**values)

    def resolved(self, task: str = "vision") -> AttentionSpec:
        """A copy with every setting the kind reads filled in: the kind's default for ``task`` where left None.

        This spec is left as it is (it keeps what was chosen); the copy is what the kind's builder reads.
        """
        entry = registered_kind(self.kind)
        filled = {name: value for name, value in vars(self._filled(entry, task)).items() if name in entry.settings}
        return replace(self, **filled)

    def block_indices(self, depth: int) -> list[int]:
        """The indices of the blocks that get ``kind`` in a model of ``depth`` blocks."""
        if self.layers == "all":
            return list(range(depth))
        too_big = [i for i in self.layers if i >= depth]
        if too_big:
            raise AttentionOptionError(
                f"AttentionSpec.layers {too_big} out of range for a model with {depth} blocks (indices 0 to "
                f"{depth - 1})"
            )
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

    def build(self, dim: int, num_heads: int = 8, *, task: str = "vision", **kwargs) -> nn.Module:
        """Build the attention module of ``kind`` (its registered builder) with timm ``Attention`` keywords.

        Args:
            dim: the model width.
            num_heads: attention heads.
            task: the :data:`Task` whose defaults fill the settings left None (:meth:`resolved`).
            **kwargs: timm ``Attention``'s other keywords.

        Raises:
            ValueError: for ``scaled_s`` without ``num_tokens``.
        """
        return registered_kind(self.kind).build(self.resolved(task), dim, num_heads, **kwargs)


@register_attention_kind("softmax", vit_family="deit")  # timm's own DeiT: timm registers deit_<size>_patch16_224
def _softmax(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return SoftmaxAttention(dim, num_heads, backend=spec.backend, **kwargs)


@register_attention_kind("symmetric", vit_family="symvit")
def _symmetric(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return SoftmaxAttention(dim, num_heads, symmetric=True, backend=spec.backend, **kwargs)


def _check_rpc(spec: Any) -> None:
    check_pap_args(spec.n_iter, spec.lambd, spec.convention, None)


@register_attention_kind(
    "rpc",
    others="symmetric",
    vit_family="rpc_symvit",
    vit_defaults={"n_iter": 4, "lambd": 4.0, "layers": [0]},
    settings={"n_iter": 4, "lambd": 4.0, "convention": "reference"},
    check=_check_rpc,
)  # RPC-SymViT: PAP in block 0 (the paper's example), symmetric attention elsewhere
def _rpc(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return RPCAttention(
        dim, num_heads, n_iter=spec.n_iter, lambd=spec.lambd, convention=spec.convention, backend=spec.backend, **kwargs
    )


@register_attention_kind("scaled_s", settings={"num_tokens": None})
def _scaled_s(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    if spec.num_tokens is None:
        raise AttentionOptionError(
            "AttentionSpec(kind='scaled_s') needs num_tokens (N, the sequence length) to build S; set it, "
            "or let swap_attention read it from a timm ViT"
        )
    return ScaledAttention(dim, num_heads, num_tokens=spec.num_tokens, backend=spec.backend, **kwargs)


@register_attention_kind("scaled_alpha")
def _scaled_alpha(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return AlphaAsymAttention(dim, num_heads, backend=spec.backend, **kwargs)


@register_attention_kind("twicing")  # all blocks (the papers' ImageNet model; the LM: its last two)
def _twicing(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return TwicingAttention(dim, num_heads, backend=spec.backend, **kwargs)


def _check_neutreno(spec: Any) -> None:
    _check_lambd(spec.lambd)


@register_attention_kind(
    "neutreno",
    others="softmax",
    settings={"lambd": 0.6},  # the papers' vision setting (ImageNet, ADE20K)
    task_settings={"language": {"lambd": 0.4}},  # WikiText-103
    check=_check_neutreno,
)
def _neutreno(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return NeuTRENOAttention(dim, num_heads, lambd=spec.lambd, backend=spec.backend, **kwargs)


def _check_elliptical(spec: Any) -> None:
    check_elliptical_convention(spec.convention)


@register_attention_kind(
    "elliptical", others="softmax", settings={"convention": "causal"}, check=_check_elliptical
)  # causal: ours; reference: the authors' code (their LM's whole-segment estimate, no 1/sqrt(D))
def _elliptical(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return EllipticalAttention(dim, num_heads, convention=spec.convention, backend=spec.backend, **kwargs)
