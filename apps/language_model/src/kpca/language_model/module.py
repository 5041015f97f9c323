"""LanguageModelModule: training, perplexity evaluation (clean and word-swapped) and generation.

Legend: B batch, N context, V vocabulary, S scored positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import nn

from kpca.language_model.data import LanguageData
from kpca.language_model.perplexity import NLLTotals, perplexity_rows, write_perplexity_report
from kpca.training.data import require_built, require_datamodule
from kpca.training.errors import OptionError
from kpca.training.module import CompileOptions, NetModule
from kpca.training.optim import parameter_groups, warmup_cosine


@dataclass(frozen=True)
class Generation:
    """How ``predict`` and the sample-text callback continue prompts.

    Args:
        max_new_tokens: tokens added to each prompt.
        top_k: sample among the k most likely tokens; None is greedy decoding.
        temperature: softmax temperature when sampling.
        seed: seed of the sampling generator (the same prompts give the same text).
    """

    max_new_tokens: int = 64
    top_k: int | None = None
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise OptionError(f"generation.max_new_tokens={self.max_new_tokens} must be 1 or more")
        if self.top_k is not None and self.top_k < 1:
            raise OptionError(f"generation.top_k={self.top_k} must be 1 or more, or null for greedy decoding")
        if not self.temperature > 0:
            raise OptionError(f"generation.temperature={self.temperature} must be above 0")


class LanguageModelModule(NetModule):
    """Next-token training with warm-up then cosine decay; sliding-window perplexity; text generation.

    Gradient clipping (the paper: 0.25) and precision (bf16) are Trainer settings in the YAML files.

    Args:
        net: the language model (``CausalTransformerLM``: ``token_nll`` for training and evaluation,
            ``generate`` for text).
        optimizer: optimizer factory taking parameter groups (the paper: Adam, lr 2.5e-4).
        warmup_steps: linear warm-up from 0 to the optimizer's lr over this many optimizer steps.
        min_lr_ratio: the cosine decays to ``min_lr_ratio`` times the peak lr at the last step.
        weight_decay_norms_and_biases: also decay biases, norms and position embeddings.
        generation: settings of ``predict``.
        compile: compile the network's trunk (``hidden``: embeddings, blocks, final norm) with ``torch.compile``
            (``true``, or :class:`~kpca.training.module.CompileOptions`); the output head runs eager (the adaptive
            softmax picks rows per cluster, shapes that depend on the data).
    """

    compiled_methods = ("hidden",)  # training, evaluation (token_nll) and generation reach the blocks through it

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = torch.optim.Adam,
        warmup_steps: int = 2000,
        min_lr_ratio: float = 0.0,
        weight_decay_norms_and_biases: bool = False,
        generation: Generation = Generation(),  # noqa: B008 (frozen dataclass)
        compile: bool | CompileOptions = False,
    ) -> None:
        if warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0:
            raise OptionError(f"need warmup_steps >= 0 and min_lr_ratio in [0, 1], got {warmup_steps}, {min_lr_ratio}")
        super().__init__(net, optimizer, compile)
        self.generation = generation
        self.eval_totals = nn.ModuleDict()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) token ids -> (B, N, V) next-token log-probabilities."""
        return self.net(tokens)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch  # (B, N), (B, N)
        loss = self.net.token_nll(inputs, targets).mean()  # mean over B * N
        self.log_train_loss(loss, inputs.shape[0])
        self.log("train/ppl", torch.exp(loss.detach()), on_step=True, on_epoch=False)
        return loss

    @property
    def data(self) -> LanguageData:
        """The trainer's datamodule as the :class:`LanguageData` this module reads; TypeError names what it lacks."""
        return require_datamodule(self.trainer, LanguageData)

    def _start_eval(self, stage: str) -> None:
        self.eval_names = self.data.eval_names(stage)
        self.eval_totals = nn.ModuleDict({name: NLLTotals() for name in self.eval_names}).to(self.device)

    def _eval_step(self, batch, dataloader_idx: int) -> None:
        inputs, targets, scored = batch  # (B, N) each
        nll = self.net.token_nll(inputs, targets, scored)  # (S,): the head runs on the scored positions only
        self.eval_totals[self.eval_names[dataloader_idx]].update(nll, torch.ones_like(nll, dtype=torch.bool))

    def _eval_results(self) -> list[dict]:
        data = self.data
        sets = {
            name: (totals, data.arrays[name].words, data.arrays[name].length, data.scored_tokens(name))
            for name, totals in self.eval_totals.items()
        }
        return perplexity_rows(sets)

    def on_validation_epoch_start(self) -> None:
        self._start_eval("validate")

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx)

    def on_validation_epoch_end(self) -> None:
        (row,) = self._eval_results()
        # the values are already summed over processes; sync_dist only spares Lightning's epoch-level warning
        self.log("val/ppl", row["ppl_word"], prog_bar=True, sync_dist=True)
        self.log("val/ppl_token", row["ppl_token"], sync_dist=True)
        self.log("val/loss", row["nll_token"], sync_dist=True)

    def on_test_epoch_start(self) -> None:
        self._start_eval("test")

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx)

    def on_test_epoch_end(self) -> None:
        rows = self._eval_results()
        for row in rows:
            name = row["set"]
            self.log(f"test/{name}/ppl", row["ppl_word"], add_dataloader_idx=False, sync_dist=True)
            self.log(f"test/{name}/ppl_token", row["ppl_token"], add_dataloader_idx=False, sync_dist=True)
        report_dir = self.report_dir()  # a collective: every rank asks
        if self.trainer.is_global_zero:
            write_perplexity_report(rows, report_dir)

    def generate_text(self, prompts: list[str]) -> list[str]:
        """Continue each prompt with the ``generation`` settings; returns the prompts with their continuations."""
        tokenizer = require_built(self.data.tokenizer, "predict")
        settings = self.generation
        generator = torch.Generator(device=self.device).manual_seed(settings.seed)
        texts = []
        was_training = self.net.training
        self.net.eval()
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode_prompt(prompt)], device=self.device)  # (1, P)
            out = self.net.generate(ids, settings.max_new_tokens, settings.top_k, settings.temperature, generator)
            texts.append(tokenizer.decode(out[0].tolist()))
        self.net.train(was_training)
        return texts

    def predict_step(self, batch: tuple[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict:
        prompt, _ = batch
        (text,) = self.generate_text([prompt])
        return {"prompt": prompt, "text": text}

    def configure_optimizers(self):
        """The optimizer over decay / no-decay groups with a per-step linear warm-up and cosine decay."""
        groups = parameter_groups(self.net, decay_everything=self.hparams.weight_decay_norms_and_biases)
        optimizer = self.optimizer_factory(groups)
        total = max(int(self.trainer.estimated_stepping_batches), 1)  # honours max_steps and max_epochs
        warmup = min(self.hparams.warmup_steps, total)
        factor = warmup_cosine(total, warmup, floor=self.hparams.min_lr_ratio, warmup_offset=1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}  # the LearningRateMonitor tag
        return {"optimizer": optimizer, "lr_scheduler": schedule}
