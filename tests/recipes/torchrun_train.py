"""Plain torchrun: ``torchrun --nproc_per_node 2 torchrun_train.py DATA OUT``, with make_loader's state."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - the conventional alias

from loaders import ShardedDataset, make_loader
from tests.recipes.common import BATCH_SIZE, NUM_WORKERS, SEED, arguments, loss_of, model, record


def main() -> None:
    args = arguments()
    dist.init_process_group("gloo")
    rank, checkpoint = dist.get_rank(), Path(args.out) / "checkpoint.pt"
    dataset = ShardedDataset(args.data, "train", seed=SEED)  # rank and world size from the process group
    loader = make_loader(dataset, BATCH_SIZE, NUM_WORKERS)
    net = DDP(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    step = 0
    if args.resume:
        saved = torch.load(checkpoint, weights_only=True)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(json.loads(saved["data"]))
        step = saved["step"]
    for epoch in range(dataset.epoch, args.epochs):  # after a resume, the saved epoch first
        loader.set_epoch(epoch)  # the saved epoch again keeps the resume point
        for batch in loader:
            record(args.out, rank, epoch, batch)
            loss = loss_of(net, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.stop_at:
                if rank == 0:
                    data = json.dumps(loader.state_dict())  # JSON-safe, the same on every rank
                    state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "data": data}
                    torch.save({**state, "step": step}, checkpoint)
                dist.barrier()
                dist.destroy_process_group()
                return
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
