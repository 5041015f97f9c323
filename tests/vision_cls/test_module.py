"""ClassificationModule (training step, Mixup, no-decay groups, lr schedule, EMA) and RobustnessEvaluator (CPU)."""

import csv
import logging
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch import Callback, LightningDataModule, Trainer
from sklearn.metrics import average_precision_score
from torch import nn
from torch.utils.data import DataLoader

from kpca.attention import AttentionSpec
from kpca.vision_cls.attacks import AttackSpec, eps_from_255
from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.eval_data import EvalData, EvalSet
from kpca.vision_cls.evaluation import RobustnessEvaluator
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.model import ViTClassifier
from kpca.vision_cls.module import ClassificationModule
from kpca.vision_cls.robustness import variant_indices
from tests.cli_support import CONFIGS, CPU, run_cli

# Expected in fits with EMA: the EMA copy stays in eval mode on purpose (timm's ModelEmaV3).
EMA_IN_EVAL_MODE = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


def tiny_net(num_classes: int = 10) -> ViTClassifier:
    """A 2-block RPC-SymViT on 32 px images without stochastic depth, so train-mode forwards are deterministic."""
    return ViTClassifier(
        "deit_tiny", num_classes=num_classes, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
        drop_path_rate=0.0, attention=AttentionSpec(kind="rpc", n_iter=2, layers=[0]),
    )  # fmt: skip


def fake_batch(batch: int = 4, num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(batch, 3, 32, 32), torch.randint(0, num_classes, (batch,))  # (B, C, H, W), (B,)


def record_logs(monkeypatch: pytest.MonkeyPatch, module: ClassificationModule) -> dict[str, torch.Tensor]:
    """Replace ``module.log`` (which needs a Trainer) by a dict of the logged values."""
    logged = {}
    monkeypatch.setattr(module, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
    return logged


def assert_all_grads_finite(net: nn.Module) -> None:
    grads = {name: p.grad for name, p in net.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), "every parameter gets a gradient"
    assert grads["vit.blocks.0.attn.qkv.weight"].abs().sum() > 0


def test_training_step_without_mixup_is_label_smoothed_cross_entropy(monkeypatch: pytest.MonkeyPatch):
    module = ClassificationModule(tiny_net(), mixup_alpha=0.0, cutmix_alpha=0.0, label_smoothing=0.1)
    logged = record_logs(monkeypatch, module)
    images, labels = fake_batch()
    loss = module.training_step((images, labels), 0)
    torch.testing.assert_close(loss, F.cross_entropy(module.net(images), labels, label_smoothing=0.1))
    assert logged["train/loss"] is module.train_loss and module.train_loss.compute() == loss.detach()
    loss.backward()
    assert_all_grads_finite(module.net)


def test_training_step_with_mixup_uses_the_mixed_soft_targets(monkeypatch: pytest.MonkeyPatch):
    module = ClassificationModule(tiny_net(), mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    record_logs(monkeypatch, module)
    images, labels = fake_batch()  # Mixup needs an even batch
    np.random.seed(0)  # timm's Mixup draws lambda and Mixup-or-CutMix from NumPy's global RNG
    loss = module.training_step((images.clone(), labels), 0)  # Mixup mixes the batch in place
    np.random.seed(0)
    mixed, targets = module.mixup(images.clone(), labels)  # (B, C, H, W), (B, K)
    assert not torch.equal(mixed, images) and (targets.max(-1).values < 0.95).all()
    expected = -(targets * F.log_softmax(module.net(mixed), dim=-1)).sum(-1).mean()
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(loss, F.cross_entropy(module.net(images), labels, label_smoothing=0.1))
    loss.backward()
    assert_all_grads_finite(module.net)


class StepRecorder(Callback):
    """Records the lr of every training step and the EMA the module should hold, computed by hand."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.lrs: list[float] = []
        self.expected_ema: dict[str, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Runs after the optimizer step and before the module's EMA update; timm's ModelEmaV3 copies
        # the weights on the first update (step 1), then keeps decay * ema + (1 - decay) * weights.
        decay = 0.0 if trainer.global_step <= 1 else self.decay
        for name, p in pl_module.net.named_parameters():
            old = self.expected_ema.get(name, p.detach())
            self.expected_ema[name] = decay * old + (1 - decay) * p.detach()


@pytest.fixture(scope="module")
def fitted(digits_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """4 epochs of 5 steps (batch 16) on the digits: lr 1e-3 at batch 512, 1 warm-up epoch, EMA decay 0.5."""
    torch.manual_seed(0)
    module = ClassificationModule(
        tiny_net(), optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05), warmup_epochs=1.0,
        warmup_lr=1e-6, min_lr=1e-5, mixup_alpha=0.0, cutmix_alpha=0.0, ema_decay=0.5,
    )  # fmt: skip
    data = ImageNetDataModule(
        builtin="digits", cache_dir=str(digits_cache_dir), batch_size=16, num_workers=0, image_size=32,
        crop_pct=1.0, train=TrainData(repeated_aug=1), pin_memory=False, eval=EvalData(subset=16),
    )  # fmt: skip
    recorder = StepRecorder(decay=0.5)
    trainer = Trainer(
        accelerator="cpu", max_epochs=4, limit_train_batches=5, limit_val_batches=1, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[recorder], default_root_dir=tmp_path_factory.mktemp("fit"),
    )  # fmt: skip
    trainer.fit(module, data)
    return module, trainer, recorder


@EMA_IN_EVAL_MODE
def test_no_weight_decay_for_biases_norms_pos_embed_and_cls_token(fitted):
    module, trainer, _ = fitted
    names = {id(p): name for name, p in module.net.named_parameters()}
    decay, no_decay = ({names[id(p)] for p in group["params"]} for group in trainer.optimizers[0].param_groups)
    groups = trainer.optimizers[0].param_groups
    assert groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0.0
    assert decay | no_decay == set(names.values()) and not decay & no_decay
    assert {"vit.pos_embed", "vit.cls_token", "vit.norm.weight", "vit.head.bias"} <= no_decay
    assert {"vit.blocks.0.norm1.weight", "vit.blocks.0.norm1.bias", "vit.blocks.1.attn.qkv.bias"} <= no_decay
    assert {"vit.patch_embed.proj.weight", "vit.blocks.0.attn.qkv.weight", "vit.head.weight"} <= decay
    assert all(name.endswith("weight") for name in decay)


@EMA_IN_EVAL_MODE
def test_lr_scaled_by_global_batch_with_warmup_then_cosine(fitted):
    _, trainer, recorder = fitted
    peak, warmup_lr, min_lr = 1e-3 * 16 / 512, 1e-6, 1e-5  # 20 steps, 5 of them warm-up
    lrs = recorder.lrs
    assert len(lrs) == 20
    assert lrs[0] == pytest.approx(warmup_lr)
    assert lrs[3] == pytest.approx(warmup_lr + (peak - warmup_lr) * 3 / 5)
    assert lrs[5] == pytest.approx(peak) and max(lrs) == pytest.approx(peak)
    assert lrs[10] == pytest.approx(min_lr + (peak - min_lr) * 0.5 * (1 + math.cos(math.pi * 5 / 15)))
    assert all(a > b for a, b in zip(lrs[5:-1], lrs[6:], strict=True))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(min_lr)  # after the last step


@EMA_IN_EVAL_MODE
def test_ema_follows_the_weights_and_is_validated(fitted):
    module, trainer, recorder = fitted
    ema = dict(module.ema.module.named_parameters())
    assert ema.keys() == recorder.expected_ema.keys()
    for name, value in recorder.expected_ema.items():
        torch.testing.assert_close(ema[name], value)
    assert not torch.allclose(ema["vit.head.weight"], module.net.vit.head.weight)
    assert "val/ema_acc1" in trainer.callback_metrics and "val/acc1" in trainer.callback_metrics


class PixelLinear(nn.Module):
    """A fixed linear classifier of normalised 4 x 4 images (1000 classes), with the buffers the evaluator reads."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))  # (1, C, 1, 1)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))  # (1, C, 1, 1)
        self.head = nn.Linear(3 * 4 * 4, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(((images - self.mean) / self.std).flatten(1))  # (B, C*H*W) -> (B, K)


def batch_with_outcomes(net: nn.Module, outcomes: list[str], columns: torch.Tensor | None = None):
    """Images and labels that ``net`` classifies as listed: ``top1``, ``top5`` (2nd best) or ``miss`` (worst).

    With ``columns`` the labels are positions among those logit columns (a 200-class variant).
    """
    images = torch.rand(len(outcomes), 3, 4, 4)  # (B, C, H, W)
    with torch.no_grad():
        logits = net(images)  # (B, K)
    if columns is not None:
        logits = logits[:, columns]  # (B, M)
    ranked = logits.argsort(dim=-1, descending=True)
    rank = {"top1": 0, "top5": 1, "miss": -1}
    return images, torch.stack([ranked[i, rank[o]] for i, o in enumerate(outcomes)])


EVAL_SETS = [
    EvalSet("clean", "clean"),
    EvalSet("corrupted/gaussian_noise/1", "corrupted", "gaussian_noise", 1),
    EvalSet("corrupted/gaussian_noise/2", "corrupted", "gaussian_noise", 2),
    EvalSet("imagenet_a", "imagenet_a"),
    EvalSet("imagenet_o", "imagenet_o"),
    EvalSet("imagenet_o_in", "imagenet_o_in"),
]


class DigitsWithoutEvalSets(LightningDataModule):
    """A datamodule that loads test batches but is not a VisionData (no eval_sets, class_indices, batch_size)."""

    def test_dataloader(self) -> DataLoader:
        return DataLoader([fake_batch(2)], batch_size=None)


def test_test_with_another_datamodule_names_what_it_lacks(tmp_path: Path):
    trainer = Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(TypeError, match=r"DigitsWithoutEvalSets is not a VisionData: it lacks \['batch_size', 'class_"):
        trainer.test(ClassificationModule(tiny_net()), datamodule=DigitsWithoutEvalSets())


@pytest.fixture
def routed():
    """Runs every set of ``EVAL_SETS`` through a RobustnessEvaluator; returns it, its results and the expected ones."""
    net = PixelLinear().eval()
    evaluator = RobustnessEvaluator()
    evaluator.start(EVAL_SETS, net.num_classes, torch.device("cpu"))
    o_columns = variant_indices("imagenet_o")
    batches = [
        batch_with_outcomes(net, ["top1", "top1", "top5", "miss"]),
        batch_with_outcomes(net, ["top1", "top1", "miss", "miss"]),
        batch_with_outcomes(net, ["top1", "miss", "miss", "miss"]),
        batch_with_outcomes(net, ["top1", "top1", "top1", "miss"], columns=variant_indices("imagenet_a")),
        (torch.rand(6, 3, 4, 4), torch.full((6,), -1)),
        (torch.rand(5, 3, 4, 4), torch.zeros(5, dtype=torch.long)),
    ]
    for index, batch in enumerate(batches):
        evaluator.step(net, batch, dataloader_idx=index, batch_idx=0)
    with torch.no_grad():
        scores = [-net(batches[i][0])[:, o_columns].softmax(-1).amax(-1) for i in (4, 5)]  # (B,) each: out, in
    aupr = average_precision_score([1] * 6 + [0] * 5, torch.cat(scores).numpy())
    expected = {
        "clean/acc1": 0.5,
        "clean/acc5": 0.75,
        "corrupted/gaussian_noise/s1/acc1": 0.5,
        "corrupted/gaussian_noise/s2/acc1": 0.25,
        "corrupted/mean_acc1": 0.375,  # no mCE: 14 of the 15 corruptions are missing
        "imagenet_a/acc1": 0.75,
        "imagenet_o/aupr": aupr,
        "clean/n_images": 4.0,
    }
    return evaluator, evaluator.compute(), expected


def test_evaluator_routes_each_set_to_its_metric(routed):
    _, results, expected = routed
    assert results == pytest.approx(expected)


def test_evaluator_writes_markdown_and_csv_reports(routed, tmp_path: Path):
    evaluator, results, _ = routed
    paths = evaluator.write_report(results, tmp_path)
    names = ["robustness.md", "robustness.csv", "robustness_corrupted.md", "robustness_corrupted.csv"]
    assert [p.name for p in paths] == names and all(p.is_file() for p in paths)
    with open(tmp_path / "robustness.csv") as f:
        rows = list(csv.DictReader(f))
    counts = {name: value for name, value in results.items() if name.endswith("/n_images")}
    assert counts == {"clean/n_images": 4.0}  # a column, not a row
    assert {row["metric"]: float(row["value"]) for row in rows} == pytest.approx(
        {name: value for name, value in results.items() if name not in counts}
    )
    assert {row["metric"]: row["n"] for row in rows if row["n"]} == {"clean/acc1": "4", "clean/acc5": "4"}
    with open(tmp_path / "robustness_corrupted.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["corruption"] for r in rows] == ["gaussian_noise", "mean"]
    assert float(rows[0]["error"]) == pytest.approx(0.625)
    assert "| imagenet_a/acc1 | 0.7500 |  |" in (tmp_path / "robustness.md").read_text()
    assert "| clean/acc1 | 0.5000 | 4 |" in (tmp_path / "robustness.md").read_text()


def test_evaluator_attacks_the_first_clean_batches_inside_inference_mode():
    net = PixelLinear().eval()
    evaluator = RobustnessEvaluator(attacks=[AttackSpec("fgsm", eps=[0.0, 0.5])], attack_batches=1)
    evaluator.start(EVAL_SETS[:1], net.num_classes, torch.device("cpu"))
    batches = [batch_with_outcomes(net, ["top1"] * 4), batch_with_outcomes(net, ["miss"] * 4)]
    with torch.inference_mode():  # as in Lightning's test loop: the batches are inference tensors
        for index, (images, labels) in enumerate(batches):
            evaluator.step(net, (images.clone(), labels.clone()), dataloader_idx=0, batch_idx=index)
    results = evaluator.compute()
    assert results["clean/acc1"] == 0.5
    assert results["attack/fgsm-pixel/eps0/acc1"] == 1.0  # only batch 0 (all correct) is attacked
    assert results["attack/fgsm-pixel/eps127.5/acc1"] < 1.0


def test_evaluator_uses_the_class_columns_it_is_given():
    net = PixelLinear().eval()
    columns = [7, 3, 500]  # e.g. a datamodule whose training classes hold 3 of ImageNet-A's wnids
    evaluator = RobustnessEvaluator()
    evaluator.start([EVAL_SETS[0], EVAL_SETS[3]], 1000, torch.device("cpu"), {"clean": None, "imagenet_a": columns})
    evaluator.step(net, batch_with_outcomes(net, ["top1"] * 2), dataloader_idx=0, batch_idx=0)
    batch = batch_with_outcomes(net, ["top1", "top1", "top1", "miss"], columns=torch.tensor(columns))
    evaluator.step(net, batch, dataloader_idx=1, batch_idx=0)
    assert evaluator.compute()["imagenet_a/acc1"] == 0.75


class Recorded(nn.Module):
    """Wraps an evaluator network: records every call's input and the dtype its logits were computed in."""

    def __init__(self, net: PixelLinear) -> None:
        super().__init__()
        self.net = net
        self.num_classes = net.num_classes
        self.inputs: list[torch.Tensor] = []
        self.dtypes: list[torch.dtype] = []

    @property
    def mean(self) -> torch.Tensor:
        return self.net.mean

    @property
    def std(self) -> torch.Tensor:
        return self.net.std

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.inputs.append(images.detach().clone())
        logits = self.net(images)
        self.dtypes.append(logits.dtype)
        return logits

    @property
    def batch_sizes(self) -> list[int]:
        return [x.shape[0] for x in self.inputs]


def attacked_sweep(attack_batches: int | None = None):
    """FGSM (2 radii), PGD (3 steps) and SPSA (2 steps, 128 samples) on clean batches of 4, 4 and 3 images.

    ``attack_batches`` None leaves the evaluator's default.
    """
    torch.manual_seed(0)
    net = Recorded(PixelLinear().eval())
    attacks = [
        AttackSpec("fgsm", [0.05, 0.3]),
        AttackSpec("pgd", [0.3], steps=3),
        AttackSpec("spsa", [0.3], steps=2),
    ]
    limit = {} if attack_batches is None else {"attack_batches": attack_batches}
    evaluator = RobustnessEvaluator(attacks=attacks, **limit)
    evaluator.start(EVAL_SETS[:1], net.num_classes, torch.device("cpu"))
    with torch.no_grad():
        batches = [
            batch_with_outcomes(net.net, ["top1", "top1", "miss", "top1"]),
            batch_with_outcomes(net.net, ["top1", "miss", "top1", "top1"]),
            batch_with_outcomes(net.net, ["miss", "top1", "top1"]),
        ]
    with torch.inference_mode():
        for index, (images, labels) in enumerate(batches):
            evaluator.step(net, (images.clone(), labels.clone()), dataloader_idx=0, batch_idx=index)
    return evaluator, evaluator.compute(), net


def attacked_batch_calls(b: int, spsa_chunks: list[int]) -> list[int]:
    """The model calls for one attacked clean batch of ``b`` images, in order (batch sizes)."""
    fgsm = [b, b]  # gradient, then the evaluation of the adversarial images
    pgd = [b] * 3 + [b]  # one gradient per step (the random start needs none), evaluation
    spsa = [2 * s * b for s in spsa_chunks] * 2 + [b]  # 2 x directions x images per call, 2 steps; evaluation
    return [b] + fgsm + fgsm + pgd + spsa


# SPSA sends at most 512 images per call: chunks of 512 // (2 * 4) = 64 directions for 4 images, 85 for 3.
CALLS_4 = attacked_batch_calls(4, [64, 64])
CALLS_3 = attacked_batch_calls(3, [85, 43])


def test_evaluator_attacks_every_clean_batch_by_default_with_exact_model_calls(tmp_path: Path, caplog):
    with caplog.at_level(logging.INFO, logger="kpca.vision_cls.evaluation"):
        evaluator, results, net = attacked_sweep()
    assert evaluator.attack_batches is None
    assert net.batch_sizes == CALLS_4 + CALLS_4 + CALLS_3
    assert results["attack/n_images"] == 11 and results["clean/n_images"] == 11
    assert "attack_batches" not in caplog.text
    attacked = {name: value for name, value in results.items() if name.startswith("attack/") and "acc1" in name}
    assert len(attacked) == 4
    assert all(value <= results["clean/acc1"] for value in attacked.values())
    assert results["clean/acc1"] == pytest.approx(8 / 11)
    assert results["attack/pgd-pixel/eps76.5/acc1"] < results["clean/acc1"]
    evaluator.write_report(results, tmp_path)
    with open(tmp_path / "robustness.csv") as f:
        n = {row["metric"]: row["n"] for row in csv.DictReader(f)}
    assert n == {"clean/acc1": "11", "clean/acc5": "11"} | dict.fromkeys(attacked, "11")


def test_evaluator_counts_a_limited_attack_subset_and_says_so(tmp_path: Path, caplog):
    with caplog.at_level(logging.INFO, logger="kpca.vision_cls.evaluation"):
        evaluator, results, net = attacked_sweep(attack_batches=1)
    assert net.batch_sizes == CALLS_4 + [4] + [3]  # only the first batch is attacked
    assert results["attack/n_images"] == 4 and results["clean/n_images"] == 11
    assert "attack_batches=1" in caplog.text and "4 of 11 clean images" in caplog.text
    evaluator.write_report(results, tmp_path)
    table = (tmp_path / "robustness.md").read_text()
    assert "| clean/acc1 | 0.7273 | 11 |" in table
    assert f"| attack/fgsm-pixel/eps12.75/acc1 | {results['attack/fgsm-pixel/eps12.75/acc1']:.4f} | 4 |" in table


def two_class_batch(net: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4 images inside (0, 1), the prediction, and labels: the first 2 images predicted right, the last 2 wrong."""
    torch.manual_seed(0)
    images = 0.3 + 0.4 * torch.rand(4, 3, 4, 4)  # (B, C, H, W)
    with torch.no_grad():
        predicted = net(images).argmax(1)  # (B,)
    return images, predicted, torch.cat([predicted[:2], 1 - predicted[2:]])


def test_predicted_labels_attack_the_prediction_and_score_the_true_labels():
    torch.manual_seed(0)
    net = Recorded(PixelLinear(num_classes=2).eval())
    images, predicted, labels = two_class_batch(net.net)
    eps = 0.2
    attacks = [AttackSpec("fgsm", [eps]), AttackSpec("fgsm", [eps], labels="predicted")]
    evaluator = RobustnessEvaluator(attacks=attacks)
    evaluator.start(EVAL_SETS[:1], 2, torch.device("cpu"))
    evaluator.step(net, (images, labels), dataloader_idx=0, batch_idx=0)
    results = evaluator.compute()
    # Calls: clean, the prediction, then per attack its gradient and the evaluation of its adversarial images.
    assert net.batch_sizes == [4] * 6
    against_truth, against_prediction = net.inputs[3], net.inputs[5]
    weight = net.net.head.weight.detach()  # (2, C*H*W); std > 0 keeps the sign of the pixel-space gradient

    def optimum(targets: torch.Tensor) -> torch.Tensor:  # the linear model's L∞ optimum against ``targets``
        return images + eps * (weight[1 - targets] - weight[targets]).sign().view(4, 3, 4, 4)

    torch.testing.assert_close(against_truth, optimum(labels), atol=1e-6, rtol=0)
    torch.testing.assert_close(against_prediction, optimum(predicted), atol=1e-6, rtol=0)
    torch.testing.assert_close(against_prediction[2:] - images[2:], images[2:] - against_truth[2:], atol=1e-6, rtol=0)

    def accuracy(adversarial: torch.Tensor) -> float:  # against the true labels
        with torch.no_grad():
            return (net.net(adversarial).argmax(1) == labels).float().mean().item()

    assert results["attack/fgsm-pixel/eps51/acc1"] == accuracy(against_truth) == 0.0
    # The 2 right predictions are pushed wrong; the 2 wrong ones are pushed off their prediction, to the truth.
    assert results["attack/fgsm-pixel-predicted/eps51/acc1"] == accuracy(against_prediction) == 0.5


def test_evaluator_attacks_in_float32_and_classifies_under_the_callers_autocast():
    net = Recorded(PixelLinear(num_classes=2).eval())
    images, _, labels = two_class_batch(net.net)
    attacks = [AttackSpec("fgsm", [0.1]), AttackSpec("pgd", [0.1], steps=2, labels="predicted")]
    evaluator = RobustnessEvaluator(attacks=attacks)
    evaluator.start(EVAL_SETS[:1], 2, torch.device("cpu"))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):  # Lightning's bf16-mixed test loop
        evaluator.step(net, (images, labels), dataloader_idx=0, batch_idx=0)
    bf16, fp32 = torch.bfloat16, torch.float32
    # clean | prediction | FGSM gradient, evaluation | 2 PGD gradients, evaluation
    assert net.dtypes == [bf16, fp32, fp32, bf16, fp32, fp32, bf16]
    assert all(x.dtype == fp32 for x in net.inputs)


def test_evaluator_refuses_the_same_attack_twice():
    with pytest.raises(ValueError, match=r"\['pgd-pixel'\] appear more than once.*single entry's eps"):
        RobustnessEvaluator(attacks=[AttackSpec("pgd", [0.01]), AttackSpec("pgd", [0.02])])
    RobustnessEvaluator(attacks=[AttackSpec("pgd", [0.01]), AttackSpec("pgd", [0.01], labels="predicted")])


@pytest.mark.parametrize(
    ("fragment", "space", "labels", "steps", "spsa_gradient"),
    [
        ("published", "reference", "predicted", (20, 10), "cleverhans"),
        ("pixel", "pixel", "ground_truth", (20, 20), "iterate"),
    ],
)
def test_attack_config_fragments_compose_after_a_model_config(capsys, fragment, space, labels, steps, spsa_gradient):
    model_config = CONFIGS / "vision_cls" / "deit-tiny_rpc_8xb128-300e_imagenet-224.yaml"
    attacks_config = CONFIGS / "vision_cls" / "attacks" / f"{fragment}.yaml"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, "vision-cls", "test", "-c", CPU, "-c", model_config, "-c", attacks_config, "--print_config")
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err
    config = yaml.safe_load(printed.out)
    assert config["model"]["net"]["init_args"]["attention"]["kind"] == "rpc"  # the model config is kept
    settings = config["model"]["evaluator"]["init_args"]
    evaluator = RobustnessEvaluator(
        attacks=[AttackSpec(**a) for a in settings["attacks"]], attack_batches=settings["attack_batches"]
    )
    assert evaluator.attack_batches is None
    assert [a.name for a in evaluator.attacks] == ["fgsm", "pgd", "spsa"]
    for a in evaluator.attacks:
        assert (a.space, a.labels) == (space, labels)
        assert a.eps == pytest.approx(eps_from_255((1, 2, 3, 4, 5, 6)), rel=1e-12)
    assert (evaluator.attacks[1].steps, evaluator.attacks[2].steps) == steps
    assert evaluator.attacks[2].spsa_gradient == spsa_gradient
