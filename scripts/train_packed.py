"""Train a small causal transformer layer on `batchtool pack` output: packed rows, attention kept inside
each example by a block-diagonal mask built from `segment_ids`.

    batchtool pack sample_data/parquet /tmp/packed --max-length 512 --sequence tokens --batch-size 8
    python scripts/train_packed.py /tmp/packed            # a few training steps, PyTorch if installed
    python scripts/train_packed.py /tmp/packed --check    # packed row == each example alone (1e-5)

With PyTorch the layer uses torch.nn.functional.scaled_dot_product_attention with the mask; without it a
NumPy forward pass shows the same. `varlen_inputs` shows the other way to feed a packed batch: drop the
padding and pass `cu_seqlens` to a FlashAttention-style varlen kernel (flash_attn_varlen_func).
PyTorch is not a batchtool dependency.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import batchtool  # noqa: E402

try:
    import torch
except ImportError:  # the NumPy path below needs nothing else
    torch = None


def block_mask(segment_ids: np.ndarray, causal: bool = True) -> np.ndarray:
    """[B, P, P] booleans, true where query i may attend to key j: same example (segment id > 0), and
    j <= i if causal. Padding (segment id 0) attends only to itself, so no softmax row is empty."""
    seg = np.asarray(segment_ids)
    mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    if causal:
        mask &= np.tril(np.ones(seg.shape[1:] * 2, dtype=bool))
    return mask | np.eye(seg.shape[1], dtype=bool)


def numpy_attention(x: np.ndarray, mask: np.ndarray, weights: tuple[np.ndarray, ...]) -> np.ndarray:
    """One attention head, [B, P, D] -> [B, P, D], in float64: softmax(q k^T / sqrt(D), masked) v."""
    wq, wk, wv = weights
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = np.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(x.shape[-1]), -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def torch_attention(x: np.ndarray, mask: np.ndarray, weights: tuple[np.ndarray, ...]) -> np.ndarray:
    """The same head through torch's scaled_dot_product_attention (float64, CPU)."""
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (x, *weights)]
    q, k, v = (t[0] @ w for w in t[1:])
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(mask))
    return out.numpy()


def embed(tokens: np.ndarray, positions: np.ndarray, dim: int, seed: int = 0) -> np.ndarray:
    """A fixed random token embedding plus a sinusoidal embedding of the per-example `positions`."""
    table = np.random.default_rng(seed).standard_normal((int(tokens.max(initial=0)) + 1, dim))
    freq = 1.0 / 10000 ** (np.arange(dim // 2) / (dim // 2))
    angle = positions[..., None] * freq
    return table[tokens] + np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)


def check(dst: str, sequence: str = "tokens", dim: int = 16, batches: int = 1) -> float:
    """Run the first batches through the head packed, and each example alone with positions from 0; return
    the largest difference over every real step (NumPy, and PyTorch if installed)."""
    weights = tuple(np.random.default_rng(1).standard_normal((dim, dim)) / np.sqrt(dim) for _ in range(3))
    attentions = [numpy_attention] + ([torch_attention] if torch is not None else [])
    worst = 0.0
    for index, batch in enumerate(batchtool.load(dst, columns=[sequence, "segment_ids", "positions", "cu_seqlens"])):
        if index == batches:
            break
        x = embed(batch[sequence], batch["positions"], dim)
        for attention in attentions:
            packed = attention(x, block_mask(batch["segment_ids"]), weights)
            for row, cu in enumerate(batch["cu_seqlens"]):
                for start, stop in zip(cu[:-1], cu[1:]):
                    alone = x[row:row + 1, start:stop]
                    out = attention(alone, block_mask(np.ones((1, stop - start), dtype=np.int32)), weights)
                    worst = max(worst, float(np.abs(out[0] - packed[row, start:stop]).max(initial=0.0)))
    return worst


def varlen_inputs(batch: dict[str, np.ndarray], sequence: str = "tokens") -> tuple[np.ndarray, np.ndarray, int]:
    """(real steps of the batch concatenated, cu_seqlens over them, longest example): what
    flash_attn_varlen_func takes instead of a padded batch and a mask."""
    real = batch["segment_ids"] > 0
    lengths = np.concatenate([np.diff(cu) for cu in batch["cu_seqlens"]])
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return batch[sequence][real], cu_seqlens, int(lengths.max(initial=0))


def train(dst: str, sequence: str, steps: int, dim: int = 64) -> None:
    """Next-token prediction with one causal attention layer; targets never cross an example boundary."""
    if torch is None:
        print("PyTorch is not installed: run with --check for the NumPy forward pass")
        return
    torch.manual_seed(0)
    vocab = 1 + max(int(b[sequence].max(initial=0)) for b in batchtool.load(dst, columns=[sequence]))
    emb, pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(1 << 16, dim)
    qkv, head = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, vocab)
    params = [p for m in (emb, pos, qkv, head) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    step = 0
    while step < steps:
        for batch in batchtool.load(dst, columns=[sequence, "segment_ids", "positions", "cu_seqlens"]):
            tokens = torch.from_numpy(batch[sequence].astype(np.int64))
            seg = torch.from_numpy(batch["segment_ids"].astype(np.int64))
            x = emb(tokens) + pos(torch.from_numpy(batch["positions"].astype(np.int64)))
            q, k, v = qkv(x).chunk(3, dim=-1)
            mask = torch.from_numpy(block_mask(batch["segment_ids"]))
            logits = head(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)  # the next step is of the same example
            loss = torch.nn.functional.cross_entropy(logits[:, :-1][same], tokens[:, 1:][same])
            opt.zero_grad()
            loss.backward()
            opt.step()
            flat, cu, longest = varlen_inputs(batch, sequence)
            print(f"step {step}: loss {loss.item():.3f} on {int(same.sum())} targets; varlen: {len(flat)} real "
                  f"steps in {len(cu) - 1} examples, longest {longest}")
            step += 1
            if step == steps:
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dst", help="a `batchtool pack` output directory")
    parser.add_argument("--sequence", default="tokens", help="the integer token column (default: tokens)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="compare packed and per-example attention")
    args = parser.parse_args()
    if args.check:
        worst = check(args.dst, args.sequence)
        print(f"largest difference, packed vs alone: {worst:.2e} ({'ok' if worst < 1e-5 else 'CONTAMINATED'})")
        sys.exit(0 if worst < 1e-5 else 1)
    train(args.dst, args.sequence, args.steps)


if __name__ == "__main__":
    main()
