"""The ``language-model`` command: LightningCLI over LanguageModelModule and WikiTextDataModule."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningCLI

from kpca.language_model.callbacks import SampleText, TextPredictionWriter
from kpca.language_model.data import WikiTextDataModule
from kpca.language_model.module import LanguageModelModule
from kpca.vision_cls.callbacks import RPCDiagnostics


class LanguageModelCLI(LightningCLI):
    """Adds best/last checkpoints, RPC diagnostics, sampled text and the prediction writer; links data to model."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/ppl",
                "checkpoint.mode": "min",
                "checkpoint.save_last": True,
                "checkpoint.filename": "best-{step:07d}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(RPCDiagnostics, "rpc_diagnostics")
        parser.add_lightning_class_args(SampleText, "sample_text")
        parser.add_lightning_class_args(TextPredictionWriter, "prediction_writer")
        parser.link_arguments("data.tokenizer.vocab_size", "model.net.init_args.vocab_size")
        parser.link_arguments("data.context", "model.net.init_args.context")


def main(args: ArgsType = None) -> LanguageModelCLI:
    """Run ``language-model fit|validate|test|predict -c configs/trainer/<hw>.yaml -c configs/language_model/<e>.yaml``.

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return LanguageModelCLI(
        LanguageModelModule,
        WikiTextDataModule,
        args=args,
        trainer_defaults={"plugins": [{"class_path": "kpca.vision_cls.checkpoint_io.AtomicCheckpointIO"}]},
        save_config_kwargs={"overwrite": True},
    )


def console_main() -> None:
    """Entry point of the ``language-model`` console script (console scripts exit with the return value)."""
    main()


if __name__ == "__main__":
    console_main()
