"""timm's RandAugment policy, written once (kpca.vision_cls.input.policy), and each executor of it held to timm's ops.

The executors: the workers' compiled ops (bit-identical to Pillow), the device's batched ops (bit-identical), and
DALI's operators (within the tolerances below; needs NVIDIA DALI, on its CPU operators). The device's ops on CUDA are
held to its CPU ops in test_batch_rand_augment.py (``make test-gpu``).
"""

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from timm.data import auto_augment as timm_aa

from kpca.vision_cls.input import policy
from kpca.vision_cls.input.dali.tables import BINS_PER_LEVEL, rand_augment_specs
from kpca.vision_cls.input.device.pillow_ops import MATRIX_OPS, PIXEL_OPS, run_op
from kpca.vision_cls.input.policy import parse_rand_augment
from kpca.vision_cls.input.workers.compiled_rand_augment import COMPILED_OPS, with_compiled_ops

DEIT_HPARAMS = policy.timm_train_hparams(224)  # bicubic, fill (124, 116, 104), translate_const 100
DALI_FILL = 115  # DALI's warps fill one grey level and have no bicubic: its reference runs timm's ops so
DALI_HPARAMS = {"img_mean": (DALI_FILL,) * 3, "interpolation": Image.BILINEAR}
RAND_OPS = sorted(set(policy.rand_op_names(True)) | set(policy.rand_op_names(False)))
# Largest mean |DALI - timm| per op kind (uint8 levels): pixel maps are exact, enhance ops round differently, warps
# and sharpness differ at edges, Equalize uses OpenCV's lookup table instead of PIL's.
DALI_TOLERANCE = {"Equalize": 6.0, "Rotate": 1.0, "ShearX": 1.0, "ShearY": 1.0, "TranslateX": 1.0}
DALI_EXACT = ("Invert", "Posterize", "Solarize", "SolarizeAdd")


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A real photograph at the size RandAugment sees in DeiT's recipe."""
    return Image.fromarray(load_sample_images().images[1]).resize((224, 224), Image.BICUBIC)


@pytest.mark.parametrize("name", sorted(policy.LEVELS))
def test_every_level_is_timms(name: str, monkeypatch: pytest.MonkeyPatch):
    hparams = {**DEIT_HPARAMS, "translate_pct": 0.4}
    magnitudes = torch.linspace(0, 10, 401, dtype=torch.float64)
    expected = {}
    for negate in (False, True):
        monkeypatch.setattr(timm_aa, "_randomly_negate", lambda v, n=negate: -v if n else v)
        level = timm_aa.LEVEL_TO_ARG[name]
        expected[negate] = [level(m, hparams)[0] if level else 0.0 for m in magnitudes.tolist()]
        ours = policy.arguments(name, magnitudes, torch.full_like(magnitudes, negate, dtype=torch.bool), hparams)
        assert ours.tolist() == expected[negate], name
    level = policy.LEVELS[name]
    assert (level is not None and level.negates) == (expected[False] != expected[True]), name


def test_the_op_sets_are_timms():
    assert policy.rand_op_names(False) == timm_aa._RAND_TRANSFORMS
    assert policy.rand_op_names(True) == timm_aa._RAND_INCREASING_TRANSFORMS
    assert set(RAND_OPS) <= set(policy.LEVELS) == set(timm_aa.LEVEL_TO_ARG) - {"Desaturate", "GaussianBlur",
                                                                               "GaussianBlurRand"}  # fmt: skip


def timm_op(name: str, magnitude: float, negated: bool, hparams: dict, monkeypatch: pytest.MonkeyPatch):
    """timm's own op at a fixed magnitude and sign (probability 1, no magnitude noise)."""
    monkeypatch.setattr(timm_aa, "_randomly_negate", (lambda v: -v) if negated else (lambda v: v))
    return timm_aa.AugmentOp(name, prob=1.0, magnitude=magnitude, hparams=hparams)


def workers(photo: Image.Image, name: str, magnitude: float, negated: bool, monkeypatch) -> np.ndarray:
    """The workers' op: timm's AugmentOp with its pixels computed by the compiled kernels where they cover it."""
    op = timm_op(name, magnitude, negated, DEIT_HPARAMS, monkeypatch)
    (compiled,) = with_compiled_ops(timm_aa.RandAugment([op], num_layers=1)).ops
    assert (compiled.aug_fn is COMPILED_OPS[name]) if name in COMPILED_OPS else (compiled.aug_fn is op.aug_fn)
    return np.asarray(compiled(photo))


def device(photo: Image.Image, name: str, magnitude: float, negated: bool, monkeypatch) -> np.ndarray:
    """The device's op: the policy's argument, then the batched op on a batch of one."""
    batch = torch.from_numpy(np.array(photo)).permute(2, 0, 1)[None].contiguous()  # (1, C, H, W)
    magnitudes, negate = torch.tensor([magnitude], dtype=torch.float64), torch.tensor([negated])
    argument = policy.arguments(name, magnitudes, negate, DEIT_HPARAMS)  # (1,)
    fill = torch.tensor(DEIT_HPARAMS["img_mean"], dtype=torch.uint8)
    return run_op(name, batch, argument, fill, "bicubic")[0].permute(1, 2, 0).numpy()


def dali(photo: Image.Image, name: str, magnitude: float, negated: bool, monkeypatch) -> np.ndarray:
    """DALI's op: the argument looked up in its table at the signed magnitude bin, in a one-op CPU pipeline."""
    pytest.importorskip("nvidia.dali", reason="not available: NVIDIA DALI is not installed (kpca-vision-cls[dali])")
    from nvidia.dali import fn, pipeline_def, types

    from kpca.vision_cls.input.dali.graph import TimmOp, WarpSettings

    config = parse_rand_augment("rand-inc1" if name in policy.rand_op_names(True) else "rand")
    (spec,) = [spec for spec in rand_augment_specs(config) if spec.name == name]
    image = np.asarray(photo)

    @pipeline_def
    def one_op():
        images = fn.copy(types.Constant(image, layout="HWC"))
        operation = TimmOp(spec, WarpSettings(image.shape[0], DALI_FILL, types.INTERP_LINEAR), "cpu")
        return operation(images, types.Constant(np.int32(2 * round(magnitude * BINS_PER_LEVEL) + negated)))

    pipeline = one_op(batch_size=1, num_threads=1, device_id=None)
    pipeline.build()
    return np.array(pipeline.run()[0][0])


EXECUTORS = {
    "workers": (workers, sorted(policy.LEVELS), DEIT_HPARAMS, (0.0, 4.4, 10.0)),
    "device": (device, sorted(PIXEL_OPS.keys() | MATRIX_OPS.keys()), DEIT_HPARAMS, (0.0, 4.4, 10.0)),
    "dali": (dali, RAND_OPS, DALI_HPARAMS, (7.3,)),
}
"""Each executor: how it runs one op, the op names it runs, the hparams of timm's reference, the magnitudes tried."""


@pytest.mark.parametrize(
    ("executor", "name"), [(executor, name) for executor, (_, names, *_) in EXECUTORS.items() for name in names]
)
def test_every_executor_runs_timms_op(photo: Image.Image, executor: str, name: str, monkeypatch: pytest.MonkeyPatch):
    # Workers and device: 0 differing values observed. DALI: the tolerances above.
    run, _, hparams, magnitudes = EXECUTORS[executor]
    for magnitude in magnitudes:
        for negated in (False, True):
            expected = np.asarray(timm_op(name, magnitude, negated, hparams, monkeypatch)(photo))
            got = run(photo, name, magnitude, negated, monkeypatch)
            if executor != "dali":
                np.testing.assert_array_equal(got, expected, err_msg=f"{name} at {magnitude}, negated={negated}")
                continue
            kind = name.removesuffix("Increasing").removesuffix("Rel")
            difference = np.abs(got.astype(int) - expected)
            assert difference.mean() <= DALI_TOLERANCE.get(kind, 0.6), (name, negated)
            assert kind not in DALI_EXACT or difference.max() == 0, (name, negated)
