"""The walk of an object through one RL step: the first-party calls that are handed it, and how often that path
climbs back up the core's layers or returns to a file it left (issue 47 item 1; docs/contributing.md, "The RL step").

    python scripts/step_walk.py [--cold DIR]

What it measures. One real fixed-seed ``rl_step`` (step 0 of the tiny example, ``examples/gspo_tiny_moe.yaml`` with
hf rollouts and torch training, set up in-process by ``rlzoo train``'s own ``TrainingRun``) runs under
``sys.setprofile``. A *followed object* is the first instance of a named class (the step's ``StepRecord``; the
``Components`` ``c``) seen as an argument of a first-party call; from then on the object itself, by identity. At
each ``call`` event of a Python function defined in a first-party file the callee frame's arguments are looked at:
``co_varnames[:co_argcount + co_kwonlyargcount]`` (``self`` included: a method of the object counts), and the values
inside ``*args`` / ``**kwargs``; a generator counts when it starts, not when it resumes. A call that holds the followed
object is a step of its *walk*; ``rl_step`` itself is the walk's root (the record is born there, ``c`` is its
argument). Only the thread that runs ``rl_step`` is profiled (the default schedule samples in it).

First-party files are those under ``rlzoo/`` (each file a stop) and the plugin distributions ``estimators/``,
``verifiers/`` and ``plugins/<name>/`` (each distribution one stop, ``plugin:<name>``: a component's insides are its
own business). Dataclasses' generated methods (``__init__``, ``__eq__``) have no file and are not counted.

From the walk's files in call order, consecutive repeats collapsed:

- ``files``: the distinct files the walk enters;
- ``returns``: entries into a file the walk had entered before and left;
- ``climbs``: steps of that sequence from a file of a lower layer into a file of a higher one (a return to the caller
  after a call down, or a call back up through an injected callable: either way the reader climbs back up).

The layers are the one declared order of ``tests/test_structure.py`` (``LAYERS``, lowest first; docs/architecture.md,
"The layout: layers, lowest first", lists the same), read from that file; the plugins sit above the whole core (they
import its public API, never the other way).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "rlzoo"
PLUGIN_ROOTS = {ROOT / "estimators": "estimators", ROOT / "verifiers": "verifiers"} | {
    p: p.name for p in sorted((ROOT / "plugins").iterdir()) if p.is_dir()
}
STRUCTURE_TEST = ROOT / "tests" / "test_structure.py"


def declared_layers(path: Path = STRUCTURE_TEST) -> tuple[tuple[str, ...], ...]:
    """``LAYERS`` as ``tests/test_structure.py`` declares it (lowest first; docs/architecture.md's layer table).

    Read from its source, not imported: importing a test module would put ``tests/`` (not a package) on the path of
    the step it measures and load pytest; the list is a literal, so its value is the same either way."""
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{path} declares no LAYERS")


LAYERS = declared_layers()
PLUGIN_LAYER = len(LAYERS)  # above the core: a plugin imports rlzoo's public API, rlzoo never imports a plugin
#: what is followed: a name -> the class's ``module.qualname`` (matched by name, so an older checkout without the
#: class runs too)
FOLLOWED = {"record": "rlzoo.rl.step_record.StepRecord", "components": "rlzoo.rl.loop.Components"}
#: the tiny example's step: tests/test_cli.py's TINY_RUN on the in-process engines
EXAMPLE = ROOT / "examples" / "gspo_tiny_moe.yaml"
TINY = [
    "rollout.engine={name: hf}",
    "trainer.engine={name: torch}",
    "cold_start.steps=2",
    "cold_start.batch_size=8",
    "cold_start.examples=32",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "train.steps=1",
    "train.eval_prompts=4",
    "train.eval_samples_per_prompt=1",
]
GENERATORS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def layer_of(module: str) -> int:
    """The layer index of a core module: the longest listed unit that is the module or contains it."""
    best, length = -1, -1
    for index, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > length:
                best, length = index, len(unit)
    return best


@dataclass(frozen=True)
class Stop:
    """A first-party file as the walk sees it: its label (``rlzoo/rl/loop.py``, ``plugin:estimators``) and layer."""

    label: str
    layer: int


def stop_of(filename: str) -> Stop | None:
    """The stop of a code object's file, or ``None`` when the file is not first-party."""
    path = Path(filename)
    if not path.is_absolute():
        return None  # <string>: dataclasses' generated methods, exec'd code
    path = path.resolve()
    if path.is_relative_to(CORE):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        return Stop(str(path.relative_to(ROOT)), layer_of(module))
    for root, name in PLUGIN_ROOTS.items():
        if path.is_relative_to(root) and "tests" not in path.relative_to(root).parts:
            return Stop(f"plugin:{name}", PLUGIN_LAYER)
    return None


@dataclass
class Call:
    """One step of a walk: the callee, where it is defined, and how deep it sits among the walk's own calls."""

    depth: int
    stop: Stop
    function: str
    line: int


@dataclass
class Walk:
    """The calls handed one object, in order, and the counts read from their files."""

    name: str
    calls: list[Call] = field(default_factory=list)

    def sequence(self) -> list[Stop]:
        """The walk's files in call order, consecutive repeats collapsed."""
        out: list[Stop] = []
        for call in self.calls:
            if not out or out[-1] != call.stop:
                out.append(call.stop)
        return out

    def counts(self) -> dict[str, int]:
        sequence = self.sequence()
        returns = sum(1 for i, stop in enumerate(sequence) if stop in sequence[:i])
        climbs = sum(1 for a, b in zip(sequence, sequence[1:]) if b.layer > a.layer)
        return {"files": len(set(sequence)), "climbs": climbs, "returns": returns}

    def render(self) -> str:
        lines = [f"{self.name}: " + ", ".join(f"{k} {v}" for k, v in self.counts().items())]
        lines += [f"{'  ' * (c.depth + 1)}{c.function}  ({c.stop.label}:{c.line})" for c in self.calls]
        lines.append("  files in order: " + " -> ".join(s.label for s in self.sequence()))
        return "\n".join(lines)


class Follower:
    """A ``sys.setprofile`` callback recording the walk of each followed object (``FOLLOWED``'s names)."""

    def __init__(self, followed: dict[str, str]) -> None:
        self.kinds = {qualified: name for name, qualified in followed.items()}
        self.objects: dict[str, Any] = {}  # name -> the followed object, once seen
        self.walks = {name: Walk(name) for name in followed}
        self.active: dict[str, set[int]] = {name: set() for name in followed}  # ids of the walk's live frames
        self.stops: dict[Any, Stop | None] = {}  # code object -> stop (cached: every call asks)
        self.started: set[int] = set()  # generator frames already entered (a resume is no new call)
        self.keep: list[FrameType] = []  # those frames, kept alive so that their ids stay theirs
        self.root: FrameType | None = None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "return":
            for active in self.active.values():
                active.discard(id(frame))
            return
        if event != "call":
            return
        code = frame.f_code
        if code not in self.stops:
            self.stops[code] = stop_of(code.co_filename)
        stop = self.stops[code]
        if stop is None:
            return
        if code.co_flags & GENERATORS:  # its first entry only, not each resume
            if id(frame) in self.started:
                return
            self.started.add(id(frame))
            self.keep.append(frame)
        if self.root is None:
            self.root = frame
            for name, walk in self.walks.items():
                walk.calls.append(Call(0, stop, code.co_qualname, code.co_firstlineno))
                self.active[name].add(id(frame))
            return
        held = list(arguments(frame))
        for name, walk in self.walks.items():
            followed = self.objects.get(name)
            if followed is None:
                followed = next((v for v in held if self.kinds.get(qualified_name(v)) == name), None)
                if followed is None:
                    continue
                self.objects[name] = followed
            if any(value is followed for value in held):
                depth = self.depth(frame, self.active[name])
                walk.calls.append(Call(depth, stop, code.co_qualname, code.co_firstlineno))
                self.active[name].add(id(frame))

    @staticmethod
    def depth(frame: FrameType, active: set[int]) -> int:
        """How many of the walk's calls are under way around ``frame`` (the root included)."""
        count, outer = 0, frame.f_back
        while outer is not None:
            count += id(outer) in active
            outer = outer.f_back
        return count


def qualified_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def arguments(frame: FrameType) -> Iterator[Any]:
    """The values of the callee's parameters (``self`` included), and those inside ``*args`` / ``**kwargs``."""
    code, values = frame.f_code, frame.f_locals
    names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    for name in names:
        if name in values:
            yield values[name]
    extra = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        yield from values.get(code.co_varnames[extra], ())
        extra += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        yield from values.get(code.co_varnames[extra], {}).values()


def measure(step: Callable[[], Any], followed: dict[str, str] = FOLLOWED) -> dict[str, Walk]:
    """The walk of each followed object through ``step()``, a call of ``rl_step`` (its first first-party call)."""
    follower = Follower(followed)
    previous = sys.getprofile()
    sys.setprofile(follower)
    try:
        step()
    finally:
        sys.setprofile(previous)
    assert follower.root is not None and follower.root.f_code.co_name == "rl_step", "step() must call rl_step first"
    return {name: walk for name, walk in follower.walks.items() if name in follower.objects}


@contextmanager
def tiny_step(folder: Path) -> Iterator[Callable[[], Any]]:
    """Step 0 of the tiny example, set up in-process (its cold start in ``folder``), as a call of ``rl_step``."""
    from rlzoo.config.resolution import load_config
    from rlzoo.registry import default_registry
    from rlzoo.rl import loop
    from rlzoo.runtime.run import TrainingRun

    registry = default_registry()
    sets = [*TINY, f"output_dir={folder / 'run'}", f"cold_start.output_dir={folder / 'cold'}"]
    run = TrainingRun(load_config(EXAMPLE, sets, registry), registry, progress=False)
    run.setup()
    try:
        prompts = loop.sample_prompts(run.train_set, 0, run.config)
        yield lambda: loop.rl_step(0, prompts, run.components, run.config)
    finally:
        run.components.schedule.close()
        run.rollout.close()
        if run.folder_lock is not None:
            run.folder_lock.release()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=Path, default=None, help="a folder for the run and its cold start")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        with tiny_step(args.cold or Path(scratch)) as step:
            walks = measure(step)
    print("\n\n".join(walk.render() for walk in walks.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
