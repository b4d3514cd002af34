"""torchdata's StatefulDataLoader over a ShardedDataset: ``torchrun --nproc_per_node 2 stateful_train.py``.

The dataset saves each worker's own position, which StatefulDataLoader keeps with the batches it handed
out and restores into the same worker: the resumed run reads on without re-reading what came before.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - the conventional alias
from torchdata.stateful_dataloader import StatefulDataLoader

from loaders import ShardedDataset
from tests.recipes.common import BATCH_SIZE, NUM_WORKERS, SEED, arguments, loss_of, model, record


def main() -> None:
    args = arguments()
    dist.init_process_group("gloo")
    rank, checkpoint = dist.get_rank(), Path(args.out) / f"checkpoint-rank{dist.get_rank()}.pt"
    # batch_size here too: each worker's share is then whole batches, and len(loader) exact
    dataset = ShardedDataset(args.data, "train", seed=SEED, batch_size=BATCH_SIZE)
    loader = StatefulDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
    net = DDP(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    step, first_epoch = 0, 0
    if args.resume:
        saved = torch.load(checkpoint, weights_only=True)  # one state per rank: its workers' positions
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step, first_epoch = saved["step"], saved["epoch"]
    for epoch in range(first_epoch, args.epochs):
        dataset.set_epoch(epoch)  # a plain loader does not: set it every epoch, as with DistributedSampler
        for batch in loader:
            record(args.out, rank, epoch, batch)
            loss = loss_of(net, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.stop_at:
                state = {"model": net.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "loader": loader.state_dict(), "step": step, "epoch": epoch}, checkpoint)
                dist.barrier()
                dist.destroy_process_group()
                return
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
