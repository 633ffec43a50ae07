"""The host question (F34, local-inference-lab/rtx6kpro#25): each GPU's PCIe link and a PCIe
switch between the GPUs, from live readings and from outputs pasted with `doctor --from`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sm120.doctor.capture import parse_text, read_captured
from sm120.doctor.needs import Needs
from sm120.doctor.nvsmi_parse import parse_query_csv
from sm120.doctor.pcie import check_pcie_links, check_pcie_switch
from sm120.doctor.snapshot import GpuInfo, Snapshot
from tests.helpers import DATA_DIR, invoke

CORPUS = DATA_DIR / "nvidia_smi"
H200 = CORPUS / "h200_4x_580"

# The shape `nvidia-smi topo -m` prints (tabs, affinity columns) for four GPUs of which two
# pairs share a PCIe switch (PIX) and the halves meet at the CPU (NODE); written here because
# no captured output in tests/data shows a switch between GPUs.
SWITCH_TOPO = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPIX\tNODE\tNODE\t0-63\t0\t\tN/A\n"
    "GPU1\tPIX\t X \tNODE\tNODE\t0-63\t0\t\tN/A\n"
    "GPU2\tNODE\tNODE\t X \tPXB\t0-63\t0\t\tN/A\n"
    "GPU3\tNODE\tNODE\tPXB\t X \t0-63\t0\t\tN/A\n"
)


def test_query_output_gives_each_gpus_link() -> None:
    # the real `nvidia-smi -q` of a 4x H200 box: Gen 5 x16 on every GPU
    snapshot, _ = read_captured(H200 / "q.txt")
    assert "query" in snapshot.kinds
    links = [
        (g.index, g.bus_id, g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current)
        for g in snapshot.gpus
    ]
    assert links == [
        (0, "00000000:00:06.0", 5, 5, 16),
        (1, "00000000:00:07.0", 5, 5, 16),
        (2, "00000000:00:08.0", 5, 5, 16),
        (3, "00000000:00:09.0", 5, 5, 16),
    ]
    assert snapshot.gpus[0].name == "NVIDIA H200"


def test_query_blocks_stop_where_the_next_output_starts() -> None:
    # q.txt, then the table and the matrix: the last GPU block must not swallow them
    snapshot, _ = read_captured(H200)
    assert snapshot.topology is not None and snapshot.topology.nvlink
    assert [g.pcie_width_max for g in snapshot.gpus] == [16, 16, 16, 16]
    assert [g.memory_total_mib for g in snapshot.gpus] == [143771] * 4


def test_full_links_are_ok() -> None:
    snapshot, _ = read_captured(H200 / "q.txt")
    [finding] = check_pcie_links(snapshot)
    assert (finding.severity, finding.message) == (
        "ok",
        "PCIe links at full width and speed (Gen 5, x16)",
    )


def test_a_narrow_link_warns_with_the_fix() -> None:
    csv = (
        "index, pcie.link.gen.current, pcie.link.gen.max, pcie.link.width.current, "
        "pcie.link.width.max\n0, 5, 5, 16, 16\n1, 5, 5, 8, 16\n"
    )
    snapshot = Snapshot(source="nvidia-smi", gpus=parse_query_csv(csv).gpus)
    [finding] = check_pcie_links(snapshot)
    assert finding.severity == "warn" and finding.failure == "F34"
    assert finding.message == (
        "PCIe links narrower than the card and slot allow: GPU1 x8 of x16; decode on this "
        "host will be slower than figures measured at full width"
    )
    assert "bifurcation" in finding.remediation


def test_an_idle_link_below_top_speed_is_only_context() -> None:
    gpu = GpuInfo(index=0, pcie_gen_current=1, pcie_gen_max=5, pcie_width_current=16)
    gpu.pcie_width_max = 16
    [finding] = check_pcie_links(Snapshot(source="nvml", gpus=[gpu]))
    assert finding.severity == "info"
    assert finding.message.startswith("PCIe links below their top speed now: GPU0 Gen 1 of 5;")


def test_no_link_readings_say_nothing() -> None:
    assert check_pcie_links(Snapshot(source="captured", gpus=[GpuInfo(index=0)])) == []


def test_a_switch_between_gpus_is_named_with_the_source() -> None:
    snapshot = parse_text(SWITCH_TOPO)
    [finding] = check_pcie_switch(snapshot, Needs(gpus=4, tensor_parallel=4))
    assert finding.severity == "info" and finding.failure == "F34"
    assert finding.message == (
        "a PCIe switch sits between GPUs (GPU0-GPU1 PIX, GPU2-GPU3 PXB): the same image and "
        "checkpoint decoded at 39.6 tok/s on one such host (EPYC 9565, PEX89144) against ~88 "
        "on the publisher's (local-inference-lab/rtx6kpro#25); figures transfer only between "
        "hosts built alike"
    )
    assert finding.data["switch"] is True


def test_gpus_on_root_ports_are_named_and_one_gpu_plans_are_not_judged() -> None:
    snapshot = parse_text((CORPUS / "rtx_pro_6000_2x_topo_phb.txt").read_text())
    [finding] = check_pcie_switch(snapshot, Needs())
    assert finding.severity == "info" and finding.data["switch"] is False
    assert finding.message.startswith("no PCIe switch between the GPUs: each hangs off a CPU")
    assert check_pcie_switch(parse_text(SWITCH_TOPO), Needs(gpus=1, tensor_parallel=1)) == []


def test_doctor_from_reports_links_and_switch(cli: CliRunner, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "q.txt").write_text((H200 / "q.txt").read_text())
    (tmp_path / "topo.txt").write_text(SWITCH_TOPO)
    code, out, _ = invoke(cli, "doctor", "--from", str(tmp_path), "--json")
    found = {f["id"]: f for f in json.loads(out)["findings"]}
    assert code == 0
    assert found["pcie-links"]["severity"] == "ok"
    assert found["pcie-switch"]["data"]["switch"] is True
    assert found["pcie-switch"]["failure"] == "F34"
