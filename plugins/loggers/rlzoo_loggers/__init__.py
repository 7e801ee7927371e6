"""rlzoo-loggers: the ``tensorboard``, ``wandb`` and ``mlflow`` loggers (docs/loggers.md)."""
