"""A cDSP crash record's Bad VA placed on the VTCM plan map of the op that died: which area, which HMX deep
load run, past which boundary (a 4 MiB bank, the end of VTCM, the end of an area).

`place_bad_va(bad_va, plan, vtcm_va)` works on any plan (kazeia.backends.htp.plan.plan_for_node); `crash_map`
takes a parsed record and a model + prompt length (what `kazeia crashlog` is given) and tries every MUL_MAT the
HTP takes in that graph, reporting those whose map holds the address.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazeia.backends.htp import MatmulPlan
from kazeia.backends.htp.forensics import BANK_BYTES, VTCM_VA, ParsedCrash, hmx_deep_loads


@dataclass
class Placement:
    bad_va: int
    offset: int | None  # inside VTCM, or None when the address is not in VTCM
    area: str | None = None
    area_range: tuple[int, int] | None = None
    boundary: str | None = None
    loads: list[dict] = field(default_factory=list)  # deep-load runs holding or crossing the address
    error_code: int | None = None  # from the crash record, when placed from one
    reason: str | None = None  # the record's "crashed ... due to ..." words

    def lines(self) -> list[str]:
        if self.offset is None:
            return [f"Bad VA 0x{self.bad_va:08X} is not inside VTCM as mapped here (give --vtcm-base)"]
        out = [f"Bad VA 0x{self.bad_va:08X} = VTCM offset 0x{self.offset:06x}"
               + (f", in area {self.area} (0x{self.area_range[0]:06x}-0x{self.area_range[1] - 1:06x})"
                  if self.area else ", in no area of the plan")]
        if self.boundary:
            out.append(f"at {self.boundary}")
        for d in self.loads:
            crosses = d["offset"] // BANK_BYTES != (d["offset"] + d["size"] - 1) // BANK_BYTES
            out.append(f"HMX {d['kind']} deep load (tile {d['tile']}, from K tile {d['k0']}) run "
                       f"0x{d['offset']:06x}-0x{d['offset'] + d['size'] - 1:06x}"
                       + (" crosses a 4 MiB bank boundary (the rule: no deep load across a bank)" if crosses else ""))
        return out


def place_bad_va(bad_va: int, plan: MatmulPlan, vtcm_va: int = VTCM_VA) -> Placement:
    off = bad_va - vtcm_va
    if not 0 <= off <= plan.vtcm:
        return Placement(bad_va, None)
    p = Placement(bad_va, off)
    for a in plan.areas:
        if a.size and a.offset <= off < a.offset + a.size:
            p.area, p.area_range = a.name, (a.offset, a.offset + a.size)
    if off % BANK_BYTES == 0 and off:
        p.boundary = f"the {off // BANK_BYTES * 4} MiB VTCM bank boundary (the first byte of bank {off // BANK_BYTES})"
    elif off == plan.vtcm:
        p.boundary = f"the end of VTCM ({plan.vtcm} B)"
    if plan.path == "hmx":
        for d in hmx_deep_loads(plan):
            if d.offset <= off < d.end or (d.offset < off <= d.end and off % BANK_BYTES == 0):
                p.loads.append(d.to_dict())
    return p


def crash_map(crash: ParsedCrash, plans: list[tuple[str, MatmulPlan]], vtcm_va: int = VTCM_VA
              ) -> list[tuple[str, Placement]]:
    """(node name, placement) for every planned MUL_MAT whose deep loads or areas hold the Bad VA, the ones with
    a load crossing it first."""
    if crash.bad_va is None:
        return []
    hits = []
    for name, plan in plans:
        pl = place_bad_va(crash.bad_va, plan, vtcm_va)
        if pl.offset is None:
            return [("", pl)]
        if pl.loads or pl.area:
            hits.append((name, pl))
    return sorted(hits, key=lambda h: not h[1].loads)
