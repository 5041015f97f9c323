"""Checkpoints: atomic writes, the checkpoint callback, resuming a run, reading model weights from files.

Modules: ``io`` (AtomicCheckpointIO), ``callback`` (Checkpoint), ``resume`` (``--ckpt_path auto``), ``weights``
(safe reading of Lightning, timm / DeiT and the authors' checkpoint files).
"""
