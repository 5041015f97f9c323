"""The training loaders' checkpoint states that Lightning 2.6 leaves unapplied, applied at the start of training."""

from __future__ import annotations

import lightning.pytorch as pl


def load_pending_loader_states(trainer: pl.Trainer) -> None:
    """Apply the checkpoint's training loader states that Lightning 2.6 left unapplied, and restart the iterator.

    Lightning applies them when the fit loop builds the training loader, and only when the loop is ``restarting``.
    Two resumes leave them pending, and the resumed epoch then silently reads the batches of another:

    - the loader was built before the checkpoint was restored, because ``configure_optimizers`` read
      ``trainer.estimated_stepping_batches`` (a warmup in epochs): its iterator was created with the sampler still
      at epoch 0;
    - the checkpoint was saved at the end of an epoch: the loop is then resuming but not ``restarting``, so its
      states (the next epoch's sampler epoch and generators) are never loaded.

    Called at ``on_train_start``, before the first batch is fetched and after every ``iter`` Lightning makes of a
    resumed fit's loader, this loads them and creates the iterator again; it does nothing when nothing is pending.
    """
    fit_loop = trainer.fit_loop
    states = fit_loop._combined_loader_states_to_load
    if not states or fit_loop._combined_loader is None or fit_loop._data_fetcher is None:
        return
    fit_loop._combined_loader._load_state_dicts(states)
    fit_loop._combined_loader_states_to_load = []
    iter(fit_loop._data_fetcher)
