"""DDR4-3200 timing model of an NDP-DIMM feeding the core's weight port (test bench side).

Pure Python: the cocotb bench uses :meth:`Ddr4Stream.beat_ready_cycles` to hold each weight beat
back until the DRAM could have delivered it; pytest checks the command trace with
:func:`check_trace`, which re-verifies every timing rule from the issued commands alone.

Sources
-------
* Timing: JEDEC DDR4-3200AA speed bin as preset in Ramulator 2.0 (``src/dram/impl/DDR4.cpp``,
  ``timing_presets["DDR4_3200AA"]``: nBL 4, nCL 22, nRCD 22, nRP 22, nRAS 52, nRC 74, nRTP 12,
  nCCDS 4, nCCDL 8, tCK 625 ps), with nRRD_S 4, nRRD_L 8 and nFAW 34 clocks, the values
  Ramulator derives for a 1 KB page (x8 devices) at 3200 MT/s.
* Organization: seed 002 Table I (4 ranks per DIMM, 8 bank groups per rank, 4 banks per group,
  102.4 GB/s internal): each rank is a 64-bit channel of x8 devices (8 KB row), BL8 = 64 B per
  rank per burst; the NDP core's central buffer reads all 4 ranks in lock step, so one logical
  burst is 256 B over 4 clocks = 64 B per clock = 102.4 GB/s at 1.6 GHz.

Model
-----
The core runs at the DRAM clock (tCK 0.625 ns), so one clock = one core cycle. Weights are laid
out contiguously in stream order; logical burst k maps to bank group ``k % 8``, column
``(k // 8) % 128``, bank ``(k // 1024) % 4``, row ``k // 4096`` (consecutive bursts alternate
bank groups, so reads can go every tCCD_S). The controller reads in order with an open-page
policy and activates the banks of upcoming bursts early (up to ``lookahead`` bursts ahead), one
command per clock. Refresh, write traffic and bus turnaround are not modelled.
"""

import dataclasses
import math

__all__ = ["Timing", "DDR4_3200AA", "Organization", "TABLE_I", "Command", "Ddr4Stream",
           "check_trace"]


@dataclasses.dataclass(frozen=True)
class Timing:
    """DDR4 timings in clocks (see module docstring for the source)."""
    tCK_ns: float = 0.625
    BL: int = 4          # BL8 occupies the data bus for 4 clocks
    CL: int = 22
    RCD: int = 22
    RP: int = 22
    RAS: int = 52
    RC: int = 74
    RTP: int = 12
    CCD_S: int = 4
    CCD_L: int = 8
    RRD_S: int = 4
    RRD_L: int = 8
    FAW: int = 34


DDR4_3200AA = Timing()


@dataclasses.dataclass(frozen=True)
class Organization:
    """One DIMM as the NDP core sees it (Table I)."""
    ranks: int = 4
    bank_groups: int = 8
    banks: int = 4
    row_bytes: int = 8192        # per rank: 8 x8 devices x 1 KB page
    burst_bytes: int = 64        # per rank: BL8 x 64 bits

    @property
    def logical_burst_bytes(self):
        return self.ranks * self.burst_bytes

    @property
    def columns(self):
        """Logical bursts per row."""
        return self.row_bytes // self.burst_bytes

    def peak_bytes_per_clock(self, timing):
        return self.logical_burst_bytes / timing.BL


TABLE_I = Organization()


@dataclasses.dataclass(frozen=True)
class Command:
    cycle: int
    kind: str            # "ACT", "RD" or "PRE"
    bank_group: int
    bank: int
    row: int


class Ddr4Stream:
    """Schedules the reads of ``total_bytes`` of contiguous weights.

    Parameters
    ----------
    total_bytes : int
    timing : Timing
    organization : Organization
    lookahead : int
        Bursts the controller's queue holds: an ACT for burst i is not issued before the RD of
        burst ``i - lookahead``.

    Members
    -------
    commands : list of Command
        Every command, in issue order per burst (sorted by cycle in :func:`check_trace`).
    data_start : list of int
        Clock at which each logical burst's first data clock arrives.
    """

    def __init__(self, total_bytes, timing=DDR4_3200AA, organization=TABLE_I, lookahead=32):
        self.t, self.org = timing, organization
        self.total_bytes = total_bytes
        self.bursts = math.ceil(total_bytes / organization.logical_burst_bytes)
        self.lookahead = lookahead
        self.commands = []
        self.data_start = []
        self._schedule()

    def address(self, burst):
        """``(bank_group, bank, row, column)`` of logical burst ``burst``."""
        org = self.org
        bank_group = burst % org.bank_groups
        column = (burst // org.bank_groups) % org.columns
        bank = (burst // (org.bank_groups * org.columns)) % org.banks
        row = burst // (org.bank_groups * org.columns * org.banks)
        return bank_group, bank, row, column

    def _schedule(self):
        t = self.t
        busy = set()                          # clocks with a command on the bus

        def slot(earliest):
            while earliest in busy:
                earliest += 1
            busy.add(earliest)
            return earliest

        open_row, last_act, last_rd, last_pre = {}, {}, {}, {}
        acts = []                             # (cycle, bank_group) of every ACT
        last_rd_any, last_rd_group = -10**9, {}
        rd_cycles = []
        for burst in range(self.bursts):
            group, bank, row, _ = self.address(burst)
            key = (group, bank)
            if open_row.get(key) != row:
                earliest = 0 if burst < self.lookahead else rd_cycles[burst - self.lookahead]
                if key in open_row:
                    pre = slot(max(earliest, last_act[key] + t.RAS, last_rd[key] + t.RTP))
                    self.commands.append(Command(pre, "PRE", group, bank, open_row[key]))
                    last_pre[key] = pre
                    earliest = pre + t.RP
                act = max(earliest, last_act.get(key, -10**9) + t.RC)
                while True:
                    act = slot(act)
                    if _act_allowed(acts, act, group, t):
                        break
                    busy.discard(act)
                    act += 1
                acts.append((act, group))
                self.commands.append(Command(act, "ACT", group, bank, row))
                open_row[key], last_act[key] = row, act
            rd = max(last_act[key] + t.RCD, last_rd_any + t.CCD_S,
                     last_rd_group.get(group, -10**9) + t.CCD_L,
                     rd_cycles[-1] + 1 if rd_cycles else 0)
            rd = slot(rd)
            self.commands.append(Command(rd, "RD", group, bank, row))
            last_rd[key] = last_rd_any = last_rd_group[group] = rd
            rd_cycles.append(rd)
            self.data_start.append(rd + t.CL)

    def bytes_by(self, cycle):
        """Bytes delivered in clocks ``< cycle`` (data arrives one data clock at a time)."""
        per_clock = self.org.peak_bytes_per_clock(self.t)
        total = 0
        for start in self.data_start:
            clocks = min(max(cycle - start, 0), self.t.BL)
            total += clocks * per_clock
        return min(total, self.total_bytes)

    def beat_ready_cycles(self, beat_bytes, beats):
        """For each weight beat, the first clock at which it is entirely in the central buffer
        (the clock after its last byte's data clock)."""
        per_clock = self.org.peak_bytes_per_clock(self.t)
        burst_bytes = self.org.logical_burst_bytes
        ready = []
        for beat in range(beats):
            last_byte = (beat + 1) * beat_bytes - 1
            burst, offset = divmod(last_byte, burst_bytes)
            ready.append(self.data_start[burst] + int(offset // per_clock) + 1)
        return ready

    @property
    def last_data_cycle(self):
        return self.data_start[-1] + self.t.BL

    def bandwidth_gb_s(self):
        """Average delivered bandwidth from the first command to the last data clock."""
        return self.total_bytes / (self.last_data_cycle * self.t.tCK_ns)


def _act_allowed(acts, cycle, group, t):
    """tRRD to every other ACT (before or after: ACTs are placed out of order) and tFAW in every
    window containing ``cycle``."""
    for other, other_group in acts:
        if abs(cycle - other) < (t.RRD_L if other_group == group else t.RRD_S):
            return False
    times = sorted([c for c, _ in acts] + [cycle])
    return all(times[i + 4] - times[i] >= t.FAW for i in range(len(times) - 4))


def check_trace(commands, timing=DDR4_3200AA):
    """Every timing rule of the model, re-checked from a command list. Returns the violations."""
    t = timing
    errors = []
    commands = sorted(commands, key=lambda c: c.cycle)
    cycles = [c.cycle for c in commands]
    if len(set(cycles)) != len(cycles):
        errors.append("two commands in one clock")
    open_row, act_at, rd_at, pre_at = {}, {}, {}, {}
    acts, rds = [], []
    for c in commands:
        key = (c.bank_group, c.bank)
        if c.kind == "ACT":
            if key in open_row:
                errors.append(f"ACT to open bank {key} at {c.cycle}")
            if key in pre_at and c.cycle - pre_at[key] < t.RP:
                errors.append(f"tRP at {c.cycle}")
            if key in act_at and c.cycle - act_at[key] < t.RC:
                errors.append(f"tRC at {c.cycle}")
            for cycle, group in acts:
                if c.cycle - cycle < (t.RRD_L if group == c.bank_group else t.RRD_S):
                    errors.append(f"tRRD at {c.cycle}")
            if sum(1 for cycle, _ in acts if c.cycle - cycle < t.FAW) >= 4:
                errors.append(f"tFAW at {c.cycle}")
            acts.append((c.cycle, c.bank_group))
            open_row[key], act_at[key] = c.row, c.cycle
        elif c.kind == "RD":
            if open_row.get(key) != c.row:
                errors.append(f"RD to a closed row at {c.cycle}")
            elif c.cycle - act_at[key] < t.RCD:
                errors.append(f"tRCD at {c.cycle}")
            for cycle, group in rds[-8:]:
                if c.cycle - cycle < (t.CCD_L if group == c.bank_group else t.CCD_S):
                    errors.append(f"tCCD at {c.cycle}")
            rds.append((c.cycle, c.bank_group))
            rd_at[key] = c.cycle
        else:
            if key not in open_row:
                errors.append(f"PRE to a closed bank at {c.cycle}")
            elif c.cycle - act_at[key] < t.RAS:
                errors.append(f"tRAS at {c.cycle}")
            if key in rd_at and c.cycle - rd_at[key] < t.RTP:
                errors.append(f"tRTP at {c.cycle}")
            open_row.pop(key, None)
            pre_at[key] = c.cycle
    return errors
