"""Lightning Fabric: ``python fabric_train.py DATA OUT`` runs DDP on 2 CPU processes.

``fabric.setup_dataloaders`` wraps the loader without a ``state_dict``: save the loader you made (or its
dataset, whose ``state_dict`` is the loader's), and Fabric calls ``state_dict`` and ``load_state_dict``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L  # noqa: N812 - the conventional alias
import torch

from loaders import ShardedDataset, make_loader
from tests.recipes.common import BATCH_SIZE, NUM_WORKERS, SEED, arguments, loss_of, model, record


def main() -> None:
    args = arguments()
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()  # the process group exists from here: build the dataset after it
    dataset = ShardedDataset(args.data, "train", seed=SEED)
    loader = make_loader(dataset, BATCH_SIZE, NUM_WORKERS)
    train = fabric.setup_dataloaders(loader, use_distributed_sampler=False)  # each rank reads its own share
    net = model()
    net, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    state = {"model": net, "optimizer": optimizer, "data": loader, "step": 0}
    checkpoint = Path(args.out) / "checkpoint.ckpt"
    if args.resume:
        fabric.load(checkpoint, state)  # calls loader.load_state_dict
    for epoch in range(dataset.epoch, args.epochs):  # after a resume, the saved epoch first
        loader.set_epoch(epoch)
        for batch in train:
            record(args.out, fabric.global_rank, epoch, batch)
            loss = loss_of(net, batch)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            state["step"] += 1
            if state["step"] == args.stop_at:
                fabric.save(checkpoint, state)  # calls loader.state_dict
                return


if __name__ == "__main__":
    main()
