"""The report's loss-and-spend chart and tables, as pure functions over a resumed run's records."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

from tasks.report import attempt_rows, loss_and_spend_chart
from thrifty.numbers import amount, metric, money
from thrifty.report import chart
from thrifty.money.ledger import Attempt

T0 = 1_800_000_000.0


def resumed_run() -> tuple[list[dict], list[Attempt]]:
    """Attempt 1 logs steps 5..30 and checkpoints at 20; it is preempted, and attempt 2 resumes at 20 and trains
    20..50 again: steps 25 and 30 are logged twice, the second time by the attempt whose weights survive."""
    first = [{"time_unix": T0 + s, "step": s, "loss": 3.0 - s / 100} for s in (5, 10, 15, 20, 25, 30)]
    second = [{"time_unix": T0 + 100, "event": "start", "step": 20, "total_steps": 50, "resumes": 1}]
    second += [{"time_unix": T0 + 80 + s, "step": s, "loss": 2.0 - s / 100} for s in (25, 30, 35, 40, 45, 50)]
    attempts = [Attempt("job", 1, "aws", "local", "g5.xlarge", True, 3.6, 1, T0, ended_unix=T0 + 40,
                        end_reason="preempted", exit_code=0),
                Attempt("job", 2, "aws", "local", "g5.xlarge", True, 3.6, 1, T0 + 90, ended_unix=T0 + 140,
                        end_reason="succeeded", exit_code=0)]
    return second + first, attempts  # files in any order: the curve sorts them


def test_curve_has_each_step_once_and_the_surviving_attempt_wins():
    metrics, _ = resumed_run()
    curve = chart.training_curve(metrics)
    assert [r["step"] for r in curve] == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50]
    assert curve[4]["loss"] == 2.0 - 0.25 and curve[-1]["loss"] == 2.0 - 0.5  # ends at the final loss


def test_sample_keeps_first_and_last_without_repeats():
    rows = list(range(88))
    picked = chart.sample(rows, 12)
    assert picked[0] == 0 and picked[-1] == 87 and len(picked) == len(set(picked)) == 12
    assert chart.sample(rows[:5], 12) == rows[:5]


def test_chart_is_an_svg_image_with_both_lines_and_the_resume():
    metrics, attempts = resumed_run()
    md = loss_and_spend_chart(metrics, attempts, max_usd=1.0, points=4)
    src = re.search(r"!\[loss and spend over time\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", md).group(1)
    svg = ET.fromstring(base64.b64decode(src))  # well-formed XML, or the browser draws nothing
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    # ten logged steps, and the run's end: the spend line closes at what the ledger says the run spent
    assert len(lines) == 2 and all(len(line.get("points").split()) == 11 for line in lines)
    assert b"resumed" in base64.b64decode(src)
    assert f"Loss {metric(2.95)} → {metric(1.5)} over 50 steps" in md and "Loss 2.95 → 1.5 over" in md
    table = [line for line in md.splitlines() if re.match(r"\| [0-9.]+ \| \d+ \|", line)]
    assert [int(line.split("|")[2]) for line in table] == [5, 20, 40, 50]
    # spend is cumulative over both attempts: 40 s of attempt 1 and 50 s of attempt 2 at $3.6/h by the run's end
    # (its last logged step came 10 s before that)
    ledger = sum(a.cost_usd() for a in attempts)
    assert ledger == 90 * 3.6 / 3600 and table[-1].endswith(f"| {amount(ledger)} |")
    assert f"spend {money(ledger)} of the $1 budget" in md and "spend $0.09 of" in md
    assert f"spend {chart.fmt_usd(ledger)} of" in base64.b64decode(src).decode()


def test_money_never_prints_minus_zero_and_attempt_rows_are_narrow():
    assert money(-0.0) == "$0.00" and money(-0.5) == "-$0.50" and amount(0.00359952) == "0.0036"
    _, attempts = resumed_run()
    rows = attempt_rows(attempts)
    assert [r["end"] for r in rows] == ["preempted", "succeeded"] and len(rows[0]) <= 8


def decoded(md: str) -> str:
    src = re.search(r"\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", md).group(1)
    return base64.b64decode(src).decode()


def test_the_chart_shows_the_validation_loss_labelled_axes_and_the_cap_within_reach():
    metrics, attempts = resumed_run()
    metrics += [{"time_unix": T0 + 20.5, "event": "eval", "step": 20, "val_loss": 2.5, "val_accuracy": 0.4},
                {"time_unix": T0 + 131, "event": "eval", "step": 50, "val_loss": 1.75, "val_accuracy": 0.6}]
    spent = sum(a.cost_usd() for a in attempts)
    text = decoded(loss_and_spend_chart(metrics, attempts, max_usd=spent * 2))
    svg = ET.fromstring(text)
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 3 and len(lines[2].get("points").split()) == 2  # train loss, spend, val_loss at 20 and 50
    assert "val_loss 1.75" in text and "- - val_loss" in text
    assert "optimizer step" in text and "spend (USD)" in text and ">loss<" in text
    cap = [e for e in svg.iter("{http://www.w3.org/2000/svg}line") if e.get("stroke-dasharray") == "6 4"]
    assert len(cap) == 1 and f"cap {chart.fmt_usd(spent * 2)}" in text
    far = decoded(loss_and_spend_chart(metrics, attempts, max_usd=spent * 100))
    assert "(above the chart)" in far and 'stroke-dasharray="6 4"' not in far


def test_a_loss_that_spans_decades_is_drawn_on_a_log_scale():
    attempts = [Attempt("job", 1, "aws", "local", "g5.xlarge", True, 3.6, 1, T0, ended_unix=T0 + 100,
                        end_reason="succeeded", exit_code=0)]
    falling = [{"time_unix": T0 + s, "step": s, "loss": 100.0 / s} for s in range(1, 101)]
    svg = decoded(loss_and_spend_chart(falling, attempts))
    assert "loss (log scale)" in svg
    points = [tuple(map(float, p.split(","))) for p in ET.fromstring(svg).findall(
        "{http://www.w3.org/2000/svg}polyline")[1].get("points").split()]
    ys = [y for _, y in points]
    # on a log axis the drop from 100 to 10 takes as much height as the drop from 10 to 1
    assert abs((ys[9] - ys[0]) - (ys[99] - ys[9])) < 1.0
    assert "loss (log scale)" not in decoded(loss_and_spend_chart(resumed_run()[0], resumed_run()[1]))


def test_the_sweep_chart_spreads_its_points_over_the_axis_and_names_the_cap():
    from thrifty.sweep.report import ChartPoint, svg

    points = [ChartPoint(0.001 * i, 1.0 / i, f"t{i}") for i in range(1, 6)]
    text = svg(points, "min", "val_loss", max_usd=1.0)
    xs = [float(c.get("cx")) for c in ET.fromstring(text).iter("{http://www.w3.org/2000/svg}circle")]
    assert max(xs) > 0.8 * chart.WIDTH  # the last point near the right end, not in the left fifth
    assert "(cap $1.00)" in text
