"""L∞ adversarial attacks (FGSM, PGD, SPSA) on pixel-space classifiers, written in the project (no torchattacks).

Legend: B batch, C channels, H x W image, K classes, S SPSA directions in one chunk.

Every attack takes a model that maps pixel images in [0, 1] of shape (B, C, H, W) to logits (B, K),
with normalisation inside the model, and returns adversarial pixel images of the same shape,
detached. Two threat models (``space``):

* ``"pixel"`` (default, the numbers to report): the attack moves the pixels by at most ``eps`` in
  L∞ and clips to [0, 1] after every step. ``eps`` is in pixel units: ``4 / 255`` is four grey levels.
* ``"reference"``: the authors' protocol. Their attacks received normalised tensors
  ``x_norm = (x - mean) / std`` and moved *those* by ``eps`` with no clipping. Here the attack runs
  on ``x_norm`` in the same way and the returned image is ``(x_norm + delta) * std + mean``, so
  ``model(returned)`` sees exactly ``x_norm + delta`` with ``|delta| <= eps`` (up to float rounding).
  **This ``eps`` is not in pixel units**: one step of ``eps`` in normalised space is ``eps * std_c``
  in pixels (about ``0.225 * eps`` for ImageNet statistics), and the returned pixels may leave [0, 1].

The attacks never call ``model.train()`` or ``model.eval()`` (the caller chooses the mode), turn
autograd on internally (so they work inside ``torch.no_grad()`` and inside Lightning's test loop
with ``Trainer(inference_mode=False)``), and differentiate with respect to the input only, so
no ``.grad`` is left on the model's parameters.

Precision: every forward and backward pass of an attack runs in float32 (float64 inputs stay
float64) with autocast switched off, whatever the caller's autocast context (a ``bf16-mixed``
trainer), as the authors' cleverhans calls do (they attack outside autocast, in fp32; KPCA
Attack/engine.py:91-108). The caller classifies the returned images under its own precision,
like its clean images (the authors classify them under autocast, engine.py:110-112).

Labels: the attacks raise the loss of the ``labels`` they are given. Pass the true labels, or
``predicted_labels(model, images)`` to attack the model's own clean prediction, which is what
cleverhans does when called without ``y`` (as the authors do).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from kpca.training.choices import check_choice
from kpca.training.errors import OptionError

AttackName = Literal["fgsm", "pgd", "spsa"]
AttackSpace = Literal["pixel", "reference"]
AttackLabels = Literal["ground_truth", "predicted"]
SpsaGradient = Literal["iterate", "cleverhans"]
SpsaLoss = Literal["margin", "ce"]
PAPER_EPS_LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
PGD_STEP_FRACTION = 0.15

Model = Callable[[torch.Tensor], torch.Tensor]
Stats = Sequence[float] | torch.Tensor


def eps_from_255(levels: Sequence[float] = PAPER_EPS_LEVELS) -> list[float]:
    """Return L∞ radii as fractions from levels in 1/255 units: ``(1, ..., 6)`` gives ``[1/255, ..., 6/255]``."""
    for level in levels:
        _check_real("eps level", level)
        if not math.isfinite(level) or level < 0:
            raise OptionError(f"eps levels are non-negative numbers in 1/255 units, got {level!r}; e.g. (1, 2, 4)")
    return [float(level) / 255.0 for level in levels]


@dataclass
class AttackSpec:
    """One attack of the robustness sweep, evaluated at each radius in ``eps``.

    Args:
        name: ``fgsm``, ``pgd`` (random start, step ``0.15 * eps``) or ``spsa`` (gradient-free).
        eps: L∞ radii as fractions, not in 1/255 units (``eps_from_255()`` builds the paper's
            ``1/255 ... 6/255``). In ``reference`` space they are radii in normalised units.
        space: ``pixel`` (clip to [0, 1], pixel-unit eps) or ``reference`` (the authors' protocol:
            perturb the normalised tensor, no clipping).
        steps: iterations of ``pgd`` and ``spsa``; ``fgsm`` ignores it.
        labels: the class whose loss the attack raises: ``ground_truth`` (the true label) or
            ``predicted`` (the model's clean top-1 prediction, as cleverhans without ``y`` and so
            the authors). Accuracy is measured against the true labels either way.
        spsa_gradient: where ``spsa`` estimates its gradient (see ``spsa``): ``iterate`` (the
            current adversarial point) or ``cleverhans`` (cleverhans' probes at ``2 x ± delta v``,
            the authors' attack). Only ``spsa`` takes it.
    """

    name: AttackName
    eps: list[float]
    space: AttackSpace = "pixel"
    steps: int = 20
    labels: AttackLabels = "ground_truth"
    spsa_gradient: SpsaGradient = "iterate"

    def __post_init__(self) -> None:
        check_choice("attack name", self.name, AttackName)
        if not self.eps:
            raise OptionError("AttackSpec.eps is empty; pass at least one radius, e.g. eps_from_255((1, 2, 4))")
        for eps in self.eps:
            _check_eps(eps)
        check_choice("space", self.space, AttackSpace)
        _check_steps(self.steps)
        check_choice("labels", self.labels, AttackLabels, "write one of them as a word (YAML's bare true is a boolean)")
        check_choice("spsa_gradient", self.spsa_gradient, SpsaGradient)
        if self.name != "spsa" and self.spsa_gradient != "iterate":
            raise OptionError(
                f"spsa_gradient={self.spsa_gradient!r} is an SPSA setting, but this attack is {self.name!r}; "
                "drop spsa_gradient from it"
            )

    @classmethod
    def from_255(
        cls,
        name: AttackName,
        levels: Sequence[float] = PAPER_EPS_LEVELS,
        space: AttackSpace = "pixel",
        steps: int = 20,
    ) -> AttackSpec:
        """Build a spec from radii in 1/255 units (default: the paper's 1..6)."""
        return cls(name=name, eps=eps_from_255(levels), space=space, steps=steps)

    @property
    def tag(self) -> str:
        """The result name of this attack: ``<name>-<space>``, then ``-predicted`` and ``-cleverhans`` when set."""
        parts = [self.name, self.space]
        if self.labels == "predicted":
            parts.append("predicted")
        if self.spsa_gradient == "cleverhans":
            parts.append("cleverhans")
        return "-".join(parts)

    def attack_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``run_attack``: ``space``, ``steps`` for pgd / spsa, ``gradient`` for spsa."""
        kwargs: dict[str, object] = {"space": self.space}
        if self.name != "fgsm":
            kwargs["steps"] = self.steps
        if self.name == "spsa":
            kwargs["gradient"] = self.spsa_gradient
        return kwargs


def predicted_labels(model: Model, images: torch.Tensor) -> torch.Tensor:
    """The model's top-1 classes (B,) for clean pixel images (B, C, H, W), in float32 with autocast off.

    These are the labels cleverhans attacks when called without ``y`` (``argmax(model(x))``).
    """
    _check_model_and_images(model, images)
    _check_model_precision(model)
    with torch.no_grad(), _autocast_off(images.device):
        return model(images.to(_working_dtype(images))).argmax(dim=1)


def fgsm(
    model: Model,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float,
    *,
    space: AttackSpace = "pixel",
    mean: Stats | None = None,
    std: Stats | None = None,
) -> torch.Tensor:
    """Fast Gradient Sign Method (Goodfellow et al. 2015): one step of ``eps * sign(grad of CE)``.

    One forward and backward pass of the model (none when ``eps`` is 0), in float32 with autocast off.

    Args:
        model: maps pixel images (B, C, H, W) to logits (B, K); its train/eval mode is left alone.
        images: clean pixel images (B, C, H, W), floating point, in [0, 1].
        labels: the classes (B,), int64, whose loss the attack raises (true or predicted labels).
        eps: L∞ radius as a fraction (``4 / 255``); in ``reference`` space, in normalised units.
        space: ``pixel`` or ``reference`` (see the module docstring).
        mean: per-channel mean (C,) the model normalises with; required for ``reference``, ignored for ``pixel``.
        std: per-channel std (C,), as ``mean``.

    Returns:
        Adversarial pixel images (B, C, H, W), detached, same dtype and device as ``images``.
    """
    start, labels, to_pixel, bounds = _prepare(model, images, labels, eps, space, mean, std)
    if eps == 0:
        return _finish(to_pixel(start), images)
    with _autocast_off(start.device):
        grad = _input_grad(model, to_pixel, start, labels)
        return _finish(to_pixel(_project(start + eps * grad.sign(), start, eps, bounds)), images)


def pgd(
    model: Model,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float,
    *,
    steps: int = 20,
    step_size: float | None = None,
    random_start: bool = True,
    space: AttackSpace = "pixel",
    mean: Stats | None = None,
    std: Stats | None = None,
) -> torch.Tensor:
    """Projected Gradient Descent on cross-entropy (Madry et al. 2018), L∞, returning the last iterate.

    The paper's setting is the default: 20 steps of ``0.15 * eps`` from a uniform random start in
    the eps-ball. After every step the iterate is projected onto the ball and, in ``pixel`` space,
    clipped to [0, 1]. Costs ``steps`` forward and backward passes of the model (the random start
    and the returned last iterate need none), in float32 with autocast off.

    Args:
        model: maps pixel images (B, C, H, W) to logits (B, K); its train/eval mode is left alone.
        images: clean pixel images (B, C, H, W), floating point, in [0, 1].
        labels: the classes (B,), int64, whose loss the attack raises (true or predicted labels).
        eps: L∞ radius as a fraction (``4 / 255``); in ``reference`` space, in normalised units.
        steps: number of gradient steps, at least 1.
        step_size: size of each signed step; ``None`` means ``0.15 * eps``.
        random_start: start from a uniform sample of the eps-ball instead of the clean image.
        space: ``pixel`` or ``reference`` (see the module docstring).
        mean: per-channel mean (C,) the model normalises with; required for ``reference``, ignored for ``pixel``.
        std: per-channel std (C,), as ``mean``.

    Returns:
        Adversarial pixel images (B, C, H, W), detached, same dtype and device as ``images``.
    """
    _check_steps(steps)
    if step_size is not None:
        _check_positive("step_size", step_size)
    start, labels, to_pixel, bounds = _prepare(model, images, labels, eps, space, mean, std)
    if step_size is None:
        step_size = PGD_STEP_FRACTION * eps
    if eps == 0:
        return _finish(to_pixel(start), images)
    adv = start
    if random_start:
        adv = _project(start + torch.empty_like(start).uniform_(-eps, eps), start, eps, bounds)
    with _autocast_off(start.device):
        for _ in range(steps):
            grad = _input_grad(model, to_pixel, adv, labels)
            adv = _project(adv + step_size * grad.sign(), start, eps, bounds)
    return _finish(to_pixel(adv), images)


def spsa(
    model: Model,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float,
    *,
    steps: int = 20,
    delta: float = 0.01,
    lr: float = 0.01,
    samples: int = 128,
    loss: SpsaLoss = "margin",
    gradient: SpsaGradient = "iterate",
    max_batch: int = 512,
    space: AttackSpace = "pixel",
    mean: Stats | None = None,
    std: Stats | None = None,
) -> torch.Tensor:
    """SPSA (Uesato et al. 2018): gradient-free L∞ attack with Adam on a finite-difference gradient estimate.

    From a uniform random start ``x + (2u - 1) eps`` in the ball around the clean input ``x``, each
    of the ``steps`` Adam steps (torch's defaults: betas 0.9 / 0.999, eps 1e-8) raises the
    objective along the estimate ``g = mean_v [(f(c + delta v) - f(c - delta v)) / (2 delta)] v``
    over ``samples`` Rademacher directions ``v`` per image, then projects onto the ball (and into
    [0, 1] in ``pixel`` space). The probes ``c ± delta v`` are not clipped. ``gradient`` picks the
    centre ``c``:

    * ``iterate`` (default): ``c`` is the current adversarial point, the SPSA gradient estimate
      that Uesato et al. describe.
    * ``cleverhans``: ``c = 2 x``, what cleverhans' PyTorch ``spsa`` computes, and so the
      authors' attack (they call it with ``nb_iter=10``; KPCA Attack/engine.py:104; their copy
      KPCA-S Attack/spsa.py is the same code). There, ``loss_fn(pert)`` evaluates
      ``model_fn(x + pert)``, and ``_compute_spsa_gradient`` calls ``loss_fn(x + delta_x)`` with
      the clean input ``x`` (cleverhans/torch/attacks/spsa.py:131, 203), so every step probes
      ``2 x ± delta v``: the estimate never depends on the iterate, and the Adam steps move along
      fresh noisy estimates of the gradient at ``2 x``. Everything else (random start, margin
      loss, Adam, projection, no clipping of the probes) is the same in both modes.

    Defaults follow cleverhans (``delta=0.01``, ``learning_rate=0.01``, ``spsa_samples=128``,
    ``spsa_iters=1``, margin loss), with ``steps`` (cleverhans' required ``nb_iter``) set to the
    PGD count of 20. One difference in both modes: a whole batch is attacked at once instead of
    one image at a time (Adam acts element-wise, so the update is the same, but the random draws
    come in another order). Each step costs ``2 * samples`` forward passes per image and no
    backward pass, run in chunks of ``max(1, max_batch // (2 * B))`` directions (``2 * B`` images
    per direction), in float32 with autocast off; cleverhans also evaluates the loss once more per
    step for its optional early stop, which changes nothing here.

    Args:
        model: maps pixel images (B, C, H, W) to logits (B, K); only forward passes are used.
        images: clean pixel images (B, C, H, W), floating point, in [0, 1].
        labels: the classes (B,), int64, whose objective the attack raises (true or predicted labels).
        eps: L∞ radius as a fraction (``4 / 255``); in ``reference`` space, in normalised units.
        steps: number of Adam updates, at least 1.
        delta: finite-difference probe size.
        lr: Adam learning rate.
        samples: random directions per image and step.
        loss: objective to raise: ``margin`` (best wrong logit minus labelled logit, as cleverhans) or ``ce``.
        gradient: ``iterate`` or ``cleverhans``, the centre of the probes (see above).
        max_batch: images per forward pass when probing; memory scales with it.
        space: ``pixel`` or ``reference`` (see the module docstring).
        mean: per-channel mean (C,) the model normalises with; required for ``reference``, ignored for ``pixel``.
        std: per-channel std (C,), as ``mean``.

    Returns:
        Adversarial pixel images (B, C, H, W), detached, same dtype and device as ``images``.
    """
    _check_steps(steps)
    _check_positive("delta", delta)
    _check_positive("lr", lr)
    _check_count("samples", samples)
    _check_count("max_batch", max_batch)
    check_choice("loss", loss, SpsaLoss)
    check_choice("gradient", gradient, SpsaGradient)
    start, labels, to_pixel, bounds = _prepare(model, images, labels, eps, space, mean, std, needs_grad=False)
    if eps == 0:
        return _finish(to_pixel(start), images)

    def objective(points: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _objective(model(to_pixel(points)), targets, loss)

    with torch.no_grad(), _autocast_off(start.device):
        adv = _project(start + (torch.rand_like(start) * 2 - 1) * eps, start, eps, bounds)
        moment1 = torch.zeros_like(start)
        moment2 = torch.zeros_like(start)
        beta1, beta2, adam_eps = 0.9, 0.999, 1e-8
        for step in range(1, steps + 1):
            centre = adv if gradient == "iterate" else 2 * start
            grad = _spsa_gradient(objective, centre, labels, delta, samples, max_batch)
            moment1.mul_(beta1).add_(grad, alpha=1 - beta1)
            moment2.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            update = (moment1 / (1 - beta1**step)) / ((moment2 / (1 - beta2**step)).sqrt() + adam_eps)
            adv = _project(adv + lr * update, start, eps, bounds)
    return _finish(to_pixel(adv), images)


def run_attack(
    name: AttackName,
    eps: float,
    model: Model,
    images: torch.Tensor,
    labels: torch.Tensor,
    **kwargs: object,
) -> torch.Tensor:
    """Run the attack called ``name`` (``fgsm``, ``pgd`` or ``spsa``) at radius ``eps``.

    Args:
        name: which attack.
        eps: L∞ radius as a fraction (see the attack's docstring for ``reference`` space).
        model: maps pixel images (B, C, H, W) to logits (B, K).
        images: clean pixel images (B, C, H, W) in [0, 1].
        labels: the classes (B,), int64, whose loss the attack raises (true or ``predicted_labels``).
        **kwargs: keyword arguments of that attack, e.g. ``AttackSpec.attack_kwargs()`` plus ``mean``/``std``.

    Returns:
        Adversarial pixel images (B, C, H, W), detached.
    """
    check_choice("attack name", name, AttackName)
    attacks = {"fgsm": fgsm, "pgd": pgd, "spsa": spsa}
    return attacks[name](model, images, labels, eps, **kwargs)


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")


def _check_positive(name: str, value: object) -> None:
    _check_real(name, value)
    if not (math.isfinite(value) and value > 0):
        raise OptionError(f"{name} must be a positive finite number, got {value!r}")


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise OptionError(f"{name} must be an integer >= 1, got {value!r}")


def _check_model_and_images(model: object, images: object) -> None:
    if not callable(model):
        raise TypeError(f"model must be callable (an nn.Module returning logits), got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        got = f"{tuple(images.shape)} {images.dtype}" if isinstance(images, torch.Tensor) else type(images).__name__
        raise TypeError(f"images must be a floating-point tensor of shape (B, C, H, W), got {got}")


def _check_eps(eps: object) -> None:
    _check_real("eps", eps)
    if not math.isfinite(eps) or eps < 0:
        raise OptionError(f"eps must be a finite number >= 0, got {eps!r}; pass a fraction such as 4 / 255")
    if eps > 1:
        raise OptionError(f"eps={eps!r} exceeds 1; eps is a fraction, not in 1/255 units: pass {eps!r} / 255")


def _check_steps(steps: object) -> None:
    _check_count("steps", steps)


def _check_model_precision(model: Model) -> None:
    """Attacks run in float32: refuse a model whose parameters are half precision (a ``*-true`` precision)."""
    if not isinstance(model, nn.Module):
        return
    low = sorted({str(p.dtype) for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)})
    if low:
        raise OptionError(
            f"attacks run in float32, but the model has {', '.join(low)} parameters; test with a mixed or "
            "32-bit precision (trainer.precision: bf16-mixed or 32-true), not a *-true half precision"
        )


def _working_dtype(images: torch.Tensor) -> torch.dtype:
    """float32 for half-precision images, else the images' own dtype (float32 or float64)."""
    return torch.promote_types(images.dtype, torch.float32)


@contextmanager
def _autocast_off(device: torch.device) -> Iterator[None]:
    """Switch autocast off for ``device``'s type, so the attack's passes run in the inputs' dtype."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def _finish(pixels: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """The attack's result, detached, in the dtype of the caller's images."""
    return pixels.detach().to(images.dtype)


def _channel_stats(name: str, value: Stats | None, images: torch.Tensor) -> torch.Tensor:
    """Return ``value`` as a (1, C, 1, 1) tensor on the images' device and dtype."""
    if value is None:
        raise OptionError(
            f"space='reference' needs {name}: pass the model's per-channel {name}, "
            f"e.g. timm.data.IMAGENET_DEFAULT_{name.upper()}"
        )
    stats = torch.as_tensor(value, dtype=images.dtype, device=images.device).flatten()
    if stats.numel() != images.shape[1]:
        raise OptionError(f"{name} must have one value per channel ({images.shape[1]}), got {stats.numel()} values")
    return stats.view(1, -1, 1, 1)  # (1, C, 1, 1)


def _prepare(
    model: Model,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float,
    space: str,
    mean: Stats | None,
    std: Stats | None,
    *,
    needs_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor], tuple[float, float] | None]:
    """Validate the arguments; return the attack-space start, the labels, the map back to pixels, the clip bounds."""
    _check_model_and_images(model, images)
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.long or labels.shape != images.shape[:1]:
        got = f"{tuple(labels.shape)} {labels.dtype}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise TypeError(f"labels must be an int64 tensor of shape ({images.shape[0]},), got {got}")
    _check_eps(eps)
    check_choice("space", space, AttackSpace)
    _check_model_precision(model)
    if needs_grad and torch.is_inference_mode_enabled():
        raise RuntimeError(
            "gradient attacks need autograd, but inference mode is on: run them under "
            "torch.inference_mode(False), or build the Trainer with inference_mode=False"
        )
    # Copies made here are normal tensors even if the caller's batch was made in inference mode.
    images = images.detach().to(_working_dtype(images), copy=True)
    labels = labels.detach().to(images.device, copy=True)
    if space == "pixel":
        low, high = images.min().item(), images.max().item()
        if low < 0 or high > 1:
            raise OptionError(
                f"space='pixel' needs images in [0, 1], got values in [{low:.4g}, {high:.4g}]; pass un-normalised "
                "images (the model normalises), or use space='reference' with mean/std"
            )
        return images, labels, _identity, (0.0, 1.0)
    mean_t = _channel_stats("mean", mean, images)
    std_t = _channel_stats("std", std, images)
    if not bool((std_t > 0).all()):
        raise OptionError(f"std must be positive in every channel, got {std_t.flatten().tolist()}")

    def to_pixel(normalised: torch.Tensor) -> torch.Tensor:
        return normalised * std_t + mean_t

    return (images - mean_t) / std_t, labels, to_pixel, None


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _project(adv: torch.Tensor, start: torch.Tensor, eps: float, bounds: tuple[float, float] | None) -> torch.Tensor:
    """Project onto the L∞ ball of radius eps around start, then into bounds (if any)."""
    adv = torch.maximum(torch.minimum(adv, start + eps), start - eps)
    if bounds is not None:
        adv = adv.clamp(*bounds)
    return adv.detach()


def _input_grad(
    model: Model, to_pixel: Callable[[torch.Tensor], torch.Tensor], point: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Gradient of the summed cross-entropy with respect to the attack-space input only, (B, C, H, W)."""
    with torch.enable_grad():
        point = point.detach().requires_grad_(True)
        logits = model(to_pixel(point))  # (B, K)
        loss = F.cross_entropy(logits.to(_working_dtype(logits)), labels, reduction="sum")
        (grad,) = torch.autograd.grad(loss, point)
    return grad


def _objective(logits: torch.Tensor, labels: torch.Tensor, loss: str) -> torch.Tensor:
    """Per-example attack objective (higher is more adversarial), (B,)."""
    logits = logits.to(_working_dtype(logits))
    if loss == "ce":
        return F.cross_entropy(logits, labels, reduction="none")
    true = logits.gather(1, labels[:, None]).squeeze(1)  # (B,)
    wrong = logits.scatter(1, labels[:, None], float("-inf")).amax(dim=1)  # (B,)
    return wrong - true


def _spsa_gradient(
    objective: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    point: torch.Tensor,
    labels: torch.Tensor,
    delta: float,
    samples: int,
    max_batch: int,
) -> torch.Tensor:
    """SPSA estimate of the objective's gradient at point (B, C, H, W) from antithetic Rademacher probes."""
    batch = point.shape[0]
    chunk = max(1, max_batch // (2 * batch))
    grad = torch.zeros_like(point)
    for first in range(0, samples, chunk):
        s = min(chunk, samples - first)
        signs = torch.randint(0, 2, (s, *point.shape), device=point.device).to(point.dtype) * 2 - 1  # (S, B, C, H, W)
        probes = torch.cat([point + delta * signs, point - delta * signs])  # (2S, B, C, H, W)
        values = objective(probes.flatten(0, 1), labels.repeat(2 * s))  # (2S*B,)
        values = values.view(2, s, batch)  # (2, S, B)
        diff = (values[0] - values[1]) / (2 * delta)  # (S, B)
        grad += (diff.view(s, batch, 1, 1, 1) * signs).sum(0)  # (B, C, H, W)
    return grad / samples
