"""A population-based sweep's lineage tree as a picture: each member's score at the end of each generation, a solid
line where it continued its own run and a dashed one from the member it forked from where it exploited, so the
lineage of every final member can be read back to the first generation."""
from __future__ import annotations

import io
from typing import Any


def lineage_png(generations: list[dict[str, Any]], title: str, score: str) -> bytes:
    """The figure of `generations` (the sweep's records: per generation its last version, each member's score and,
    between generations, the exploits), as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, on any machine
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.2), dpi=100)
    members = sorted(generations[0]["members"]) if generations else []
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(members)}
    for before, after in zip(generations, generations[1:]):
        sources = {e["member"]: e["source"] for e in before.get("exploits", [])}
        for member in members:
            origin = sources.get(member, member)
            axis.plot([before["version"], after["version"]],
                      [before["members"][origin]["score"], after["members"][member]["score"]],
                      color=colors[member], linestyle="--" if member in sources else "-", linewidth=1.4)
    for member in members:
        points = [(g["version"], g["members"][member]["score"]) for g in generations]
        axis.scatter(*zip(*points), color=colors[member], s=18, zorder=3, label=member)
    axis.set_xlabel("iterations (generation ends)")
    axis.set_ylabel(score.replace("_", " "))
    axis.set_title(f"{title}: dashed = forked from the better member", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="best")
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()
