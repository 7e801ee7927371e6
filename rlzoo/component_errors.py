"""How errors name a component, and where a component's exception was raised: one line for the console."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable

from rlzoo.errors import RlzooError
from rlzoo.interfaces.base import Component


def named(kind: str, name: str, distribution: str | None = None) -> str:
    """``kind 'name' (distribution)``: how errors and warnings name a component (as ``rlzoo plugins list`` lists it;
    a script's distribution is ``script my_loss.py``)."""
    return f"{kind} {name!r}" + (f" ({distribution})" if distribution else "")


def component_raised(component: Component, exc: BaseException, distribution: str | None = None) -> str:
    """``clipper 'my-clip' (script my_loss.py) raised RuntimeError: boom in clip (my_loss.py, line 14)``:
    ``component``'s failure in one line, where it happened: the innermost line of the traceback in the file that
    defines the component's class, else in one of the component's own methods."""
    reason = " ".join(str(exc).split())  # one line, whatever the exception's text
    text = f"{named(component.kind, component.name, distribution)} raised "
    text += reason if isinstance(exc, RlzooError) else f"{type(exc).__name__}: {reason}"
    source = getattr(sys.modules.get(type(component).__module__), "__file__", None)
    where = _innermost(exc, lambda frame: frame.f_code.co_filename == source)
    where = where or _innermost(exc, lambda frame: frame.f_locals.get("self") is component)
    return text + (f" in {where[2]} ({_shown(where[0])}, line {where[1]})" if where else "")


def raising_component(
    exc: BaseException, accept: Callable[[Component], bool] = lambda component: True
) -> Component | None:
    """The component in one of whose methods ``exc`` was raised: the innermost frame of its traceback whose
    ``self`` is a component ``accept`` takes (``None``: no such component's method is in the traceback)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        found = owner if isinstance(owner, Component) and accept(owner) else found
        tb = tb.tb_next
    return found


def _innermost(exc: BaseException, wanted: Callable[[types.FrameType], bool]) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame of ``exc``'s traceback that is ``wanted``."""
    hit = None
    tb = exc.__traceback__
    while tb is not None:
        if wanted(tb.tb_frame):
            hit = (tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return hit


def _shown(path: str) -> str:
    """``path`` relative to the working folder when it lies inside it (a script beside the config), else as it is."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
