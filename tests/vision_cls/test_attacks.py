"""FGSM, PGD and SPSA on tiny real models (CPU, no downloads): bounds, loss, reference space, side effects, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kpca.vision_cls.attacks import AttackSpec, eps_from_255, fgsm, pgd, run_attack, spsa

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
NUM_CLASSES = 4
# Small SPSA budget so each test stays well under a second on CPU.
SPSA_FAST = {"samples": 32, "steps": 10}


class Normalised(nn.Module):
    """Pixel images -> ImageNet normalisation -> net; keeps the normalised input it last saw."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1))
        self.seen = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) / self.std
        self.seen = z.detach()
        return self.net(z)


def attack(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, **kw) -> torch.Tensor:
    if name == "spsa":
        kw = {**SPSA_FAST, **kw}
    return run_attack(name, eps, model, x, y, **kw)


@pytest.fixture(scope="module")
def trained() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP fitted to 4 separable classes of 3x8x8 images (class template + noise)."""
    gen = torch.Generator().manual_seed(0)
    templates = torch.rand(NUM_CLASSES, 3, 8, 8, generator=gen)

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
        return (0.6 * templates[y] + 0.4 * torch.rand(n, 3, 8, 8, generator=gen)).clamp(0, 1), y

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    model = Normalised(net)
    params = list(model.parameters())
    x, y = sample(128)
    # Plain gradient descent: a torch.optim optimizer costs about a second of first-use imports.
    for _ in range(60):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                param.sub_(0.1 * grad)
    model.eval()
    x_test, y_test = sample(32)
    assert (model(x_test).argmax(1) == y_test).float().mean() > 0.9
    return model, x_test, y_test


@pytest.fixture
def linear() -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed 2-class linear model, inputs away from the [0, 1] edges, and the optimal L∞ direction."""
    model = Normalised(nn.Sequential(nn.Flatten(), nn.Linear(48, 2)))
    x = 0.3 + 0.4 * torch.rand(8, 3, 4, 4)
    y = torch.randint(0, 2, (8,))
    weight = model.net[1].weight.detach()
    # Cross-entropy of a 2-class linear model rises fastest along sign(w_wrong - w_true) (std > 0 keeps the sign).
    direction = (weight[1 - y] - weight[y]).view(8, 3, 4, 4).sign()
    return model, x, y, direction


@pytest.mark.parametrize("name", ["fgsm", "pgd", "spsa"])
def test_pixel_attack_stays_in_ball_and_range_and_raises_loss(trained, name):
    model, x, y = trained
    eps = 8 / 255
    adv = attack(name, model, x, y, eps)
    assert adv.shape == x.shape and adv.dtype == x.dtype and not adv.requires_grad
    assert (adv - x).abs().max() <= eps + 1e-6
    assert adv.min() >= 0 and adv.max() <= 1
    with torch.no_grad():
        assert F.cross_entropy(model(adv), y) > F.cross_entropy(model(x), y)


def test_pgd_beats_fgsm_on_average(trained):
    model, x, y = trained
    for eps in eps_from_255((4, 8, 16)):
        with torch.no_grad():
            loss_fgsm = F.cross_entropy(model(fgsm(model, x, y, eps)), y)
            loss_pgd = F.cross_entropy(model(pgd(model, x, y, eps)), y)
        assert loss_pgd >= loss_fgsm


def test_fgsm_and_pgd_find_the_linear_optimum(linear):
    model, x, y, direction = linear
    eps = 4 / 255
    torch.testing.assert_close(fgsm(model, x, y, eps) - x, eps * direction, atol=1e-6, rtol=0)
    # 20 steps of 0.15 eps cover the 2 eps between any random start and the optimal corner.
    torch.testing.assert_close(pgd(model, x, y, eps) - x, eps * direction, atol=1e-6, rtol=0)
    # Without a random start, 7 steps (1.05 eps) reach the corner.
    no_start = pgd(model, x, y, eps, random_start=False, steps=7)
    torch.testing.assert_close(no_start - x, eps * direction, atol=1e-6, rtol=0)


def test_spsa_estimates_the_linear_gradient_direction(linear):
    model, x, y, direction = linear
    eps = 0.03
    adv = spsa(model, x, y, eps, samples=64, steps=30)
    moved = (adv - x) / eps
    assert (moved.sign() == direction).float().mean() > 0.85
    assert F.cosine_similarity(moved.flatten(1), direction.flatten(1)).min() > 0.6


def test_pixel_attacks_clip_at_the_image_edges(linear):
    model, _, y, direction = linear
    x = (direction > 0).float()  # every pixel sits on the edge the optimal step pushes it through
    for adv in (fgsm(model, x, y, 0.1), pgd(model, x, y, 0.1), spsa(model, x, y, 0.1, **SPSA_FAST)):
        assert adv.min() >= 0 and adv.max() <= 1
    torch.testing.assert_close(fgsm(model, x, y, 0.1), x)


@pytest.mark.parametrize("name", ["fgsm", "pgd", "spsa"])
def test_reference_space_perturbs_the_normalised_tensor_without_clipping(linear, name):
    model, _, y, direction = linear
    x = (direction > 0).float()  # on the [0, 1] edges, so a pixel-space attack would have to clip
    x_norm = (x - model.mean) / model.std
    eps = 0.5  # normalised units: 0.5 * std in pixels
    adv = attack(name, model, x, y, eps, space="reference", mean=MEAN, std=STD)
    with torch.no_grad():
        logits = model(adv)
    delta = model.seen - x_norm
    assert delta.abs().max() <= eps + 1e-5
    assert (adv < 0).any() or (adv > 1).any()
    torch.testing.assert_close(adv - x, delta * model.std, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, model.net(x_norm + delta))
    if name == "fgsm":
        torch.testing.assert_close(delta, eps * direction, atol=1e-5, rtol=0)


def test_no_parameter_grads_and_mode_untouched(trained):
    model, x, y = trained
    model.train()
    try:
        for name in ("fgsm", "pgd", "spsa"):
            attack(name, model, x, y, 4 / 255)
            assert model.training
        assert all(p.grad is None for p in model.parameters())
        assert all(p.requires_grad for p in model.parameters())
    finally:
        model.eval()


def test_gradient_attacks_run_inside_no_grad_but_not_inference_mode(trained):
    model, x, y = trained
    with torch.no_grad():
        adv = pgd(model, x, y, 4 / 255, steps=2)
    assert (adv - x).abs().max() > 0
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="inference_mode=False"):
            fgsm(model, x, y, 4 / 255)
        assert spsa(model, x, y, 4 / 255, samples=4, steps=1).shape == x.shape
        x_inference, y_inference = x.clone(), y.clone()
    # A batch made in inference mode (Lightning's default loop) is still usable once autograd is back.
    assert (fgsm(model, x_inference, y_inference, 4 / 255) - x).abs().max() > 0


def test_zero_eps_returns_the_input(trained):
    model, x, y = trained
    for name in ("fgsm", "pgd", "spsa"):
        torch.testing.assert_close(attack(name, model, x, y, 0.0), x)
    torch.testing.assert_close(fgsm(model, x, y, 0.0, space="reference", mean=MEAN, std=STD), x)


def test_spsa_chunking_gives_the_same_result(trained):
    model, x, y = trained
    # The CPU generator streams values in order, so 8 draws of 1 direction equal 1 draw of 8.
    torch.manual_seed(1)
    one_chunk = spsa(model, x, y, 8 / 255, samples=8, steps=2, max_batch=512)
    torch.manual_seed(1)
    one_direction_per_chunk = spsa(model, x, y, 8 / 255, samples=8, steps=2, max_batch=1)
    assert (one_chunk - x).abs().max() > 0
    torch.testing.assert_close(one_chunk, one_direction_per_chunk)


def test_attack_spec_and_dispatch(trained):
    model, x, y = trained
    spec = AttackSpec.from_255("pgd", space="pixel", steps=3)
    assert spec.eps == pytest.approx([k / 255 for k in range(1, 7)])
    assert spec.attack_kwargs() == {"space": "pixel", "steps": 3}
    assert AttackSpec("fgsm", [0.01]).attack_kwargs() == {"space": "pixel"}
    torch.manual_seed(3)
    via_dispatch = run_attack(spec.name, spec.eps[3], model, x, y, **spec.attack_kwargs())
    torch.manual_seed(3)
    torch.testing.assert_close(via_dispatch, pgd(model, x, y, spec.eps[3], steps=3))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m, x, y: fgsm(m, x, y, -0.1), ValueError, r"eps must be a finite number >= 0, got -0.1"),
        (lambda m, x, y: fgsm(m, x, y, math.nan), ValueError, "got nan"),
        (lambda m, x, y: fgsm(m, x, y, 4), ValueError, r"eps=4 exceeds 1.*4 / 255"),
        (lambda m, x, y: fgsm(m, x, y, "4/255"), TypeError, "eps must be a real number"),
        (lambda m, x, y: pgd(m, x, y, 0.01, steps=0), ValueError, "steps must be an integer >= 1, got 0"),
        (lambda m, x, y: pgd(m, x, y, 0.01, steps=2.0), TypeError, "steps must be an int"),
        (lambda m, x, y: pgd(m, x, y, 0.01, step_size=-1.0), ValueError, "step_size.*-1.0"),
        (lambda m, x, y: spsa(m, x, y, 0.01, samples=0), ValueError, "samples.*got 0"),
        (lambda m, x, y: spsa(m, x, y, 0.01, delta=0.0), ValueError, "delta.*0.0"),
        (lambda m, x, y: spsa(m, x, y, 0.01, loss="hinge"), ValueError, "loss must be 'margin' or 'ce'.*hinge"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="normalised"), ValueError, "space must be one of.*normalised"),
        (lambda m, x, y: fgsm(m, x * 2 - 1, y, 0.01), ValueError, r"needs images in \[0, 1\].*space='reference'"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="reference"), ValueError, "needs mean"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="reference", mean=MEAN, std=(1.0,)), ValueError, "one value per"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="reference", mean=MEAN, std=(1, 0, 1)), ValueError, "std must be"),
        (lambda m, x, y: fgsm(m, x[0], y, 0.01), TypeError, r"images must be .*\(B, C, H, W\)"),
        (lambda m, x, y: fgsm(m, x, y[:2], 0.01), TypeError, "labels must be an int64 tensor of shape"),
        (lambda m, x, y: fgsm(m, x, y.float(), 0.01), TypeError, "labels must be an int64"),
        (lambda m, x, y: fgsm("model", x, y, 0.01), TypeError, "model must be callable"),
        (lambda m, x, y: run_attack("cw", 0.01, m, x, y), ValueError, "attack name must be one of.*'cw'"),
        (lambda m, x, y: AttackSpec("pgd", []), ValueError, "eps is empty"),
        (lambda m, x, y: AttackSpec("pgd", [0.01], steps=0), ValueError, "steps"),
        (lambda m, x, y: AttackSpec("apgd", [0.01]), ValueError, "attack name.*'apgd'"),
        (lambda m, x, y: AttackSpec("pgd", [0.01], space="norm"), ValueError, "space.*'norm'"),
        (lambda m, x, y: eps_from_255((1, -2)), ValueError, "got -2"),
    ],
)
def test_bad_arguments_raise_with_the_value(linear, call, error, match):
    model, x, y, _ = linear
    with pytest.raises(error, match=match):
        call(model, x, y)
