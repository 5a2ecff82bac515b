"""TMA tiling of the attention tensors' (seq, d, heads, batch) views (shared by the kernels)."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync


def seq_tiles(atom, mX: cute.Tensor, sX: cute.Tensor, tile: tuple, head, batch):
    """The TMA partition of one (head, batch) slice of ``mX`` (seq, d, heads, batch; a TMA view)
    into boxes of ``tile`` = (rows, d): (shared side indexed by stage, global side indexed by the
    tile's position along seq). ``sX``: (rows, d, stages) with the box's layout."""
    gX = cute.flat_divide(mX, tile)[None, None, None, 0, head, batch]
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2))
