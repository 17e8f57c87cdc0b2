"""Train a small PyTorch classifier with DistributedDataParallel on `batchtool bucket` output, and resume it
exactly after a stop in the middle of an epoch.

Each of --world-size processes (CPU, `gloo` backend, one machine) reads its own equal part of every
epoch with `batchtool.load(DST, rank=r, world_size=N)`: equal batch counts keep DDP's collective
calls in step, so no rank waits forever for another. Every --checkpoint-every steps, and at
--stop-after (which simulates a preemption), rank 0 saves the model, the optimizer and the loader's
position; started again with the same --checkpoint, every rank continues with exactly the next batch.
Rank 0 prints one JSON line per rank and epoch: which batches it trained on.

    batchtool bucket sample_data/parquet /tmp/buckets --boundaries 20,40,80 --batch-size 32
    python scripts/train_ddp.py /tmp/buckets --checkpoint /tmp/ckpt.pt --stop-after 5   # stops mid-epoch
    python scripts/train_ddp.py /tmp/buckets --checkpoint /tmp/ckpt.pt                  # finishes the epoch

PyTorch is only needed for this example (`pip install torch`); batchtool does not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
except ImportError:
    raise SystemExit("this example needs PyTorch (pip install torch); batchtool itself does not") from None

import batchtool  # noqa: E402  (after torch, so the loader registers as a torch IterableDataset)


class Classifier(nn.Module):
    """Per-step features -> tanh layer -> mean over the real steps (mask from `length`) -> class logits."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.step = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        mask = (torch.arange(x.shape[1])[None, :] < length[:, None]).unsqueeze(2).float()
        pooled = (torch.tanh(self.step(x)) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)


def train(rank: int, args: argparse.Namespace, port: int) -> None:
    """One rank: join the process group, read this rank's batches, train, checkpoint, report."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    loader = batchtool.load(args.dst, columns=[args.input, args.target, "length", "batch"], seed=args.seed,
                            rank=rank, world_size=args.world_size)
    features = loader.schema.field(args.input).type.value_type
    model = DistributedDataParallel(Classifier(features.list_size if hasattr(features, "list_size") else 1,
                                               args.hidden, args.classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    first_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # one state serves every rank: they are all at the same step
        first_epoch = saved["loader"]["epoch"]
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps the resumed position in the checkpoint's epoch
        start = step = loader.position
        seen, total = [], 0.0
        # workers read ahead in other processes, so the loop counts its own position (`step`)
        for step, batch in enumerate(DataLoader(loader, batch_size=None, num_workers=args.workers), start + 1):
            x = batch[args.input].float().reshape(*batch[args.input].shape[:2], -1)
            loss = loss_fn(model(x, batch["length"]), batch[args.target])
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            seen.append(int(batch["batch"][0]))
            total += loss.item()
            stopping = step == args.stop_after
            if args.checkpoint and (stopping or (args.checkpoint_every and step % args.checkpoint_every == 0)):
                save(args.checkpoint, model, optimizer, loader.state_dict(position=step), rank)
            if stopping:
                break
        report = {"rank": rank, "epoch": epoch, "start": start, "end": step, "batches": seen,
                  "epoch_batches": loader.epoch_batches().tolist(), "mean_loss": round(total / max(len(seen), 1), 4)}
        reports = [None] * args.world_size if rank == 0 else None
        dist.gather_object(report, reports)  # one process prints: long lines from several would interleave
        for line in reports or ():
            print(json.dumps(line), flush=True)
        if step == args.stop_after:
            break
    dist.destroy_process_group()


def save(path: str, model: DistributedDataParallel, optimizer: torch.optim.Optimizer, state: dict,
         rank: int) -> None:
    """Rank 0 writes the checkpoint (atomically: a stop mid-write leaves the previous one); all ranks wait."""
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "loader": state},
                   path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dst", help="a `batchtool bucket` (or other independent-batch) output directory")
    parser.add_argument("--world-size", type=int, default=2, help="training processes (ranks)")
    parser.add_argument("--input", default="frames", help="sequence column fed to the model")
    parser.add_argument("--target", default="label", help="integer column to predict")
    parser.add_argument("--classes", type=int, default=4, help="number of target classes")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and of the epochs' batch order")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--checkpoint", help="checkpoint file: resumed from if it exists, written while training")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS")
    parser.add_argument("--stop-after", type=int, default=0, metavar="STEP",
                        help="checkpoint and stop at this step of the epoch (a simulated preemption)")
    args = parser.parse_args()
    # fork starts the ranks without importing torch again; elsewhere spawn (Windows, macOS) works the same
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(train, args=(args, free_port()), nprocs=args.world_size, start_method=method)


if __name__ == "__main__":
    main()
