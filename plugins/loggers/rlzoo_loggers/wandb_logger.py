"""The ``wandb`` logger: a Weights & Biases run, offline by default (``wandb sync`` uploads it later)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Logger, Params, TrackedRun
from rlzoo_loggers.common import plain, read_state, write_state

#: wandb refuses a tag longer than this
MAX_TAG_LENGTH = 64


@rlzoo.register("logger", "wandb")
class WandbLogger(Logger):
    """Record the run as a Weights & Biases run: config, metrics at their steps, summary, plots and result files.

    ``wandb.init`` with the run's name, group and tags (``key=value``, also in the config as ``tracking.tags`` so
    runs can be filtered by them), the resolved config as the run's config and ``dir`` = the run folder. Offline by
    default (``mode: offline``): nothing goes over the network; the run is written to
    ``<run folder>/wandb/offline-run-*`` and ``wandb sync <that folder>`` uploads it later. ``mode: online`` streams
    it (needs ``wandb login`` or ``WANDB_API_KEY``; a server out of reach fails the start after ``init_timeout_s``).
    wandb stays quiet on the console (no banner, no console capture) and several runs may be open in one process
    (``reinit="create_new"``).

    Each step: ``run.log(metrics, step=step)`` (NaN kept: wandb shows it as a gap). Finish: ``run.summary``
    updated with the summary, each PNG artifact logged as a ``wandb.Image`` (key ``artifacts/<file stem>``) and
    the artifact files saved as a wandb Artifact of type ``run-results`` (this works offline too: ``wandb sync``
    uploads it from a copy in ``loggers/wandb/artifact/``, inside the run folder); then ``run.finish()``.
    Closed without finishing (a crash, an interrupt): ``run.finish(exit_code=1)``, so it shows as failed.

    Resume: the wandb run id is made once and kept in ``loggers/wandb/run.json``; a resumed process reopens the same
    run (``resume="allow"``) and logs of the steps it runs again only what wandb does not hold yet
    (:meth:`TrackedRun.unlogged`; wandb cannot overwrite a step's value). Offline, each process writes its own
    ``offline-run-*`` folder with the same id; ``wandb sync`` them in order.
    Reference: wandb.init / wandb.Run.log / wandb.Artifact (Weights & Biases SDK).
    """

    reference = "Weights & Biases SDK: wandb.init(resume='allow'), Run.log(step=...), Artifact"
    requires = ("wandb",)
    install_hint = "pip install 'rlzoo-loggers[wandb]'"

    class Params(Params):
        project: str = Field("rlzoo", description="the wandb project")
        entity: str | None = Field(None, description="the wandb team or user; null: the default entity of the login")
        mode: Literal["offline", "online"] = Field(
            "offline",
            description="offline: written under <run folder>/wandb, uploaded by `wandb sync`; online: streamed",
        )
        init_timeout_s: float = Field(
            90.0,
            gt=0,
            le=600,
            description="online: how long the start may wait for the server before the logger is dropped",
        )

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        self._run: Any = None
        self._resumed: TrackedRun | None = None  # a resumed run's record of what this tracker holds
        self._last_step: int | None = None
        self._finished = False
        self._state_dir = Path()
        self.run_id: str | None = None

    def start(self, run: TrackedRun) -> None:
        import wandb

        state = read_state(run.state_dir) if run.resumed_at is not None else {}
        self.run_id = state.get("id") or new_run_id()
        write_state(run.state_dir, {"id": self.run_id})
        tags = {str(k): str(v) for k, v in run.tags.items()}
        config = plain(run.config)
        tracking = config.get("tracking")
        config["tracking"] = {**(tracking if isinstance(tracking, dict) else {}), "tags": tags}
        settings = wandb.Settings(
            console="off",  # rlzoo's own output is not wandb's to capture
            silent=True,  # no banner, no "run data is saved locally" lines: the docs say where it is
            init_timeout=self.params.init_timeout_s,
        )
        Path(run.run_dir).mkdir(parents=True, exist_ok=True)  # wandb warns about a dir that does not exist
        with _weave_suggestion_off():
            self._run = wandb.init(
                project=self.params.project,
                entity=self.params.entity,
                mode=self.params.mode,
                id=self.run_id,
                resume="allow",
                name=run.name,
                group=run.group,
                tags=[f"{k}={v}"[:MAX_TAG_LENGTH] for k, v in tags.items()],
                config=config,
                dir=str(run.run_dir),
                reinit="create_new",
                settings=settings,
            )
        self._state_dir = Path(run.state_dir)
        self._resumed = run if state.get("id") else None  # a new tracker run holds nothing yet

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._resumed is not None:  # what the earlier process gave it: the same values again
            metrics = self._resumed.unlogged(step, metrics)
            if not metrics:
                return
        self._run.log({k: float(v) for k, v in metrics.items()}, step=step)
        self._last_step = step

    def finish(self, summary: Mapping[str, float], artifacts: Sequence[Path]) -> None:
        import wandb

        images = {
            f"artifacts/{Path(p).stem}": wandb.Image(str(p)) for p in artifacts if Path(p).suffix.lower() == ".png"
        }
        if images and self._last_step is not None:  # beside the last step (with none given, there is no free step)
            self._run.log(images, step=self._last_step)
        self._run.summary.update({k: float(v) for k, v in summary.items()})
        if artifacts:
            artifact = wandb.Artifact(f"run-results-{_artifact_name(self.run_id or self._run.id)}", type="run-results")
            kept = self._state_dir / "artifact"
            kept.mkdir(parents=True, exist_ok=True)
            for path in artifacts:
                # a copy in the run folder, as it is now: what `wandb sync` uploads (wandb's own copy would be in
                # the user's home, not in the run folder, and `rlzoo plot` may redraw the plot meanwhile)
                copy = Path(shutil.copy2(path, kept / Path(path).name))
                artifact.add_file(str(copy), name=copy.name, policy="immutable")
            self._run.log_artifact(artifact)
        self._run.finish()
        self._finished = True

    def close(self) -> None:
        if self._run is not None and not self._finished:
            self._run.finish(exit_code=1)  # it did not complete: shown as failed
        self._run = None


def new_run_id(length: int = 8) -> str:
    """A run id as wandb makes them: lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _artifact_name(text: str) -> str:
    """Only the characters wandb allows in an artifact's name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


@contextlib.contextmanager
def _weave_suggestion_off():
    """``wandb.init`` prints "Detected [openai] in use" and an advert for its Weave product on the console, even when
    silent, whenever openai or anthropic is imported (vLLM imports openai); its documented switch is the
    ``WANDB_DISABLE_WEAVE`` variable, set here for the call only so that the process's environment is left as it was."""
    before = os.environ.get("WANDB_DISABLE_WEAVE")
    os.environ["WANDB_DISABLE_WEAVE"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WANDB_DISABLE_WEAVE", None)
        else:
            os.environ["WANDB_DISABLE_WEAVE"] = before
