"""fa4.common.scheduling.tile_grid: the tile count the forward's host grid, its device decode and
the backward's decode share (plain Python, traced inline into each kernel)."""

from __future__ import annotations

import pytest
import torch

from fa4.common.scheduling import tile_grid


@pytest.mark.parametrize("tile", [64, 80, 128, 192])
@pytest.mark.parametrize("extent", [1, 63, 64, 65, 127, 128, 129, 1000, 8192])
def test_dense_tiles_cover_the_axis_with_no_empty_tile(extent, tile):
    n, bh = tile_grid(extent, tile, 12, 3)
    assert (n - 1) * tile < extent <= n * tile
    assert bh == 36


def test_varlen_walks_the_longest_sequence_of_each_packed_sequence():
    # Three sequences of 100, 300 and 40 rows packed in one batch of 440: the walked axis is the
    # longest sequence (300 rows: 3 tiles of 128), not the packed extent (4 tiles), and heads x
    # sequences counts the cu_seqlens' sequences, not the tensor's batch of 1.
    cu = torch.tensor([0, 100, 400, 440], dtype=torch.int32)
    vl = (cu, cu, None, None, 300)
    assert tile_grid(440, 128, 8, 1, vl) == (3, 24)
    assert tile_grid(440, 128, 8, 1) == (4, 8)
