"""Tasks: sources of prompts with verifiable answers (synthetic generators or users' data files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rlzoo.interfaces.base import Component

if TYPE_CHECKING:
    from rlzoo.interfaces.run_facts import Problem, RunFacts

Split = Literal["train", "eval"]


@dataclass
class Sample:
    """One verifiable example.

    prompt:        the text given to the policy; with ``messages`` set, their text (for splitting and logs).
                   A plain prompt is encoded as it is, unless ``prompt.plain: chat`` (:mod:`rlzoo.episodes.prompts`).
    answer:        the reference answer a verifier checks against.
    demonstration: a correct response, used by cold-start SFT; ``None`` if the task has none.
    meta:          anything else a verifier needs (``tests`` for code, ``steps`` for process rewards, ...).
    messages:      the prompt as chat messages (``[{"role": ..., "content": ...}, ...]``), rendered with the
                   tokenizer's chat template; ``None`` for a plain-string prompt.
    demonstration_turns: a correct multi-turn episode for the cold start: the policy's turns as assistant messages
                   (``{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}``); the observations
                   between them come from the run's environment (:meth:`rlzoo.episodes.runner.EpisodeRunner.demonstration`).
    """

    prompt: str
    answer: str
    demonstration: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] | None = None
    demonstration_turns: list[dict[str, Any]] | None = None


class Task(Component):
    """``samples(split, count, seed)`` returns a deterministic list of :class:`Sample`.

    ``train`` and ``eval`` splits must not share prompts. ``count=None`` means the whole split (finite sources)
    or a task-defined default (generators). ``alphabet()`` lists every character prompts and responses use,
    so a character-level tokenizer can be built locally. ``default_verifier`` names the verifier that scores it.
    ``check()`` reports what would stop a run using this task (optional; see its docstring).
    """

    kind = "task"
    default_verifier: ClassVar[str] = "exact"

    def samples(self, split: Split, count: int | None, seed: int) -> list[Sample]:
        raise NotImplementedError

    def alphabet(self) -> str:
        raise NotImplementedError

    def chat_prompts(self) -> bool:
        """Whether this task's samples carry chat messages, which need a tokenizer with a chat template (so a
        character tokenizer of the cold start cannot encode them); answered from the parameters, without data."""
        return False

    def preflight(self, run: RunFacts, at: str) -> list[Problem]:
        """:meth:`check`'s problems at ``task.<parameter>``, and, when ``verifier`` is null, that the task's default
        verifier is installed."""
        problems = [(f"{at}.{parameter}", message) for parameter, message in self.check()]
        if run.config.verifier is None and self.default_verifier not in run.registry.names("verifier"):
            problems.append(
                (
                    "verifier",
                    f"null uses task {self.name!r}'s default verifier {self.default_verifier!r}, which is not installed; "
                    f"name one of: {', '.join(run.registry.names('verifier'))}",
                )
            )
        return problems

    def check(self) -> list[tuple[str, str]]:
        """Problems a run with these parameters would hit, found cheaply (e.g. a data file that does not exist).

        Called by :func:`rlzoo.preflight.checks.preflight` (``rlzoo config check`` and the start of ``rlzoo train``)
        before anything heavy starts; must not load the data itself. Returns ``(parameter, message)`` pairs, the
        message saying what is allowed; ``[]`` (the default) means nothing to report.
        """
        return []
