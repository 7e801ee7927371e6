"""A Hugging Face model folder read from its files' metadata, nothing loaded: the one check of a model folder.

The policy's folder (``model.path``), a critic's (``algorithm.critic.model``), a teacher's (``teacher.model``) and a
reward model's (the ``reward-model`` verifier's ``path``) are all read by :class:`ModelFolder`: the folder and its
``config.json`` (readable, a JSON object), the weight files (present, and whole as far as their safetensors headers
show: nothing is loaded), ``config.json`` against the weights (an architecture transformers builds as the role's
model, and every tensor it implies present in the headers with its shape:
:mod:`rlzoo.models.folder_tensors`), the tokenizer files, the token ids of its ``tokenizer.json`` against
``config.json``'s ``vocab_size``, and the chat template. Each caller words what a missing
folder means for it (the field it reports at, what to use instead); what is wrong inside a folder reads the same for
every model. :class:`ModelFacts` are what the start-up check keeps of the policy (:class:`rlzoo.interfaces.RunFacts`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.models.folder_tensors import Head, tensor_problems
from rlzoo.models.memory import MOE_KEYS, ModelShape
from rlzoo.util.safetensors_header import header_problem

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
SHARD_INDEX = ".safetensors.index.json"  # a sharded model's map from tensor names to its weight files
UNREADABLE_TOKENIZER = (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError)

# why a path is no model folder (:attr:`ModelFolder.absent`), as "<path> <reason>"
MISSING = "does not exist"
A_FILE = "is a file"
NO_CONFIG = "has no config.json"
NOT_A_MODEL_FOLDER = "is not a Hugging Face model folder (no config.json)"


@dataclass
class ModelFacts:
    """What the preflight knows about the policy without building it; ``None`` where it cannot tell.

    ``tiny``: the model is built from ``model.tiny`` (so a shape problem is reported at ``model.tiny.<field>``,
    otherwise at ``model.path``). ``problems``: what makes the model unusable, ``(field, message)``, reported once
    by the preflight's model rule (a component need not report them again)."""

    moe: bool | None
    head_dim: int | None
    max_positions: int | None
    chat_template: bool | None = None  # whether its tokenizer has a chat template
    shape: ModelShape | None = None  # its sizes, for the memory estimate
    tiny: bool = False
    chat_template_tools: bool | None = None  # whether its chat template reads `tools` (renders tool descriptions)
    problems: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def field(self, name: str) -> str:
        """Where a problem with the model's ``name`` (e.g. ``head_dim``) is reported."""
        return f"model.tiny.{name}" if self.tiny else "model.path"


def read_config(file: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A transformers ``config.json`` as a dict, or ``None`` and why it cannot be read."""
    try:
        hf = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"{file} is not readable JSON: {err}"
    if not isinstance(hf, dict):
        return None, f"{file} is not a JSON object"
    return hf, None


def config_facts(hf: dict[str, Any]) -> ModelFacts:
    """The facts the preflight uses from a ``config.json``: MoE or dense, head size, context, the shape."""
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    head_dim = hf.get("head_dim")
    if head_dim is None and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        head_dim = hidden // heads  # configs without head_dim split the hidden size evenly
    return ModelFacts(
        moe=any(isinstance(hf.get(k), int) and hf[k] > 0 for k in MOE_KEYS),
        head_dim=head_dim,
        max_positions=hf.get("max_position_embeddings"),
        shape=ModelShape.from_hf(hf),
    )


def tokenizer_vocab(file: Path) -> dict[str, int]:
    """Token -> id of a ``tokenizer.json``: its model's vocabulary and the added tokens (raises
    :data:`UNREADABLE_TOKENIZER` if unreadable)."""
    tok = json.loads(file.read_text())
    vocab = tok["model"]["vocab"]
    pieces = vocab.items() if isinstance(vocab, dict) else ((piece, i) for i, (piece, _) in enumerate(vocab))  # Unigram
    return {**dict(pieces), **{t["content"]: t["id"] for t in tok.get("added_tokens", [])}}


def chat_template_text(path: Path) -> str:
    """The tokenizer's chat template source ("" if none): transformers keeps it in chat_template.jinja (or .json),
    or tokenizer_config.json."""
    try:
        if (path / "chat_template.jinja").is_file():
            return (path / "chat_template.jinja").read_text()
        if (path / "chat_template.json").is_file():
            return (path / "chat_template.json").read_text()
        return str(json.loads((path / "tokenizer_config.json").read_text()).get("chat_template") or "")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return ""


@dataclass
class ModelFolder:
    """A model folder as its files describe it. ``absent``: why ``path`` is no model folder (:data:`MISSING`,
    :data:`A_FILE`, :data:`NO_CONFIG`), else ``None``; ``config``: its ``config.json`` (``None`` when absent or
    unreadable, ``unreadable`` then saying why)."""

    path: Path
    absent: str | None = None
    config: dict[str, Any] | None = None
    unreadable: str | None = None

    @classmethod
    def read(cls, path: Path | str) -> ModelFolder:
        path = Path(path)
        if not path.is_dir():
            return cls(path, absent=A_FILE if path.exists() else MISSING)
        if not (path / "config.json").is_file():
            return cls(path, absent=NO_CONFIG)
        config, unreadable = read_config(path / "config.json")
        return cls(path, config=config, unreadable=unreadable)

    @property
    def tokenizer_file(self) -> Path:
        return self.path / "tokenizer.json"

    def facts(self) -> ModelFacts:
        """:func:`config_facts` and the chat template's (call with a readable ``config``)."""
        facts = config_facts(self.config or {})
        template = chat_template_text(self.path)
        facts.chat_template = bool(template)
        facts.chat_template_tools = "tools" in template if template else None
        return facts

    def problems(self, tokenizer: str | None = None, ids: bool = False, head: Head = "lm") -> list[str]:
        """What is wrong inside a folder with a readable ``config``: no weights, or damaged ones
        (:meth:`weight_problems`), or a ``config.json`` that does not describe them as the model the role builds
        (``head``: ``lm`` the policy and a teacher, ``value`` a critic, ``score`` a reward model;
        :func:`rlzoo.models.folder_tensors.tensor_problems`: an architecture transformers cannot build so, missing,
        unexpected or mis-shaped tensors); with ``tokenizer`` (what to do about it, appended to the message), no
        tokenizer files; with ``ids`` too, token ids beyond ``vocab_size``."""
        problems = []
        if not any(any(self.path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
            problems.append(f"{self.path} holds no weights (expected {' or '.join(WEIGHT_PATTERNS)})")
        damaged = self.weight_problems()
        problems += damaged
        if not damaged:  # a damaged header says nothing reliable about the tensors
            problems += tensor_problems(self.path, self.config or {}, head)
        if tokenizer is None:
            return problems
        if not any((self.path / name).is_file() for name in TOKENIZER_FILES):
            problems.append(f"{self.path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}){tokenizer}")
        elif ids and (problem := self.vocab_problem()):
            problems.append(problem)
        return problems

    def weight_problems(self) -> list[str]:
        """What the safetensors weights show of themselves, no tensor loaded: each file's header whole and covering
        the file exactly (:func:`rlzoo.util.safetensors_header.header_problem`: truncated, a damaged header, longer
        than its header says), and each shard that a ``*.safetensors.index.json`` names present."""
        problems = []
        for file in sorted(self.path.glob("*.safetensors")):
            if (problem := header_problem(file)) is not None:
                problems.append(f"{file} is damaged: {problem}; the weights cannot be loaded: copy or save the model "
                                "again")
        for index in sorted(self.path.glob(f"*{SHARD_INDEX}")):
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                problems.append(f"{index} is not a readable shard index ({type(err).__name__}: {err})")
                continue
            missing = sorted(str(shard) for shard in shards if not (self.path / str(shard)).is_file())
            if missing:
                problems.append(f"{index} names {len(missing)} weight file(s) the folder lacks, e.g. {missing[0]}: "
                                "copy the model again")
        return problems

    def vocab(self) -> tuple[dict[str, int] | None, str | None]:
        """The ``tokenizer.json`` token -> id map, or ``None`` and why it cannot be read."""
        try:
            return tokenizer_vocab(self.tokenizer_file), None
        except UNREADABLE_TOKENIZER as err:
            return None, f"{self.tokenizer_file} is not a readable tokenizer: {type(err).__name__}: {err}"

    def vocab_problem(self, vocab: dict[str, int] | None = None) -> str | None:
        """Every token id the tokenizer (``vocab``, read from ``tokenizer.json`` if not given) can produce must index
        the model's embedding (``config.json`` ``vocab_size``); not checked without both."""
        vocab_size = (self.config or {}).get("vocab_size")
        if not isinstance(vocab_size, int) or not self.tokenizer_file.is_file():
            return None
        if vocab is None:
            vocab, unreadable = self.vocab()
            if vocab is None:
                return unreadable
        largest = max(vocab.values(), default=-1)
        if largest >= vocab_size:
            return (f"the tokenizer's ids reach {largest} but config.json vocab_size is {vocab_size} (ids must be "
                    f"0..{vocab_size - 1}): the tokenizer does not belong to this model")
        return None
