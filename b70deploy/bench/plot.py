"""A PNG chart of a compare matrix: one panel per metric (their scales differ by 1000x),
grouped bars per context/concurrency, one bar per stack, ratio to the first stack on top.

matplotlib is the optional extra `[plot]`; it is imported only here.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import stats
from .compare import Matrix

PANEL_TITLES = {"prefill": "Prefill (prompt tokens / time to first token)",
                "decode": "Decode (tokens after the first / their time)",
                "aggregate": "Aggregate (completion tokens / wall time)",
                "replay": "Replay of captured traffic (aggregate)"}


def _group_label(metric: str, ctx: int, conc: int) -> str:
    parts = []
    if ctx:
        parts.append(f"{ctx // 1024}K" if ctx % 1024 == 0 else f"{ctx:,}")
    if metric in ("aggregate", "replay") or conc != 1:
        parts.append(f"C={conc}")
    return "\n".join(parts) or "-"


def render(m: Matrix, out: Path, *, title: str | None = None) -> Path:
    try:  # lazy: matplotlib is the optional `plot` extra, needed only when a chart is asked for
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("matplotlib is not installed", where="--plot",
                        fix="pip install 'b70deploy[plot]'") from None
    metrics = sorted({k[0] for k in m.keys}, key=lambda x: ["prefill", "decode", "aggregate", "replay"].index(x)
                     if x in PANEL_TITLES else 9)
    n_cols = len(m.labels)
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(6.0, 4.8 * len(metrics)), 5.2), squeeze=False)
    colors = plt.get_cmap("tab10")
    width = 0.8 / n_cols
    for ax, metric in zip(axes[0], metrics, strict=True):
        keys = [k for k in m.keys if k[0] == metric]
        top = max((v for k in keys for v in m.values[k] if v is not None), default=1.0)
        for col, lab in enumerate(m.labels):
            xs = [i + (col - (n_cols - 1) / 2) * width for i in range(len(keys))]
            heights = [m.values[k][col] or 0.0 for k in keys]
            bars = ax.bar(xs, heights, width * 0.95, label=lab, color=colors(col % 10))
            for bar, k in zip(bars, keys, strict=True):
                v = m.values[k][col]
                r = m.ratio(k, col) if col else None
                text = "n/a" if v is None else stats.fmt_rate(v) + (f"\n{stats.fmt_ratio(r)}" if r is not None else "")
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(keys)), [_group_label(*k) for k in keys])
        ax.set_ylim(0, top * 1.25)
        ax.set_title(PANEL_TITLES.get(metric, metric), fontsize=10)
        ax.set_ylabel("tokens per second")
        ax.set_xlabel("context" if metric in ("prefill", "decode") else "context / concurrency")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(n_cols, 4), frameon=False,
               bbox_to_anchor=(0.5, 0.93))
    others = ", ".join(m.labels[1:])
    fig.suptitle(title or f"b70deploy bench: {others} vs {m.labels[0]} (ratios: new/old)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
