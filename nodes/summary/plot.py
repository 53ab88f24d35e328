"""The tuning plot: what the change metric did against the threshold, evaluation by evaluation.

A pure function of a run's evaluation records (``EvaluationRecord``-like objects: ``step``,
``metric``, ``threshold``, ``skipped`` and, when present, the forward/block counters), drawn with
Pillow and returned as a ComfyUI IMAGE tensor. Nothing here touches ComfyUI.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 960, 540
BACKGROUND = (255, 255, 255)
INK = (33, 33, 33)
MUTED = (110, 110, 110)
GRID = (225, 225, 225)
COMPUTED = (46, 125, 50)
SKIPPED = (239, 108, 0)
SKIPPED_BAND = (255, 236, 214)
METRIC = (21, 101, 192)
THRESHOLD = (198, 40, 40)
NO_CHECK = (189, 189, 189)


@functools.lru_cache(maxsize=None)
def _font(size: int):
    try:  # Pillow >= 10.1 with FreeType ships a scalable default font
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[int, int]:
    box = draw.textbbox((0, 0), text, font=font)
    return box[2] - box[0], box[3] - box[1]


def _nice_step(span: float, target: int = 5) -> float:
    raw = span / max(target, 1)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def _fmt(value: float, step: float) -> str:
    decimals = max(0, -int(math.floor(math.log10(step))) + (1 if step / 10 ** math.floor(math.log10(step)) == 2.5 else 0))
    return f"{value:.{min(decimals, 4)}f}"


def _work_saved(records: Sequence) -> float:
    """Share of model work not done, read as the run summary reads it: the work the records counted per forward
    (``work_done``) over what the plain sampler does (``rows_total``), both in batch rows. Records without
    counters: share of evaluations skipped."""
    whole = sum(getattr(r, "rows_total", 0) for r in records)
    if not whole:
        return sum(1 for r in records if r.skipped) / len(records) if records else 0.0
    return round(1.0 - sum(r.work_done for r in records) / whole, 9)  # as the summary rounds it


def _step_count(records: Sequence) -> int:
    """Steps the records span: a step starts where the step changes (runs may be concatenated, each from step 0;
    a second-order sampler's evaluations of one step are in a row)."""
    return sum(1 for i, r in enumerate(records) if i == 0 or r.step != records[i - 1].step)


def _one_per_step(records: Sequence) -> bool:
    return _step_count(records) == len(records)


def headline(records: Sequence) -> str:
    """One line saying what the records show: computed of total, work saved, estimated speedup. Counted as the run
    summary counts (interceptors/records.py ``counted_in``): in steps where each evaluation is one, else in model
    evaluations."""
    total = len(records)
    computed = sum(1 for r in records if not r.skipped)
    saved = _work_saved(records)
    unit = "steps" if _one_per_step(records) else f"model evaluations ({_step_count(records)} steps)"
    return (f"computed {computed} of {total} {unit}, skipped {total - computed}; "
            f"~{saved:.0%} model work saved (est. {1.0 / max(1.0 - saved, 1e-6):.2f}x)")


def legend(records: Sequence, metric_name: str, threshold_rule: str, thresholds: set) -> list[tuple]:
    """The legend's items, (kind, colour, text), in order."""
    threshold_text = f"threshold {next(iter(thresholds)):.4g}" if len(thresholds) == 1 else "threshold"
    items = [("line", METRIC, metric_name), ("dash", THRESHOLD, f"{threshold_text} ({threshold_rule})"),
             ("box", COMPUTED, "computed"), ("box", SKIPPED, "skipped (reused / forecast)")]
    if any(r.metric is None and not r.skipped for r in records):
        items.append(("mark", NO_CHECK, "not checked"))
    return items


def _dashed(draw, start, end, fill, width=2, dash=8, gap=6):
    (x0, y0), (x1, y1) = start, end
    length = math.hypot(x1 - x0, y1 - y0)
    if length == 0:
        return
    pos = 0.0
    while pos < length:
        a, b = pos / length, min(pos + dash, length) / length
        draw.line([(x0 + (x1 - x0) * a, y0 + (y1 - y0) * a), (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b)],
                  fill=fill, width=width)
        pos += dash + gap


def message_image(lines: Iterable[str], width: int = 512, height: int = 128) -> Image.Image:
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    lines = list(lines)
    fonts = [_font(22)] + [_font(14)] * (len(lines) - 1)
    heights = [_text_size(draw, t, f)[1] + 10 for t, f in zip(lines, fonts)]
    y = (height - sum(heights)) / 2
    for text, font, h in zip(lines, fonts, heights):
        w, _ = _text_size(draw, text, font)
        draw.text(((width - w) / 2, y), text, fill=INK if font is fonts[0] else MUTED, font=font)
        y += h
    return image


def render(records: Sequence, heading: str | None = None, metric_name: str = "change metric",
           width: int = WIDTH, height: int = HEIGHT, threshold_rule: str = "skip below") -> Image.Image:
    """The tuning plot as a PIL image. ``records`` in evaluation order (several runs may be concatenated);
    an empty list gives a small image saying no interceptors ran. ``threshold_rule``: what the threshold means
    (the deciders' ``threshold_rule``), in the legend."""
    records = list(records)
    if not records:
        return message_image(["no interceptors", "connect a caching node to 'interceptors' to see this plot"])
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    f_title, f_sub, f_label, f_tick = _font(20), _font(15), _font(15), _font(13)

    # -- title --------------------------------------------------------------------------------------
    y = 12
    if heading:
        draw.text((20, y), heading, fill=INK, font=f_title)
        y += _text_size(draw, heading, f_title)[1] + 12
    sub = headline(records)
    draw.text((20, y), sub, fill=MUTED if heading else INK, font=f_sub if heading else f_title)
    y += _text_size(draw, sub, f_sub if heading else f_title)[1] + 16

    # -- geometry -----------------------------------------------------------------------------------
    n = len(records)
    left, right = 78, width - 24
    legend_h, xlabel_h, strip_h, ticks_h = 30, 24, 16, 22
    top = y + 6
    bottom = height - legend_h - xlabel_h - strip_h - ticks_h - 14
    cell = (right - left) / n
    xs = [left + (i + 0.5) * cell for i in range(n)]

    values = [r.metric for r in records if r.metric is not None]
    thresholds = [r.threshold for r in records if r.threshold is not None]
    peak = max(values + thresholds + [0.0])
    ymax = peak * 1.15 if peak > 0 else 1.0
    ystep = _nice_step(ymax)
    ymax = math.ceil(ymax / ystep - 1e-9) * ystep

    def ypos(v: float) -> float:
        return bottom - (min(max(v, 0.0), ymax) / ymax) * (bottom - top)

    # skipped evaluations: shaded columns
    for i, r in enumerate(records):
        if r.skipped:
            draw.rectangle([left + i * cell, top, left + (i + 1) * cell, bottom], fill=SKIPPED_BAND)

    # y grid and ticks
    k = 0
    while k * ystep <= ymax + 1e-12:
        v = k * ystep
        yy = ypos(v)
        draw.line([(left, yy), (right, yy)], fill=GRID, width=1)
        label = _fmt(v, ystep)
        w, h = _text_size(draw, label, f_tick)
        draw.text((left - 8 - w, yy - h / 2 - 2), label, fill=MUTED, font=f_tick)
        k += 1
    draw.line([(left, top), (left, bottom)], fill=INK, width=1)
    draw.line([(left, bottom), (right, bottom)], fill=INK, width=1)
    ylabel = metric_name
    w, h = _text_size(draw, ylabel, f_label)
    label_img = Image.new("RGB", (w + 4, h + 6), BACKGROUND)
    ImageDraw.Draw(label_img).text((2, 0), ylabel, fill=INK, font=f_label)
    label_img = label_img.rotate(90, expand=True)
    image.paste(label_img, (6, int((top + bottom) / 2 - label_img.height / 2)))

    # threshold: dashed, per evaluation (it may change along the run), labelled once
    runs_of_threshold: list[tuple[int, int, float]] = []
    for i, r in enumerate(records):
        t = r.threshold
        if t is None:
            continue
        if runs_of_threshold and runs_of_threshold[-1][1] == i - 1 and runs_of_threshold[-1][2] == t:
            runs_of_threshold[-1] = (runs_of_threshold[-1][0], i, t)
        else:
            runs_of_threshold.append((i, i, t))
    for a, b, t in runs_of_threshold:
        _dashed(draw, (left + a * cell, ypos(t)), (left + (b + 1) * cell, ypos(t)), THRESHOLD, width=2)
    # metric: line between consecutive measured evaluations, a marker on each (green computed, orange skipped)
    radius = max(3.0, min(6.0, cell / 4))
    for i in range(1, n):
        a, b = records[i - 1], records[i]
        if a.metric is not None and b.metric is not None:
            draw.line([(xs[i - 1], ypos(a.metric)), (xs[i], ypos(b.metric))], fill=METRIC, width=2)
    for i, r in enumerate(records):
        if r.metric is None:
            continue
        x, yy = xs[i], ypos(r.metric)
        color = SKIPPED if r.skipped else COMPUTED
        draw.ellipse([x - radius, yy - radius, x + radius, yy + radius], fill=color, outline=INK if not r.skipped else color)

    # evaluations the decider did not check (first, last, warm-up, outside start/end): a grey mark on the axis
    for i, r in enumerate(records):
        if r.metric is None and not r.skipped:
            x = xs[i]
            draw.polygon([(x, bottom - 9), (x + 5, bottom - 3), (x - 5, bottom - 3)], fill=NO_CHECK, outline=MUTED)

    # x ticks: the step each evaluation belongs to (1-based); second-order samplers repeat steps
    steps = [getattr(r, "step", i) for i, r in enumerate(records)]
    one_per_step = _one_per_step(records)
    every = next(e for e in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10 ** 9)
                 if len(set(steps)) / e <= 16)
    last_right = -1e9
    for i in range(n):
        first_of_step = i == 0 or steps[i] != steps[i - 1]
        if not first_of_step or not (steps[i] == 0 or (steps[i] + 1) % every == 0):
            continue
        label = str(steps[i] + 1)
        w, h = _text_size(draw, label, f_tick)
        if xs[i] - w / 2 < last_right + 12:
            continue
        last_right = xs[i] + w / 2
        draw.line([(xs[i], bottom), (xs[i], bottom + 4)], fill=INK)
        draw.text((xs[i] - w / 2, bottom + 6), label, fill=MUTED, font=f_tick)

    # decision strip: one cell per evaluation
    sy = bottom + ticks_h + 4
    gap = 1 if cell > 3 else 0
    for i, r in enumerate(records):
        color = SKIPPED if r.skipped else COMPUTED
        draw.rectangle([left + i * cell + gap, sy, left + (i + 1) * cell - gap, sy + strip_h], fill=color)
    label = "decision"
    w, h = _text_size(draw, label, f_tick)
    draw.text((left - 8 - w, sy + (strip_h - h) / 2 - 2), label, fill=MUTED, font=f_tick)
    # Guidance Cache: which evaluations computed the negative (uncond) branch, a thin strip under the first
    negative = [getattr(r, "branches", {}).get("uncond") for r in records]
    if False in negative:
        uy = sy + strip_h + 2
        for i, computed in enumerate(negative):
            if computed is not None:
                draw.rectangle([left + i * cell + gap, uy, left + (i + 1) * cell - gap, uy + strip_h // 2],
                               fill=COMPUTED if computed else SKIPPED)
        w, h = _text_size(draw, "uncond", f_tick)
        draw.text((left - 8 - w, uy + (strip_h // 2 - h) / 2 - 2), "uncond", fill=MUTED, font=f_tick)
        sy += strip_h // 2 + 2

    xlabel = "sampling step" if one_per_step else "sampling step (several model evaluations per step)"
    w, h = _text_size(draw, xlabel, f_label)
    draw.text(((left + right) / 2 - w / 2, sy + strip_h + 6), xlabel, fill=INK, font=f_label)

    # legend, centred under the plot
    ly = height - legend_h + 4
    items = legend(records, metric_name, threshold_rule, {t for _, _, t in runs_of_threshold})
    widths = [32 + _text_size(draw, text, f_tick)[0] + 22 for _, _, text in items]
    x = max(8, (width - sum(widths) + 22) / 2)
    for kind, color, text in items:
        cy = ly + 9
        if kind == "line":
            draw.line([(x, cy), (x + 26, cy)], fill=color, width=2)
            draw.ellipse([x + 9, cy - 4, x + 17, cy + 4], fill=color)
        elif kind == "dash":
            _dashed(draw, (x, cy), (x + 26, cy), color, width=2, dash=7, gap=5)
        elif kind == "mark":
            draw.polygon([(x + 13, cy - 5), (x + 19, cy + 4), (x + 7, cy + 4)], fill=color, outline=MUTED)
        else:
            draw.rectangle([x + 4, cy - 7, x + 22, cy + 7], fill=color)
        w, h = _text_size(draw, text, f_tick)
        draw.text((x + 32, cy - h / 2 - 3), text, fill=INK, font=f_tick)
        x += 32 + w + 22
    return image


def to_tensor(image: Image.Image) -> torch.Tensor:
    """A PIL image as a ComfyUI IMAGE: [1, H, W, 3] float in 0..1."""
    return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / np.float32(255.0)).unsqueeze(0)


def tuning_plot(records: Sequence, heading: str | None = None, metric_name: str = "change metric",
                threshold_rule: str = "skip below") -> torch.Tensor:
    """The tuning plot of ``records`` as a ComfyUI IMAGE tensor [1, H, W, 3]."""
    return to_tensor(render(records, heading=heading, metric_name=metric_name, threshold_rule=threshold_rule))
