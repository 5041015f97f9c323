"""The ``language-model`` command: LightningCLI over LanguageModelModule and WikiTextDataModule."""

from __future__ import annotations

from lightning.pytorch.cli import ArgsType

from kpca.language_model.callbacks import SampleText, TextPredictionWriter
from kpca.language_model.data import WikiTextDataModule
from kpca.language_model.module import LanguageModelModule
from kpca.training.cli import ProjectCLI, batch_size, batch_tokens
from kpca.training.errors import run_command


class LanguageModelCLI(ProjectCLI):
    """Adds best/last checkpoints on ``val/ppl``, sampled text, the prediction writer and links (to ProjectCLI's)."""

    description = (
        "language-model: WikiText-103 causal language modelling with softmax, symmetric and RPC attention; fit, "
        "validate, test (perplexity, clean and word-swapped), predict (text generation) and analyze (kernel PCA)."
    )

    monitor, mode, best_filename = "val/ppl", "min", "best-{step:07d}"
    throughput = (batch_size, batch_tokens)  # ThroughputMonitor logs tokens/s as items_per_sec

    def add_app_arguments(self, parser) -> None:
        parser.add_lightning_class_args(SampleText, "sample_text")
        parser.add_lightning_class_args(TextPredictionWriter, "prediction_writer")
        parser.link_arguments("data.tokenizer.vocab_size", "model.net.init_args.vocab_size")
        parser.link_arguments("data.context", "model.net.init_args.context")


def main(args: ArgsType = None) -> LanguageModelCLI:
    """Run ``language-model fit|validate|test|predict -c configs/trainer/<hw>.yaml -c configs/language_model/<e>.yaml``.

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return LanguageModelCLI(LanguageModelModule, WikiTextDataModule, args=args)


def console_main() -> None:
    """Entry point of the ``language-model`` console script; a user error ends it with one ``error:`` line."""
    run_command(main)


if __name__ == "__main__":
    console_main()
