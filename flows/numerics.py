"""`moegen numerics`: the FP8 accumulation-precision finding of seed 003 §3.1, reproduced.

For K-long E4M3 dot products the relative error against the exact sum of the exact products
(``golden.fp.exact_dot``), for three accumulations of ``golden.fp.dot`` (the numerics the
``fp_dot`` hardware is specified to: groups of 32 products aligned to the largest exponent with
the accumulator, truncated to ``acc_frac`` fraction bits):

* ``acc_frac`` 13 without promotion (Hopper's FP22 accumulation over the whole K);
* ``acc_frac`` 13 promoted into FP32 every 128 elements (DeepSeek-V3's fix);
* ``acc_frac`` 23 without promotion (FP32-like).

Inputs: ``random``, both operands N(0, 1) cast to E4M3 (zero-mean, as activations and weights
after fine-grained scaling), max and mean over the trials; ``crafted``, one product of 256 * 256
followed by K - 1 products of 1 * 1, which a 13-bit accumulator at exponent 16 drops entirely.

A second table (seed 003 §3.2) compares the formats for transmitting activations: per 1 x 128
tile, the relative error of LogFMT-8 and LogFMT-10 as the codec blocks compute them
(``golden.logfmt``, on the tile cast to BF16) and as the float64 rule (``golden.fp``), E4M3 and
E5M2 with one scale per tile (the tile's largest magnitude onto the format's largest finite
value), and BF16, on Gaussian and heavy-tailed (Student t, 2 degrees of freedom) tiles.
"""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np

from flows.reports import table
from golden import fp, logfmt

__all__ = ["LENGTHS", "MODES", "error_table", "format_table", "plot", "run", "TILE_FORMATS",
           "tile_error_table", "format_tile_table"]

LENGTHS = (128, 512, 1024, 4096, 16384)
MODES = {
    "acc_frac 13": fp.DotConfig(group=32, acc_frac=13, promote_every=0),
    "acc_frac 13, promoted every 128": fp.DotConfig(group=32, acc_frac=13, promote_every=128),
    "acc_frac 23": fp.DotConfig(group=32, acc_frac=23, promote_every=0),
}
FORMAT = "fp8_e4m3"


def _relative_error(a, b, config):
    exact = fp.exact_dot(a, b, FORMAT, FORMAT)
    got = Fraction(fp.decode(fp.dot(a, b, FORMAT, FORMAT, config), "fp32"))
    return float(abs(got - exact) / abs(exact))


def _codes(values):
    return [fp.encode(float(v), FORMAT) for v in values]


def error_table(trials=16, seed=1, lengths=LENGTHS):
    """Rows ``{"K", "inputs", mode: {"max", "mean"}}`` for random and crafted inputs."""
    rng = np.random.default_rng(seed)
    rows = []
    for count in lengths:
        errors = {mode: [] for mode in MODES}
        for _ in range(trials):
            a, b = (_codes(rng.normal(0.0, 1.0, count)) for _ in range(2))
            if fp.exact_dot(a, b, FORMAT, FORMAT) == 0:
                continue
            for mode, config in MODES.items():
                errors[mode].append(_relative_error(a, b, config))
        rows.append({"K": count, "inputs": "random",
                     **{mode: {"max": max(v), "mean": float(np.mean(v))}
                        for mode, v in errors.items()}})
        crafted = _codes([256.0] + [1.0] * (count - 1))
        rows.append({"K": count, "inputs": "crafted",
                     **{mode: {"max": _relative_error(crafted, crafted, config)}
                        for mode, config in MODES.items()}})
    return rows


def format_table(rows):
    def cell(figures):
        text = f"{100 * figures['max']:.4f}%"
        return text + (f" (mean {100 * figures['mean']:.4f}%)" if "mean" in figures else "")
    return table(["K", "inputs", *MODES],
                 [(row["K"], row["inputs"], *(cell(row[mode]) for mode in MODES))
                  for row in rows])


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    for axis, inputs in zip(axes, ("random", "crafted")):
        chosen = [row for row in rows if row["inputs"] == inputs]
        for mode in MODES:
            # A relative error of exactly 0 cannot sit on a log axis: drawn at 1e-9.
            axis.plot([row["K"] for row in chosen],
                      [max(row[mode]["max"], 1e-9) for row in chosen], marker="o", label=mode)
        axis.axhline(0.02, color="grey", linestyle=":", label="~2% (DeepSeek-V3, K = 4096)")
        axis.set(xscale="log", yscale="log", xlabel="K (dot-product length)",
                 title=f"E4M3 dot products, {inputs} inputs: max relative error")
        axis.legend(fontsize=8)
    axes[0].set_ylabel("relative error vs the exact sum")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TILE = 128
TILE_FORMATS = ("LogFMT-8", "LogFMT-10", "LogFMT-8 float64", "LogFMT-10 float64", "fp8_e4m3",
                "fp8_e5m2", "bf16")


def _round_trip(tile, name):
    """The tile after encoding in ``name`` and decoding. ``LogFMT-n``: the codec blocks
    (``golden.logfmt``, fixed point) on the tile cast to BF16, their input format;
    ``LogFMT-n float64``: the rule in float64 (``golden.fp.logfmt_encode``); FP8: one scale per
    tile (its largest magnitude onto the format's largest finite value)."""
    if name.endswith(" float64"):
        bits = int(name.split()[0].split("-")[1])
        return fp.logfmt_decode(*fp.logfmt_encode(tile, bits), bits)
    if name.startswith("LogFMT-"):
        bits = int(name.split("-")[1])
        codes, params = logfmt.encode_tile([fp.encode(v, "bf16") for v in tile], bits)
        return [fp.decode(code, "bf16") for code in logfmt.decode_tile(codes, params, bits)]
    if name == "bf16":
        return [fp.decode(fp.encode(v, name), name) for v in tile]
    scale = max(abs(v) for v in tile) / fp.FORMATS[name].max_finite
    return [fp.decode(fp.encode(v / scale, name), name) * scale for v in tile]


def tile_error_table(tiles=200, seed=1):
    """Rows ``{"inputs", format: {"mean", "max"}}``: the relative error |x' - x| / |x| of every
    nonzero element of ``tiles`` 1 x 128 tiles, Gaussian and heavy-tailed."""
    rng = np.random.default_rng(seed)
    rows = []
    for inputs in ("gaussian", "heavy-tailed"):
        errors = {name: [] for name in TILE_FORMATS}
        for _ in range(tiles):
            draw = rng.normal(0.0, 1.0, TILE) if inputs == "gaussian" else \
                rng.standard_t(2, TILE)
            tile = [float(v) for v in draw]
            for name in TILE_FORMATS:
                errors[name] += [abs(y - x) / abs(x) for x, y in zip(tile, _round_trip(tile, name))
                                 if x]
        rows.append({"inputs": inputs, **{name: {"mean": float(np.mean(v)), "max": max(v)}
                                           for name, v in errors.items()}})
    return rows


def format_tile_table(rows):
    return table(["tiles", *TILE_FORMATS],
                 [(row["inputs"], *(f"{100 * row[n]['mean']:.3f}% (max {100 * row[n]['max']:.2f}%)"
                                    for n in TILE_FORMATS)) for row in rows])


def run(output, trials=16, seed=1, tiles=200):
    """The tables (printed), their JSON and the plot under ``output``; returns the rows."""
    rows = error_table(trials, seed)
    print(format_table(rows))
    print("relative error |dot - exact| / |exact|; random: max (and mean) over "
          f"{trials} trials of N(0,1) operands cast to E4M3; crafted: 256*256 then K-1 1*1")
    tile_rows = tile_error_table(tiles, seed)
    print()
    print(format_tile_table(tile_rows))
    print(f"mean (and max) relative error of every nonzero element of {tiles} 1x{TILE} tiles; "
          "LogFMT-n: the logfmt_encoder/decoder blocks (BF16 in and out); float64: the rule "
          "with exact logarithms; FP8 with one scale per tile (largest magnitude onto the "
          "largest finite value)")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "fp8_accumulation.json").write_text(json.dumps(rows, indent=1))
    (output / "tile_formats.json").write_text(json.dumps(tile_rows, indent=1))
    print(f"wrote {output / 'fp8_accumulation.json'} and {output / 'tile_formats.json'}")
    print(f"wrote {plot(rows, output / 'fp8_accumulation.png')}")
    return rows
