"""A data file this user may not read (mode 000, without root's override) is refused by the file tasks (issue 36):
``check()`` names the field and the file, and reading it raises a one-line ``DataError``, never a PermissionError.

Root reads any file, so the refusal is stubbed here (``open`` / ``os.listdir`` of the one path fail as they do for
another user); where the tests do not run as root, a real mode-000 file is tried too. Through the real CLI, with
root's privileges dropped: tests/test_fault_table_config.py.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
from pathlib import Path

import pytest

from rlzoo.errors import DataError
from rlzoo_tasks import _common
from rlzoo_tasks.jsonl import JsonlTask

ROWS = "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(8))


def _denied(path: Path) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))


@pytest.fixture
def unreadable(tmp_path, monkeypatch) -> Path:
    """``tmp_path/locked.jsonl``, which this user may not open (and ``tmp_path/locked``, a folder it may not list)."""
    locked = tmp_path / "locked.jsonl"
    locked.write_text(ROWS)
    (tmp_path / "locked").mkdir()

    def fake_open(file, *args, **kwargs):
        if Path(file) == locked:
            raise _denied(locked)
        return builtins.open(file, *args, **kwargs)

    real_listdir = os.listdir
    monkeypatch.setattr(_common, "open", fake_open, raising=False)
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: fake_open(self, *a, **k))
    monkeypatch.setattr(
        _common.os,
        "listdir",
        lambda p: (_ for _ in ()).throw(_denied(Path(p))) if Path(p) == tmp_path / "locked" else real_listdir(p),
    )
    return locked


def test_the_message_names_the_file_why_and_what_to_do(unreadable):
    message = _common.unreadable(unreadable)
    assert message.startswith(f"{unreadable}: Permission denied: this user (uid {os.geteuid()}) may not read it (mode ")
    assert "chmod a+r" in message
    assert _common.unreadable(unreadable.parent / "absent.jsonl") is None  # the caller says "not found"
    assert _common.unreadable(unreadable.parent / "locked").startswith(f"{unreadable.parent / 'locked'}: Permission")


def test_the_jsonl_task_refuses_an_unreadable_train_or_eval_file(unreadable, tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(ROWS.replace("+", "-"))
    task = JsonlTask(JsonlTask.Params(path=str(unreadable), eval_path=str(good)))
    ((field, problem),) = task.check()
    assert field == "path" and "may not read it" in problem
    with pytest.raises(DataError, match=f"{unreadable}: Permission denied"):
        task.samples("train", 1, 0)
    ((field, _),) = JsonlTask(JsonlTask.Params(path=str(good), eval_path=str(unreadable))).check()
    assert field == "eval_path"


def test_the_dataset_task_refuses_an_unreadable_file_or_folder(unreadable, tmp_path):
    pytest.importorskip("datasets")
    from rlzoo_tasks.dataset import DatasetTask

    task = DatasetTask(DatasetTask.Params(path=str(unreadable)))
    assert [(f, "may not read it" in p) for f, p in task.check()] == [("path", True)]
    with pytest.raises(DataError, match=f"{unreadable}: Permission denied"):
        task.samples("train", 1, 0)
    folder = DatasetTask(DatasetTask.Params(path=str(tmp_path / "locked")))  # a save_to_disk folder
    assert [(f, "may not read it" in p) for f, p in folder.check()] == [("path", True)]


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root reads a mode-000 file (its override); the stubbed tests above "
    "and the CLI case run as another user (tests/test_fault_table_config.py) cover it",
)
def test_a_real_mode_000_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(ROWS)
    path.chmod(0)
    try:
        ((field, problem),) = JsonlTask(JsonlTask.Params(path=str(path))).check()
        assert field == "path" and "(mode 000, owner uid " in problem
    finally:
        path.chmod(0o644)
