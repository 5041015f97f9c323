"""ValueRelay: the values one forward pass hands from attention block to attention block (Elliptical, NeuTRENO).

Legend: B batch, H heads, N tokens, D head dim.

Elliptical attention needs the previous block's values (detached), NeuTRENO the first block's (with their graph).
One relay, a plain Python object (no parameters, no buffers: a state_dict does not change, nothing moves between
devices or DDP ranks), is shared by the attention modules of one stack of blocks (a ViT, the LM, Segmenter's
encoder, its decoder). :func:`install_relay` gives it to them when some module's kind asks for it (its class
attribute ``relay_needs``) and to none otherwise, so the other kinds never see it. Each module knows its position
in the stack: every module hands on its values (:meth:`ValueRelay.hand_on`); the module at position 0 starts a new
forward (whatever an earlier, interrupted forward left is dropped) and the last one clears the relay, so nothing
outlives the forward that made it (the previous step's graph is not kept alive). A module reads what it needs before
handing on its own (:meth:`ValueRelay.first_for`, :meth:`ValueRelay.previous_for`), and the relay checks that the
values come from this forward's earlier blocks. Decisions on positions are Python ints: a ``torch.compile`` graph
and a torch.fx trace see constants and the tensors' edges, with no graph break.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from kpca.attention.errors import OptionError

Need = Literal["first", "previous"]
"""What a kind asks of the relay: the first block's values (NeuTRENO) or the previous block's (Elliptical)."""


class ValueRelay:
    """The (B, H, N, D) values that one forward of a stack of ``depth`` attention blocks hands on.

    Args:
        depth: number of attention modules sharing it (positions 0 .. depth - 1).
        needs: what the modules ask for; only that is kept.

    Attributes:
        first: block 0's values, not detached (gradients flow into block 0), or None.
        previous: the last handing-on block's values, detached, or None.
        next_position: the position that hands on next in this forward (0: none has yet).
    """

    def __init__(self, depth: int, needs: frozenset[str]) -> None:
        self.depth = depth
        self.keep_first = "first" in needs
        self.keep_previous = "previous" in needs
        self.first: torch.Tensor | None = None
        self.previous: torch.Tensor | None = None
        self.next_position = 0

    def __repr__(self) -> str:
        held = [name for name in ("first", "previous") if getattr(self, name) is not None]
        return f"ValueRelay(depth={self.depth}, next_position={self.next_position}, holds={held})"

    def clear(self) -> None:
        """Drop every value held: the relay is as after construction."""
        self.first = None
        self.previous = None
        self.next_position = 0

    def hand_on(self, position: int, v: torch.Tensor) -> None:
        """Record the (B, H, N, D) values ``v`` of the block at ``position``; the last block clears the relay.

        Raises:
            RuntimeError: if ``position`` is not the next one of this forward (blocks run out of order).
        """
        if position == 0:
            self.clear()
        elif position != self.next_position:
            raise RuntimeError(
                f"attention block {position} handed on its values after block {self.next_position - 1}: the blocks "
                "of a model with Elliptical or NeuTRENO attention must run in order, each once per forward"
            )
        if position == self.depth - 1:
            self.clear()
            return
        if position == 0 and self.keep_first:
            self.first = v  # (B, H, N, D), with its graph
        if self.keep_previous:
            self.previous = v.detach()  # (B, H, N, D)
        self.next_position = position + 1

    def first_for(self, position: int) -> torch.Tensor | None:
        """Block 0's values for the block at ``position`` of this forward; None at position 0 (it is the first)."""
        if position == 0:
            return None
        self._check_fed(position, self.first, "first")
        return self.first

    def previous_for(self, position: int) -> torch.Tensor | None:
        """Block ``position - 1``'s values (detached) for the block at ``position``; None at position 0."""
        if position == 0:
            return None
        self._check_fed(position, self.previous, "previous")
        return self.previous

    def _check_fed(self, position: int, value: torch.Tensor | None, name: str) -> None:
        if value is None or self.next_position != position:
            raise RuntimeError(
                f"attention block {position} asks for the {name} block's values, but blocks 0..{position - 1} did not "
                "hand theirs on in this forward; run the whole stack of blocks in order (install_relay gives every "
                "attention module of the stack the relay)"
            )


def install_relay(attentions: Sequence[nn.Module], owner: str = "the model") -> ValueRelay | None:
    """Share one :class:`ValueRelay` among ``attentions``, the attention modules of one stack of blocks, in order.

    A relay is installed when some module asks for one (a class attribute ``relay_needs``, e.g. ``("previous",)``);
    otherwise every module's ``relay`` is set to None (a kind that needs none never sees one). Call it again after
    replacing modules (``swap_attention`` and the model builders do).

    Args:
        attentions: the attention module of each block, block 0 first.
        owner: what holds the blocks, for the error message.

    Returns:
        The relay, or None where no module needs one.

    Raises:
        ValueError: if a module needs the relay but some module of the stack cannot hand on its values (not one of
            ``kpca.attention``'s modules, e.g. timm's ``Attention``).
    """
    needs = frozenset(need for module in attentions for need in getattr(module, "relay_needs", ()))
    relay = ValueRelay(len(attentions), needs) if needs else None
    if relay is not None:
        foreign = [i for i, module in enumerate(attentions) if not hasattr(module, "relay_position")]
        if foreign:
            raise OptionError(
                f"blocks {foreign} of {owner} have attention that cannot hand on its values "
                f"({type(attentions[foreign[0]]).__name__}), which its {sorted(needs)} attention needs; give those "
                "blocks kpca.attention modules (AttentionSpec's per_block does: kind 'softmax' for plain ones)"
            )
    for position, module in enumerate(attentions):
        if hasattr(module, "relay_position"):
            module.relay = relay
            module.relay_position = position
    return relay
