"""Multi-turn episodes as one token sequence each, all live episodes generating together, turn by turn.

    turn 1:   the rollout engine samples `group_size` responses per prompt (one call, as single-turn rollouts)
    repeat:   the environment answers every live episode's last turn (concurrently: tool calls run at once)
              an episode ends when the environment says so, or at a limit (counted in episode/truncated):
                  `episode.max_turns` turns, a turn without end-of-sequence, `episode.max_tokens` reached
              the others get the observation's token ids appended (mask 0: in the context, out of the loss)
              the rollout engine samples the next turn of every live episode (one call, n = 1 each)

The episode's token ids are the truth: the sampled ids are kept as sampled, the observation's ids are appended
(never re-tokenising the conversation, which would train on other tokens than were sampled), and each turn's
MoE routing is stitched into one tensor over the whole sequence (:func:`rlzoo.moe.stitch_routing`). An observation is
rendered by the tokenizer's chat template when prompts are chat messages (the text between the policy's
end-of-turn and the next generation prompt), otherwise by :meth:`Environment.plain_text`.

An environment's fault never ends the run: an episode whose ``reset`` or ``step`` raised (or answered with something
other than an :class:`Observation`) ends there with reward 0 whatever the verifier says (:meth:`EpisodeBatch.scored`),
counted and named once on the console (:mod:`rlzoo.episodes.faults`); a demonstration it fails on is left out of the
cold start.

References: verl ``verl/experimental/agent_loop/tool_agent_loop.py`` (one agent loop per episode, observation
tokens with response mask 0); TRL ``GRPOTrainer(tools=..., environment_factory=...)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlzoo.config.schema import PromptConfig
from rlzoo.engines import Generation, RolloutEngine, SamplingSettings
from rlzoo.episodes.faults import (
    DEMONSTRATION_LEFT_OUT,
    EPISODE_ENDS,
    EnvironmentFailure,
    FaultNotices,
    Raised,
    error_key,
    observation_problem,
)
from rlzoo.episodes.prompts import chat_messages, prompt_ids
from rlzoo.errors import RlzooError
from rlzoo.interfaces import Environment, Observation, Sample, Verdict
from rlzoo.interfaces.base import collecting
from rlzoo.moe import stitch_routing
from rlzoo.util.decode import response_text
from rlzoo.util.reductions import FailedEpisodes, Mean, Sum

#: worker threads answering one turn's episodes (each may run several tool calls concurrently itself)
ENVIRONMENT_THREADS = 16


@dataclass
class EpisodeBatch:
    """Every sample's episodes (``group[i]`` holds sample ``i``'s, as :meth:`RolloutEngine.generate` returns them)
    and the step's episode and tool metrics (empty for single-turn episodes)."""

    groups: list[list[Generation]]
    metrics: dict[str, Any] = field(default_factory=dict)
    #: why the episodes whose environment failed ended, by their index in the flattened ``groups``
    errors: dict[int, str] = field(default_factory=dict)

    def scored(self, verdicts: list[Verdict]) -> list[Verdict]:
        """``verdicts`` of the flattened ``groups``, those of the failed episodes replaced by reward 0."""
        if not self.errors:
            return verdicts
        return [Verdict(0.0, reason=self.errors[i]) if i in self.errors else v for i, v in enumerate(verdicts)]


class EpisodeRunner:
    """Runs a batch of episodes of ``environment`` on a rollout engine (see the module docstring)."""

    def __init__(
        self,
        environment: Environment,
        tokenizer: Any,
        max_turns: int = 1,
        max_tokens: int = 0,
        distributions: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        self.environment, self.tokenizer = environment, tokenizer
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.notices = FaultNotices(environment, distributions)  # names failing components, with their distributions

    @property
    def multi_turn(self) -> bool:
        return self.environment.multi_turn and self.max_turns > 1

    def response_width(self, max_new_tokens: int) -> int:
        """Columns of a batch's response mask: ``max_new_tokens`` for one turn, else the episode budget (every
        turn and observation after the prompt fits it), so length-normalising aggregations see a fixed width."""
        return self.max_tokens if self.multi_turn else max_new_tokens

    def run(
        self, engine: RolloutEngine, samples: Sequence[Sample], sampling: SamplingSettings, prompt: PromptConfig
    ) -> EpisodeBatch:
        """``sampling.n`` episodes per sample, prompts encoded by ``prompt``; each turn at most
        ``sampling.max_new_tokens`` tokens."""
        prompts = [prompt_ids(self.tokenizer, s, prompt) for s in samples]
        first = engine.generate(prompts, sampling)
        if not self.multi_turn:  # exactly the single-turn rollouts
            return EpisodeBatch(first)
        episodes = [
            self._start(sample, chat_messages(sample, prompt))
            for sample, group in zip(samples, first, strict=True)
            for _ in group
        ]
        turn = [g for group in first for g in group]
        live = list(episodes)
        for index in range(self.max_turns):
            for episode, generation in zip(live, turn, strict=True):
                episode.add_turn(generation, self.max_tokens)
                if episode.error is not None:  # its reset failed: the episode is its first turn
                    episode.end(truncated=False)
            answering = [e for e in live if not e.ended]
            answers = self._answer(answering)
            live = []
            for episode, observation in zip(answering, answers, strict=True):
                if isinstance(observation, Raised):
                    episode.error = self.notices.environment_failed(observation, EPISODE_ENDS)
                    episode.end(truncated=False)
                    continue
                episode.add_answer(observation)
                if observation.done:
                    episode.end(truncated=False)
                elif index + 1 == self.max_turns:
                    episode.end(truncated=True)
                else:
                    ids = self.observation_ids(episode.messages, episode.last_text(self.tokenizer), observation, prompt)
                    if len(episode.tokens) + len(ids) >= self.max_tokens:  # no room for one more policy token
                        episode.end(truncated=True)
                    else:
                        episode.add_observation(ids, observation)
                        live.append(episode)
            if not live:
                break
            room = max(self.max_tokens - len(e.tokens) for e in live)
            settings = replace(
                sampling,
                n=1,
                max_new_tokens=min(sampling.max_new_tokens, room),
                seed=None if sampling.seed is None else (sampling.seed * 1_000_003 + 7919 * (index + 1)) % 2**63,
            )
            turn = [group[0] for group in engine.generate([e.tokens for e in live], settings)]
        generations = [e.generation() for e in episodes]
        groups, start = [], 0
        for group in first:
            groups.append(generations[start : start + len(group)])
            start += len(group)
        self.notices.tools_failed([o for e in episodes for o in e.outcomes])
        errors = {i: e.error for i, e in enumerate(episodes) if e.error is not None}
        return EpisodeBatch(groups, episode_metrics(episodes, self.environment), errors)

    def _start(self, sample: Sample, messages: list[dict[str, Any]] | None) -> _Episode:
        """A new episode of ``sample``; one whose ``reset`` raised carries its error from the start."""
        episode = _Episode(sample, None, messages)
        try:
            with collecting():  # an environment's reports are not collected, here as in its worker threads
                episode.state = self.environment.reset(sample)
        except Exception as exc:  # noqa: BLE001 - whatever the environment does, the run goes on
            episode.error = self.notices.environment_failed(Raised("reset", exc), EPISODE_ENDS)
        return episode

    def _answer(self, episodes: list[_Episode]) -> list[Observation | Raised]:
        """The environment's answer to each episode's last turn, the episodes answered concurrently; what it did
        wrong instead, where it failed."""
        env = self.environment

        def answer(episode: _Episode) -> Observation | Raised:
            text = episode.last_text(self.tokenizer)
            try:
                observation = env.step(episode.state, episode.sample, text)
            except Exception as exc:  # noqa: BLE001 - whatever the environment does, the run goes on
                return Raised("step", exc)
            problem = observation_problem(observation)
            return observation if problem is None else Raised("step", problem)

        if len(episodes) <= 1:
            with collecting():  # in this thread; its reports dropped, as a worker thread's are
                return [answer(e) for e in episodes]
        with ThreadPoolExecutor(min(ENVIRONMENT_THREADS, len(episodes)), thread_name_prefix="rlzoo-env") as pool:
            return list(pool.map(answer, episodes))

    def observation_ids(
        self, history: list[dict[str, Any]] | None, turn: str, observation: Observation, prompt: PromptConfig
    ) -> list[int]:
        """The observation's token ids, appended after the policy's ``turn``; ``history`` is the conversation
        before that turn as chat messages (``None``: plain-text prompts)."""
        if history is None:
            text = self.environment.plain_text(observation.messages)
        else:
            text = chat_observation_text(self.tokenizer, history, turn, observation.messages, prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def demonstration(self, sample: Sample, prompt: PromptConfig) -> tuple[list[int], list[int], list[int]]:
        """``sample.demonstration_turns`` as an episode for the cold start: ``(prompt ids, response ids, policy
        mask)``. Each demonstrated turn is rendered by the environment (its tool calls through the parser) and
        ends with end-of-sequence; the observations between turns come from the environment itself (the real
        tools), so the cold start sees exactly the tokens a rollout would. Raises :class:`EnvironmentFailure`
        (named once on the console) when the environment fails on it."""
        tokenizer, env = self.tokenizer, self.environment
        prompt_tokens = prompt_ids(tokenizer, sample, prompt)
        history = chat_messages(sample, prompt)
        state, response, mask = self._demonstrated("reset", env.reset, sample), [], []
        turns = list(sample.demonstration_turns or [])
        for index, turn in enumerate(turns):
            text = self._demonstrated("render_turn", env.render_turn, turn)
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
            response, mask = response + ids, mask + [1] * len(ids)
            if index + 1 == len(turns):
                break
            observation = self._demonstrated("step", env.step, state, sample, text)
            problem = observation_problem(observation)
            if problem is not None:
                raise self._left_out(Raised("step", problem))
            if observation.done:
                raise RlzooError(
                    f"the demonstration of {sample.prompt!r} has {len(turns)} turns but the environment "
                    f"{env.name!r} ended it after turn {index + 1}"
                )
            ids = self.observation_ids(history, text, observation, prompt)
            response, mask = response + ids, mask + [0] * len(ids)
            if history is not None:
                history = [*history, {"role": "assistant", "content": text}, *observation.messages]
        return prompt_tokens, response, mask

    def _demonstrated(self, where: str, call: Any, *args: Any) -> Any:
        """``call(*args)``, one of the environment's methods, while replaying a demonstration."""
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - whatever the environment does, the cold start goes on
            raise self._left_out(Raised(where, exc)) from exc

    def _left_out(self, raised: Raised) -> EnvironmentFailure:
        return EnvironmentFailure(self.notices.environment_failed(raised, DEMONSTRATION_LEFT_OUT))


def chat_observation_text(
    tokenizer: Any, history: list[dict[str, Any]], turn: str, messages: Sequence[dict[str, Any]], prompt: PromptConfig
) -> str:
    """What the chat template writes between the policy's end-of-turn token and the next assistant turn's first
    token, when ``messages`` (tool results, a user reply) answer ``turn``: render the conversation with and
    without them and keep the difference, plus whatever the template writes after its end-of-turn token (Qwen:
    a newline)."""
    kwargs = prompt.chat_template_kwargs
    before = [*history, {"role": "assistant", "content": turn}]
    closed = tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=False, **kwargs)
    opened = tokenizer.apply_chat_template([*before, *messages], tokenize=False, add_generation_prompt=True, **kwargs)
    eos = tokenizer.eos_token or ""
    end = closed.rfind(eos) if eos else -1
    if not opened.startswith(closed) or end < 0:
        raise RlzooError(
            "the tokenizer's chat template does not render an observation as a continuation of the conversation "
            "(rendering with the tool/user messages changes the text before them, or the assistant turn does not "
            f"end with {eos!r}); an episode cannot append the observation's tokens to the sampled ones"
        )
    return closed[end + len(eos) :] + opened[len(closed) :]


class _Episode:
    """One episode in progress: its token sequence, masks, turn spans, rewards and tool outcomes."""

    def __init__(self, sample: Sample, state: Any, messages: list[dict[str, Any]] | None) -> None:
        self.sample, self.state, self.messages = sample, state, messages
        self.prompt: list[int] = []
        self.response: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.turns: list[tuple[int, int]] = []
        self.rewards: list[float] = []
        self.routing: torch.Tensor | None = None
        self.versions: list[int] | None = []  # per token (rollout.partial); None once a turn recorded none
        self.outcomes: list[Any] = []
        self.error: str | None = None  # why its environment failed (the episode then ends there, with reward 0)
        self.ended = False
        self.truncated = False
        self.finished = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response

    def add_turn(self, g: Generation, max_tokens: int) -> None:
        """Append a sampled turn (cut where it would pass ``max_tokens``; a cut or unfinished turn ends it)."""
        if not self.turns:
            self.prompt = list(g.prompt_ids)
        room = max(0, max_tokens - len(self.prompt) - len(self.response))  # a prompt past the budget: no room
        ids, logprobs = g.response_ids[:room], g.response_logprobs[:room]
        start = len(self.response)
        self.response += ids
        self.logprobs += logprobs
        self.mask += [1] * len(ids)
        self.versions = None if self.versions is None or g.versions is None else self.versions + g.versions[:room]
        self.turns.append((start, len(self.response)))
        self.finished = g.finished and len(ids) == len(g.response_ids)
        if g.routing is not None:
            self.routing = stitch_routing(self.routing, g.routing, len(self.tokens) - 1)
        if not self.finished:
            self.end(truncated=True)

    def add_answer(self, observation: Observation) -> None:
        self.rewards.append(float(observation.reward))
        self.outcomes += list(observation.tool_outcomes)

    def add_observation(self, ids: list[int], observation: Observation) -> None:
        self.response += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [0] * len(ids)
        if self.versions is not None:  # an observation's tokens sampled by nobody: the version of the turn before
            self.versions = self.versions + [self.versions[-1]] * len(ids) if self.versions else None
        if self.messages is not None:
            self.messages = [*self.messages, {"role": "assistant", "content": self._last_text}, *observation.messages]

    def last_text(self, tokenizer: Any) -> str:
        start, end = self.turns[-1]
        self._last_text = response_text(tokenizer, self.response[start:end])
        return self._last_text

    def end(self, truncated: bool) -> None:
        self.ended, self.truncated = True, truncated

    def generation(self) -> Generation:
        rewards = self.rewards + [0.0] * (len(self.turns) - len(self.rewards))  # a cut turn got no answer
        if self.error is not None:  # a failed episode scores 0, its earlier turns' rewards too
            rewards = [0.0] * len(self.turns)
        finished = self.finished and not self.truncated and self.error is None
        return Generation(
            self.prompt,
            self.response,
            self.logprobs,
            finished,
            self.routing,
            policy_mask=self.mask,
            turns=self.turns,
            turn_rewards=rewards,
            truncated=self.truncated,
            versions=self.versions or None,
        )


def episode_metrics(episodes: Sequence[_Episode], environment: Environment) -> dict[str, Any]:
    """``episode/*`` and ``tool/*`` of a batch of finished episodes of ``environment`` (tool counts summed over
    ranks); per-tool counts for its tools only (a name the model made up is an ``unknown`` call, counted in
    ``tool/errors``). The fault counts, ``episode/errors`` with the environment's own (:func:`error_key`) and
    ``tool/abandoned``, only where there were any: a run without faults logs what it always did."""
    count = len(episodes)
    outcomes = [o for e in episodes for o in e.outcomes]
    statuses = Counter(o.status for o in outcomes)
    metrics: dict[str, Any] = {
        "episode/turns_mean": Mean(sum(len(e.turns) for e in episodes) / count),
        "episode/truncated": Mean(sum(e.truncated for e in episodes) / count),
        "episode/observation_tokens_mean": Mean(sum(len(e.mask) - sum(e.mask) for e in episodes) / count),
        "tool/calls": Sum(float(len(outcomes))),
        "tool/calls_per_episode": Mean(len(outcomes) / count),
        "tool/errors": Sum(float(statuses["error"] + statuses["unknown"] + statuses["malformed"])),
        "tool/timeouts": Sum(float(statuses["timeout"])),
    }
    for name in sorted(environment.tools):
        mine = Counter(o.status for o in outcomes if o.name == name)
        metrics[f"tool/{name}/calls"] = Sum(float(sum(mine.values())))
        metrics[f"tool/{name}/errors"] = Sum(float(mine["error"]))
        metrics[f"tool/{name}/timeouts"] = Sum(float(mine["timeout"]))
    failed = sum(e.error is not None for e in episodes)
    if failed:
        metrics["episode/errors"] = Sum(float(failed))
        metrics[error_key(environment)] = FailedEpisodes(float(failed))  # the one the failure policy reads
    abandoned = sum(o.abandoned for o in outcomes)
    if abandoned:
        metrics["tool/abandoned"] = Sum(float(abandoned))
    return metrics
