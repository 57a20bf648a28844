"""A kernel that fails makes the call fail (#49): an engine's parallel-for hook returning nonzero
and a kernel's workspace allocation refused under RLIMIT_AS, through a C program linking a
bundle of one op and of a graph's plan, on x86 and on aarch64 under qemu; and the plan through
TVM's runtime (what `deploy run` and `deploy test` call) with a kernel failing its own check."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import numpy as np
import pytest

from deploy.compiler.cache import Buildable
from deploy.compiler.options import BuildOptions
from deploy.model import load_model
from deploy.ops import TensorType, bind, get_op
from deploy.ops.graph import bind_graph
from tests.test_bundle import build_c, bundle, on_targets, runs, x86_runs_here

SIDE = 1024
"""argmax over 4 channels of SIDE x SIDE keeps its running maxima in workspace buffers of
SIDE * SIDE * 4 bytes (4 MiB), allocated at call time: past glibc's mmap threshold, so a
limit on the address space refuses them."""
LIMIT = 1 << 30
"""The address space the program runs in: its RLIMIT_AS natively; under qemu, which ignores a
guest's RLIMIT_AS (and starves itself under its own), the guest's space qemu reserves (-R)."""
MARGIN = 2 << 20
"""What the program leaves free of LIMIT before the call: less than one workspace buffer."""
TASK_MARGIN = 10 << 20
"""As MARGIN, with two threads: room for the kernel's own two buffers, not for the half-size
buffer each parallel task allocates (2 MiB): the failure is a task's, carried to the caller."""

GRAPH = f"""name: k
inputs:
  x: {{shape: [1, 4, {SIDE}, {SIDE}]}}
nodes:
  - {{name: pool, op: max_pool2d, attrs: {{kernel: 3, stride: 1, padding: 1}}, inputs: [x]}}
  - {{name: best, op: argmax, attrs: {{axis: 1}}, inputs: [pool]}}
output: best
"""

PROGRAM = f"""#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "k.h"

/* Runs k once on its caller's memory and prints "STATUS LAST_ERROR". `hook`: with an engine's
 * parallel-for that runs every task and then returns 7. `memory`: on one thread, once it has
 * reserved all of its address space but {MARGIN} bytes. `task`: the engine's parallel-for
 * returning what the tasks did, all but {TASK_MARGIN} bytes reserved. */
static void* aligned(size_t bytes) {{
  void* data = NULL;
  if (bytes == 0) return NULL;
  if (posix_memalign(&data, 64, bytes) != 0) exit(3);
  memset(data, 1, bytes);
  return data;
}}

static int engine(void* seven, k_task task, void* context, int count) {{  /* on this thread */
  int failed = 0;
  for (int i = 0; i < count; ++i) failed |= task(i, context);
  return seven ? 7 : failed;
}}

/* Reserve all the address space but `margin` bytes, in ever smaller mappings. */
static int reserve_all_but(size_t margin) {{
  char* first = NULL;
  for (size_t size = (size_t)1 << 30; size >= 4096; size /= 2) {{
    void* taken;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    while ((taken = mmap(NULL, size, PROT_NONE, flags, -1, 0)) != MAP_FAILED) {{
      if (first == NULL && size >= margin) first = taken;
    }}
  }}
  return first != NULL && munmap(first, margin) == 0;
}}

int main(int argc, char** argv) {{
  int64_t sx[4] = {{1, 4, {SIDE}, {SIDE}}}, so[3] = {{1, {SIDE}, {SIDE}}};
  size_t bytes = k_workspace_size();
  DLTensor x = {{aligned(4 * {SIDE} * {SIDE} * 4), {{kDLCPU, 0}}, 4, {{kDLFloat, 32, 1}}, sx, NULL, 0}};
  DLTensor out = {{aligned({SIDE} * {SIDE} * 8), {{kDLCPU, 0}}, 3, {{kDLInt, 64, 1}}, so, NULL, 0}};
  void* workspace = aligned(bytes);
  if (argc != 2) return 2;
  int hook = strcmp(argv[1], "hook") == 0, task = strcmp(argv[1], "task") == 0;
  k_set_num_threads(hook || task ? 2 : 1);
  if (hook || task) k_set_parallel_for(engine, hook ? (void*)argv : NULL);
  if (!hook && !reserve_all_but(task ? {TASK_MARGIN} : {MARGIN})) return 4;
  int status = k_with_workspace(&x, &out, workspace, bytes);
  printf("%d %s\\n", status, k_last_error());
  return 0;
}}
"""


def program_for(graph: bool, target: str, work: Path) -> Path:
    """PROGRAM linked with a bundle named k of argmax alone or of GRAPH, for `target`."""
    item: Buildable
    if graph:
        (work / "k.yaml").write_text(GRAPH)
        item = bind_graph(load_model(work / "k.yaml"))
    else:
        item = bind(get_op("argmax"), {"axis": 1}, [TensorType((1, 4, SIDE, SIDE), "float32")])
    directory = bundle(item, target, work / "k", name="k")
    return build_c(PROGRAM, directory, work / "calls", target, ("-static",) if target != "x86" else ())


def last_line(proc: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    assert proc.returncode == 0, proc.stderr
    status, _, error = proc.stdout.splitlines()[-1].partition(" ")
    return int(status), error


def limited(target: str, program: Path, mode: str) -> subprocess.CompletedProcess[str]:
    """`program MODE` in LIMIT bytes of address space."""
    if target == "x86":
        limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))  # noqa: E731
        return subprocess.run([str(program), mode], capture_output=True, text=True, timeout=300,
                              preexec_fn=limit)  # fmt: skip
    qemu, *options = runs(target)
    command = [qemu, "-R", str(LIMIT), *options, str(program), mode]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@on_targets("x86", "arm")
@pytest.mark.parametrize("graph", [False, True], ids=["op", "graph"])
def test_a_failing_kernel_fails_the_call(target: str, graph: bool, tmp_path: Path) -> None:
    """Each failure returns NAME_ERR_KERNEL with its reason, behind the kernel it stopped for a
    graph; before, the graph's call returned 0 and the op's said only 'a kernel failed'."""
    if target == "x86":
        x86_runs_here()
    built = program_for(graph, target, tmp_path)
    program = [*runs(target), str(built)]
    first = "RuntimeError: kernel 1 of 2 (max_pool2d) failed: " if graph else ""
    hooked = subprocess.run([*program, "hook"], capture_output=True, text=True, timeout=300)
    assert last_line(hooked) == (-2, f"k: {first}the parallel_for hook returned 7")
    second = "RuntimeError: kernel 2 of 2 (argmax) failed: " if graph else ""
    for mode, buffer in (("memory", SIDE * SIDE * 4), ("task", SIDE * SIDE * 2)):
        refused = limited(target, built, mode)
        assert last_line(refused) == (-2, f"k: {second}workspace allocation of {buffer} bytes failed"), mode


def test_through_tvms_runtime_main_stops_at_a_failing_kernel(tmp_path: Path) -> None:
    """The plan as `deploy run/test` call it (TVM's runtime, `deploy/devices/session.py`), its first
    kernel one whose body fails its own check: main raises naming that kernel and does not
    run the second (the output keeps what it held); before, it returned 0 over that output."""
    import tvm

    from deploy.compiler.compile import ScheduledKernel, lay_out, schedule_op
    from deploy.compiler.plan import arena_bytes, plan_arena, plan_module
    from deploy.compiler.shared_object import _calls
    from deploy.compiler.targets import get_target
    from deploy.compiler.tir_passes import compile_cpu

    (tmp_path / "k.yaml").write_text(GRAPH.replace(str(SIDE), "8"))
    graph = bind_graph(load_model(tmp_path / "k.yaml"))
    target, options = get_target("x86"), BuildOptions(cores=1)
    laid = lay_out(graph, target, options)
    scheduled = [ScheduledKernel(k, schedule_op(k.bound, target, options)) for k in laid.kernels]
    calls = _calls(laid.graph, scheduled, target, 64)
    name, func, reads, writes = calls[0]
    check = tvm.tirx.AssertStmt(
        tvm.tirx.const(False), tvm.ir.StringImm("ValueError"), [tvm.ir.StringImm("its check failed")]
    )
    calls[0] = (name, func.with_body(check), reads, writes)
    planned = plan_module(laid.graph, calls)
    main = compile_cpu(planned, target.tvm_target(), target.two_vector_shuffles).mod["main"]
    x = tvm.runtime.tensor(np.zeros((1, 4, 8, 8), "float32"))
    out = tvm.runtime.tensor(np.full((1, 8, 8), -7, "int64"))
    slots = plan_arena(laid.graph, [(r, w) for _, _, r, w in calls]).slots
    arena = tvm.runtime.empty((arena_bytes(slots, {}),), "uint8")
    with pytest.raises(RuntimeError) as raised:
        main(x, out, arena)
    assert "kernel 1 of 2 (max_pool2d) failed" in str(raised.value).splitlines()[0]
    assert (out.numpy() == -7).all()
