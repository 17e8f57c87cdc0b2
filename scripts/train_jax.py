"""Train a small JAX classifier on `bucket` output through Grain, on CPU: batchtool.source(DST) is Grain's data
source, Grain shuffles it per epoch and reads ahead on threads, JAX trains on the padded [B, T] batches.

    pip install '.[jax]'
    batchtool bucket sample_data/parquet out --boundaries 20,40 --batch-size 32
    python scripts/train_jax.py out --epochs 3

The model mean-pools token embeddings over each row's real steps (`length`) and predicts `label`. Each batch is
padded on to a multiple of STEP_MULTIPLE steps, so jit compiles once per few (rows, steps) shapes.
"""

from __future__ import annotations

import argparse

import grain
import jax
import jax.numpy as jnp
import numpy as np

import batchtool

VOCAB = 1024
"""Token ids are hashed into this many embeddings."""
STEP_MULTIPLE = 64
"""Batches are padded on to a multiple of this many steps, so jit compiles a few shapes, not one per batch
(`bucket` pads each batch to its own longest row)."""


def init(key: jax.Array, classes: int, width: int) -> dict[str, jax.Array]:
    embed, out = jax.random.split(key)
    return {"embed": jax.random.normal(embed, (VOCAB, width)) * 0.1,
            "w": jax.random.normal(out, (width, classes)) * 0.1, "b": jnp.zeros(classes)}


def loss_fn(params: dict[str, jax.Array], tokens: jax.Array, length: jax.Array, label: jax.Array) -> jax.Array:
    steps = jnp.arange(tokens.shape[1])[None, :] < length[:, None]  # real steps, not padding
    vectors = params["embed"][tokens % VOCAB] * steps[..., None]
    pooled = vectors.sum(axis=1) / jnp.maximum(length, 1)[:, None]
    logits = pooled @ params["w"] + params["b"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(label)), label])


@jax.jit
def train_step(params: dict[str, jax.Array], tokens: jax.Array, length: jax.Array, label: jax.Array,
               lr: float) -> tuple[dict[str, jax.Array], jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, length, label)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dst", help="bucket output (a batchtool output directory)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--width", type=int, default=32)
    args = parser.parse_args()

    source = batchtool.source(args.dst, columns=["tokens", "length", "label"], writable=False)
    classes = int(max(int(batch["label"].max()) for batch in grain.MapDataset.source(source))) + 1
    params = init(jax.random.key(args.seed), classes, args.width)
    for epoch in range(args.epochs):
        batches = (grain.MapDataset.source(source).shuffle(seed=args.seed * 1000 + epoch)
                   .to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)))
        losses = []
        for batch in batches:
            tokens = batch["tokens"]
            tokens = np.pad(tokens, ((0, 0), (0, -tokens.shape[1] % STEP_MULTIPLE)))
            params, loss = train_step(params, tokens, np.asarray(batch["length"]), np.asarray(batch["label"]), args.lr)
            losses.append(float(loss))
        print(f"epoch {epoch} batches {len(losses)} loss {np.mean(losses):.4f}", flush=True)


if __name__ == "__main__":
    main()
