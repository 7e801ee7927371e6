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

    rows = [{"step": s, "reward/mean": 0.5, "critic/vf_loss": 1.0 / (s + 1), "critic/explained_variance": 0.1 * s,
             "kl/in_reward": 0.01, "kl/coef": 0.001} for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    titles = []
    original = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, *a, **k: titles.append(t) or original(ax, t, *a, **k))
    assert main(["plot", str(tmp_path)]) == 0
    assert {"critic: explained variance", "critic: value loss", "KL in the reward"} <= set(titles)
    assert "tool calls per episode" not in titles  # no episodes logged: no episode panels
