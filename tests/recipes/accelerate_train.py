"""Hugging Face Accelerate: ``accelerate launch --num_processes 2 accelerate_train.py DATA OUT`` (or
torchrun).

``accelerator.prepare`` passes make_loader's loader through as it is (every rank reads its own share
already; a plain DataLoader would be re-sharded), and ``register_for_checkpointing`` puts its state in
``save_state`` / ``load_state``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator

from loaders import ShardedDataset, make_loader
from tests.recipes.common import BATCH_SIZE, NUM_WORKERS, SEED, arguments, loss_of, model, record


def main() -> None:
    args = arguments()
    accelerator = Accelerator(cpu=True)  # the process group exists from here: build the dataset after it
    dataset = ShardedDataset(args.data, "train", seed=SEED)
    net = model()
    net, optimizer, loader = accelerator.prepare(
        net, torch.optim.SGD(net.parameters(), lr=0.1), make_loader(dataset, BATCH_SIZE, NUM_WORKERS)
    )
    accelerator.register_for_checkpointing(loader)
    checkpoint, step = Path(args.out) / "checkpoint", 0
    if args.resume:
        accelerator.load_state(checkpoint)  # the model, the optimizer and the loader's position
    for epoch in range(dataset.epoch, args.epochs):  # after a resume, the saved epoch first
        loader.set_epoch(epoch)
        for batch in loader:
            record(args.out, accelerator.process_index, epoch, batch)
            loss = loss_of(net, batch)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if step == args.stop_at:
                accelerator.save_state(checkpoint)
                accelerator.wait_for_everyone()
                accelerator.end_training()
                return
    accelerator.end_training()


if __name__ == "__main__":
    main()
