"""The bench's Pareto plot (PSNR against block work), drawn with PIL only.

One row of panels per step count; one column per forecast (none, TaylorSeer order 1, order 2), with
ComfyUI's EasyCache/LazyCache (grey/black diamonds) and the uncached sampler at fewer steps (thick maroon
line, crosses: the baseline every method must beat) in every panel for reference. One curve per method
(its sweep, in sweep order), colour = caching method. Outputs identical to the uncached run (PSNR inf)
sit on the top row; every threshold sweep starts there (caching off). PSNR below 20 dB is drawn as an
open circle on the bottom edge.
"""
from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from .bench_results import per_steps

SCALE = 2  # drawn at twice the size, then downsampled: smooth lines without an antialiasing API
PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207),
           (140, 86, 75), (227, 119, 194), (188, 189, 34)]
PEER_COLOURS = {"EasyCache": (150, 150, 150), "EasyCache (input copied)": (0, 0, 0), "LazyCache": (110, 110, 110)}
PEER_DASH = {"EasyCache": (3, 4), "LazyCache": (10, 5)}
OTHER_PEER = [(90, 60, 20), (60, 90, 20), (20, 60, 90)]
FEWER_STEPS_STYLE = ((128, 0, 38), None, "cross", 3)  # the uncached sampler at fewer steps: thick maroon, crosses
FEWER_STEPS_LABEL = "fewer steps (uncached)"


def _font(size: int):
    try:
        return ImageFont.load_default(size=size * SCALE)
    except TypeError:  # Pillow < 10.1: bitmap font only
        return ImageFont.load_default()


def _text_size(draw, text, font):
    box = draw.textbbox((0, 0), text, font=font)
    return box[2] - box[0], box[3] - box[1]


def _wrap(draw, text, font, width) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if line and _text_size(draw, trial, font)[0] > width:
            lines.append(line)
            line = word
        else:
            line = trial
    return lines + [line] if line else lines


def _dashed(draw, points, fill, width, pattern):
    """A polyline with a dash pattern (on, off) in pixels; solid when ``pattern`` is None."""
    if pattern is None:
        draw.line(points, fill=fill, width=width, joint="curve")
        return
    on, off = pattern
    carry, drawing = 0.0, True
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        length = math.hypot(x1 - x0, y1 - y0)
        pos = 0.0
        while pos < length:
            step = min((on if drawing else off) - carry, length - pos)
            if drawing:
                a, b = pos / length, (pos + step) / length
                draw.line([(x0 + (x1 - x0) * a, y0 + (y1 - y0) * a), (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b)],
                          fill=fill, width=width)
            pos += step
            carry += step
            if carry >= (on if drawing else off) - 1e-9:
                carry, drawing = 0.0, not drawing


def _marker(draw, x, y, shape, colour, r):
    if shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)
    elif shape == "square":
        draw.rectangle([x - r, y - r, x + r, y + r], fill=colour)
    elif shape == "triangle":
        draw.polygon([(x, y - r * 1.2), (x - r * 1.1, y + r * 0.8), (x + r * 1.1, y + r * 0.8)], fill=colour)
    elif shape == "cross":
        w = max(1, int(r / 2))
        draw.line([(x - r, y - r), (x + r, y + r)], fill=colour, width=w)
        draw.line([(x - r, y + r), (x + r, y - r)], fill=colour, width=w)
    else:  # diamond
        draw.polygon([(x, y - r * 1.3), (x + r * 1.3, y), (x, y + r * 1.3), (x - r * 1.3, y)], fill=colour)


def styles(curves: list[dict]) -> dict:
    """Colour, dash pattern, marker and line width per curve label (colour by method family)."""
    families = []
    for c in curves:
        if c["source"] == "pack" and c["family"] not in families:
            families.append(c["family"])
    out, other = {}, 0
    for c in curves:
        ts = c["taylorseer"]
        if c["source"] == "pack":
            colour = PALETTE[families.index(c["family"]) % len(PALETTE)]
            dash = {None: None, 1: (7, 5), 2: (2, 4)}.get(ts, (12, 4))
            marker = {None: "circle", 1: "square", 2: "triangle"}.get(ts, "diamond")
            width = 2
        else:
            colour = PEER_COLOURS.get(c["family"])
            if colour is None:
                colour = OTHER_PEER[other % len(OTHER_PEER)]
                other += 1
            dash, marker, width = PEER_DASH.get(c["family"]), "diamond", 3
        out[c["method"]] = (colour, dash, marker, width)
    return out, families


def _group(curve: dict):
    """Which column a curve is drawn in: peers in every one; pack curves by TaylorSeer order (a planning
    method, which forecasts with TaylorSeer order 1 itself, with order 1)."""
    if curve["source"] != "pack":
        return "peer"
    if curve.get("estimator"):
        return "spectrum"
    if curve["taylorseer"] is None and curve.get("kind") == "planned":
        return 1
    return curve["taylorseer"]


def front(rows: list[dict]) -> list[dict]:
    """The settings of a grid sweep that no other one beats (as little work or less and as high a PSNR or
    higher, better in one), from the most work to the least: the curve a grid is drawn as."""
    kept = [r for r in rows if not any(o is not r and o["work"] <= r["work"] and o["psnr"] >= r["psnr"]
                                       and (o["work"] < r["work"] or o["psnr"] > r["psnr"]) for o in rows)]
    return sorted(kept, key=lambda r: -r["work"])


GROUP_TITLES = {None: "no forecast (reuse)", 1: "+ TaylorSeer order 1", 2: "+ TaylorSeer order 2",
                "spectrum": "+ Spectrum Forecast"}


def pareto(results: dict, path: Path, panel=(600, 470)) -> Path:
    steps_list = list(per_steps(results))
    curves: dict[str, dict] = {}
    for steps in steps_list:
        for r in per_steps(results)[steps]["rows"]:
            curves.setdefault(r["method"], {"method": r["method"], "family": r["family"], "source": r["source"],
                                            "taylorseer": r["taylorseer"], "kind": r.get("kind"),
                                            "estimator": r.get("estimator")})
    style, families = styles(list(curves.values()))
    groups = [g for g in (None, 1, 2) if any(_group(c) == g for c in curves.values())] or [None]
    for c in curves.values():  # other orders (0) get their own column
        g = _group(c)
        if g != "peer" and g not in groups:
            groups.append(g)
    y_lo, y_hi = 20.0, 60.0
    s = SCALE
    pw, ph = panel
    margin_l, margin_r, margin_t, margin_b = 70, 16, 58, 58
    title_h = 44
    peers = [c for c in curves.values() if c["source"] != "pack"]
    legend_items = [(f, PALETTE[i % len(PALETTE)], None, "circle", 2) for i, f in enumerate(families)]
    legend_items += [(c["method"], *style[c["method"]]) for c in peers]
    if any(per_steps(results)[st].get("fewer_steps") for st in steps_list):
        legend_items.append((FEWER_STEPS_LABEL, *FEWER_STEPS_STYLE))
    width = len(groups) * pw
    probe = ImageDraw.Draw(Image.new("RGB", (8, 8)))
    widest = max((_text_size(probe, item[0], _font(15))[0] / s for item in legend_items), default=100)
    legend_cols = max(1, int((width - margin_l - margin_r) // (widest + 80)))
    legend_h = 56 + 18 + 26 * math.ceil(len(legend_items) / legend_cols)
    height = title_h + len(steps_list) * ph + legend_h
    img = Image.new("RGB", (width * s, height * s), "white")
    d = ImageDraw.Draw(img)
    title_font, font, small = _font(20), _font(15), _font(13)
    meta = results["meta"]
    model = meta.get("model", "digits")
    name = {"video": "Wan 2.1 video", "photos": "Flux photos"}.get(model, "Flux digits")
    batch = len(meta["digits"] if model == "digits" else meta["classes"])
    title = (f"PSNR against transformer-block work: tiny {name} model, "
             f"{meta['sampler']}, cfg {meta['cfg']:g}, batch {batch}, seed {meta['seed']}")
    tw, _ = _text_size(d, title, title_font)
    d.text(((width * s - tw) / 2, 10 * s), title, fill="black", font=title_font)

    for row_i, steps in enumerate(steps_list):
        rows = per_steps(results)[steps]["rows"]
        for col_i, group in enumerate(groups):
            ox, oy = col_i * pw, title_h + row_i * ph
            x0, x1 = ox + margin_l, ox + pw - margin_r
            y0, y1 = oy + margin_t, oy + ph - margin_b
            top_row = y0 + 16
            scale_top = y0 + 38

            def X(work):
                return s * (x0 + (x1 - x0) * work)

            def Y(db):
                if db is None or math.isinf(db):
                    return s * top_row
                db = min(max(db, y_lo), y_hi)
                return s * (y1 - (y1 - scale_top) * (db - y_lo) / (y_hi - y_lo))

            d.rectangle([x0 * s, y0 * s, x1 * s, y1 * s], outline="black", width=s)
            for k in range(11):
                xv = k / 10
                d.line([X(xv), y0 * s, X(xv), y1 * s], fill=(235, 235, 235), width=1)
                if k % 2 == 0:
                    label = f"{xv:.1f}"
                    lw, _ = _text_size(d, label, small)
                    d.text((X(xv) - lw / 2, (y1 + 5) * s), label, fill="black", font=small)
            db = y_lo
            while db <= y_hi + 1e-9:
                target = db in (30, 35, 40, 45)
                _dashed(d, [(x0 * s, Y(db)), (x1 * s, Y(db))], (170, 170, 170) if target else (235, 235, 235),
                        s if target else 1, (6 * s, 4 * s) if target else None)
                label = f"{db:g}"
                lw, lh = _text_size(d, label, small)
                d.text(((x0 - 6) * s - lw, Y(db) - lh / 2 - 2 * s), label, fill="black", font=small)
                db += 5
            d.line([x0 * s, (top_row + 11) * s, x1 * s, (top_row + 11) * s], fill=(200, 200, 200), width=1)
            lw, lh = _text_size(d, "same", small)
            d.text(((x0 - 6) * s - lw, s * top_row - lh / 2 - 2 * s), "same", fill="black", font=small)
            xlabel = "block work vs uncached (lower = faster)"
            lw, _ = _text_size(d, xlabel, small)
            d.text(((x0 + x1) / 2 * s - lw / 2, (y1 + 24) * s), xlabel, fill="black", font=small)
            heading = f"{steps} steps, {GROUP_TITLES.get(group, f'TaylorSeer order {group}')}"
            lw, _ = _text_size(d, heading, font)
            d.text(((x0 + x1) / 2 * s - lw / 2, (y0 - 24) * s), heading, fill="black", font=font)
            ylabel = Image.new("RGB", (200 * s, 20 * s), "white")
            ImageDraw.Draw(ylabel).text((0, 0), "PSNR vs uncached (dB)", fill="black", font=small)
            ylabel = ylabel.rotate(90, expand=True)
            img.paste(ylabel, (int((x0 - 64) * s), int(((y0 + y1) / 2 - 80) * s)))

            by_curve: dict[str, list] = {}
            for r in rows:
                if r.get("error") or r.get("work") is None or r.get("psnr") is None:
                    continue
                g = _group(curves[r["method"]])
                if g == group or g == "peer":
                    by_curve.setdefault(r["method"], []).append(r)
            fewer = sorted((r for r in per_steps(results)[steps].get("fewer_steps") or []
                            if not r.get("error") and r.get("work") is not None and r.get("psnr") is not None),
                           key=lambda r: -r["work"])
            if fewer:  # from the full-step run itself (work 1, the same output) down to the fewest steps
                colour, _, marker, lw_ = FEWER_STEPS_STYLE
                pts = [(X(1.0), Y(math.inf))] + [(X(r["work"]), Y(r["psnr"])) for r in fewer]
                _dashed(d, pts, colour, lw_ * s, None)
                for (x, y), r in zip(pts[1:], fewer):
                    if r["psnr"] < y_lo:
                        d.ellipse([x - 5 * s, y - 5 * s, x + 5 * s, y + 5 * s], outline=colour, width=s)
                    else:
                        _marker(d, x, y, marker, colour, 6 * s)
            for m, rs in by_curve.items():
                if any(isinstance(r.get("value"), dict) for r in rs):  # a grid (a peer's schedule): its front
                    by_curve[m] = front(rs)
            order = sorted(by_curve, key=lambda m: curves[m]["source"] == "pack")  # pack curves on top
            for m in order:
                colour, dash, marker, lw_ = style[m]
                pts = [(X(r["work"]), Y(r["psnr"])) for r in by_curve[m]]
                if curves[m].get("kind") != "planned" and not any(r.get("identical") for r in by_curve[m]):
                    pts.insert(0, (X(1.0), Y(math.inf)))  # caching off: the uncached output, for every method
                if len(pts) > 1:
                    _dashed(d, pts, colour, lw_ * s, None if dash is None else (dash[0] * s, dash[1] * s))
                for (x, y), r in zip(pts[-len(by_curve[m]):], by_curve[m]):
                    if r["psnr"] < y_lo:  # off the scale: an open marker on the bottom edge
                        d.ellipse([x - 5 * s, y - 5 * s, x + 5 * s, y + 5 * s], outline=colour, width=s)
                    else:
                        _marker(d, x, y, marker, colour, 4.5 * s)

    # legend: method colours, then the line/marker code, then the peers
    ly = title_h + len(steps_list) * ph + 4
    note = ("Colour = method. Solid/circle: cached result reused; dashed/square: TaylorSeer order 1 forecast; "
            "dotted/triangle: order 2. A peer swept over a grid of settings (a Spectrum port's schedule) is drawn as "
            "the settings none of its others beats. PSNR above 60 dB is drawn at 60; open circles on the bottom "
            "edge: below 20 dB.")
    note_lines = _wrap(d, note, small, (width - margin_l - margin_r) * s)
    for k, line in enumerate(note_lines):
        d.text((margin_l * s, (ly + 18 * k) * s), line, fill="black", font=small)
    ly += 18 * (len(note_lines) - 1)
    col_w = (width - margin_l - margin_r) / legend_cols
    for i, (label, colour, dash, marker, lw_) in enumerate(legend_items):
        cx = margin_l + (i % legend_cols) * col_w
        cy = ly + 36 + (i // legend_cols) * 26
        _dashed(d, [(cx * s, cy * s), ((cx + 40) * s, cy * s)], colour, lw_ * s,
                None if dash is None else (dash[0] * s, dash[1] * s))
        _marker(d, (cx + 20) * s, cy * s, marker, colour, 4.5 * s)
        _, th = _text_size(d, label, font)
        d.text(((cx + 50) * s, cy * s - th / 2 - 3 * s), label, fill="black", font=font)

    img = img.resize((width, height), Image.LANCZOS)
    img.convert("P", palette=Image.ADAPTIVE, colors=256).save(path, optimize=True)  # a third of the size
    return Path(path)
