"""kpca.segmentation: Segmenter with softmax, symmetric or RPC attention on ADE20K through mmsegmentation.

Importing this package installs the light ``mmcv.ops`` shim (only when mmcv's compiled ops are absent), so import
it before anything imports ``mmseg``; the package's own modules do.
"""

from kpca.segmentation._mmcv_shim import install as _install_mmcv_shim

_install_mmcv_shim()
