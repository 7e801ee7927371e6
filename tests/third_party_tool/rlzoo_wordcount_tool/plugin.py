"""The entry point (``[project.entry-points.rlzoo] wordcount-tool``): registers the tool and the rollout engine.

The modules are imported inside the hooks, as rlzoo's own plugins do, so discovery stays cheap.
"""

from __future__ import annotations

import rlzoo


@rlzoo.hookimpl
def rlzoo_tools() -> list[type]:
    from rlzoo_wordcount_tool.tool import WordCount

    return [WordCount]


@rlzoo.hookimpl
def rlzoo_rollout_engines() -> list[type]:
    from rlzoo_wordcount_tool.rollout import WordCountCaller

    return [WordCountCaller]
