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


def _drawn_figure(monkeypatch, draw):
    """The figure `draw()` makes, laid out and drawn as `_png` would, before it is saved."""
    figs = []

    def keep(fig):
        fig.tight_layout()
        fig.canvas.draw()
        figs.append(fig)
        return b""

    monkeypatch.setattr(charts, "_png", keep)
    draw()
    (fig,) = figs
    return fig


def _inside(ax, text) -> bool:
    box = text.get_window_extent(ax.figure.canvas.get_renderer())
    return ax.bbox.x0 <= box.x0 and box.x1 <= ax.bbox.x1 and ax.bbox.y0 <= box.y0 <= ax.bbox.y1


def test_an_unpriced_namespace_has_its_row_on_the_recommendations_chart(monkeypatch):
    """A namespace whose model has no price (SPEC: kept, never dropped) has null savings: sorted
    first, its NaN bars fell outside the autoscaled rows, so its row had no label and its
    "n/a (no price)" stood on the x axis's tick labels (adversarial review). It has a row like
    the others, the n/a where its bar would be."""
    import polars as pl

    rec = pl.DataFrame(
        {
            "namespace": ["train", "unpriced-ns", "serve"],
            "utilization_savings_frac": [0.2, None, 0.1],
            "total_savings_frac": [0.6, None, 0.5],
            "monthly_savings_usd": [1200.0, None, 900.0],
        }
    )
    fig = _drawn_figure(monkeypatch, lambda: charts.recommendations(rec))
    ax = fig.axes[0]
    lo, hi = sorted(ax.get_ylim())
    rows = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)}
    assert set(rows) == {"train", "unpriced-ns", "serve"}
    for name, y in rows.items():  # every row inside the axes, with room for its bar
        assert lo <= y - 0.4 and y + 0.4 <= hi, (name, y, (lo, hi))
    assert len(set(rows.values())) == 3
    (na,) = [t for t in ax.texts if t.get_text() == "n/a (no price)"]
    assert na.get_position()[1] == rows["unpriced-ns"]
    assert na.get_position()[0] < 5  # where its bar would start
    for t in ax.texts:  # every savings label in the plot, none on the axis below
        assert _inside(ax, t), t.get_text()
    plt.close(fig)


def test_a_model_without_figures_has_its_slot_on_the_models_chart(monkeypatch):
    """The same NaN bars on the model chart: a last model without utilization or RFU stood at
    the axes' edge. Its slot is whole, and says n/a."""
    import polars as pl

    g = pl.DataFrame(
        {
            "gpu_model": ["A100", "Acme X1"],
            "gpus": [3, 1],
            "gpu_util_pct": [50.0, None],
            "rfu_pct": [30.0, None],
        }
    )
    fig = _drawn_figure(monkeypatch, lambda: charts.models(g))
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert list(ax.get_xticks()) == [0, 1] and lo <= -0.4 and hi >= 1.4
    na = [t for t in ax.texts if t.get_text() == "n/a"]
    assert sorted(t.get_position()[0] for t in na) == [0.8, 1.2]
    assert all(_inside(ax, t) for t in na)
    plt.close(fig)
