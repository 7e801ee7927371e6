"""The ``tensorboard`` logger: event files in ``<run folder>/tensorboard``, read by ``tensorboard --logdir``."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

import rlzoo
from rlzoo.interfaces import Logger, Params, TrackedRun
from rlzoo_loggers.common import finite, flatten, plain

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour type -> TensorBoard's Summary.Image colorspace (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA)
PNG_COLORSPACE = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


@rlzoo.register("logger", "tensorboard")
class TensorBoardLogger(Logger):
    """Write the run's metrics, config, summary and plots as TensorBoard event files in ``<run folder>/tensorboard``.

    Uses PyTorch's ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package writes the files). At a
    fresh start: the resolved config as text (tag ``config``, YAML) and, for the HParams dashboard, a session-start
    record with the config flattened to dotted keys (scalars and strings; the dashboard takes its metrics from the
    run's scalars). Each step: every finite metric with ``add_scalar`` at that step (NaN and infinities are left
    out), then a flush, so a killed run loses nothing it logged. Finish: the summary as a text table (``summary``)
    and as scalars ``summary/<key>``, each PNG artifact as an image (``artifacts/<file stem>``, its bytes as they
    are), all at the last step; then the HParams session end.

    Resume: the writer is opened with ``purge_step`` = the step resumed from, so TensorBoard's reader discards the
    steps of the earlier files from that step on, which this process logs again: every step shows once. The config
    text is not written again (the earlier files hold it). A sweep (``rlzoo ablate``) gives one run per cell and
    seed under ``tensorboard --logdir <sweep folder>``.
    Reference: torch.utils.tensorboard.SummaryWriter (purge_step); TensorBoard's HParams plugin.
    """

    reference = "torch.utils.tensorboard.SummaryWriter; TensorBoard (scalars, text, images, HParams)"
    requires = ("tensorboard",)
    install_hint = "pip install 'rlzoo-loggers[tensorboard]'"

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._writer: Any = None
        self._last_step = 0
        self.log_dir: Path | None = None

    def start(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run.run_dir) / "tensorboard"
        earlier = self.log_dir.is_dir() and any(self.log_dir.glob("events.out.tfevents.*"))
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=run.resumed_at)
        self._last_step = run.resumed_at or 0
        if run.resumed_at is None or run.resumed_at == 0 or not earlier:  # the tracker run starts here
            config = plain(run.config)
            text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
            # indented: markdown shows it as preformatted text
            self._writer.add_text("config", "\n".join(f"    {line}" for line in text.splitlines()), 0)
            self._write_hparams(config)
        self._writer.flush()

    def _write_hparams(self, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        values = {k: v for k, v in flatten(config).items() if isinstance(v, (bool, int, float, str))}
        _, session_start, _ = hparams(values, {})
        self._writer.file_writer.add_summary(session_start)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if finite(value):
                self._writer.add_scalar(key, float(value), step)
        self._last_step = step
        self._writer.flush()

    def finish(self, summary: Mapping[str, float], artifacts: Sequence[Path]) -> None:
        from torch.utils.tensorboard.summary import hparams

        step = self._last_step
        rows = "\n".join(f"| {key} | {value:.6g} |" for key, value in summary.items())
        self._writer.add_text("summary", f"| metric | value |\n|---|---|\n{rows}", step)
        for key, value in summary.items():
            if finite(value):
                self._writer.add_scalar(f"summary/{key}", float(value), step)
        for path in artifacts:
            if Path(path).suffix.lower() == ".png":
                self._writer.file_writer.add_summary(png_summary(f"artifacts/{Path(path).stem}", Path(path)), step)
        _, _, session_end = hparams({}, {})
        self._writer.file_writer.add_summary(session_end)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def png_summary(tag: str, path: Path) -> Any:
    """An image summary holding the PNG file's bytes as they are (no decoding, no re-encoding)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    data = path.read_bytes()
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    colorspace = PNG_COLORSPACE.get(data[25], 4)
    image = Summary.Image(height=height, width=width, colorspace=colorspace, encoded_image_string=data)
    return Summary(value=[Summary.Value(tag=tag, image=image)])
