"""Numbers the host launch code and the kernels must agree on."""

import math

# exp(x) = exp2(x * LOG2_E): the kernels evaluate the softmax in base 2, so the host folds
# log2(e) into the scale it passes and the backward's preprocess into the LSE it stores.
LOG2_E = math.log2(math.e)

# Threads of a Hopper warpgroup: the unit a WGMMA is issued by (4 warps).
THREADS_PER_WG = 128
