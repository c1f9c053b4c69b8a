"""One cost model (issue 37 deliverable 3): `check`, `upgrade` and `bench` print the same modeled prefill t/s for
the same scenario, from the graphs the engine builds over the file's own tensor types (debug/modeled.py
ScenarioCost): a Q4_K_M file is priced with its K-quant weights, not as the Q4_0 file of the same shapes."""

from __future__ import annotations

import re

import pytest

from cli_utils import kazeia_clean

pytestmark = pytest.mark.slow  # runs of the emulator (make test runs them; the quick loop does not)


@pytest.fixture(scope="module", params=["q4_0", "q4_k_m"])
def model(request, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("cost") / f"tiny_{request.param}.gguf")
    r = kazeia_clean("make-model", "--preset", "tiny", "--arch", "qwen3", "--type", request.param, "-o", path)
    assert r.returncode == 0, r.stderr[-500:]
    return path


def test_check_upgrade_and_bench_price_the_scenario_alike(model, tmp_path):
    n = "12"
    chk = kazeia_clean("check", "-m", model, "--n-prompt", n, "--htp-arch", "v79", "--htp-profile", "2026-05,2026-10")
    assert chk.returncode in (0, 1), chk.stderr[-500:]
    checked = {p: float(v) for p, v in re.findall(r"^\s+(2026-05|2026-10)\s+v79: prefill ([\d.]+) t/s \(12-token",
                                                     chk.stdout, re.M)}
    up = kazeia_clean("upgrade", "-m", model, "--n-prompt", n, "-o", str(tmp_path / "u"), "--quiet")
    assert up.returncode in (0, 1, 4), up.stderr[-500:]
    b, a = re.search(r"\| modeled prefill t/s \| ([\d.]+) \| ([\d.]+) \|", up.stdout).groups()
    upgraded = {"2026-05": float(b), "2026-10": float(a)}
    for profile in ("2026-05", "2026-10"):
        be = kazeia_clean("bench", "-m", model, "-p", n, "-n", "0", "-r", "1", "-dev", "HTP0", "--htp-profile", profile)
        assert be.returncode == 0, be.stderr[-500:]
        row = next(ln for ln in be.stdout.splitlines() if f"pp{n}" in ln)
        benched = float(row.strip().strip("|").split("|")[-1].split("±")[0])  # the modeled column
        for other in (checked[profile], upgraded[profile]):
            assert abs(other - benched) <= 0.01 * benched, (profile, checked, upgraded, benched)
