"""A report chart is drawn once into its PNG (issue 34): the bytes a figure laid out and saved
the way matplotlib does by default gives, without its second, output-less draw."""

import io

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from gpu_pipeline.lib.io.report import charts


def _figure():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(range(10), [x * x for x in range(10)], label="GPU-minutes")
    ax.set_title("a chart")
    ax.set_xlabel("hour (UTC)")
    ax.legend()
    return fig


def test_a_chart_is_drawn_once_to_the_same_png(monkeypatch):
    fig = _figure()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)  # the layout engine left on: drawn twice
    plt.close(fig)
    draws: list[int] = []
    real = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, r: draws.append(1) or real(self, r))
    png = charts._png(_figure())
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == buf.getvalue()
    assert len(draws) == 1


def test_a_label_with_dollar_signs_is_text_not_a_formula():
    """A namespace (or model, host) written `team-$\\x$` failed the day's report: matplotlib
    parsed it as mathtext (adversarial review). It is drawn as the text it is."""
    import polars as pl

    from gpu_pipeline.lib.money import MONEY

    row = {c: 1.0 for c in MONEY} | {"namespace": "team-$\\x$"}
    chart = charts.waste(pl.DataFrame([row, row | {"namespace": "a $b$ c"}]))
    assert chart.png[:8] == b"\x89PNG\r\n\x1a\n"
