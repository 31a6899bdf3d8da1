"""Deterministic synthetic training tokens: no download, the same batches in the same
order for a given seed on every run and every device.

The tokens follow a fixed random Markov chain (each token has a few likely successors), so
a small model has something real to learn and its loss falls visibly within a few steps.
"""

from __future__ import annotations

import torch

__all__ = ["SyntheticTokens"]


class SyntheticTokens:
    """Batches of ``[batch_size, seq_len + 1]`` token ids (inputs plus next-token targets).

    Batch ``i`` depends only on ``(seed, i)``: both parity runs see identical data in an
    identical order, and a run cut short replays the same prefix.
    """

    def __init__(
        self, vocab_size: int, seq_len: int, batch_size: int, seed: int = 0, successors: int = 4
    ):
        if vocab_size < 2 or seq_len < 1 or batch_size < 1 or successors < 1:
            raise ValueError(
                f"vocab_size >= 2, seq_len >= 1, batch_size >= 1, successors >= 1 required, got "
                f"{vocab_size}, {seq_len}, {batch_size}, {successors}"
            )
        self.vocab_size, self.seq_len, self.batch_size, self.seed = (
            vocab_size,
            seq_len,
            batch_size,
            seed,
        )
        chain = torch.Generator().manual_seed(seed)
        # successors[t] holds the few tokens that may follow t, drawn once per seed.
        self.successors = torch.randint(0, vocab_size, (vocab_size, successors), generator=chain)

    def batch(self, index: int, device="cpu") -> torch.Tensor:
        """Batch number ``index`` (0-based) as int64 token ids on ``device``."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        rows = self.batch_size
        tokens = torch.empty(rows, self.seq_len + 1, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, self.vocab_size, (rows,), generator=gen)
        picks = torch.randint(0, self.successors.shape[1], (rows, self.seq_len), generator=gen)
        for pos in range(self.seq_len):
            tokens[:, pos + 1] = self.successors[tokens[:, pos], picks[:, pos]]
        return tokens.to(device)
