"""`Layout.cpu_affinity` / `mat validate --cpu-affinity`: each rank's process left on the launcher's CPUs or bound to
its GPU's NUMA node, and where it could run recorded per rank (`validate.affinity`)."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.validate.affinity import cpu_placement, numa_node_cpus, parse_cpu_list
from megatron_autotuner.validate.layout import Layout, load_layouts_file


def test_linux_cpu_lists():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    assert parse_cpu_list("") == set()


def test_the_numa_nodes_a_process_may_run_on(tmp_path):
    """Two sockets of 4 CPUs: a process allowed CPUs 2-5 spans both nodes; bound to node 1's, only node 1."""
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "has_cpu").write_text("0-7\n")  # sysfs holds other files beside the nodes
    nodes = numa_node_cpus(tmp_path)
    assert nodes == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
    assert cpu_placement({2, 3, 4, 5}, nodes) == {"allowed_cpus": 4, "numa_nodes": [0, 1]}
    assert cpu_placement({4, 5, 6, 7}, nodes) == {"allowed_cpus": 4, "numa_nodes": [1]}
    assert cpu_placement({0}, {}) == {"allowed_cpus": 1, "numa_nodes": []}  # a host that exposes no nodes


def test_the_binding_is_a_layout_field_that_keeps_earlier_ids():
    """Unset, the id is the one the committed runs of these layouts have (x2_moe_graphs PART=ranks, host O)."""
    layouts, _ = load_layouts_file("benchmarks/validation/x2_rank_pace_layouts.json")
    unbound, bound = layouts[0], layouts[1]
    assert unbound.cpu_affinity == "inherit" and unbound.layout_id.endswith(".a6b9b446a9")
    assert bound.cpu_affinity == "gpu_numa" and bound.layout_id != unbound.layout_id
    assert "numa-bound" in bound.replace(name="").label and "numa-bound" not in unbound.replace(name="").label
    with pytest.raises(ConfigError) as exc:
        unbound.replace(cpu_affinity="socket")
    assert str(exc.value) == "cpu_affinity: must be one of inherit, gpu_numa, got 'socket'"


def test_the_command_line_binds_every_layout(capsys, tmp_path):
    from megatron_autotuner.cli import main

    common = ["validate", "--dry-run", "--json", "--gpu", "H200"]
    layouts = "benchmarks/validation/x2_rank_pace_layouts.json"
    assert main([*common, "--layouts", layouts, "--cpu-affinity", "gpu_numa", "--output-dir", str(tmp_path / "a")]) == 0
    assert {lay["layout"]["cpu_affinity"] for lay in json.loads(capsys.readouterr().out)["layouts"]} == {"gpu_numa"}
    assert main([*common, "--layouts", layouts, "--output-dir", str(tmp_path / "b")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [lay["layout"]["cpu_affinity"] for lay in doc["layouts"]] == ["inherit", "gpu_numa", "inherit", "gpu_numa"]
    with pytest.raises(SystemExit) as exc:
        main([*common, "--layouts", layouts, "--cpu-affinity", "core"])
    assert exc.value.code == 2
    assert "--cpu-affinity" in capsys.readouterr().err


@pytest.mark.mcore
def test_a_cpu_run_records_where_each_rank_could_run(tiny, tmp_path):
    """Bound on a machine without CUDA: the record says why the affinity was left, and where the ranks ran."""
    pytest.importorskip("megatron.core")
    from megatron_autotuner.validate import validate_layouts
    from megatron_autotuner.validate.results import rank_file, read_records

    lay = Layout(model=tiny, seq_length=32, global_batch_size=2, warmup_steps=1, steps=1, use_te=False,
                 cpu_affinity="gpu_numa", name="bound")  # fmt: skip
    rep = validate_layouts([lay], tmp_path / "o", "H200", device="cpu", layout_timeout_s=60, log=lambda *a: 0)
    assert [r["status"] for r in rep.rows] == ["ok"]
    (rec,) = read_records(rank_file(tmp_path / "o", 0))
    assert rec["cpu_affinity"].startswith("not set (")
    assert rec["cpu_placement"]["allowed_cpus"] >= 1
