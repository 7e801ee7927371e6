"""Entry point of the ``rlzoo-loggers`` distribution: contributes the experiment trackers (``loggers: [...]``)."""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_loggers() -> list[type]:
    from rlzoo_loggers.mlflow_logger import MlflowLogger
    from rlzoo_loggers.tensorboard_logger import TensorBoardLogger
    from rlzoo_loggers.wandb_logger import WandbLogger

    return [TensorBoardLogger, WandbLogger, MlflowLogger]
