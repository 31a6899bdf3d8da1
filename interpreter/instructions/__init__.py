"""ISA instruction implementations, one module per engine (DMA, Tensor, Vector, Scalar, GpSimd)."""
