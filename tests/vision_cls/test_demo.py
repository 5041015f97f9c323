"""The demo's report: curves, the comparison table and the plot, from hand-made results."""

import pytest

from kpca.vision_cls import demo


def results(clean: float, corrupted: float, attacked: float) -> dict[str, float]:
    out = {"clean/acc1": clean, "clean/acc5": 1.0, "corrupted/mean_acc1": corrupted}
    for name in ("gaussian_noise", "contrast"):
        for severity in range(1, 6):
            out[f"corrupted/{name}/s{severity}/acc1"] = corrupted - 0.01 * severity
    for attack in ("fgsm-pixel", "pgd-pixel"):
        for level in (1, 2, 4):
            out[f"attack/{attack}/eps{level}/acc1"] = attacked / level
    return out


def test_curves_start_from_clean_accuracy():
    r = results(0.9, 0.7, 0.4)
    assert demo.severity_curve(r) == pytest.approx([0.9, 0.69, 0.68, 0.67, 0.66, 0.65])
    eps, acc = demo.attack_curve(r, "pgd-pixel")
    assert eps == [0.0, 1.0, 2.0, 4.0] and acc == [0.9, 0.4, 0.2, 0.1]


def test_markdown_names_the_winner_of_each_headline():
    text = demo.markdown({"symmetric": results(0.9, 0.7, 0.4), "rpc": results(0.8, 0.75, 0.4)})
    assert "| clean/acc1 | 0.9000 | 0.8000 | -0.1000 |" in text
    assert "- clean accuracy: SymViT 0.9000, RPC-SymViT 0.8000 (SymViT higher by 0.1000)" in text
    assert "- mean corrupted accuracy: SymViT 0.7000, RPC-SymViT 0.7500 (RPC-SymViT higher by 0.0500)" in text
    assert "FGSM accuracy, mean over radii: SymViT 0.2333, RPC-SymViT 0.2333 (neither higher" in text


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "report.png"
    demo.plot({"symmetric": results(0.9, 0.7, 0.4), "rpc": results(0.8, 0.75, 0.3)}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
