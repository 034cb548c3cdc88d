"""Text reports the CLI, `make demo` and `make bench` print: tables and per-family model reports.

Blocks hold data (figures, legends, tier contents); the reports that run flows live here.
"""

from flows.toolchain import BUILD_ROOT

__all__ = ["table", "tier_report", "model_reports"]


def table(headers, rows):
    """A plain-text table: headers, a rule, then the rows, columns padded to their widest cell."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def tier_report(block):
    """The 2D/3D table of a two-tier block in its first demo configuration."""
    from flows.threed import synthesize_3d
    params = block.demo_configs[0]
    r = synthesize_3d(block, block.config(**params))
    shown = " ".join(f"{key}={value}" for key, value in params.items()) or "(defaults)"
    top_holds, bottom_holds = block.tier_contents
    return "\n".join([
        f"{block.name} {shown}, two-tier 3D build (moegen synth {block.name} --3d)",
        f"  tier top (die 0: {top_holds}): {r['top']['cells']} cells",
        f"  tier bottom (die 1: {bottom_holds}): {r['bottom']['cells']} cells",
        f"  2D (one die): {r['2d']['cells']} cells; bonds {r['bonds']['down']} down, "
        f"{r['bonds']['up']} up",
        f"  footprint estimate (largest tier / 2D): {r['footprint_ratio']:.2f}"])


def _ndp_schedule(measured):
    from flows import ndp_schedule       # imported late: the flow needs matplotlib
    rows = ndp_schedule.run()
    out = BUILD_ROOT / "demo"
    out.mkdir(parents=True, exist_ok=True)
    plot = ndp_schedule.plot(rows, out / "ndp_schedule.png")
    ndp_schedule.write_json(rows, out / "ndp_schedule.json")
    return ("NDP schedule model (moegen schedule): one MoE layer, speedup over MoNDE\n"
            + ndp_schedule.format_table(rows) + f"\nplot: {plot}")


def _spiking_moe_layer(measured):
    if not measured:
        return ""
    figures = measured["metrics"]
    return "\n".join([
        "spiking_moe, one full layer with K = 1 on Verilator, checked against "
        "golden.spiking_moe:",
        f"  routing histogram (tokens per expert): {measured['routing_histogram']}",
        f"  spike rates: input {figures['input_spike_rate']}, output "
        f"{figures['output_spike_rate']}",
        f"  {figures['cycles']} cycles (every phase on the golden cycle model), "
        f"{figures['synaptic_ops_per_cycle']} synaptic ops/cycle of "
        f"{figures['peak_ops_per_cycle']} peak"])


# Reports of a family's models beyond its measured figures, by block name:
# ``report(measured) -> str``, ``measured`` being what the block's first demo configuration's
# ``test_throughput`` wrote (None when it did not run).
_MODEL_REPORTS = {"ndp_core": _ndp_schedule, "spiking_moe": _spiking_moe_layer}


def model_reports(block, measured):
    """The reports printed after the `make demo` table for ``block``: its model reports and,
    for a two-tier block, the 2D/3D table."""
    texts = []
    if block.name in _MODEL_REPORTS:
        texts.append(_MODEL_REPORTS[block.name](measured))
    if block.tiers is not None:
        texts.append(tier_report(block))
    return [text for text in texts if text]
