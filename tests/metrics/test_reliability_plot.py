"""The reliability diagram is a valid PNG, written headless."""

import pytest

from kglightning.metrics.plots import plot_reliability_diagram

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("conf", "correct"),
    [([0.9, 0.8, 0.3, 0.6, 1.0, 0.05], [1, 0, 0, 1, 1, 0]), ([1.0, 1.0], [True, False]), ([0.5], [True])],
)
def test_png_written(tmp_path, conf, correct):
    out = plot_reliability_diagram(conf, correct, tmp_path / "sub" / "rel.png", n_bins=5, title="test")
    data = out.read_bytes()
    assert out == tmp_path / "sub" / "rel.png"
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.shape[0] == 600 and img.shape[1] == 500  # figsize (5, 6) at 100 dpi


def test_no_pyplot_state(tmp_path):
    import sys

    plot_reliability_diagram([0.2, 0.7], [0, 1], tmp_path / "r.png")
    if "matplotlib.pyplot" in sys.modules:  # another test may have imported it; then no figure may leak into it
        import matplotlib.pyplot as plt

        assert plt.get_fignums() == []


def test_the_seed_summary_plot_draws_every_answer_beside_the_graph_nodes(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from kglightning.metrics.plots import plot_seed_summary

    bars = []
    real = Axes.bar
    monkeypatch.setattr(Axes, "bar", lambda self, xs, means, **kw: bars.append((kw["label"], list(means))) or real(
        self, xs, means, **kw))  # fmt: skip
    summary = {"test/f1": {"mean": 0.3, "std": 0.1}, "test/all/f1": {"mean": 0.7, "std": 0.1},
               "test/all/structural/f1": {"mean": 0.6, "std": 0.1}, "test/structural/f1": {"mean": 0.0, "std": 0.0}}  # fmt: skip
    assert plot_seed_summary(summary, tmp_path / "s.png", metrics=("f1",)) is not None
    # one group per method (no "all" method), one bar per population
    assert bars == [("f1 (every answer)", [0.7, 0.6]), ("f1 (nodes)", [0.3, 0.0])]
