"""PyTorch Lightning: ``python lightning_train.py DATA OUT`` runs DDP on 2 CPU processes.

Lightning saves and restores the loader's state with its checkpoints (the loader has ``state_dict`` and
``load_state_dict``) and stops each epoch at ``len(loader)``, which counts a resumed epoch whole, as
Lightning's own batch counter does.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L  # noqa: N812 - the conventional alias
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from loaders import ShardedDataset, ShardedLoader, make_loader
from tests.recipes.common import BATCH_SIZE, NUM_WORKERS, SEED, arguments, loss_of, model, record

# Lightning warns about every IterableDataset with a length; make_loader's length is exact on every rank.
warnings.filterwarnings("ignore", "Your `IterableDataset` has `__len__` defined")


class Data(L.LightningDataModule):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def setup(self, stage: str) -> None:  # the process group exists here: the dataset finds its rank
        self.train_set = ShardedDataset(self.path, "train", seed=SEED)

    def train_dataloader(self) -> ShardedLoader:
        return make_loader(self.train_set, BATCH_SIZE, NUM_WORKERS)


class Model(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.net, self.out = model(), out

    def on_train_epoch_start(self) -> None:  # not called for an epoch resumed midway: its state stands
        self.trainer.datamodule.train_set.set_epoch(self.current_epoch)

    def training_step(self, batch: dict[str, Any], batch_index: int) -> torch.Tensor:
        record(self.out, self.global_rank, self.current_epoch, batch)
        return loss_of(self.net, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    args = arguments()
    sampler = args.option != "use_distributed_sampler=False"
    checkpoint = ModelCheckpoint(args.out, "stop", every_n_train_steps=args.stop_at or 0, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        max_steps=args.stop_at or -1,
        use_distributed_sampler=sampler,
        callbacks=[checkpoint] if args.stop_at else [],
        default_root_dir=args.out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.stop_at),
    )
    resume = str(Path(args.out) / "stop.ckpt") if args.resume else None
    trainer.fit(Model(args.out), datamodule=Data(args.data), ckpt_path=resume)


if __name__ == "__main__":
    main()
