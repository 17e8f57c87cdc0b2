"""Train a small PyTorch LSTM with truncated BPTT on `batchtool segment` output.

The recurrent state lives in a [layers, B, H] tensor indexed by lane: row b of every batch
continues lane b's example, so the state is carried from batch to batch, reset where
sequence == 0 and detached after every batch (that detach is the truncation). Steps past
`length` are padding: they are packed away, so they neither update the state nor count in
the loss. Here the model predicts the example's label (a context column) at every real step.

A checkpoint (--checkpoint, written every --checkpoint-every batches and at --stop-after) holds
the model, the optimizer, the loader's position and the carried [layers, B, H] state: the state
is part of where training is, so a restart continues every lane exactly where it stopped.

    batchtool segment sample_data/parquet /tmp/seg --key key --sequence tokens,frames \\
        --context label --num-unroll 20 --batch-size 32
    python scripts/train_tbptt.py /tmp/seg --input frames --target label --epochs 2

For several ranks, write the output with `segment --world-size N` and give rank r
`batchtool.load(DST, rank=r, world_size=N)`: the loop is the same (see scripts/train_ddp.py for
the process group).

PyTorch is only needed for this example (`pip install torch`); batchtool does not depend on it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import batchtool  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dst", help="a `batchtool segment` output directory")
    parser.add_argument("--input", default="frames", help="sequence column fed to the LSTM")
    parser.add_argument("--target", default="label", help="integer context column to predict")
    parser.add_argument("--classes", type=int, help="number of target classes (default: max + 1, one more pass)")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="checkpoint file: resumed from if it exists, written while training")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="BATCHES")
    parser.add_argument("--stop-after", type=int, default=0, metavar="BATCH",
                        help="checkpoint and stop at this batch of the epoch (a simulated preemption)")
    args = parser.parse_args()
    try:
        import torch
        from torch import nn
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    except ImportError:
        raise SystemExit("this example needs PyTorch (pip install torch); batchtool itself does not") from None

    torch.manual_seed(args.seed)
    # tensors=True: torch tensors sharing the decoded batch's memory (no copy)
    loader = batchtool.load(args.dst, columns=[args.input, args.target, "sequence", "length", "lane"], tensors=True)
    step_type = loader.schema.field(args.input).type.value_type
    features = step_type.list_size if hasattr(step_type, "list_size") else 1
    lanes = loader.num_lanes
    classes = args.classes or int(max(int(b[args.target].max())
                                      for b in batchtool.load(args.dst, columns=[args.target]))) + 1

    lstm = nn.LSTM(features, args.hidden, num_layers=args.layers, batch_first=True)
    head = nn.Linear(args.hidden, classes)
    optimizer = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    h = torch.zeros(args.layers, lanes, args.hidden)
    c = torch.zeros(args.layers, lanes, args.hidden)
    first_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        lstm.load_state_dict(saved["lstm"])
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        h, c = saved["h"], saved["c"]
        loader.load_state_dict(saved["loader"])
        first_epoch = saved["loader"]["epoch"]

    def checkpoint() -> None:
        state = {"lstm": lstm.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                 "h": h, "c": c, "loader": loader.state_dict()}
        torch.save(state, args.checkpoint + ".tmp")
        os.replace(args.checkpoint + ".tmp", args.checkpoint)  # a stop mid-write keeps the previous one

    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position in the checkpoint's epoch
        if loader.position == 0:
            h.zero_()
            c.zero_()
        total_loss = total_steps = correct = 0.0
        started = time.perf_counter()
        for batch in loader:
            lane = batch["lane"].long()
            length = batch["length"].long()
            x = batch[args.input].float().reshape(len(lane), -1, features)
            y = batch[args.target].long()
            start = batch["sequence"] == 0
            # this batch's rows continue their lanes' state; a new example starts from zeros
            h0 = h[:, lane].masked_fill(start[None, :, None], 0.0)
            c0 = c[:, lane].masked_fill(start[None, :, None], 0.0)
            live = torch.nonzero(length > 0).squeeze(1)  # empty padding rows and zero-length segments: no step
            h_new, c_new = h0.detach().clone(), c0.detach().clone()
            if len(live):
                packed = pack_padded_sequence(x[live], length[live], batch_first=True, enforce_sorted=False)
                out, (hn, cn) = lstm(packed, (h0[:, live].contiguous(), c0[:, live].contiguous()))
                out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
                mask = torch.arange(x.shape[1])[None, :] < length[live][:, None]
                logits = head(out)[mask]
                targets = y[live][:, None].expand(-1, x.shape[1])[mask]
                loss = loss_fn(logits, targets)
                optimizer.zero_grad()
                (loss / mask.sum()).backward()
                optimizer.step()
                h_new[:, live], c_new[:, live] = hn.detach(), cn.detach()
                total_loss += loss.item()
                total_steps += int(mask.sum())
                correct += int((logits.argmax(1) == targets).sum())
            # carry the state to the next batch, cut from this batch's graph (truncated BPTT)
            h[:, lane], c[:, lane] = h_new, c_new
            stopping = loader.position == args.stop_after
            every = args.checkpoint_every and loader.position % args.checkpoint_every == 0
            if args.checkpoint and (stopping or every):
                checkpoint()
            if stopping:
                print(f"stopped at batch {loader.position} of epoch {epoch + 1}; checkpoint in {args.checkpoint}")
                return
        print(f"epoch {epoch + 1}: loss {total_loss / max(total_steps, 1):.4f} per step, "
              f"step accuracy {correct / max(total_steps, 1):.3f}, {len(loader)} batches in "
              f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
