"""plan_for_node is the one MUL_MAT plan: the cost model, the vtcm-plan gate and the investigation's plan scan
must say what the HTP backend then does, op by op, whatever the settings (arch without HMX, USE_HMX=0, profile,
VTCM size, NHVX) and the layout of src1 (the KQ / KQV matmuls of a graph without flash attention are batched
and permuted). What the backend did is observed through its hooks, never computed with the plan."""

from __future__ import annotations

import pytest

from kazeia.backends.base import Hook
from kazeia.backends.htp import VtcmPlanGate
from kazeia.backends.htp.cost import op_seconds
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node, src_layout
from kazeia.debug.investigate.facts import PlanScan
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec

M = 40  # prompt tokens: M >= 32 sends eligible matmuls to HMX


class Observed(Hook):
    """What each HTP MUL_MAT did (path, chunking, fallback, death) and what every plan user said beforehand."""

    def __init__(self, settings: HtpSettings) -> None:
        self.settings = settings
        self.said: dict[str, tuple] = {}
        self.did: dict[str, tuple] = {}
        self.layouts: set[tuple[bool, bool]] = set()

    def on_start(self, node, info):
        if node.op != "MUL_MAT" or info.backend != "HTP0":
            return
        cost = op_seconds(node, self.settings).where
        gate = VtcmPlanGate(self.settings)(node)
        scan = PlanScan(self.settings)
        scan.on_start(node, info)
        self.said[node.name] = (cost, gate, scan.plans[0].plan)
        self.layouts.add(src_layout(node.src[0], node.src[1]))

    def on_complete(self, node, info):
        if node.name in self.said:
            self.did[node.name] = (info.path, info.extra.get("mc"), info.extra.get("nc"),
                                   bool(info.extra.get("hmx_fallback")), info.extra.get("status"))

    def on_fault(self, node, info):
        if node.name in self.said:
            self.did[node.name] = ("died", None, None, False, None)


def _check(obs: Observed) -> set[str]:
    """Every plan user agrees with what the backend did; returns the outcomes seen."""
    seen = set()
    assert obs.did, "no HTP matmul ran"
    for name, (path, mc, nc, fallback, _status) in obs.did.items():
        cost, gate, plan = obs.said[name]
        if path == "died":
            assert plan.path == "hmx" and not plan.fits and gate == "CPU", (name, plan.reason)
            seen.add("died")
            continue
        assert gate is None, (name, plan.reason)
        assert cost == ("HTP0/hmx" if path == "hmx" else "HTP0/hvx"), (name, cost, path)
        assert plan.path == path, (name, plan.path, path, plan.reason)
        assert fallback == (plan.hmx_attempt is not None), name
        if path == "hmx":
            assert (plan.mc, plan.nc) == (mc, nc), name
        seen.add("fallback" if fallback else path)
    return seen


def _settings(spec: RunSpec) -> HtpSettings:
    return spec.htp_settings()


@pytest.fixture(scope="module")
def vtcm_sizes(tiny_qwen3_q4) -> dict[str, int]:
    """VTCM sizes at which some matmul of the tiny model dies under 2026-05 ("dying") and falls back to HVX
    under robust ("fallback") at M tokens, found by scanning the plans of its own graph (no size is written here)."""
    scan = PlanScan(HtpSettings())
    run(RunSpec(model=tiny_qwen3_q4, n_prompt=M, device="CPU"), hooks=(scan,))
    found: dict[str, int] = {}
    for kib in range(1024, 64, -1):
        dying = [plan_for_node(p.node, HtpSettings(profile="2026-05", vtcm_bytes=kib * 1024)) for p in scan.plans]
        robust = [plan_for_node(p.node, HtpSettings(profile="robust", vtcm_bytes=kib * 1024)) for p in scan.plans]
        if any(p.path == "hmx" and not p.fits for p in dying):
            found.setdefault("dying", kib * 1024)
        if any(p.hmx_attempt is not None for p in robust):
            found.setdefault("fallback", kib * 1024)
        if len(found) == 2:
            return found
    pytest.fail(f"the tiny model's HMX plans never overflow / fall back above 64 KiB: {found}")


CONFIGS = [
    ("robust", {}, None),
    ("robust", {"GGML_HEXAGON_ARCH": "v68"}, None),  # no HMX built for v68
    ("robust", {"GGML_HEXAGON_USE_HMX": "0"}, None),
    ("robust", {"GGML_HEXAGON_NHVX": "2"}, None),
    ("robust", {}, "dying"),  # robust's plan counts the rounding: it fits where 2026-05 dies
    ("robust", {}, "fallback"),  # no chunking fits: HVX instead
    ("2026-05", {}, "dying"),
    ("2026-05", {"GGML_HEXAGON_ARCH": "v68"}, "dying"),  # same VTCM, no HMX: nothing dies, nothing is gated
]


@pytest.mark.parametrize("fa", ["on", "off"])
def test_cost_gate_and_scan_say_what_the_backend_does(tiny_qwen3_q4, vtcm_sizes, fa):
    seen: set[str] = set()
    layouts: set[tuple[bool, bool]] = set()
    for profile, env, vtcm in CONFIGS:
        spec = RunSpec(model=tiny_qwen3_q4, n_prompt=M, device="HTP0", htp_profile=profile, env=env,
                       vtcm=vtcm_sizes[vtcm] if vtcm else None, flash_attn=fa == "on")
        obs = Observed(_settings(spec))
        res = run(spec, hooks=(obs,))
        outcomes = _check(obs)
        assert ("died" in outcomes) == bool(res.death), (profile, env, res.signature())
        if env.get("GGML_HEXAGON_ARCH") == "v68" or env.get("GGML_HEXAGON_USE_HMX") == "0":
            assert outcomes == {"hvx"}, (env, outcomes)
        seen |= outcomes
        layouts |= obs.layouts
    assert {"hmx", "hvx", "fallback", "died"} <= seen, seen
    if fa == "off":  # KQ and KQV: batched src1 (F16 HMX plans it per batch)
        assert any(batched for batched, _ in layouts), layouts


@pytest.mark.parametrize("type_a,view", [("f16", "contig"), ("f16", "transposed"), ("f16", "rows"),
                                         ("f16", "permuted"), ("q4_0", "contig"), ("q4_0", "transposed"),
                                         ("q4_0", "rows")])
def test_src1_layouts(type_a, view):
    """Transposed, strided and permuted src1: the cost model says the path the backend then takes."""
    from kazeia.debug import oracle as O
    from kazeia.debug.oracle.ops import build_case

    kw = {"bs": (2, 3), "per": (0, 2, 1, 3)} if view == "permuted" else {}
    case = O.mul_mat_case(type_a, 64, M, 256, view=view, **kw)
    node = build_case(case).out
    settings = HtpSettings()
    res = O.run_case(case, "HTP0")
    assert res.status == O.OK, res.reason
    plan = plan_for_node(node, settings)
    assert res.path == plan.path, (res.path, plan.reason)
    assert op_seconds(node, settings).where == f"HTP0/{plan.path}"
    if view == "transposed":  # nb[0] > nb[1]: op_matmul's "permuted" gate sends it to HVX
        assert plan.path == "hvx" and "permuted" in plan.reason, plan.reason


def test_the_gate_keeps_a_dying_run_alive(tiny_qwen3_q4, vtcm_sizes):
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=M, device="HTP0", htp_profile="2026-05", vtcm=vtcm_sizes["dying"])
    assert run(spec).death
    gated = run(spec.with_(gates=["vtcm-plan"]))
    assert gated.ok, gated.signature()
    routed = [p for p in gated.placements if p["reason"].startswith("gate")]
    assert routed and all(p["backend"] == "CPU" for p in routed)


def test_the_cost_model_prices_graphs_its_callers_build():
    """kazeia.debug.modeled builds the real Qwen3-4B prefill graph from shapes (kazeia.models.shapes) and the
    HTP cost model prices it: the calibration the cost model's docstring states (about 300 t/s with HMX, about
    41 without, for 256 tokens), and HMX off is slower by the same plans the backend runs."""
    from kazeia.debug.modeled import modeled_prefill_tps
    from kazeia.models.base import ModelArgs

    qwen3_4b = ModelArgs(arch="qwen3", n_layer=36, n_embd=2560, n_ff=9728, n_head=32, n_head_kv=8, head_dim=128,
                         n_rot=128, n_vocab=151936, n_ctx_train=40960, rope_freq_base=1e6, rope_freq_scale=1.0,
                         rms_eps=1e-6, tied_embeddings=True)
    # the calibration was made on the May code's plans (robust: the same kernels, no fusion)
    hmx = modeled_prefill_tps(qwen3_4b, 256, HtpSettings(profile="robust"))
    hvx = modeled_prefill_tps(qwen3_4b, 256, HtpSettings(profile="robust", use_hmx=False))
    no_hmx_arch = modeled_prefill_tps(qwen3_4b, 256, HtpSettings(profile="robust", arch=68))
    assert 250 < hmx < 350 and 34 < hvx < 48, (hmx, hvx)
    assert no_hmx_arch == pytest.approx(hvx)  # no HMX built for v68: the HVX plans, as the backend would
    # 2026-10: the same HMX cost per tile, plus the ADD and MUL its host fuses away
    assert modeled_prefill_tps(qwen3_4b, 256, HtpSettings()) > hmx
