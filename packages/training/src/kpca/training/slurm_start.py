"""Start an app with SLURM's requeue signal (SIGUSR1) held from its first instruction.

``python -m kpca.training.slurm_start <module> [args...]`` runs ``python -m <module> [args...]`` in the same process.

SLURM sends ``--signal=USR1@<seconds>`` at a time-limit check, which can fall while the app still imports torch and
Lightning, before Lightning installs its requeue handler, or after the fit has ended and Lightning has put the
default action back. SIGUSR1's default action ends the process, so the job would end FAILED instead of being
requeued or completing. A held (blocked) signal stays pending instead; the mask survives ``exec`` and is inherited by
every thread and process the app starts, so the signal reaches no handler and no default action at any time.
:class:`kpca.training.callbacks.DeferredSlurmRequeue` takes it at the next batch boundary of a stage (after the
first batch, for a signal that came during start-up), and one that comes after the last stage is discarded with the
finished process. ``docker/launch_slurm.sh`` and the Slurm executor of ``kpca-experiment`` start every app through
this module, which imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

REQUEUE_SIGNAL = signal.SIGUSR1
USAGE = "usage: python -m kpca.training.slurm_start <module> [args...]  (e.g. kpca.vision_cls fit -c config.yaml)"


def hold_signal(signum: int) -> None:
    """Block ``signum`` in the calling thread (and the threads and processes it starts): it stays pending."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Hold SIGUSR1 and replace this process by ``python -m <module> [args...]`` (same interpreter, same pid)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        sys.exit(f"error: no module to run; {USAGE}")
    hold_signal(REQUEUE_SIGNAL)
    os.execv(sys.executable, [sys.executable, "-m", *args])


if __name__ == "__main__":
    main()
