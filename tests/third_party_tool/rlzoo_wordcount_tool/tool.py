"""``word-count``: how many whitespace-separated words a text has; each call is also logged to ``log_path``."""

from __future__ import annotations

import json
import threading
from typing import Any

from pydantic import Field

from rlzoo.interfaces import Params, Tool, ToolError

_LOG_LOCK = threading.Lock()  # calls run concurrently, one thread each: one line per call, never interleaved


class WordCount(Tool):
    """Count the words of a text (``len(text.split())``); the observation is ``<n> words``.

    With ``log_path`` every call appends ``{"text": ..., "words": n}`` as a JSON line to that file: the side effect
    a test reads to see that the tool really ran. Texts longer than ``max_chars`` are refused (a ``ToolError``
    the model reads).
    """

    name = "word-count"
    description = "Count the words (whitespace-separated) of a text."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "the text whose words are counted"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    class Params(Params):
        max_chars: int = Field(1000, ge=1, description="longest text accepted")
        timeout_s: float = Field(1.0, gt=0, description="time budget of one call")
        log_path: str | None = Field(None, description="append one JSON line per call to this file")

    def call(self, arguments: dict[str, Any]) -> str:
        text = arguments["text"]
        if len(text) > self.params.max_chars:
            raise ToolError(f"the text has {len(text)} characters; the limit is {self.params.max_chars}")
        words = len(text.split())
        if self.params.log_path is not None:
            with _LOG_LOCK, open(self.params.log_path, "a") as log:
                log.write(json.dumps({"text": text, "words": words}) + "\n")
        return f"{words} words"
