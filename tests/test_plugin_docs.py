"""Every Python example of docs/writing-a-plugin.md runs, registers, and computes what the doc says.

Each ```python block is executed as a module of its own. A block whose caption (the line before the fence, e.g.
``src/rlzoo_capped_is/clipper.py``) or first line (``# src/rlzoo_my_plugin/batch_filter.py``) names a file under
``src/`` becomes that importable module (``rlzoo_capped_is.clipper``), so later blocks import it as a reader would
after installing the plugin. A block whose first line is ``# fragment`` is not run. Then: each block's
``@rlzoo.hookimpl`` functions are registered in a fresh :class:`rlzoo.registry.Registry`, every class they return
is found under its kind and name and constructs with default parameters; the examples' main methods are called
on tiny tensors; and the doc's own ``test_*`` functions (section "Testing a plugin") are run.
"""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlzoo.errors import ConfigError
from rlzoo.hookspecs import HOOK_KINDS
from rlzoo.registry import Registry

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "writing-a-plugin.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MODULE_FILE = re.compile(r"^(?:# )?`?src/([\w/]+)\.py`?")
TEST_FUNCTION = re.compile(r"^def (test_\w+)\(", re.M)


@dataclass(frozen=True)
class Block:
    line: int  # the doc line of the block's first code line
    code: str
    module: str | None  # the import name its caption gives it, if any

    @property
    def fragment(self) -> bool:
        return self.code.startswith("# fragment")

    @property
    def import_name(self) -> str:
        return self.module or f"_rlzoo_doc_block_{self.line}"

    def __str__(self) -> str:
        return f"{DOC.name}:{self.line}"


def python_blocks(text: str) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start(1)) + 1
        code = match.group(1)
        before = [ln for ln in text[: match.start()].splitlines() if ln.strip()]
        caption = MODULE_FILE.match(before[-1].strip()) if before else None
        first = MODULE_FILE.match(code.splitlines()[0]) if code.strip() else None
        named = first or caption
        blocks.append(Block(line, code, named.group(1).replace("/", ".") if named else None))
    return blocks


BLOCKS = python_blocks(DOC.read_text())
RUNNABLE = [b for b in BLOCKS if not b.fragment]
DOC_TESTS = [(b, name) for b in RUNNABLE for name in TEST_FUNCTION.findall(b.code)]


@pytest.fixture(scope="module")
def doc_modules():
    """Every runnable block executed in doc order as a module in ``sys.modules`` (removed afterwards); a block
    that raises is recorded, not fatal, so each block's own test names it."""
    added: list[str] = []

    def install(name: str, module: types.ModuleType) -> None:
        parts = name.split(".")
        for i in range(1, len(parts)):  # parent packages of a captioned module
            parent = ".".join(parts[:i])
            if parent not in sys.modules:
                package = types.ModuleType(parent)
                package.__path__ = []
                sys.modules[parent] = package
                added.append(parent)
        assert name not in sys.modules or name in added, f"{name} is a real module; rename the doc's example"
        sys.modules[name] = module
        added.append(name)
        if len(parts) > 1:
            setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)

    modules: dict[int, types.ModuleType] = {}
    errors: dict[int, BaseException] = {}
    try:
        for block in RUNNABLE:
            module = types.ModuleType(block.import_name)
            module.__file__ = str(DOC)
            install(block.import_name, module)
            try:  # blank lines first, so a traceback's line numbers are the doc's
                exec(compile("\n" * (block.line - 1) + block.code, str(DOC), "exec"), module.__dict__)
            except BaseException as exc:  # noqa: BLE001 - reported by test_every_block_runs
                errors[block.line] = exc
            modules[block.line] = module
        yield modules, errors
    finally:
        for name in reversed(added):
            sys.modules.pop(name, None)


def hook_functions(module: types.ModuleType) -> list:
    return [f for f in vars(module).values() if callable(f) and hasattr(f, "rlzoo_impl")]


@pytest.fixture(scope="module")
def examples(doc_modules) -> dict[tuple[str, str], type]:
    """(kind, name) -> class of every component the doc's hooks return or its ``@rlzoo.register`` lines mark."""
    modules, _ = doc_modules
    found = {}
    code = {block.line: block.code for block in RUNNABLE}
    for line, module in modules.items():
        for hook in hook_functions(module):
            if hook.__name__ not in HOOK_KINDS:  # a misspelt hook: test_hooks_register_... names it
                continue
            for cls in hook():
                found[(HOOK_KINDS[hook.__name__], cls.name)] = cls
        if "@rlzoo.register(" in code[line]:
            registry = Registry()  # a marked class is found as an installed package's module finds it
            found.update({(i.kind, i.name): i.cls for i in registry.add_plugin(module, name="doc", distribution="doc")})
            assert not registry.load_errors, [str(e) for e in registry.load_errors]
    return found


def test_the_doc_has_examples_and_few_fragments():
    assert len(RUNNABLE) >= 15, [str(b) for b in RUNNABLE]
    assert len(BLOCKS) - len(RUNNABLE) <= 3, [str(b) for b in BLOCKS if b.fragment]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_resolve():
    text = DOC.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path, _, anchor = target.partition("#")
        if path.startswith("http"):
            continue
        file = (DOC.parent / path) if path else DOC
        assert file.exists(), f"{DOC.name} links to {target}, which does not exist"
        if anchor:
            assert anchor in anchors(file.read_text()), f"{DOC.name} links to {target}: no such heading"


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_every_block_runs(block, doc_modules):
    _, errors = doc_modules
    if block.line in errors:
        raise AssertionError(f"the example at {block} raises") from errors[block.line]


@pytest.mark.parametrize("block", [b for b in RUNNABLE if "@rlzoo.hookimpl" in b.code], ids=str)
def test_hooks_register_each_class_under_its_kind_and_name(block, doc_modules):
    modules, errors = doc_modules
    assert block.line not in errors, f"the example at {block} raises: {errors[block.line]!r}"
    module = modules[block.line]
    hooks = hook_functions(module)
    assert hooks, f"{block}: no @rlzoo.hookimpl function"
    registry = Registry()
    registry.add_plugin(module, name=block.import_name, distribution="rlzoo-doc-examples")
    assert not registry.load_errors, [str(e) for e in registry.load_errors]
    for hook in hooks:
        assert hook.__name__ in HOOK_KINDS, f"{block}: {hook.__name__} is not an rlzoo hook (a typo is silently unused)"
        kind = HOOK_KINDS[hook.__name__]
        classes = hook()
        assert classes, f"{block}: {hook.__name__} returns nothing"
        for cls in classes:
            info = registry.get(kind, cls.name)
            assert info.cls is cls and cls.kind == kind
            assert cls.summary(), f"{cls.__name__} has no docstring summary"
            assert isinstance(registry.create(kind, cls.name, {}, loc="x"), cls)  # default params, as a config
            assert isinstance(cls(), cls)


def test_every_kind_has_an_example(examples):
    kinds = {kind for kind, _ in examples}
    assert kinds == set(HOOK_KINDS.values()), kinds


@pytest.mark.parametrize(("block", "name"), DOC_TESTS, ids=[f"{b}:{n}" for b, n in DOC_TESTS])
def test_the_docs_own_tests_pass(block, name, doc_modules, tmp_path):
    modules, errors = doc_modules
    assert block.line not in errors, f"the example at {block} raises: {errors[block.line]!r}"
    function = getattr(modules[block.line], name)
    fixtures = {"tmp_path": tmp_path}
    function(**{arg: fixtures[arg] for arg in function.__code__.co_varnames[: function.__code__.co_argcount]})


# -- what the examples compute -----------------------------------------------------------------------------------


def test_batch_filter_keeps_varied_groups_reports_and_checks_the_group_size(examples, tmp_path):
    from rlzoo.interfaces import ModelFacts, RunFacts
    from rlzoo.interfaces.base import collecting
    from rlzoo.registry import default_registry
    from rlzoo.util.reductions import Sum

    cls = examples[("batch_filter", "min-std")]
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.45])  # varied, constant, barely varied (std 0.025)
    keep = cls().keep(rewards, groups)
    assert keep.tolist() == [True, False, False]
    assert cls(cls.Params(min_std=0.0)).keep(rewards, groups).tolist() == [True, False, True]
    component = cls()
    with collecting() as reports:  # as the docs' "Reporting metrics" says a test reads them
        component.keep(rewards, groups)
    assert reports == {"filter/min-std/kept_groups": 1.0} and type(reports["filter/min-std/kept_groups"]) is Sum
    assert component.max_gen_batches() == 10

    def problems(group_size: int) -> list:
        path = tmp_path / f"g{group_size}.yaml"
        path.write_text(f"rollout: {{group_size: {group_size}}}\n")
        from rlzoo import load_config

        run = RunFacts(load_config(path), ModelFacts(None, None, None), 1, default_registry())
        return component.preflight(run, "algorithm.batch_filter")

    assert [field for field, _ in problems(1)] == ["rollout.group_size"]
    assert problems(2) == []


def test_router_policy_replays_the_old_pass_in_its_layers_only(examples):
    from rlzoo.interfaces import RecordedRouting
    from rlzoo.moe import Routing

    cls = examples[("router", "replay-old-layers")]
    old = Routing(torch.randint(0, 8, (2, 5, 3, 2)), layers=[0, 1, 2], num_experts=8)
    recorded = RecordedRouting(old=old, rollout=None)
    policy = cls(cls.Params(layers=(2, 0)))
    assert policy.old_pass_routing(RecordedRouting(old=None, rollout=None)) is None  # the old pass routes afresh
    routing = policy.update_routing(recorded)
    assert isinstance(routing, Routing) and routing.layers == (2, 0)
    assert torch.equal(routing.indices, old.indices[:, :, [2, 0]])
    assert cls().update_routing(recorded).layers == (0,)
    assert policy.replays_routing() and policy.needs_old_pass() and not policy.needs_rollout_routing()


def test_reward_shaper_rewards_short_correct_responses_only(examples):
    from rlzoo.interfaces import ResponseTooLong

    shaper = examples[("reward_shaper", "short-correct-bonus")]()
    bonus = shaper.shape(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([4, 8, 2]), 8)
    assert bonus.tolist() == pytest.approx([0.05, 0.0, 0.0])
    with pytest.raises(ResponseTooLong, match="short-correct-bonus"):
        shaper.shape(torch.tensor([1.0]), torch.tensor([9]), 8)


def test_advantage_source_subtracts_the_group_mean_on_response_tokens(examples):
    from rlzoo.interfaces import RewardBatch

    source = examples[("advantage", "mean-baseline")]()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
    advantages = source.compute(RewardBatch(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), mask))
    assert advantages.tolist() == [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_clipper_caps_the_weight_and_never_drops_a_gradient(examples):
    clipper = examples[("clipper", "capped-is")]()
    ratio = torch.tensor([[0.5, 1.0, 2.0]], requires_grad=True)
    result = clipper.clip(ratio, torch.tensor([[1.0, -1.0, 2.0]]))
    result.loss.sum().backward()
    assert result.loss.flatten().tolist() == pytest.approx([-0.8, 1.0, -2.4])
    assert ratio.grad.flatten().tolist() == pytest.approx([-1.6, 1.0, -1.2])
    assert not result.clipped_low.any() and not result.clipped_high.any()


def test_the_other_examples_compute_their_formulas(examples):
    logp, old = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.5, -2.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    log_ratio = examples[("ratio", "sequence-sum")]().log_ratio(logp, old, mask)
    assert log_ratio.tolist() == [[0.5, 0.5, 0.0]]
    aggregation = examples[("aggregation", "token-sum-constant")]
    losses = torch.tensor([[1.0, 3.0, float("nan")]])  # a masked position never contributes
    assert aggregation(aggregation.Params(norm=4.0)).aggregate(losses, mask).item() == 1.0
    kl = examples[("kl", "k3-capped")]
    assert kl().estimate(torch.zeros(1), torch.zeros(1)).item() == 0.0
    assert kl(kl.Params(cap=1.0)).estimate(torch.tensor([-10.0]), torch.tensor([0.0])).item() == 1.0
    weights = examples[("correction", "two-sided-tis")]().weights(
        torch.log(torch.tensor([[0.1, 1.0, 9.0]])), torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]])
    )
    assert weights.flatten().tolist() == pytest.approx([0.5, 1.0, 0.0])
    regulariser = examples[("regulariser", "entropy-target")]
    assert regulariser.needs_entropy
    token_mean = aggregation(aggregation.Params(norm=2.0))
    term = regulariser(regulariser.Params(coef=1.0, target=0.5)).loss(
        logp, torch.tensor([[1.0, 2.0, 5.0]]), mask, token_mean
    )
    assert term.item() == pytest.approx(1.0)  # (3 / 2 - 0.5) ** 2


def test_verifier_and_task_examples_work_together(examples):
    task = examples[("task", "reverse")](examples[("task", "reverse")].Params(length=3))
    train, again, held_out = task.samples("train", 5, 0), task.samples("train", 5, 0), task.samples("eval", 5, 0)
    assert train == again and not {s.prompt for s in train} & {s.prompt for s in held_out}
    verifier = examples[("verifier", "contains")]()
    sample = train[0]
    assert verifier.verify(sample, f"it is {sample.answer}").reward == 1.0
    assert verifier.verify(sample, "no idea").reward == 0.0


def test_a_correction_failing_at_set_up_names_its_field_and_message(doc_modules):
    modules, _ = doc_modules
    module = next(m for m in modules.values() if m.__name__ == "rlzoo_my_plugin.correction")
    registry = Registry()
    registry.add_plugin(module, name="my_correction", distribution="rlzoo-my-plugin")
    with pytest.raises(ConfigError) as info:
        registry.create("correction", "two-sided-tis", {"low": 3.0}, loc="algorithm.correction")
    assert info.value.problems == [
        (
            "algorithm.correction",
            "correction 'two-sided-tis' (rlzoo-my-plugin) failed to set up: low (3.0) must be below high (2.0)",
        )
    ]
    with pytest.raises(ConfigError) as info:
        registry.create("correction", "two-sided-tis", {"low": -1.0}, loc="algorithm.correction")
    assert info.value.problems[0][0] == "algorithm.correction.low"


def test_logger_writes_long_rows_and_a_resume_skips_what_it_holds(examples, tmp_path):
    import csv

    from rlzoo.config.schema import RunConfig
    from rlzoo.reporting.trackers import Trackers, tracked_runs

    cls = examples[("logger", "long-csv")]
    config = RunConfig()

    def attempt(steps, resumed_at=None, finish=False):
        logger = cls()
        trackers = Trackers({"loggers.0": logger})
        trackers.start(tracked_runs(config, tmp_path, resumed_at, {"loggers.0": logger}))
        for step in steps:
            row = {"reward/mean": step / 10, "loss/policy": -step}
            (tmp_path / "metrics.jsonl").open("a").write(json.dumps({"step": step, **row}) + "\n")  # as the core
            trackers.log_metrics(step, row)
        if finish:
            trackers.finish({"eval/accuracy": 0.5}, [])
        trackers.close()
        assert len(trackers) == 1  # it never failed

    attempt(range(4))  # killed after step 3
    attempt(range(2, 6), resumed_at=2, finish=True)  # resumed from step 2's checkpoint
    with open(tmp_path / "loggers" / "long-csv" / "metrics_long.csv") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["step", "key", "value"]
    steps = [row[0] for row in rows[1:] if row[1] == "reward/mean"]
    assert steps == ["0", "1", "2", "3", "4", "5"]  # each once
    assert rows[-1] == ["summary", "eval/accuracy", "0.5"]


def test_rollout_engine_rule_is_reported_by_the_config_check(doc_modules, tmp_path):
    """The whole check (``rlzoo config check``'s): the engine is selected by name and its rule reported by field."""
    from rlzoo.config.resolution import build_config
    from rlzoo.preflight.checks import preflight

    modules, _ = doc_modules
    module = next(m for m in modules.values() if m.__name__ == "rlzoo_my_plugin.rollout_engine")
    registry = Registry.discover()
    registry.add_plugin(module, name="my_rollout_engine", distribution="rlzoo-my-plugin")

    def check(max_new_tokens: int) -> list:
        data = {
            "output_dir": str(tmp_path / "run"),
            "rollout": {"engine": {"name": "hf-short", "max_response_tokens": 32}, "max_new_tokens": max_new_tokens},
        }
        config = build_config(data, registry=registry)
        try:
            preflight(config, registry)
        except ConfigError as err:
            return err.problems
        return []

    assert check(16) == []
    assert check(48) == [("rollout.max_new_tokens", "48 exceeds rollout.engine.max_response_tokens 32; use at most 32")]


# -- what the doc says about the code ----------------------------------------------------------------------------


def table(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with ``header`` (``|`` inside a cell escaped)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def calls(cell: str) -> set[str]:
    """The methods a cell names as calls: ``name(...)`` in backticks."""
    return {m.group(1) for tick in ticked(cell) if (m := re.match(r"(\w+)\(", tick))}


def base_classes() -> dict[str, type]:
    """kind -> the base class of that kind in the public API."""
    import rlzoo.engines
    import rlzoo.interfaces
    from rlzoo.interfaces import Component

    classes = [getattr(rlzoo.interfaces, n) for n in rlzoo.interfaces.__all__]
    classes += [rlzoo.engines.RolloutEngine, rlzoo.engines.TrainingEngine]
    found = {c.kind: c for c in classes if isinstance(c, type) and issubclass(c, Component) and c.kind}
    assert set(found) == set(HOOK_KINDS.values()), set(HOOK_KINDS.values()) ^ set(found)
    return found


def test_the_kind_table_names_each_kinds_base_class_hook_and_methods():
    rows = table(DOC.read_text(), "| kind (`plugins list`) |")
    bases = base_classes()
    assert sorted(ticked(row[0])[0] for row in rows) == sorted(HOOK_KINDS.values())
    for row in rows:
        kind, base, hook = ticked(row[0])[0], ticked(row[1])[0], ticked(row[2])[0]
        assert bases[kind].__name__ == base and HOOK_KINDS[hook] == kind, row
        for method in calls(row[4]) | calls(row[5]):
            assert callable(getattr(bases[kind], method, None)), f"{base} has no method {method!r} ({row[0]})"


@pytest.mark.parametrize("base", ["RolloutEngine", "TrainingEngine"])
def test_the_engine_tables_name_every_engine_method_and_where_it_is_called(base):
    """Each table row's methods exist on the base class and are used (``.method``) in a file the row names; every
    public method of the base class is in a row."""
    import rlzoo.engines
    from rlzoo.interfaces import Component

    cls = getattr(rlzoo.engines, base)
    text = DOC.read_text()
    section = text[text.index(f"**{base.removesuffix('Engine')} engine** (`") :]
    rows = table(section, "| when | method | called in |")
    documented: set[str] = set()
    for when, methods, where in rows:
        files = [REPO / path for path in ticked(where)]
        assert files and all(f.is_file() for f in files), f"{where}: no such file"
        sources = "".join(f.read_text() for f in files)
        for method in calls(methods):
            assert callable(getattr(cls, method, None)), f"{base} has no method {method!r} ({when})"
            assert re.search(rf"\.{method}\b", sources), f"{method!r} is not called in {where} ({when})"
        documented |= calls(methods)
    own = {
        name
        for klass in cls.__mro__
        if klass not in Component.__mro__
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    }
    assert own | {"preflight"} <= documented, sorted(own - documented)


def test_the_documented_tracked_run_fields_are_the_dataclasses():
    import dataclasses

    from rlzoo.interfaces import TrackedRun

    rows = table(DOC.read_text(), "| `TrackedRun` field |")
    assert [ticked(row[0])[0] for row in rows] == [f.name for f in dataclasses.fields(TrackedRun)]


def test_the_metrics_namespace_table_is_each_kinds_namespace():
    rows = table((REPO / "docs" / "metrics.md").read_text(), "| kind | namespace | the scope that collects it |")
    bases, seen = base_classes(), []
    for row in rows:
        kinds = [k for k in ticked(row[0]) if k in bases]
        namespaces = ticked(row[1])
        assert kinds and len(namespaces) == len(kinds), row
        for kind, namespace in zip(kinds, namespaces, strict=True):
            assert namespace == (bases[kind].metric_namespace or kind), row
        seen += kinds
    assert sorted(seen) == sorted(HOOK_KINDS.values())


def test_the_doc_engines_report_in_a_real_run_and_a_logger_gets_the_documented_calls(doc_modules, tmp_path):
    """The doc's rollout and training engines, selected by name in a short run of the main example (tiny MoE:
    the routing learner's old pass), with a logger that records every call: the engines' reports are in each
    step's metrics under the documented keys, an evaluation's never; the logger is called as the doc's table says
    and each evaluation comes again through ``log_metrics``."""
    from test_cli import TINY_RUN

    import rlzoo
    from rlzoo.config.resolution import load_config
    from rlzoo.interfaces import Logger
    from rlzoo.reporting.metrics_log import read_metrics
    from rlzoo.runtime.run import train

    calls_seen: list[tuple] = []

    class Recording(Logger):
        """Records every call."""

        name = "recording"

        def start(self, run):
            calls_seen.append(("start", run))

        def log_metrics(self, step, metrics):
            calls_seen.append(("log_metrics", step, dict(metrics)))

        def log_evaluation(self, step, metrics):
            calls_seen.append(("log_evaluation", step, dict(metrics)))

        def finish(self, summary, artifacts):
            calls_seen.append(("finish", dict(summary), list(artifacts)))

        def close(self):
            calls_seen.append(("close",))

    modules, _ = doc_modules
    registry = Registry.discover()
    for name in ("rollout_engine", "training_engine"):
        module = next(m for m in modules.values() if m.__name__ == f"rlzoo_my_plugin.{name}")
        registry.add_plugin(module, name=f"my_{name}", distribution="rlzoo-my-plugin")
    loggers = types.ModuleType("recording_logger")
    loggers.rlzoo_loggers = rlzoo.hookimpl(lambda: [Recording])
    loggers.rlzoo_loggers.__name__ = "rlzoo_loggers"
    registry.add_plugin(loggers, name="recording", distribution="tests")
    assert not registry.load_errors, registry.load_errors
    run_dir = tmp_path / "run"
    sets = [
        *TINY_RUN,
        "rollout.engine={name: hf-short}",
        "trainer.engine={name: torch-counting}",
        "train.steps=2",
        "loggers=[{name: recording}]",
        f"output_dir={run_dir}",
        f"cold_start.output_dir={tmp_path / 'cold'}",
    ]
    config = load_config(REPO / "examples" / "gspo_tiny_moe.yaml", sets, registry)
    train(config, registry=registry, progress=False)

    rows = read_metrics(run_dir / "metrics.jsonl")
    steps, final = [r for r in rows if "reward/mean" in r], rows[-1]
    assert [r["step"] for r in steps] == [0, 1]
    responses = config.rollout.prompts_per_step * config.rollout.group_size
    for row in steps:
        assert row["rollout_engine/hf-short/prompt_tokens_max"] >= 1  # the step's own generation batch
        # a Sum over the step's minibatches: every response token trained on once
        tokens = row["response/length_mean"] * responses
        assert row["training_engine/torch-counting/response_tokens"] == pytest.approx(tokens)
        rows_per_minibatch = responses / config.algorithm.minibatches_per_rollout
        assert row["training_engine/torch-counting/minibatch_rows_max"] == rows_per_minibatch
    assert set(final) == {"step", "final"} | {k for k in final if k.startswith("eval/")}  # no engine key leaked in

    # the logger: start, then each evaluation alone before its step's metrics, the final one twice, finish, close
    names = [(c[0], c[1]) if c[0].startswith("log_") else c[0] for c in calls_seen]
    assert names == [
        "start",
        ("log_evaluation", 0),
        ("log_metrics", 0),
        ("log_evaluation", 1),
        ("log_metrics", 1),
        ("log_evaluation", 2),
        ("log_metrics", 2),
        "finish",
        "close",
    ]
    logged = {c[1]: c[2] for c in calls_seen if c[0] == "log_metrics"}
    for _, step, evaluation in (c for c in calls_seen if c[0] == "log_evaluation"):
        assert evaluation and all(k.startswith("eval/") or k == "final" for k in evaluation)
        assert evaluation.items() <= logged[step].items()  # the same values again through log_metrics
        assert {k: v for k, v in logged[step].items() if k.startswith("eval/")} == {
            k: v for k, v in evaluation.items() if k.startswith("eval/")
        }
    assert logged[2] == next(c[2] for c in calls_seen if c[:2] == ("log_evaluation", 2)) and logged[2]["final"] == 1.0
    run = calls_seen[0][1]
    assert run.run_dir == run_dir and run.state_dir == run_dir / "loggers" / "recording" and run.resumed_at is None
    assert run.config["trainer"]["engine"]["name"] == "torch-counting"
    summary = calls_seen[-2][1]
    assert summary == {**logged[2], "steps": 2.0}


# -- the quick path: a component from a script -------------------------------------------------------------------


def quick_path() -> str:
    text = DOC.read_text()
    return text[text.index("## Components from a script") : text.index("## A complete clipper plugin")]


def test_the_quick_path_script_loads_from_its_file_and_computes_ppos_clip(tmp_path, monkeypatch):
    """The section's file and config, as a reader saves them: the config loads the file, the clipper is found under
    the script's origin, and it is PPO's clip with ``eps`` on both sides (loss, gradient and flags)."""
    from rlzoo import local_plugins
    from rlzoo.config.resolution import load_config

    [code] = FENCE.findall(quick_path())
    [config_text] = re.findall(r"^```yaml\n(.*?)^```", quick_path(), re.S | re.M)
    (tmp_path / "my_loss.py").write_text(code)
    (tmp_path / "run.yaml").write_text(config_text)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(local_plugins, "_LOADED", {})
    monkeypatch.delitem(sys.modules, "my_loss", raising=False)
    registry = Registry.discover()
    try:
        config = load_config(tmp_path / "run.yaml", registry=registry)
    finally:
        sys.modules.pop("my_loss", None)
    assert config.plugins == [str(tmp_path / "my_loss.py")]
    assert config.algorithm.clipper.model_dump() == {"name": "my-clip", "eps": 0.15}
    assert registry.get("clipper", "my-clip").distribution == "script my_loss.py"
    mine = registry.create("clipper", "my-clip", {"eps": 0.15})
    ppo = registry.create("clipper", "ppo", {"eps_low": 0.15, "eps_high": 0.15})
    results = []
    for clipper in (mine, ppo):
        ratio = torch.tensor([[0.5, 0.9, 1.0, 1.1, 1.3], [0.7, 1.2, 0.95, 1.5, 0.8]], requires_grad=True)
        advantages = torch.tensor([[1.0, -1.0, 2.0, 1.0, 1.0], [-1.0, -2.0, 1.0, -1.0, 1.0]])
        result = clipper.clip(ratio, advantages)
        result.loss.sum().backward()
        results.append((result.loss.detach(), ratio.grad, result.clipped_low, result.clipped_high))
    for got, expected in zip(*results):
        assert torch.equal(got, expected)
    assert results[0][2].any() and results[0][3].any()  # both flags occur in this batch


def test_the_quick_path_commands_parse_as_the_cli_does():
    import shlex

    from rlzoo.cli import parser

    [bash] = re.findall(r"^```bash\n(.*?)^```", quick_path(), re.S | re.M)
    lines = [line.split("#")[0].strip() for line in bash.splitlines() if line.strip()]
    assert len(lines) == 3 and all("--plugin my_loss.py" in line for line in lines)
    for line in lines:
        args = parser().parse_args(shlex.split(line)[1:])
        assert args.plugin == ["my_loss.py"]
