"""`rlzoo plot` draws a PNG from metrics.jsonl and refuses an empty run folder clearly."""

from __future__ import annotations

import json

import pytest

from rlzoo.cli import main


def test_plot_writes_a_png(tmp_path, capsys):
    rows = [
        {"step": s, "reward/mean": 0.1 * s, "clip/fraction": 0.2, "kl/old_approx": 0.01, "response/length_mean": 3.0}
        for s in range(5)
    ]
    rows[0]["eval/accuracy"] = 0.3
    rows.append({"step": 5, "eval/accuracy": 0.5, "final": 1.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot", str(tmp_path)]) == 0
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in capsys.readouterr().out


def test_plot_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 1
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_a_run_with_a_critic_gets_its_panels(tmp_path, monkeypatch):
    import matplotlib.axes

    rows = [
        {
            "step": s,
            "reward/mean": 0.5,
            "critic/vf_loss": 1.0 / (s + 1),
            "critic/explained_variance": 0.1 * s,
            "kl/in_reward": 0.01,
            "kl/coef": 0.001,
        }
        for s in range(5)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    titles = []
    original = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_title", lambda ax, t, *a, **k: titles.append(t) or original(ax, t, *a, **k)
    )
    assert main(["plot", str(tmp_path)]) == 0
    assert {"critic: explained variance", "critic: value loss", "KL in the reward"} <= set(titles)
    assert "tool calls per episode" not in titles  # no episodes logged: no episode panels


def test_a_row_without_a_step_is_skipped_naming_its_line(tmp_path, capsys, caplog):
    rows = [
        {"step": 0, "reward/mean": 0.1},
        {"reward/mean": 0.2},
        {"step": True, "reward/mean": 0.3},
        {"step": 1, "reward/mean": 0.4},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot", str(tmp_path)]) == 0  # the two rows with a step are drawn
    assert (tmp_path / "curves.png").is_file()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any('line 2: an object without an integer "step" (none)' in w for w in warned), warned
    assert any('line 3: an object without an integer "step" (True)' in w for w in warned), warned


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe\x00garbage\n\x80\x81\n", "line 1: not valid UTF-8 (invalid start byte at byte 0)"),
        (
            b"not json at all\n{\"step\": 1\n",
            "line 1: not a whole JSON object (a torn or corrupted write): Expecting value",
        ),
        (b'[1, 2]\n{"reward/mean": 1}\n', "line 1: a JSON list, not an object"),
        (b'{"reward/mean": 1}\n', 'line 1: an object without an integer "step" (none)'),
    ],
)
def test_a_file_with_no_readable_row_is_unreadable_not_missing(tmp_path, capsys, content, expected):
    (tmp_path / "metrics.jsonl").write_bytes(content)
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'metrics.jsonl'} is unreadable: {expected}" in err, err
    assert "no metrics.jsonl" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "curves.png").exists()


def test_a_metrics_file_that_cannot_be_read_is_one_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").mkdir()  # a folder where the file should be: reading it fails
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "metrics.jsonl cannot be read: Is a directory" in err and len(err.strip().splitlines()) == 1
