"""The nvidia-smi parsers on real captured outputs (tests/data/nvidia_smi/, sources in
SOURCES.md), plus the documented variations no captured file happens to show."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120.doctor.capture import parse_text, read_captured
from sm120.doctor.detect import hardware_from_csv
from sm120.doctor.gpu_names import edition, gpu_arch
from sm120.doctor.nvsmi_parse import parse_banner, parse_query_csv, parse_table
from sm120.doctor.snapshot import Snapshot
from sm120.doctor.topology import interconnect
from tests.helpers import DATA_DIR

CORPUS = DATA_DIR / "nvidia_smi"


def captured(name: str) -> Snapshot:
    return parse_text((CORPUS / name).read_text(encoding="utf-8"))


def test_every_corpus_file_has_a_source() -> None:
    sources = (CORPUS / "SOURCES.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in CORPUS.glob("*.txt"))
    assert len(files) >= 8
    for name in files:
        row = next((line for line in sources.splitlines() if line.startswith(f"| {name} |")), "")
        assert "https://github.com/" in row, name


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.txt")))
def test_every_corpus_file_is_recognised(name: str) -> None:
    assert captured(name).kinds, name


# --- RTX PRO 6000 ----------------------------------------------------------------------


def test_rtx_pro_6000_max_q_table() -> None:
    snap = captured("rtx_pro_6000_maxq_580_table.txt")
    assert snap.kinds == ["table"]
    assert (snap.driver_version, snap.cuda_version) == ("580.105.08", "13.0")
    [gpu] = snap.gpus
    assert gpu.index == 0
    assert gpu.name == "NVIDIA RTX PRO 6000 Blac..."
    assert gpu.name_truncated is True
    assert gpu.compute_cap is None  # the table does not print it
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.memory_free_mib) == (94490, 97887, 3397)
    assert gpu.bus_id == "00000000:41:00.0"
    assert gpu.power_limit_w == 325.0
    assert gpu.mig is None  # "MIG M." reads N/A
    assert gpu_arch(gpu.name, gpu.compute_cap) == ("sm_120", "name")
    assert edition(gpu.name, gpu.power_limit_w) == "Max-Q (from its 325 W power cap)"
    # The paste stops at the process table's title: no process list was seen.
    assert snap.processes == [] and snap.processes_listed is None


def test_rtx_pro_6000_600w_table() -> None:
    snap = captured("rtx_pro_6000_600w_580_table.txt")
    assert (snap.driver_version, snap.cuda_version) == ("580.95.05", "13.0")
    [gpu] = snap.gpus
    assert gpu.name == "NVIDIA RTX PRO 6000 Blac..."
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (14, 97887)
    assert gpu.power_limit_w == 600.0
    assert gpu.bus_id == "00000000:16:00.0"
    assert gpu.mig is False  # "Disabled" in the MIG M. cell
    assert (
        edition(gpu.name, gpu.power_limit_w) == "Workstation or Server (from its 600 W power cap)"
    )


def test_rtx_pro_6000_pair_topology_without_gpu_numa_column() -> None:
    snap = captured("rtx_pro_6000_2x_topo_phb.txt")
    assert snap.kinds == ["topology"]
    topo = snap.topology
    assert topo is not None
    assert topo.devices == ["GPU0", "GPU1"]
    assert topo.links == {"GPU0-GPU1": "PHB"}
    assert topo.nvlink is False
    assert interconnect(topo) == "pcie"
    assert topo.affinity == {
        "GPU0": {"cpu_affinity": "0-13", "numa_affinity": "0"},
        "GPU1": {"cpu_affinity": "0-13", "numa_affinity": "0"},
    }


# --- RTX 5090 --------------------------------------------------------------------------


def test_rtx_5090_pair_on_the_610_driver_banner() -> None:
    snap = captured("rtx_5090_2x_610_kmd_table.txt")
    # 610 prints "KMD Version:" and "CUDA UMD Version:".
    assert (snap.driver_version, snap.cuda_version) == ("610.57.04", "13.3")
    assert [g.index for g in snap.gpus] == [0, 1]
    assert {g.name for g in snap.gpus} == {"NVIDIA GeForce RTX 5090"}
    assert not any(g.name_truncated for g in snap.gpus)
    assert [(g.memory_used_mib, g.memory_total_mib) for g in snap.gpus] == [
        (29428, 32607),
        (30347, 32607),
    ]
    assert [g.power_limit_w for g in snap.gpus] == [575.0, 600.0]
    assert [g.bus_id for g in snap.gpus] == ["00000000:01:00.0", "00000000:02:00.0"]
    assert gpu_arch("NVIDIA GeForce RTX 5090", None) == ("sm_120", "name")


@pytest.mark.parametrize("name", ["rtx_5090_2x_p2p_tabs.txt", "rtx_5090_2x_p2p_spaces.txt"])
def test_rtx_5090_peer_to_peer_matrix(name: str) -> None:
    snap = captured(name)
    assert snap.kinds == ["p2p"]
    assert snap.p2p == {"GPU0-GPU1": "GNS"}
    assert snap.topology is None  # a P2P matrix is not a link matrix


# --- GB10 ------------------------------------------------------------------------------


def test_gb10_table_without_memory() -> None:
    snap = captured("gb10_580_table.txt")
    assert (snap.driver_version, snap.cuda_version) == ("580.95.05", "13.0")
    [gpu] = snap.gpus
    assert gpu.name == "NVIDIA GB10"
    assert gpu.memory_reported is False  # "Not Supported": unified memory
    assert gpu.memory_total_mib is None and gpu.memory_used_mib is None
    assert gpu.power_limit_w is None  # "4W /  N/A"
    assert gpu.bus_id == "0000000F:01:00.0"
    assert gpu_arch(gpu.name, None) == ("sm_121", "name")
    assert gpu.as_dict() == {
        "index": 0,
        "name": "NVIDIA GB10",
        "memory_reported": False,
        "bus_id": "0000000F:01:00.0",
    }


def test_gb10_csv_with_na_memory_and_a_headerless_process_list() -> None:
    snap = captured("gb10_csv_na.txt")
    assert snap.kinds == ["csv-gpus", "csv-apps"]
    [gpu] = snap.gpus
    # The query named in the prose above the output supplies the missing header.
    assert gpu.memory_reported is False
    assert gpu.memory_used_mib is None and gpu.memory_total_mib is None
    [proc] = snap.processes
    assert (proc.pid, proc.name, proc.used_mib) == (114687, "/usr/local/bin/python", 19135)
    assert proc.gpu_uuid == "GPU-..."  # redacted in the report
    assert proc.gpu is None  # no GPU listing to map the UUID onto
    assert snap.processes_listed is True


# --- H100 ------------------------------------------------------------------------------


def test_h100_table_from_a_550_driver() -> None:
    snap = captured("h100_550_table.txt")
    assert (snap.driver_version, snap.cuda_version) == ("550.90.07", "12.4")
    assert [g.name for g in snap.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert [g.bus_id for g in snap.gpus] == ["00000000:19:00.0", "00000000:3B:00.0"]
    assert [g.memory_used_mib for g in snap.gpus] == [72790, 72790]
    assert {g.memory_total_mib for g in snap.gpus} == {81559}
    assert {g.power_limit_w for g in snap.gpus} == {700.0}
    assert {g.mig for g in snap.gpus} == {False}
    assert gpu_arch("NVIDIA H100 80GB HBM3", None) == ("sm_90", "name")


def test_dgx_nv18_topology_with_nics_and_lost_tabs() -> None:
    snap = captured("h100_dgx_8x_topo_nv18_tabs.txt")
    topo = snap.topology
    assert topo is not None
    gpus = [d for d in topo.devices if d.startswith("GPU")]
    nics = [d for d in topo.devices if d.startswith("NIC")]
    assert gpus == [f"GPU{i}" for i in range(8)]
    # "NIC8NIC9" in the header is two columns.
    assert nics == [f"NIC{i}" for i in range(12)]
    assert len(topo.links) == 28
    assert set(topo.links.values()) == {"NV18"}
    assert topo.nvlink is True and interconnect(topo) == "nvlink"
    assert len(topo.nic_links) == 8 * 12
    assert topo.nic_links["GPU0-NIC0"] == "PXB"
    assert topo.nic_links["GPU1-NIC3"] == "PXB"
    assert topo.nic_links["GPU3-NIC5"] == "PXB"
    # "NODENODE" and "NODEPXB" were two cells each.
    assert topo.nic_links["GPU4-NIC8"] == "NODE" and topo.nic_links["GPU4-NIC9"] == "NODE"
    assert topo.nic_links["GPU5-NIC8"] == "NODE" and topo.nic_links["GPU5-NIC9"] == "PXB"
    assert topo.nic_links["GPU7-NIC11"] == "PXB"
    assert topo.affinity["GPU0"] == {
        "cpu_affinity": "0-55,112-167",
        "numa_affinity": "0",
        "gpu_numa_id": None,
    }
    assert topo.affinity["GPU7"]["cpu_affinity"] == "56-111,168-223"
    assert topo.affinity["GPU7"]["numa_affinity"] == "1"


# --- other machines, for the variations they show ----------------------------------------


def test_rtx_4090_topology_with_nic_rows() -> None:
    topo = captured("rtx_4090_8x_topo_tabs.txt").topology
    assert topo is not None
    assert len(topo.links) == 28 and set(topo.links.values()) == {"SYS"}
    assert topo.nvlink is False
    assert topo.nic_links["GPU6-NIC0"] == "PHB" and topo.nic_links["GPU6-NIC1"] == "PHB"
    assert topo.nic_links["GPU0-NIC0"] == "SYS"
    assert "NIC0" not in topo.affinity  # NIC rows carry no affinity
    assert topo.affinity["GPU4"] == {
        "cpu_affinity": "56-111,168-223",
        "numa_affinity": "1",
        "gpu_numa_id": None,
    }


def test_mig_enabled_gpu() -> None:
    snap = captured("a800_mig_enabled_535_table.txt")
    assert (snap.driver_version, snap.cuda_version) == ("535.86.10", "12.2")
    [gpu] = snap.gpus
    assert gpu.name == "NVIDIA A800-SXM4-80GB"
    assert gpu.mig is True
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (36537, 81920)
    assert gpu.power_limit_w == 400.0


def test_mig_devices_table() -> None:
    snap = captured("mig_devices_table.txt")
    assert snap.gpus == []
    assert [(d.gpu, d.gi, d.ci, d.mig_dev) for d in snap.mig_devices] == [
        (1, 3, 0, 0),
        (1, 5, 0, 1),
        (1, 6, 0, 2),
    ]
    assert [d.memory_used_mib for d in snap.mig_devices] == [14366, 9826, 13]
    assert {d.memory_total_mib for d in snap.mig_devices} == {19968}


def test_old_driver_table_and_process_columns() -> None:
    snap = captured("gtx_1070_396_old_table.txt")
    assert snap.driver_version == "396.24"
    assert snap.cuda_version is None  # 396 prints no CUDA version
    [gpu] = snap.gpus
    assert (gpu.name, gpu.memory_used_mib, gpu.memory_total_mib) == ("GeForce GTX 1070", 1917, 8114)
    assert gpu.power_limit_w == 210.0
    assert [(p.gpu, p.pid, p.type, p.name, p.used_mib) for p in snap.processes] == [
        (0, 489, "G", "/usr/bin/X", 1025),
        (0, 662, "G", "kwin_x11", 313),
        (0, 668, "G", "/usr/bin/krunner", 3),
    ]


def test_list_and_csv_with_an_unused_column_merge() -> None:
    snap = captured("csv_header_and_list.txt")
    assert snap.kinds == ["list", "csv-gpus"]
    assert snap.driver_version == "570.86.15"
    assert [(g.index, g.name, g.compute_cap) for g in snap.gpus] == [
        (0, "NVIDIA TITAN V", "7.0"),
        (1, "NVIDIA RTX 5880 Ada Generation", "8.9"),
    ]
    assert snap.gpus[1].uuid == "GPU-7518f6b0-991f-ce2b-3d37-c779130d3137"


def test_a_folder_is_read_as_one_machine(tmp_path: Path) -> None:
    for name in ("rtx_pro_6000_2x_topo_phb.txt", "rtx_5090_2x_p2p_tabs.txt"):
        (tmp_path / name).write_text((CORPUS / name).read_text())
    snap, files = read_captured(tmp_path)
    assert [f.name for f in files] == ["rtx_5090_2x_p2p_tabs.txt", "rtx_pro_6000_2x_topo_phb.txt"]
    assert snap.kinds == ["p2p", "topology"]
    assert snap.p2p == {"GPU0-GPU1": "GNS"}
    assert snap.topology is not None and snap.topology.links == {"GPU0-GPU1": "PHB"}


# --- variations from hardware_facts.md no captured file shows --------------------------
# These snippets are written in the documented formats, not copied from a machine.


def test_csv_full_names_with_units_and_merge_with_a_cut_table_name() -> None:
    text = (
        "index, name, compute_cap, memory.total [MiB], memory.used [MiB], driver_version\n"
        "0, NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition, 12.0, 97887 MiB, 15 MiB, "
        "580.95.05\n"
        "\n" + (CORPUS / "rtx_pro_6000_600w_580_table.txt").read_text()
    )
    snap = parse_text(text)
    [gpu] = snap.gpus
    assert gpu.name == "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    assert gpu.name_truncated is False  # the CSV's full name wins over "Blac..."
    assert gpu.compute_cap == "12.0"
    assert gpu.memory_total_mib == 97887
    assert gpu.memory_used_mib == 15  # the first source that showed it
    assert gpu.power_limit_w == 600.0  # only the table showed it
    assert edition(gpu.name, gpu.power_limit_w) == "Max-Q"


def test_csv_without_units_and_not_found_names() -> None:
    result = parse_query_csv(
        "gpu_uuid, pid, process_name, used_memory [MiB]\n"
        "GPU-8d0d, 4121, [Not Found], 81234\n"
        "GPU-8d0d, 4188, /usr/bin/python3, 512\n"
    )
    assert result.apps is True
    assert [(p.pid, p.name, p.used_mib) for p in result.processes] == [
        (4121, None, 81234),
        (4188, "/usr/bin/python3", 512),
    ]


def test_csv_na_in_brackets_even_with_nounits() -> None:
    [gpu] = parse_query_csv(
        "name, compute_cap, memory.total [MiB], memory.used [MiB]\n"
        "NVIDIA GB10, 12.1, [N/A], [N/A]\n"
    ).gpus
    assert gpu.compute_cap == "12.1" and gpu.memory_reported is False
    assert gpu.memory_total_mib is None


def test_sm120s_own_detect_query_goes_through_the_same_parser() -> None:
    hw = hardware_from_csv("NVIDIA GeForce RTX 5090, 12.0\nNVIDIA GeForce RTX 5090, 12.0\n")
    assert hw is not None and (hw.gpus, hw.arch, hw.source) == (2, "sm_120", "detected")
    hw = hardware_from_csv("NVIDIA GB10, 12.1\n")
    assert hw is not None and hw.arch == "sm_121"
    mixed = hardware_from_csv("NVIDIA H100 80GB HBM3, 9.0\nNVIDIA GeForce RTX 5090, 12.0\n")
    assert mixed is not None and mixed.arch == "mixed"
    assert hardware_from_csv("") is None


CONSTRUCTED = DATA_DIR / "nvidia_smi_constructed"


def constructed(name: str) -> Snapshot:
    return parse_text((CONSTRUCTED / name).read_text(encoding="utf-8"))


def test_several_processes_per_gpu_and_names_cut_from_the_left() -> None:
    snap = constructed("processes_several_cut_names.txt")
    assert [(p.pid, p.type, p.name, p.used_mib) for p in snap.processes] == [
        (123456, "C", "...envs/vllm/bin/python3.12", 81000),
        (2266, "G", "/usr/lib/xorg/Xorg", 4),
    ]
    assert snap.processes_listed is True


def test_no_running_processes_while_memory_is_in_use() -> None:
    snap = constructed("processes_none_found_memory_used.txt")
    assert snap.processes == [] and snap.processes_listed is False
    assert snap.gpus[0].memory_used_mib == 81234  # held by someone this view cannot see


def test_empty_process_block() -> None:
    snap = constructed("processes_block_empty.txt")
    assert snap.gpus[0].name == "NVIDIA GeForce RTX 5090"
    assert snap.processes == [] and snap.processes_listed is None


def test_banner_variants() -> None:
    newer = parse_banner(
        "| NVIDIA-SMI 610.43.02   KMD Version: 610.43.02   CUDA UMD Version: 13.3 |"
    )
    assert (newer.smi_version, newer.driver_version, newer.cuda_version) == (
        "610.43.02",
        "610.43.02",
        "13.3",
    )
    two_part = parse_banner("| NVIDIA-SMI 580.142  Driver Version: 580.142  CUDA Version: 13.0 |")
    assert two_part.driver_version == "580.142"
    freebsd = parse_banner("| NVIDIA-SMI 550.78   Driver Version: 550.78   CUDA Version: N/A |")
    assert freebsd.cuda_version is None


def test_windows_table_with_driver_model_column() -> None:
    table = parse_table((CONSTRUCTED / "windows_driver_model.txt").read_text())
    [gpu] = table.gpus
    assert gpu.name == "NVIDIA GeForce RTX 5090"
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (2101, 32607)
    assert table.banner.cuda_version == "12.8"


def test_topology_with_blank_cpu_affinity_mlx_columns_and_ansi() -> None:
    text = "\n".join(
        [
            "\x1b[4mGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m",
            "GPU0\t X \tNV4\tPIX\t\t0\t\tN/A",
            "GPU1\tNV4\t X \tSYS\t\t0\t\tN/A",
            "mlx5_0\tPIX\tSYS\t X ",
            "",
            "Legend:",
            "  X    = Self",
            "  NV#  = Connection traversing a bonded set of # NVLinks",
        ]
    )
    topo = parse_text(text).topology
    assert topo is not None
    assert topo.links == {"GPU0-GPU1": "NV4"} and topo.nvlink is True
    assert topo.nic_links == {"GPU0-mlx5_0": "PIX", "GPU1-mlx5_0": "SYS"}
    # A blank CPU affinity (containers, Slurm) leaves the NUMA values in place.
    assert topo.affinity["GPU0"] == {
        "cpu_affinity": None,
        "numa_affinity": "0",
        "gpu_numa_id": None,
    }


def test_nic_legend_names_the_nics() -> None:
    text = "\n".join(
        [
            "        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID",
            "GPU0     X      PXB     NODE    0-31            0               N/A",
            "GPU1    PXB      X      NODE    0-31            0               N/A",
            "NIC0    NODE    NODE     X",
            "",
            "Legend:",
            "",
            "  X    = Self",
            "  PXB  = Connection traversing multiple PCIe bridges",
            "",
            "NIC Legend:",
            "",
            "  NIC0: mlx5_0",
        ]
    )
    topo = parse_text(text).topology
    assert topo is not None
    assert topo.nic_names == {"NIC0": "mlx5_0"}
    assert topo.links == {"GPU0-GPU1": "PXB"}
    assert interconnect(topo) == "pcie"


def test_prose_without_outputs_is_not_recognised() -> None:
    snap = parse_text("I ran vllm serve and it hangs. Driver is new, CUDA too.\n")
    assert snap.kinds == [] and snap.gpus == []
