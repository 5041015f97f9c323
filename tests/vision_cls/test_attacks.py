"""FGSM, PGD and SPSA on tiny real models (CPU, no downloads): bounds, loss, reference space, model-call budgets,
fp32 under autocast, cleverhans' SPSA against a loop restatement, side effects, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kpca.vision_cls.attacks import AttackSpec, eps_from_255, fgsm, pgd, predicted_labels, run_attack, spsa

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


class Counted(nn.Module):
    """Wraps a model: records every call's input and the dtype its logits were computed in (bf16 under autocast)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.inputs: list[torch.Tensor] = []
        self.dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.detach().clone())
        logits = self.model(x)
        self.dtypes.append(logits.dtype)
        return logits

    @property
    def batch_sizes(self) -> list[int]:
        return [x.shape[0] for x in self.inputs]


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


def test_each_attack_calls_the_model_an_exact_number_of_times(trained):
    model, x, y = trained
    counted = Counted(model)
    batch = x.shape[0]  # 32
    fgsm(counted, x, y, 4 / 255)
    assert counted.batch_sizes == [batch]  # one forward + backward
    counted.inputs.clear()
    pgd(counted, x, y, 4 / 255, steps=3)
    assert counted.batch_sizes == [batch] * 3  # one pass per step; the random start needs none
    counted.inputs.clear()
    # 10 directions per step, max_batch 192 = 3 directions x 2 signs x 32 images per call: chunks of 3, 3, 3, 1.
    spsa(counted, x, y, 4 / 255, samples=10, steps=2, max_batch=192)
    assert counted.batch_sizes == [2 * batch * s for s in (3, 3, 3, 1)] * 2
    assert sum(counted.batch_sizes) == 2 * 10 * 2 * batch  # 2 * samples * steps forwards per image
    counted.inputs.clear()
    for name in ("fgsm", "pgd", "spsa"):
        attack(name, counted, x, y, 0.0)
    assert counted.batch_sizes == []


@pytest.mark.parametrize("name", ["fgsm", "pgd", "spsa"])
def test_attacks_run_in_float32_under_a_bf16_autocast(trained, name):
    model, x, y = trained
    counted = Counted(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert counted(x).dtype == torch.bfloat16  # the surrounding code does run in bf16
        torch.manual_seed(0)
        adv = attack(name, counted, x, y, 8 / 255)
        labels = predicted_labels(counted, x)
    assert counted.dtypes[1:] == [torch.float32] * (len(counted.dtypes) - 1)
    assert adv.dtype == torch.float32
    torch.manual_seed(0)
    torch.testing.assert_close(adv, attack(name, model, x, y, 8 / 255), atol=0, rtol=0)
    torch.testing.assert_close(labels, model(x).argmax(1))


def test_attacks_refuse_a_half_precision_model(trained):
    model, x, y = trained
    half = Normalised(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, NUM_CLASSES))).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"torch.bfloat16 parameters.*bf16-mixed or 32-true"):
        fgsm(half, x, y, 4 / 255)
    with pytest.raises(ValueError, match="torch.bfloat16 parameters"):
        predicted_labels(half, x)


def cleverhans_spsa_restated(net, x_norm, y, eps, steps, samples, delta, lr, starts, signs, gradient_at):
    """cleverhans' spsa (cleverhans/torch/attacks/spsa.py) restated in loop form: one image, one step at a time.

    ``net`` takes normalised tensors (the authors' ``model_fn``); no clipping (clip_min/max = -inf/inf).
    The random numbers are given (``starts`` (B, C, H, W) uniforms in [0, 1), ``signs`` (steps, S, B, C, H, W)
    Rademacher signs) because cleverhans draws them image by image and the port draws them for the batch at
    once. ``gradient_at="cleverhans"`` passes ``x`` to ``loss_fn`` as cleverhans does (probes at 2x ± δv);
    ``"iterate"`` passes the perturbation, the estimate at the iterate. Returns the adversarial normalised
    images and every probe, (B, steps, 2S, C, H, W).
    """
    adversarial, probes = [], []
    for b in range(x_norm.shape[0]):
        x = x_norm[b : b + 1]  # (1, C, H, W)
        label = y[b : b + 1]
        perturbation = ((starts[b : b + 1] * 2 - 1) * eps).clamp(-eps, eps)
        m = torch.zeros_like(x)
        v = torch.zeros_like(x)
        image_probes = []
        for t in range(1, steps + 1):

            def loss_fn(pert, x=x, label=label):
                logits = net(x + pert)  # (2S, K)
                correct = logits.gather(1, label.expand(len(pert))[:, None]).squeeze(1)
                wrong = logits.scatter(1, label.expand(len(pert))[:, None], float("-inf")).amax(1)
                return -(wrong - correct)  # untargeted: minimise the negative margin

            delta_x = delta * signs[t - 1][:, b]  # (S, C, H, W)
            delta_x = torch.cat([delta_x, -delta_x])  # (2S, C, H, W)
            centre = x if gradient_at == "cleverhans" else perturbation
            image_probes.append(x + (centre + delta_x))
            loss_vals = loss_fn(centre + delta_x)  # (2S,)
            grad = torch.zeros_like(x)
            for k in range(2 * samples):
                grad += loss_vals[k] * delta_x[k].sign() / delta / (2 * samples)
            # torch.optim.Adam, default betas and eps, on the perturbation.
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            denom = v.sqrt() / math.sqrt(1 - 0.999**t) + 1e-8
            perturbation = (perturbation - lr / (1 - 0.9**t) * m / denom).clamp(-eps, eps)
        adversarial.append(x + perturbation)
        probes.append(torch.stack(image_probes))  # (steps, 2S, C, H, W)
    return torch.cat(adversarial), torch.stack(probes)


@pytest.mark.parametrize("gradient", ["cleverhans", "iterate"])
def test_spsa_matches_a_loop_restatement_of_cleverhans_in_float64(gradient):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    model = Counted(Normalised(net).double())
    x = 0.2 + 0.6 * torch.rand(3, 3, 2, 2, dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    settings = {"steps": 3, "samples": 4, "delta": 0.01, "lr": 0.01}
    eps = 0.05
    torch.manual_seed(1)
    mean, std = model.model.mean, model.model.std  # float64 buffers: the attack and the model normalise alike
    adv = spsa(model, x, y, eps, gradient=gradient, space="reference", mean=mean, std=std, **settings)
    torch.manual_seed(1)  # the port's draws: the start, then each step's signs for the whole batch
    starts = torch.rand(3, 3, 2, 2, dtype=torch.float64)
    signs = [torch.randint(0, 2, (4, 3, 3, 2, 2)).double() * 2 - 1 for _ in range(3)]
    x_norm = (x - mean) / std
    expected, probes = cleverhans_spsa_restated(
        net, x_norm, y, eps, starts=starts, signs=signs, gradient_at=gradient, **settings
    )
    assert adv.dtype == torch.float64
    torch.testing.assert_close((adv - mean) / std, expected, atol=1e-12, rtol=0)
    seen = torch.stack(model.inputs)  # (steps, 2 * S * B, C, H, W): [+v for S x B images, then -v]
    seen = ((seen - mean) / std).view(3, 2, 4, 3, 3, 2, 2)  # (steps, sign, S, B, C, H, W)
    seen = seen.permute(3, 0, 1, 2, 4, 5, 6).reshape(3, 3, 8, 3, 2, 2)  # (B, steps, 2S, C, H, W)
    torch.testing.assert_close(seen, probes, atol=1e-12, rtol=0)
    if gradient == "cleverhans":  # every probe sits at 2x ± delta v, whatever the iterate
        offsets = (probes - 2 * x_norm[:, None, None]) / settings["delta"]
        torch.testing.assert_close(offsets.abs(), torch.ones_like(offsets))
    moved = (adv - mean) / std - (x_norm + (starts * 2 - 1) * eps)  # the Adam steps, beyond the random start
    assert moved.abs().max() > settings["lr"]


def test_attack_spec_and_dispatch(trained):
    model, x, y = trained
    spec = AttackSpec.from_255("pgd", space="pixel", steps=3)
    assert spec.eps == pytest.approx([k / 255 for k in range(1, 7)])
    assert spec.attack_kwargs() == {"space": "pixel", "steps": 3}
    assert AttackSpec("fgsm", [0.01]).attack_kwargs() == {"space": "pixel"}
    published = AttackSpec("spsa", [0.01], space="reference", steps=10, labels="predicted", spsa_gradient="cleverhans")
    assert published.attack_kwargs() == {"space": "reference", "steps": 10, "gradient": "cleverhans"}
    assert published.tag == "spsa-reference-predicted-cleverhans" and spec.tag == "pgd-pixel"
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
        (lambda m, x, y: spsa(m, x, y, 0.01, loss="hinge"), ValueError, "loss='hinge' is not one of 'margin', 'ce'"),
        (
            lambda m, x, y: fgsm(m, x, y, 0.01, space="normalised"),
            ValueError,
            "space='normalised' is not one of 'pixel', 'reference'",
        ),
        (lambda m, x, y: fgsm(m, x * 2 - 1, y, 0.01), ValueError, r"needs images in \[0, 1\].*space='reference'"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="reference"), ValueError, "needs mean"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="reference", mean=MEAN, std=(1.0,)), ValueError, "one value per"),
        (lambda m, x, y: fgsm(m, x, y, 0.01, space="reference", mean=MEAN, std=(1, 0, 1)), ValueError, "std must be"),
        (lambda m, x, y: fgsm(m, x[0], y, 0.01), TypeError, r"images must be .*\(B, C, H, W\)"),
        (lambda m, x, y: fgsm(m, x, y[:2], 0.01), TypeError, "labels must be an int64 tensor of shape"),
        (lambda m, x, y: fgsm(m, x, y.float(), 0.01), TypeError, "labels must be an int64"),
        (lambda m, x, y: fgsm("model", x, y, 0.01), TypeError, "model must be callable"),
        (
            lambda m, x, y: run_attack("cw", 0.01, m, x, y),
            ValueError,
            "attack name='cw' is not one of 'fgsm', 'pgd', 'spsa'",
        ),
        (lambda m, x, y: AttackSpec("pgd", []), ValueError, "eps is empty"),
        (lambda m, x, y: AttackSpec("pgd", [0.01], steps=0), ValueError, "steps"),
        (lambda m, x, y: AttackSpec("apgd", [0.01]), ValueError, "attack name.*'apgd'"),
        (lambda m, x, y: AttackSpec("pgd", [0.01], space="norm"), ValueError, "space.*'norm'"),
        (
            lambda m, x, y: AttackSpec("pgd", [0.01], labels=True),
            ValueError,
            "labels=True is not one of 'ground_truth', 'predicted'; write one of them as a word",
        ),
        (lambda m, x, y: AttackSpec("pgd", [0.01], spsa_gradient="cleverhans"), ValueError, "SPSA setting.*'pgd'"),
        (
            lambda m, x, y: AttackSpec("spsa", [0.01], spsa_gradient="2x"),
            ValueError,
            "spsa_gradient='2x' is not one of 'iterate', 'cleverhans'",
        ),
        (
            lambda m, x, y: spsa(m, x, y, 0.01, gradient="clean"),
            ValueError,
            "gradient='clean' is not one of 'iterate', 'cleverhans'",
        ),
        (lambda m, x, y: eps_from_255((1, -2)), ValueError, "got -2"),
    ],
)
def test_bad_arguments_raise_with_the_value(linear, call, error, match):
    model, x, y, _ = linear
    with pytest.raises(error, match=match):
        call(model, x, y)
