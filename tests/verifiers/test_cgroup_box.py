"""Finding a delegated cgroup v2, on cgroup trees built in a temporary directory.

The cgroup path itself needs a host that delegates memory and pids to the service (a container
with its own cgroup namespace, a systemd unit with Delegate=yes); the machine these tests were
written on has cgroup v1 with an empty unified mount, so what runs here is the decision: which
trees count as ours, which are refused and why, and what setting one up writes. The refusals
matter most: as root every cgroup is writable, and a box must never be put under a cgroup the
service was not given.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verifiers.sandbox.cgroup import SERVICE_LEAF, BoxCgroups, Delegation, cgroup2_mount, find_delegation, own_cgroup

PID = 4242
HYBRID_CGROUP = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n"


def mountinfo(point: Path, root: str = "/") -> str:
    escaped = str(point).replace(" ", "\\040")
    return (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        f"41 31 0:38 {root} {escaped} rw,relatime - cgroup2 cgroup2 rw\n"
    )


def cgroup_dir(path: Path, controllers: str = "", subtree: str = "", procs: str = "", limits: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers)
    (path / "cgroup.subtree_control").write_text(subtree)
    (path / "cgroup.procs").write_text(procs)
    if limits:  # the host's root cgroup has no memory.max; every other cgroup has one
        (path / "memory.max").write_text("max")
    return path


def test_parsing_proc_files() -> None:
    assert own_cgroup(HYBRID_CGROUP) == "/"
    assert own_cgroup("0::/system.slice/tierroute.service\n") == "/system.slice/tierroute.service"
    assert own_cgroup("4:memory:/x\n") is None
    assert cgroup2_mount(mountinfo(Path("/sys/fs/cgroup/my mount"))) == ("/", "/sys/fs/cgroup/my mount")
    assert cgroup2_mount("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n") is None


def test_this_hosts_kind_cgroup_v1_with_an_empty_unified_mount_is_refused(tmp_path: Path) -> None:
    unified = cgroup_dir(tmp_path / "unified", controllers="", limits=False)
    found = find_delegation(PID, HYBRID_CGROUP, mountinfo(unified))
    assert isinstance(found, str)
    assert "memory and pids" in found and "cgroup v1" in found
    assert find_delegation(PID, HYBRID_CGROUP, "31 23 0:28 / /x rw - tmpfs tmpfs rw\n") == "no cgroup v2 hierarchy"


def test_the_hosts_root_cgroup_is_never_taken(tmp_path: Path) -> None:
    root = cgroup_dir(tmp_path / "cg", controllers="cpu memory pids", subtree="memory pids", limits=False)
    found = find_delegation(PID, "0::/\n", mountinfo(root))
    assert isinstance(found, str) and "root cgroup" in found
    # a service one level down, as root on a host: its parent is the host's root, not given to it
    cgroup_dir(root / "init.scope", controllers="memory pids", procs=f"{PID}\n")
    found = find_delegation(PID, "0::/init.scope\n", mountinfo(root))
    assert isinstance(found, str) and "not delegated" in found


def test_a_container_root_cgroup_with_the_service_alone_is_taken(tmp_path: Path) -> None:
    ns_root = cgroup_dir(tmp_path / "cg", controllers="cpu memory pids", procs=f"{PID}\n")
    found = find_delegation(PID, "0::/\n", mountinfo(ns_root))
    assert found == Delegation(ns_root, leave_first=True)
    boxes = BoxCgroups.claim(found, PID)
    # the service moved itself into a leaf, then gave children their controllers
    assert (ns_root / SERVICE_LEAF / "cgroup.procs").read_text() == str(PID)
    assert (ns_root / "cgroup.subtree_control").read_text() == "+memory +pids"
    box = boxes.new_box(600 << 20, 10)
    assert box.path.parent == ns_root and box.path.name.startswith(f"tierroute-box-{os.getpid()}-")
    assert (box.path / "memory.max").read_text() == str(600 << 20)
    assert (box.path / "pids.max").read_text() == "10"
    assert (box.path / "memory.oom.group").read_text() == "1"
    assert not (box.path / "memory.swap.max").exists()  # written only where the kernel has it
    argv = box.entry_argv("/bin/sh")
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-1] == str(box.path / "cgroup.procs")


def test_a_child_of_the_service_uses_the_set_up_parent(tmp_path: Path) -> None:
    # after the service moved into its leaf, a process it starts is in that leaf too
    ns_root = cgroup_dir(tmp_path / "cg", controllers="memory pids", subtree="memory pids")
    cgroup_dir(ns_root / SERVICE_LEAF, controllers="memory pids", procs=f"1\n{PID}\n")
    found = find_delegation(PID, f"0::/{SERVICE_LEAF}\n", mountinfo(ns_root))
    assert found == Delegation(ns_root, leave_first=False)


def test_a_shared_cgroup_is_left_alone(tmp_path: Path) -> None:
    ns_root = cgroup_dir(tmp_path / "cg", controllers="memory pids", procs=f"1\n{PID}\n")
    found = find_delegation(PID, "0::/\n", mountinfo(ns_root))
    assert isinstance(found, str) and "1 other process" in found
    assert (ns_root / "cgroup.subtree_control").read_text() == ""


def test_systemd_delegation_is_recognised_by_its_mark(tmp_path: Path) -> None:
    root = cgroup_dir(tmp_path / "cg", controllers="memory pids", subtree="memory pids", limits=False)
    unit = cgroup_dir(root / "system.slice" / "tierroute.service", controllers="memory pids", procs=f"{PID}\n")
    path = "0::/system.slice/tierroute.service\n"
    found = find_delegation(PID, path, mountinfo(root))
    assert isinstance(found, str) and "not delegated" in found
    try:
        os.setxattr(unit, "user.delegate", b"1")
    except OSError:
        pytest.skip("this filesystem keeps no user extended attributes")
    assert find_delegation(PID, path, mountinfo(root)) == Delegation(unit, leave_first=True)


def test_a_cgroup_outside_the_mounted_tree_is_refused(tmp_path: Path) -> None:
    mounted = cgroup_dir(tmp_path / "cg", controllers="memory pids")
    found = find_delegation(PID, "0::/elsewhere/unit\n", mountinfo(mounted, root="/machine.slice"))
    assert isinstance(found, str) and "outside" in found
