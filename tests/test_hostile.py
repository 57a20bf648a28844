"""The hostile-input table: every bad input is one `error:` line on stderr naming the bad value,
exit 2 (1 for a failed device), no traceback, nothing written.

Each row is (command line, exit code, a fragment of the message). `TMP/` in a row names the
files `hostile_files` prepares: bad .npy files, op files, a plain file where a directory belongs.
The CLI runs in-process, so the whole table takes seconds; rows touch no device (a row naming
`--device nosuch` checks that the bad value is refused before any device is asked).
"""

from __future__ import annotations

import json
import os
import shlex
import textwrap
from pathlib import Path

import numpy as np
import pytest

from deploy.ops import registry
from tests.conftest import invoke

LR = "build --target x86 --op leaky_relu"
ADD = "build --target x86 --op add"
POOL = "build --target x86 --op max_pool2d --shape 1x1x8x8"
ARGMAX = "build --target x86 --op argmax --shape 3x4"
RUN = "run --target x86 --op leaky_relu -o out.npy"
RUN_ADD = "run --target x86 --op add -o out.npy"
TUNE = "tune --target x86 --op leaky_relu"
BENCH = "bench --target x86 --device nosuch"
BOARD = "device add b --host h --user u"
BIG = "9" * 5000
MODEL = "build --target x86 --model"
GOOD = "--model TMP/good.yaml"

MODEL_ROWS: list[tuple[str, int, str]] = [
    # models (--model): the file, its graph, and options that only describe an op
    (f"{MODEL} TMP/missing.yaml", 2, "cannot read it: No such file"),
    (f"{MODEL} TMP/adir", 2, "is a directory"),
    (f"{MODEL} TMP/model.txt", 2, "unknown model file type '.txt'"),
    (f"{MODEL} TMP/syntax.yaml", 2, "TMP/syntax.yaml"),
    (f"{MODEL} TMP/cycle.yaml", 2, "node 'p' (max_pool2d) is on a cycle: p -> s -> p"),
    (f"{MODEL} TMP/unknown_op.yaml", 2, "node 'c'"),
    (f"{MODEL} TMP/bad_attr.yaml", 2, "node 'p' (max_pool2d): attribute kernel='abc'"),
    (f"{MODEL} TMP/mismatch.yaml", 2, "node 's' (add): cannot broadcast"),
    (f"{MODEL} TMP/missing_input.yaml", 2, "node 's' (add) reads 'q', which is no graph input"),
    (f"{MODEL} TMP/twice.yaml", 2, "twice.yaml:1: not valid YAML: key 'x' given twice"),
    (f"{MODEL} TMP/fifo.yaml", 2, "fifo.yaml: cannot read it: not a regular file"),  # would block
    (f"{MODEL} TMP/deep.yaml", 2, "deep.yaml: not valid YAML: nested too deeply"),
    (f"{MODEL} TMP/deep.json", 2, "deep.json: not valid JSON: nested too deeply"),
    (f"{MODEL} TMP/twice_attr.yaml", 2, "twice_attr.yaml:2: not valid YAML: key 'alpha' given twice"),
    (f"{MODEL} TMP/twice.json", 2, "twice.json: not valid JSON: key 'name' given twice"),
    (f"{MODEL} TMP/escape.yaml", 2, "node name 'act\\x1b]0;title\\x07': expected printable characters"),
    (f"{MODEL} TMP/custom.onnx", 2, "(com.example::HardTanh): no registered op implements it"),
    (f"{MODEL} TMP/good.yaml --op add", 2, "give --op NAME or --model FILE (one of them)"),
    (f"{MODEL} TMP/good.yaml --shape 4", 2, "--shape describe an op; the model file gives its own"),
    (f"{MODEL} TMP/good.yaml --dtype ''", 2, "--dtype describe an op"),
    (f"{MODEL} TMP/good.yaml -a alpha=1", 2, "-a describe an op"),
    (f"{MODEL} TMP/good.yaml --name x", 2, "--name names a bundle: give --bundle too"),
    (f"{MODEL} TMP/good.yaml --bundle --name int", 2, "--name 'int' cannot prefix a bundle"),
    (f"{MODEL} TMP/good.yaml --bundle --name 3d", 2, "--name '3d' cannot prefix a bundle"),
    (f"{MODEL} TMP/good.yaml --bundle --name a-b", 2, "--name 'a-b' cannot prefix a bundle"),
    (f"{MODEL} TMP/good.yaml --bundle --name ''", 2, "--name '' cannot prefix a bundle"),
    (
        f"{MODEL} TMP/good.yaml --layout NCHW5c",
        2,
        "--layout 'NCHW5c': expected one of NCHW, NHWC, NCHW4c, NCHW8c",
    ),
    (f"{MODEL} TMP/good.yaml --layout ''", 2, "--layout '': expected one of"),
    (
        "build --target x86 --op leaky_relu --shape 4 --layout NCHW4c",
        2,
        "--layout 'NCHW4c': lays out a model's graph",
    ),
    (f"test --target x86 {GOOD} --layout nchw", 2, "--layout 'nchw'"),
    (f"bench --target x86 {GOOD} --layout NCHW16c", 2, "--layout 'NCHW16c'"),
    ("tune --target x86 --op add --shape 4 --shape 4 --layout NHWC", 2, "lays out a model's graph (--model)"),
    (f"run --target x86 {GOOD} -i TMP/f32_4.npy -o out.npy", 2, "input x of model good is 3x4:float32"),
    (f"run --target x86 {GOOD} -i TMP/f32_3x4.npy -i TMP/f32_3x4.npy -o out.npy", 2, "takes 1 input(s) (x)"),
    (f"run --target x86 {GOOD} -i TMP/f64_4.npy -o out.npy", 2, "TMP/f64_4.npy holds 4:float64"),
    (f"run --target x86 {GOOD} -a alpha=1 -i TMP/f32_3x4.npy -o out.npy", 2, "-a describe an op"),
    (f"test --target x86 {GOOD} --op add", 2, "--op and --dtype select ops"),
    ("test --target x86 --model TMP/cycle.yaml", 2, "is on a cycle"),
    (f"bench --target x86 {GOOD} --dtype float16", 2, "--op and --dtype select ops"),
    ("bench --target x86 --model TMP/unknown_op.yaml", 2, "node 'c'"),
    (f"tune --target x86 {GOOD} --shape 4", 2, "--shape describe an op"),
    ("tune --target x86 --model TMP/bad_attr.yaml", 2, "attribute kernel='abc'"),
    ("tune --target x86 --model TMP/batch.yaml", 2, "tuning batch needs static shapes: the batch N is"),
    ("build --target opencl --model TMP/batch.yaml", 2, "target opencl needs static shapes"),
    (
        f"run --target x86 {GOOD.replace('good', 'batch')} -i TMP/f32_4.npy -o out.npy",
        2,
        "input x of model batch is Nx4",
    ),
    # issue #37: each was a traceback's last line and exit 1, a hang, or a model overwritten
    (f"{MODEL} TMP/inf_kernel.yaml", 2, "node 'p' (max_pool2d): attribute kernel=inf: expected an integer"),
    (f"{MODEL} TMP/inf_stride.json", 2, "node 'p' (max_pool2d): attribute stride=inf: expected an integer"),
    (f"{MODEL} TMP/huge_alpha.yaml", 2, "(leaky_relu): attribute alpha=9999999999999999999999...99999"),
    (f"{MODEL} TMP/huge_dim.yaml", 2, "(400 characters)]: about 1e399 elements, more than the 2147483647"),
    (f"{LR} --shape {'9' * 400}", 2, "about 1e399 elements, more than the 2147483647"),
    (f"{MODEL} TMP/long_int.yaml", 2, "long_int.yaml:1: an int of 5000 digits (9999"),
    (f"{MODEL} TMP/scalar_batch.yaml", 2, "input 'x': shape ['scalar', 4]: expected a list of positive ints"),
    (f"{MODEL} TMP/x_batch.yaml", 2, "input 'x': shape ['x', 4]: expected a list of positive ints"),
    (f"{MODEL} TMP/merged.yaml", 2, "merged.yaml:1: not valid YAML: key 'shape' given by two maps it merges"),
    (f"{MODEL} TMP/ref_attr.onnx", 2, "ONNX attribute alpha refers to a function's attribute (slope)"),
    (
        "run --target x86 --op leaky_relu -i TMP/fifo.npy -o out.npy",
        2,
        "fifo.npy' as a .npy array: not a regular",
    ),
    (f"run --target x86 {GOOD} -i TMP/f32_3x4.npy -o TMP/good.yaml", 2, "which this command reads"),
    ("run --target x86 --op leaky_relu -i TMP/f32_4.npy -o TMP/f32_4.npy", 2, "which this command reads"),
    (f"{MODEL} TMP/sparse.yaml", 2, "sparse.yaml: 1073741824 bytes, more than a graph file may hold"),
]

RUNNER_ROWS: list[tuple[str, int, str]] = [
    # what deploy-run refuses too, in the same words (#49; tests/test_runner_refuses.py runs it)
    (f"{RUN} -i TMP/f32_4.npy -o ./out.npy", 2, "-o './out.npy' is 'out.npy', which another -o writes"),
    ("run --target x86 --op leaky_relu -i TMP/f32_4.npy -o TMP/./f32_4.npy", 2, "which this command reads"),
    (f"{RUN} -i TMP/digits.npy", 2, " (5057 characters)"),  # the header's 5,000-digit shape, cut
    (f"{RUN} -i TMP/fortran0.npy", 2, "fortran_order is not a valid bool: 0"),
    (f"{RUN} -i TMP/adir", 2, "cannot read input 'TMP/adir' as a .npy array: it is a directory"),
    (f"{RUN} -i TMP/gone.npy", 2, "cannot read input 'TMP/gone.npy' as a .npy array: No such file or"),
    (f'{RUN} -i "TMP/it\'s.npy"', 2, "cannot read input 'TMP/it\\'s.npy' as a .npy array: No such file"),
]

TAKEN = {
    "name of the C or POSIX library": ("pthread_create", "main", "free", "errno", "size_t", "memcpy"),
    "C or C++ keyword": ("_Bool", "_Alignas", "asm", "typeof"),
    "name deploy's bundle runtime or glue gives": (
        "DLTensor",
        "deploy_rt1_scratch",
        "call",
        "__tvm_ffi_main",
    ),
}
"""Names --name may not take (#49), by why: each would have failed at link time, or linked wrong."""
NAMES_ROWS: list[tuple[str, int, str]] = [
    # --name: refused before the build, the name or one it makes (NAME_task, NAME_H_) being taken
    *((f"{ADD} --bundle --name {n}", 2, f"--name '{n}' cannot prefix a bundle: it is a {w}")
      for w, names in TAKEN.items() for n in names),
    (f"{ADD} --bundle --name dlpack_dlpack", 2, "it makes DLPACK_DLPACK_H_, which is a name deploy's bundle"),
    (f"{ADD} --bundle --name k0_add", 2, "--name 'k0_add' cannot prefix a bundle: it is reserved (names"),
    (f"{ADD} --bundle --name Deployed", 2, "it is reserved (names that begin deploy_, DEPLOY_ or Deploy are"),
    (f"{ADD} --bundle --name PTHREAD_X", 2, "it is reserved (names that begin pthread_ or PTHREAD_ are"),
    (f"{ADD} --bundle --name exp", 2, "--name 'exp' cannot prefix a bundle: it is a name of the C or POSIX"),
    # a name that would have closed NAME.h's comment (a model's own, the default, gets a made one)
    (f"{ADD} --bundle --name 'g */ int pwned; /*'", 2, "--name 'g */ int pwned; /*' cannot prefix a bundle"),
]  # fmt: skip

ROBUST_ROWS: list[tuple[str, int, str]] = [
    # a dead node is checked before it is dropped; LLVM aborting in codegen is one line, exit 1
    (f"{MODEL} TMP/dead_bad.yaml", 2, "node 'dead' (max_pool2d): attribute kernel"),
    (
        "--ops-path TMP/ops_llvm_abort build --target x86 --op crc32w --shape 1 --dtype int32 --cores 1",
        1,
        "compiling module.so for target x86: LLVM aborted: Cannot select: intrinsic %llvm.aarch64.crc32w",
    ),
]

LLVM_ABORT_OP = (
    "import tvm\nfrom tvm import te\nfrom deploy.ops import Case, Input, Op, register\n\n@register\n"
    "class Crc(Op):\n    name = 'crc32w'\n    inputs = (Input('x'),)\n    dtypes = ('int32',)\n"
    "    cases = (Case(((1,),)),)\n\n    def infer(self, attrs, inputs):\n        return inputs[0]\n\n"
    "    def compute(self, attrs, out, x):  # an aarch64 intrinsic, which LLVM cannot select for x86\n"
    "        crc = tvm.tirx.call_llvm_pure_intrin\n"
    "        return te.compute(out.shape, lambda *i: crc('int32', 'llvm.aarch64.crc32w', x[i], x[i]))\n\n"
    "    def reference(self, attrs, x):\n        return x\n"
)
"""A user op whose kernel LLVM aborts on (`deploy/base/forked.py`)."""

MODEL_FILES = {
    "good.yaml": (
        "inputs: {x: {shape: [3, 4]}}\nnodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    ),
    "model.txt": "not a model\n",
    "inf_kernel.yaml": (
        "inputs: {a: {shape: [1, 1, 8, 8]}}\n"
        "nodes: [{name: p, op: max_pool2d, attrs: {kernel: .inf}, inputs: [a]}]\noutput: p\n"
    ),
    "inf_stride.json": (
        '{"inputs": {"a": {"shape": [1, 1, 8, 8]}}, "output": "p",'
        ' "nodes": [{"name": "p", "op": "max_pool2d", "attrs": {"stride": 1e999}, "inputs": ["a"]}]}'
    ),
    "huge_alpha.yaml": (
        "inputs: {x: {shape: [4]}}\n"
        f"nodes: [{{name: act, op: leaky_relu, attrs: {{alpha: {'9' * 400}}}, inputs: [x]}}]\noutput: act\n"
    ),
    "huge_dim.yaml": (
        f"inputs: {{x: {{shape: [{'9' * 400}]}}}}\n"
        "nodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    ),
    "long_int.yaml": (
        f"inputs: {{x: {{shape: [2, {'9' * 5000}]}}}}\nnodes: [{{name: act, op: leaky_relu, inputs: [x]}}]\n"
        "output: act\n"
    ),
    "scalar_batch.yaml": (
        "inputs: {x: {shape: [scalar, 4]}}\nnodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    ),
    "x_batch.yaml": (
        "inputs: {x: {shape: [x, 4]}}\nnodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    ),
    "merged.yaml": (
        "inputs: {x: {<<: [{shape: [3, 4]}, {shape: [5]}]}}\n"
        "nodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    ),
    "batch.yaml": (
        "inputs: {x: {shape: [N, 4]}}\nnodes: [{name: act, op: leaky_relu, inputs: [x]}]\noutput: act\n"
    ),
    "syntax.yaml": "inputs: {x: [\n",
    "cycle.yaml": (
        "inputs: {a: {shape: [1, 1, 8, 8]}}\nnodes:\n"
        "  - {name: p, op: max_pool2d, inputs: [s]}\n  - {name: s, op: add, inputs: [p, a]}\noutput: s\n"
    ),
    "unknown_op.yaml": "inputs: {x: {shape: [4]}}\nnodes: [{name: c, op: conv9d, inputs: [x]}]\noutput: c\n",
    "bad_attr.yaml": (
        "inputs: {a: {shape: [1, 1, 8, 8]}}\n"
        "nodes: [{name: p, op: max_pool2d, attrs: {kernel: abc}, inputs: [a]}]\noutput: p\n"
    ),
    "mismatch.yaml": (
        "inputs: {a: {shape: [3, 4]}, b: {shape: [5]}}\n"
        "nodes: [{name: s, op: add, inputs: [a, b]}]\noutput: s\n"
    ),
    "missing_input.yaml": (
        "inputs: {a: {shape: [3, 4]}}\nnodes: [{name: s, op: add, inputs: [a, q]}]\noutput: s\n"
    ),
    "twice.yaml": (
        "inputs: {x: {shape: [3, 4]}, x: {shape: [5]}}\n"
        "nodes: [{name: act, op: leaky_relu, attrs: {alpha: 0.5}, inputs: [x]}]\noutput: act\n"
    ),
    "twice_attr.yaml": (
        "inputs: {x: {shape: [3, 4]}}\n"
        "nodes: [{name: act, op: leaky_relu, attrs: {alpha: 0.5, alpha: 0.25}, inputs: [x]}]\noutput: act\n"
    ),
    "dead_bad.yaml": (
        "inputs: {x: {shape: [1, 1, 8, 8]}}\nnodes: [{name: dead, op: max_pool2d, attrs: {kernel: abc},"
        " inputs: [x]}, {name: y, op: leaky_relu, inputs: [x]}]\noutput: y\n"
    ),
    "twice.json": (
        '{"inputs": {"x": {"shape": [4]}}, "nodes": [{"name": "a", "op": "leaky_relu", "inputs": ["x"],'
        ' "name": "b"}], "output": "b"}'
    ),
    "escape.yaml": (
        'inputs: {x: {shape: [4]}}\nnodes: [{name: "act\\e]0;title\\a", op: leaky_relu, inputs: [x]}]\n'
        'output: "act\\e]0;title\\a"\n'
    ),
}
"""Model files the MODEL_ROWS name under TMP/ (`custom.onnx` is the ONNX example, whose custom op
is not loaded)."""

ROWS: list[tuple[str, int, str]] = [
    # the group, its options and op files (--ops-path)
    ("nosuch", 2, "No such command 'nosuch'"),
    ("--bogus ops", 2, "No such option '--bogus'"),
    ("--ops-path", 2, "'--ops-path' requires an argument"),
    ("--ops-path TMP/missing ops", 2, "TMP/missing' is not a directory"),
    ("--ops-path TMP/afile ops", 2, "TMP/afile' is not a directory"),
    ("--ops-path TMP/ops_exit ops", 2, "TMP/ops_exit/quit.py called exit(0)"),
    ("--ops-path TMP/ops_exit_msg ops", 2, "called exit('bye')"),
    ("--ops-path TMP/ops_import ops", 2, "imports.py failed to import: ModuleNotFoundError"),
    ("--ops-path TMP/ops_old ops", 2, "old.py:2: 'from ops import Op': the op framework is deploy.ops"),
    ("--ops-path TMP/ops_syntax ops", 2, "syntax.py failed to import: SyntaxError"),
    ("--ops-path TMP/ops_raise ops", 2, "raises.py failed to import: RuntimeError: boom"),
    ("--ops-path TMP/ops_noname ops", 2, "op class NoName in TMP/ops_noname/noname.py: name None: expected"),
    ("--ops-path TMP/ops_builtin ops", 2, "deploy/ops/library/leaky_relu.py and in TMP/ops_builtin/lr.py"),
    ("--ops-path TMP/ops_twins ops", 2, "'hostile_twin' is defined twice: in TMP/ops_twins/a.py and in"),
    (
        "--ops-path TMP/first/ops --ops-path TMP/second/ops ops",
        2,
        "in TMP/first/ops/lr.py and in TMP/second/ops/lr.py",
    ),
    ("--ops-path TMP/ops_exit build --target x86 --op add --shape 4 --shape 4", 2, "called exit(0)"),
    ("ops --bogus", 2, "No such option '--bogus'"),
    ("ops extra", 2, "unexpected extra argument (extra)"),
    ("targets extra", 2, "unexpected extra argument (extra)"),
    # build: required options, op and target names
    ("build --target x86 --shape 4", 2, "give --op NAME or --model FILE (one of them)"),
    ("build --op add --shape 4 --shape 4", 2, "Missing option '--target'"),
    ("build --op add --target x86", 2, "--shape is required with --op"),
    ("build --target x86 --op conv9d --shape 4", 2, "unknown op 'conv9d'"),
    ("build --target x86 --op '' --shape 4", 2, "unknown op ''"),
    ("build --target x86 --op ADD --shape 4 --shape 4", 2, "unknown op 'ADD'"),
    ("build --target x86 --op ' add' --shape 4 --shape 4", 2, "unknown op ' add'"),
    ("build --target riscv --op add --shape 4 --shape 4", 2, "'riscv'"),
    ("build --target '' --op add --shape 4 --shape 4", 2, "''"),
    ("build --target X86 --op add --shape 4 --shape 4", 2, "'X86'"),
    (f"{LR} --shape 4 --bogus", 2, "No such option '--bogus'"),
    (f"{LR} --shape 4 extra", 2, "unexpected extra argument (extra)"),
    (f"{LR} --shape", 2, "'--shape' requires an argument"),
    # build: shapes
    (f"{LR} --shape ''", 2, "--shape '': expected dims like 32x64x112x112 (or 'scalar' for rank 0;"),
    (f"{LR} --shape ' '", 2, "--shape ' ': expected dims"),
    (f"{LR} --shape \uff14", 2, "--shape '\uff14': expected dims"),
    (f"{LR} --shape 4x\uff14", 2, "--shape '4x\uff14': expected dims"),
    (f"{LR} --shape \u0664", 2, "--shape '\u0664': expected dims"),
    (f"{LR} --shape \u00b2", 2, "--shape '\u00b2': expected dims"),
    (f"{LR} --shape 1_000", 2, "--shape '1_000': expected dims"),
    (f"{LR} --shape 3xa", 2, "--shape '3xa'"),
    (f"{LR} --shape 4x", 2, "--shape '4x'"),
    (f"{LR} --shape x4", 2, "--shape 'x4'"),
    (f"{LR} --shape 4xx4", 2, "--shape '4xx4'"),
    (f"{LR} --shape -4", 2, "--shape '-4'"),
    (f"{LR} --shape +4", 2, "--shape '+4'"),
    (f"{LR} --shape 4.0", 2, "--shape '4.0'"),
    (f"{LR} --shape 4,4", 2, "--shape '4,4'"),
    (f"{LR} --shape '4 4'", 2, "--shape '4 4'"),
    (f"{LR} --shape '4 x 4'", 2, "--shape '4 x 4'"),
    (f"{LR} --shape 1e3", 2, "--shape '1e3'"),
    (f"{LR} --shape 4*4", 2, "--shape '4*4'"),
    (f"{LR} --shape '[4, 4]'", 2, "--shape '[4, 4]'"),
    (f"{LR} --shape '(4,)'", 2, "--shape '(4,)'"),
    (f"{LR} --shape abc", 2, "--shape 'abc'"),
    (f"{LR} --shape 0", 2, "--shape '0': every dim must be >= 1"),
    (f"{LR} --shape 3x0", 2, "--shape '3x0': every dim must be >= 1"),
    (f"{LR} --shape 0x10", 2, "--shape '0x10': every dim must be >= 1"),
    (f"{LR} --shape {BIG}", 2, "expected dims like"),
    (f"{LR} --shape 1000000000x1000000000", 2, "1e+18 elements, more than the 2147483647"),
    (f"{LR} --shape 9223372036854775808", 2, "[9223372036854775808]: 9.22e+18 elements"),
    (f"{LR} --shape 100000x100000x100", 2, "[100000, 100000, 100]: 1e+12 elements"),
    (f"{LR} --shape 46341x46341", 2, "[46341, 46341]: 2.15e+09 elements"),
    (f"{LR} --shape 2147483648", 2, "[2147483648]: 2.15e+09 elements"),
    (f"{LR} --shape 1x1x1x1x1x1x1", 2, "has shape [1, 1, 1, 1, 1, 1, 1]: expected rank 0..6"),
    (f"{ADD} --shape 46341x1 --shape 1x46341", 2, "the output of add has shape [46341, 46341]"),
    ("build --target x86 --op max_pool2d --shape scalar", 2, "has shape []: expected rank 4..5"),
    ("build --target x86 --op argmax --shape '()'", 2, "has shape []: expected rank 1..6"),
    ("build --target x86 --op max_pool2d --shape 8x8", 2, "[8, 8]"),
    # build: input count and broadcasting
    ("build --target x86 --op add --shape 4", 2, "takes 2 inputs (a, b), got 1"),
    ("build --target x86 --op add --shape 4 --shape 4 --shape 4", 2, "takes 2 inputs (a, b), got 3"),
    (f"{LR} --shape 4 --shape 4", 2, "takes 1 inputs (x), got 2"),
    (f"{ADD} --shape 3x4 --shape 5", 2, "[5]"),
    (f"{ADD} --shape 2x3 --shape 3x2", 2, "[3, 2]"),
    # build: dtypes
    (f"{LR} --shape 4 --dtype int8", 2, "does not support dtype int8"),
    (f"{LR} --shape 4 --dtype int32", 2, "does not support dtype int32"),
    (f"{ADD} --shape 4 --shape 4 --dtype float128", 2, "float128"),
    (f"{ADD} --shape 4 --shape 4 --dtype ''", 2, "does not support dtype  for input a"),
    (f"{ADD} --shape 4 --shape 4 --dtype FLOAT32", 2, "FLOAT32"),
    (f"{ADD} --shape 4 --shape 4 --dtype float", 2, "dtype float for"),
    (f"{ADD} --shape 4 --shape 4 --dtype bfloat16", 2, "bfloat16"),
    (f"{LR} --shape 4 --dtype uint16", 2, "does not support dtype uint16"),
    (f"{ADD} --shape 4 --shape 4 --dtype bool", 2, "dtype bool"),
    (f"{ADD} --shape 4 --shape 4 --dtype complex64", 2, "complex64"),
    (f"{ADD} --shape 4 --shape 4 --dtype", 2, "'--dtype' requires an argument"),
    # build: attributes
    (f"{LR} --shape 4 -a alpha=abc", 2, "alpha='abc'"),
    (f"{LR} --shape 4 -a alpha=nan", 2, "alpha='nan': expected a finite float"),
    (f"{LR} --shape 4 -a alpha=inf", 2, "alpha='inf': expected a finite float"),
    (f"{LR} --shape 4 -a alpha=-inf", 2, "alpha='-inf'"),
    (f"{LR} --shape 4 -a alpha=1e309", 2, "alpha='1e309'"),
    (f"{LR} --shape 4 -a alpha=", 2, "alpha='': expected a float"),
    (f"{LR} --shape 4 -a alpha=1_0", 2, "alpha='1_0': expected a float"),
    (f"{LR} --shape 4 -a alpha=\uff11", 2, "alpha='\uff11': expected a float"),
    (f"{LR} --shape 4 -a alpha=0x10", 2, "alpha='0x10'"),
    (f"{LR} --shape 4 -a alpha=1,2", 2, "alpha='1,2'"),
    (f"{LR} --shape 4 -a alpha=true", 2, "alpha='true'"),
    (f"{LR} --shape 4 -a alpha=1e308", 2, "alpha=1e+308: expected a float within the range of float32"),
    (f"{LR} --shape 4 -a alpha=-1e39", 2, "alpha=-1e+39: expected a float within the range of float32"),
    (f"{LR} --shape 4 --dtype float16 -a alpha=1e6", 2, "within the range of float16 (|x| <= 65504)"),
    (f"{LR} --shape 4 --dtype float16 -a alpha=65520", 2, "alpha=65520.0"),
    (f"{LR} --shape 4 -a alpha", 2, "-a 'alpha': expected key=value"),
    (f"{LR} --shape 4 -a =3", 2, "-a '=3': expected key=value"),
    (f"{LR} --shape 4 -a ''", 2, "-a '': expected key=value"),
    (f"{LR} --shape 4 -a alpha=1 -a alpha=2", 2, "-a 'alpha=2': attribute alpha is given twice"),
    (f"{LR} --shape 4 -a", 2, "'-a' requires an argument"),
    (f"{ADD} --shape 4 --shape 4 -a axis=1", 2, "op add has no attribute 'axis' (attributes: layout)"),
    (f"{LR} --shape 4 -a Alpha=1", 2, "has no attribute 'Alpha' (attributes: alpha)"),
    (f"{POOL} -a kernel=0", 2, "kernel='0'"),
    (f"{POOL} -a kernel=17", 2, "kernel='17'"),
    (f"{POOL} -a kernel=-1", 2, "kernel='-1'"),
    (f"{POOL} -a kernel=3.5", 2, "kernel='3.5'"),
    (f"{POOL} -a kernel=a", 2, "kernel='a'"),
    (f"{POOL} -a kernel=1,2,3", 2, "kernel='1,2,3'"),
    (f"{POOL} -a kernel=", 2, "kernel=''"),
    (f"{POOL} -a kernel=\uff13", 2, "kernel='\uff13'"),
    (f"{POOL} -a kernel=1_0", 2, "kernel='1_0'"),
    (f"{POOL} -a kernel=99999999999999999999999", 2, "kernel='99999999999999999999999'"),
    (f"{POOL} -a kernel=true", 2, "kernel='true'"),
    (f"{POOL} -a kernel=2,", 2, "kernel='2,'"),
    (f"{POOL} -a stride=0", 2, "stride='0'"),
    (f"{POOL} -a stride=1,0", 2, "stride='1,0'"),
    (f"{POOL} -a padding=-1", 2, "padding='-1'"),
    (f"{POOL} -a kernel=2 -a padding=2", 2, "padding [2, 2]"),
    (f"{POOL} -a ceil_mode=maybe", 2, "ceil_mode='maybe'"),
    (f"{POOL} -a ceil_mode=", 2, "ceil_mode=''"),
    ("build --target x86 --op max_pool2d --shape 1x1x2x2 -a kernel=3", 2, "kernel"),
    # layouts (deploy/ops/layouts.py): a wrong rank, a pack dim other than p, an unknown layout
    (f"{POOL} -a layout=NCHW4c", 2, "expected NCHW4c (rank 5: N, C/p, H, W, p)"),
    (f"{POOL} -a layout=NCHW5c", 2, "layout='NCHW5c': expected one of NCHW, NHWC, NCHW4c, NCHW8c"),
    (f"{POOL} -a layout=", 2, "layout=''"),
    (f"{POOL[: -len('--shape 1x1x8x8')]} --shape 1x2x8x8x3 -a layout=NCHW4c", 2, "whose last dim is 4"),
    (f"{POOL[: -len('--shape 1x1x8x8')]} --shape 1x8x8x8 -a layout=NCHW8c", 2, "expected NCHW8c (rank 5"),
    (f"{ARGMAX} -a layout=NHWC", 2, "expected NHWC (rank 4: N, H, W, C)"),
    ("build --target x86 --op argmax --shape 1x2x9x9x4 -a layout=NCHW4c -a axis=2", 2, "expected axis=1"),
    (
        "build --target x86 --op argmax --shape 1x2x9x9x4 -a layout=NCHW4c -a axis=1 -a channels=4",
        2,
        "channels=4: input x of shape [1, 2, 9, 9, 4] in NCHW4c holds 5..8 channels",
    ),
    (f"{ARGMAX} -a channels=3", 2, "channels=3: expected it only with a layout other than NCHW"),
    (f"{ADD} --shape 1x2x9x9x4 --shape 1x2x9x9 -a layout=NCHW4c", 2, "or NCHW with one channel [N, 1, H, W]"),
    (f"{ADD} --shape 1x2x9x9x4 --shape 9 -a layout=NCHW4c", 2, "input b has shape [9]"),
    (
        "build --target x86 --op layout_transform --shape 1x3x8x8 -a src=NCHW -a dst=NCHW4c -a channels=2",
        2,
        "channels=2: input x of shape [1, 3, 8, 8] in NCHW holds 3 channels",
    ),
    (
        "build --target x86 --op layout_transform --shape 1x3x8x8x4 -a src=NCHW8c -a dst=NCHW",
        2,
        "whose last dim is 8",
    ),
    (f"{ARGMAX} -a axis=2", 2, "axis=2"),
    (f"{ARGMAX} -a axis=-7", 2, "axis='-7'"),
    (f"{ARGMAX} -a axis=x", 2, "axis='x'"),
    (f"{ARGMAX} -a axis=1.0", 2, "axis='1.0'"),
    (f"{ARGMAX} -a keepdims=2", 2, "keepdims='2'"),
    (f"{ARGMAX} -a out_dtype=int16", 2, "out_dtype='int16'"),
    (f"{ARGMAX} -a out_dtype=INT64", 2, "out_dtype='INT64'"),
    (f"{ARGMAX} -a out_dtype=", 2, "out_dtype=''"),
    # build: cores, tuned records, devices
    (f"{LR} --shape 4 --cores 0", 2, "--cores 0: expected a thread count from 1 to 4096"),
    (f"{LR} --shape 4 --cores -1", 2, "--cores -1"),
    (f"{LR} --shape 4 --cores 4097", 2, "--cores 4097"),
    (f"{LR} --shape 4 --cores abc", 2, "'abc' is not a valid integer"),
    (f"{LR} --shape 4 --cores 1.5", 2, "'1.5' is not a valid integer"),
    (f"{LR} --shape 4 --tuned TMP/missing", 2, "--tuned TMP/missing: no such directory"),
    (f"{LR} --shape 4 --tuned TMP/afile", 2, "--tuned TMP/afile: is not a directory"),
    (f"{LR} --shape 4 --device nosuch", 2, "unknown device 'nosuch'"),
    (f"{LR} --shape 4 --device local --cl-device 0:0", 2, "--cl-device goes instead of --device"),
    (f"{LR} --shape 4 --tracker 127.0.0.1:9190", 2, "--tracker and --key go together"),
    (f"{LR} --shape 4 --key k", 2, "--tracker and --key go together"),
    (f"{LR} --shape 4 --device local --tracker 127.0.0.1:9190 --key k", 2, "instead of --device"),
    (f"{LR} --shape 4 --tracker nocolon --key k", 2, "tracker address 'nocolon'"),
    (f"{LR} --shape 4 --tracker 127.0.0.1:0 --key k", 2, "tracker address '127.0.0.1:0'"),
    (f"{LR} --shape 4 --tracker 127.0.0.1:70000 --key k", 2, "tracker address '127.0.0.1:70000'"),
    (f"{LR} --shape 4 --tracker :9190 --key k", 2, "tracker address ':9190'"),
    # run: .npy inputs
    ("run --target x86 --op leaky_relu -i TMP/f32_4.npy", 2, "Missing option '-o'"),
    ("run --target x86 --op leaky_relu -o out.npy", 2, "Missing option '-i'"),
    (f"{RUN} -i TMP/missing.npy", 2, "input 'TMP/missing.npy'"),
    (f"{RUN} -i TMP/text.npy", 2, "input 'TMP/text.npy'"),
    (f"{RUN} -i TMP/empty.npy", 2, "input 'TMP/empty.npy'"),
    (f"{RUN} -i TMP/truncated.npy", 2, "input 'TMP/truncated.npy'"),
    (f"{RUN} -i TMP/bad_header.npy", 2, "input 'TMP/bad_header.npy'"),
    (f"{RUN} -i TMP/object.npy", 2, "input 'TMP/object.npy'"),
    (f"{RUN} -i TMP/arrays.npz", 2, "holds several arrays (.npz)"),
    (f"{RUN} -i TMP/i8_4.npy", 2, "does not support dtype int8"),
    (f"{RUN} -i TMP/u16_4.npy", 2, "dtype uint16"),
    (f"{RUN} -i TMP/c64_4.npy", 2, "dtype complex64"),
    (f"{RUN} -i TMP/bool_4.npy", 2, "dtype bool"),
    (f"{RUN} -i TMP/str_4.npy", 2, "dtype <U1"),
    (f"{RUN} -i TMP/datetime.npy", 2, "dtype datetime64[D]"),
    (f"{RUN} -i TMP/be_f32_4.npy", 2, "input 'TMP/be_f32_4.npy' is big-endian (>f4): save it little-endian"),
    (f"{RUN} -i TMP/trailing.npy", 2, "claims a 3x4 float32 array (48 bytes) but the file holds 53 bytes"),
    (f"{RUN} -i TMP/zero_size.npy", 2, "has shape [0]: dims must be >= 1"),
    (f"{RUN} -i TMP/rank7.npy", 2, "expected rank 0..6"),
    (f"{RUN} -i TMP/f32_4.npy -i TMP/f32_4.npy", 2, "takes 1 inputs (x), got 2"),
    (f"{RUN_ADD} -i TMP/f32_4.npy", 2, "takes 2 inputs (a, b), got 1"),
    (f"{RUN_ADD} -i TMP/f32_3x4.npy -i TMP/f32_5.npy", 2, "[5]"),
    (f"{RUN_ADD} -i TMP/f32_4.npy -i TMP/f64_4.npy", 2, "must share one dtype, got float32, float64"),
    # a symbolic batch: where a name may go, what takes static shapes only, arrays against it
    (f"{ADD} --shape 3xN --shape 4", 2, "--shape '3xN': expected dims like 32x64x112x112"),
    (f"{LR} --shape Nx4 --target opencl", 2, "target opencl needs static shapes: the batch N is symbolic"),
    (f"{LR} --shape Nx4 --bundle --target opencl", 2, "target opencl needs static shapes: the batch N"),
    (f"{TUNE} --shape Nx4", 2, "tuning leaky_relu needs static shapes: the batch N is symbolic"),
    (f"{LR} --shape maxx4", 2, "--shape 'maxx4': expected dims like"),
    (f"{ADD} --shape Nx1x3 --shape 2x1x1x3", 2, "the output of add has shape [2, N, 1, 3]: only the first"),
    (f"{ARGMAX.replace('3x4', 'Nx4')} -a axis=0", 2, "axis=0 reduces the symbolic batch N"),
    (f"{RUN_ADD} --shape Nx4 --shape Nx4 -i TMP/f32_3x4.npy -i TMP/f32_4.npy", 2, "input b has shape [4]"),
    (f"{RUN_ADD} --shape Nx4 -i TMP/f32_3x4.npy -i TMP/f32_3x4.npy", 2, "give one per -i input (2), got 1"),
    (f"{RUN} --shape Nx5 -i TMP/f32_3x4.npy", 2, "input x has shape [3, 4]: expected [N, 5]"),
    (f"run --target x86 {GOOD} --shape Nx4 -i TMP/f32_3x4.npy -o out.npy", 2, "--shape describe an op"),
    (f"{RUN} -i TMP/f32_4.npy -a alpha=1e308", 2, "within the range of float32"),
    (f"{RUN} -i TMP/f16_4.npy -a alpha=-7e4", 2, "within the range of float16"),
    (f"{RUN} -i TMP/f32_4.npy -a beta=1", 2, "has no attribute 'beta'"),
    (f"{RUN} -i TMP/f32_4.npy --cores 0", 2, "--cores 0"),
    (f"{RUN} -i TMP/f32_4.npy --tuned TMP/afile", 2, "is not a directory"),
    (f"{RUN} -i TMP/f32_4.npy --device nosuch", 2, "unknown device 'nosuch'"),
    ("run --target x86 --op nope -o out.npy -i TMP/f32_4.npy", 2, "unknown op 'nope'"),
    ("run --target arm9 --op leaky_relu -o out.npy -i TMP/f32_4.npy", 2, "'arm9'"),
    # test
    ("test", 2, "Missing option '--target'"),
    ("test --target nosuch", 2, "'nosuch'"),
    ("test --target x86 --op nosuch", 2, "unknown op 'nosuch'"),
    ("test --target x86 --dtype float128", 2, "no cases for ops all with dtypes float128"),
    ("test --target x86 --op leaky_relu --dtype int8", 2, "no cases for ops leaky_relu with dtypes int8"),
    ("test --target x86 --cores 0", 2, "--cores 0"),
    ("test --target x86 --tuned TMP/afile", 2, "is not a directory"),
    ("test --target x86 --device nosuch", 2, "unknown device 'nosuch'"),
    ("test --target x86 --tracker 127.0.0.1:9190", 2, "--tracker and --key go together"),
    ("test --target x86 --tracker 127.0.0.1:9190 --key ''", 2, "--key '': expected a device key"),
    ("test --target x86 --cl-device 0:0 --device local", 2, "--cl-device goes instead"),
    ("test --target x86 --shape 4", 2, "No such option '--shape'"),
    # bench: bad values are refused before any device (nosuch would be refused next)
    ("bench --target x86 --op leaky_relu --dtype int8", 2, "no op in the selection supports dtype int8"),
    (f"{BENCH} --op leaky_relu --dtype int8", 2, "no op in the selection supports dtype int8"),
    (f"{BENCH} --op add --op leaky_relu --dtype int8", 2, "--op leaky_relu: does not support dtype int8"),
    (f"{BENCH} --dtype float128", 2, "no op in the selection supports dtype float128"),
    (f"{BENCH} --op nosuch", 2, "unknown op 'nosuch'"),
    (f"{BENCH} --repeat 0", 2, "--repeat 0: expected 1 to 1000"),
    (f"{BENCH} --repeat -3", 2, "--repeat -3: expected 1 to 1000"),
    (f"{BENCH} --repeat 99999999999999999999999", 2, "--repeat 99999999999999999999999: expected 1 to 1000"),
    (f"{BENCH} --repeat abc", 2, "'abc' is not a valid integer"),
    (f"{BENCH} --min-mb 0", 2, "--min-mb 0: expected 1 to 8000"),
    (f"{BENCH} --min-mb 8001", 2, "--min-mb 8001: expected 1 to 8000"),
    (f"{BENCH} --min-mb 1.5", 2, "'1.5' is not a valid integer"),
    ("bench --target x86 --op add --dtype int8 --min-mb 8000", 2, "--min-mb 8000: add grown to 3328x64x"),
    (f"bench --target x86 {GOOD} --min-mb 100", 2, "a model's shapes are its own"),
    (f"{BENCH} --plot TMP/missing/bench.png", 2, "TMP/missing is not an existing directory"),
    (f"{BENCH} --plot TMP/afile/bench.png", 2, "TMP/afile is not an existing directory"),
    (f"{BENCH} --plot TMP/adir", 2, "'TMP/adir' is a directory"),
    (f"{BENCH} --plot TMP/bench.txt", 2, "--plot 'TMP/bench.txt': expected a .png file path"),
    (f"{BENCH} --plot ''", 2, "--plot '': expected a .png file path"),
    (f"{BENCH} --plot TMP/fifo.png", 2, "--plot TMP/fifo.png: not a regular file (or a link to one)"),
    (f"{BENCH} --plot TMP/dangling.png", 2, "--plot TMP/dangling.png: not a regular file"),
    (f"{TUNE} --shape 4 --db ''", 2, "--db '': expected a records directory"),
    (f"{BENCH} --cores 0", 2, "--cores 0"),
    (f"{BENCH} --tuned TMP/afile", 2, "--tuned TMP/afile: is not a directory"),
    ("bench --target x86 --device nosuch --op add", 2, "unknown device 'nosuch'"),
    ("bench --target nosuch", 2, "'nosuch'"),
    # tune: what is checked before a search starts
    ("tune --target x86", 2, "--op or --model is required"),
    ("tune --target x86 --op leaky_relu", 2, "--shape is required with --op"),
    (f"{TUNE} --shape ''", 2, "--shape '': expected dims"),
    (f"{TUNE} --shape \uff14", 2, "--shape '\uff14': expected dims"),
    (f"{TUNE} --shape 1000000000x1000000000", 2, "1e+18 elements"),
    (f"{TUNE} --shape 4 -a alpha=1e308", 2, "within the range of float32"),
    (f"{TUNE} --shape 4 --dtype int8", 2, "does not support dtype int8"),
    ("tune --target x86 --op nosuch --shape 4", 2, "unknown op 'nosuch'"),
    (f"{TUNE} --shape 4 --trials abc", 2, "'abc' is not a valid integer"),
    (f"{TUNE} --shape 4 --timeout abc", 2, "'abc' is not a valid float"),
    (f"{TUNE} --shape 4 --cores 0", 2, "--cores 0"),
    (f"{TUNE} --shape 4 --tuned TMP/adir", 2, "No such option '--tuned'"),
    (f"{TUNE} --shape 4 --device nosuch", 2, "unknown device 'nosuch'"),
    ("tune --target x86 --report --db TMP/missing", 2, "TMP/missing"),
    ("tune --target x86 --report --db TMP/afile", 2, "--db TMP/afile: is a file"),
    (f"{TUNE} --shape 4 --db TMP/afile/sub", 2, "--db TMP/afile/sub: is under TMP/afile, a file"),
    (f"{TUNE} --shape 4 --trials 0", 2, "--trials 0: expected 1..100000"),
    (f"{TUNE} --shape 4 --trials -3", 2, "--trials -3: expected 1..100000"),
    (f"{TUNE} --shape 4 --trials 10000000", 2, "--trials 10000000: expected 1..100000"),
    (f"{TUNE} --shape 4 --timeout -1", 2, "--timeout -1.0: expected seconds in (0, 86400]"),
    (f"{TUNE} --shape 4 --timeout 0", 2, "--timeout 0.0: expected seconds"),
    (f"{TUNE} --shape 4 --timeout nan", 2, "--timeout nan: expected seconds"),
    (f"{TUNE} --shape 4 --timeout inf", 2, "--timeout inf: expected seconds"),
    # run -o and .npy inputs that lie (the op runs first: the output is written after it)
    (f"{RUN} -i TMP/f32_4.npy -o TMP/adir", 2, "is a directory; expected a .npy file path"),
    (f"{RUN} -i TMP/f32_4.npy -o TMP/afile/out.npy", 2, "afile is not a directory"),
    (f"{RUN} -i TMP/forged.npy", 2, "its header claims a 100000x100000 float32 array"),
    (f"{RUN} -i TMP/v3.npy", 2, "is .npy format 3.0; expected 1.0 or 2.0"),
    (f"{LR} --shape 4 -o TMP/afile/art", 2, "afile is a file, not a directory"),
    (f"{LR} --shape 4 -o ''", 2, "-o '': expected an artifact directory"),
    ("build --target arm --op leaky_relu --shape 4 -o ''", 2, "-o '': expected"),  # before the emulator
    (f"{RUN} -i TMP/f32_4.npy -o ''", 2, "-o '': expected a .npy file path"),
    # where nothing can be created (sysfs, even for root): refused before the work, not after it
    (f"{LR} --shape 4 -o /sys/deploy-art", 2, "cannot write output directory /sys/deploy-art: "),
    (f"{TUNE} --shape 4 --db /sys/deploy-db", 2, "--db /sys/deploy-db: "),
    (f"{TUNE} --shape 4 --db TMP/dangling", 2, "dangling: is a symbolic link to nothing"),
    (f"{TUNE} --shape 4 --db TMP/dangling/sub", 2, "dangling, a symbolic link to nothing"),
    (f"{BENCH} --plot /sys/deploy.png", 2, "--plot /sys/deploy.png: cannot write in /sys: "),
    (f"{LR} --shape 4 -o TMP/afile/deeper/art", 2, "afile is a file, not a directory"),
    # device and tracker: names and addresses (nothing is started)
    ("device nosuch", 2, "No such command 'nosuch'"),
    ("device check nosuch", 2, "no device named 'nosuch'"),
    ("device setup nosuch", 2, "no device named 'nosuch'"),
    ("device remove nosuch", 2, "no device named 'nosuch'"),
    ("device serve nosuch --tracker 127.0.0.1:9190 --key k", 2, "no device named 'nosuch'"),
    ("device serve b --tracker nocolon --key k", 2, "tracker address 'nocolon'"),
    ("device serve b --key k", 2, "Missing option '--tracker'"),
    ("device add", 2, "Missing argument 'NAME'"),
    ("device add b --user u", 2, "Missing option '--host'"),
    ("device add 'a b' --host h --user u", 2, "device name 'a b'"),
    ("device add local --host h --user u", 2, "device name 'local'"),
    ("device add b --host '' --user u", 2, "board host ''"),
    ("device add b --host 'h h' --user u", 2, "board host 'h h'"),
    (
        "device add b --host h:22 --user u",
        2,
        "board host 'h:22': expected a host name or address (the port goes in --port)",
    ),
    (
        "device add b --host u@h --user u",
        2,
        "board host 'u@h': expected a host name or address (the user goes in --user)",
    ),
    ("device add b --host '[::1]' --user u", 2, "board host '[::1]'"),
    ("device add b --host h --user ''", 2, "board user ''"),
    (f"{BOARD} --port 0", 2, "board port 0: expected 1..65535"),
    (f"{BOARD} --port 70000", 2, "board port 70000"),
    (f"{BOARD} --port abc", 2, "'abc' is not a valid integer"),
    (f"{BOARD} --arch sparc", 2, "board arch 'sparc'"),
    (f"{BOARD} --key TMP/missing_key", 2, "board key 'TMP/missing_key': no such file"),
    ("device emulator nosuch", 2, "No such command 'nosuch'"),
    ("device emulator start --tracker nocolon", 2, "tracker address 'nocolon'"),
    ("device emulator start --port abc", 2, "'abc' is not a valid integer"),
    ("tracker nosuch", 2, "No such command 'nosuch'"),
    ("tracker status --tracker nocolon", 2, "tracker address 'nocolon'"),
    ("tracker status --tracker 'h h:9190'", 2, "tracker address 'h h:9190'"),
    ("tracker status --tracker 127.0.0.1:9190:1", 2, "tracker address '127.0.0.1:9190:1'"),
    ("tracker status --tracker '[::1'", 2, "tracker address '[::1'"),
    (
        "tracker status --tracker ::1:9190",
        2,
        "tracker address '::1:9190': expected HOST:PORT, e.g. 127.0.0.1:9190 or [::1]:9190",
    ),
    ("device emulator start --tracker 127.0.0.1:9190 --key ''", 2, "--key '': expected a device key"),
    ("device emulator start --tracker 127.0.0.1:9190 --key 'a b'", 2, "--key 'a b': expected a device key"),
    ("device serve b --tracker 127.0.0.1:9190 --key ''", 2, "--key '': expected a device key"),
    ("tracker start --port abc", 2, "'abc' is not a valid integer"),
    ("tracker status --tracker 127.0.0.1:\uff19\uff11\uff19\uff10", 2, "tracker address '127.0.0.1:"),
    # where boards keep our files, and what servers listen on (checked before anything starts)
    (f"{BOARD} --remote-dir ''", 2, "remote dir ''"),
    (f"{BOARD} --remote-dir .", 2, "remote dir '.'"),
    (f"{BOARD} --remote-dir /", 2, "remote dir '/'"),
    (f"{BOARD} --remote-dir ..", 2, "remote dir '..'"),
    (f"{BOARD} --remote-dir a/../..", 2, "remote dir 'a/../..'"),
    ("tracker start --port 70000", 2, "--port 70000: expected a port from 1 to 65535"),
    ("tracker start --port 0", 2, "--port 0: expected a port from 1 to 65535"),
    ("tracker start --host 0.0.0.0", 2, "add --public to mean it"),
    ("tracker start --host ::", 2, "add --public to mean it"),
    ("tracker start --host ''", 2, "--host '': expected an address of this host"),
    ("tracker start --host no-such-host.invalid", 2, "expected an address of this host"),
    ("device emulator start --port 70000", 2, "--port 70000: expected a port from 1 to 65535"),
    *MODEL_ROWS,
    *RUNNER_ROWS,
    *NAMES_ROWS,
    *ROBUST_ROWS,
]

OP_FILE = textwrap.dedent(
    '''
    """A user op named {name!r}."""
    from tvm import te
    from deploy.ops import Case, Input, Op, register

    @register
    class {cls}(Op):
        """x, copied."""
        name = "{name}"
        inputs = (Input("x"),)
        cases = (Case(((4,),)),)

        def infer(self, attrs, inputs):
            return inputs[0]

        def compute(self, attrs, out, x):
            return te.compute(out.shape, lambda *i: x[i], name="out")

        def reference(self, attrs, x):
            return x.copy()
    '''
)

OP_DIRS = {
    "ops_exit": {"quit.py": "import sys\nsys.exit(0)\n"},
    "ops_exit_msg": {"bye.py": "raise SystemExit('bye')\n"},
    "ops_import": {"imports.py": "import no_such_module_for_deploy\n"},
    "ops_old": {"old.py": "import numpy\nfrom ops import Op\n"},
    "ops_syntax": {"syntax.py": "def (:\n"},
    "ops_raise": {"raises.py": "raise RuntimeError('boom')\n"},
    "ops_noname": {"noname.py": "from deploy.ops import Op, register\n\n@register\nclass NoName(Op): pass\n"},
    "ops_builtin": {"lr.py": OP_FILE.format(name="leaky_relu", cls="LeakyRelu")},
    "ops_twins": {
        "a.py": OP_FILE.format(name="hostile_twin", cls="Twin"),
        "b.py": OP_FILE.format(name="hostile_twin", cls="Twin"),
    },
    "first/ops": {"lr.py": OP_FILE.format(name="hostile_namesake", cls="Namesake")},
    "second/ops": {"lr.py": OP_FILE.format(name="hostile_namesake", cls="Namesake")},
    "ops_llvm_abort": {"crc.py": LLVM_ABORT_OP},
}


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the rows name under TMP/."""
    root = tmp_path_factory.mktemp("hostile").resolve()
    (root / "afile").write_text("a plain file\n")
    (root / "adir").mkdir()
    (root / "dangling").symlink_to(root / "nowhere")
    os.mkfifo(root / "fifo.yaml")
    os.mkfifo(root / "fifo.npy")
    (root / "sparse.yaml").touch()
    os.truncate(root / "sparse.yaml", 2**30)  # 1 GB that takes no disk: refused before it is read
    os.mkfifo(root / "fifo.png")
    (root / "dangling.png").symlink_to(root / "nowhere.png")
    (root / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    arrays = {
        "f32_4": np.ones(4, "float32"),
        "f32_3x4": np.ones((3, 4), "float32"),
        "f32_5": np.ones(5, "float32"),
        "f64_4": np.ones(4, "float64"),
        "f16_4": np.ones(4, "float16"),
        "i8_4": np.ones(4, "int8"),
        "u16_4": np.ones(4, "uint16"),
        "c64_4": np.ones(4, "complex64"),
        "bool_4": np.ones(4, "bool"),
        "str_4": np.array(["a", "b", "c", "d"]),
        "datetime": np.array(["2020-01-01"], dtype="datetime64[D]"),
        "be_f32_4": np.ones(4, ">f4"),
        "zero_size": np.ones(0, "float32"),
        "rank7": np.ones((1,) * 7, "float32"),
    }
    for name, array in arrays.items():
        np.save(root / f"{name}.npy", array)
    np.save(root / "object.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(root / "arrays.npz", a=np.ones(4, "float32"), b=np.ones(4, "float32"))
    (root / "text.npy").write_text("not a numpy file")
    (root / "empty.npy").write_bytes(b"")
    whole = (root / "f32_3x4.npy").read_bytes()
    (root / "truncated.npy").write_bytes(whole[: len(whole) - 8])
    (root / "trailing.npy").write_bytes(whole + b"extra")
    with open(root / "forged.npy", "wb") as forged:
        np.lib.format.write_array_header_1_0(
            forged, {"descr": "<f4", "fortran_order": False, "shape": (100000, 100000)}
        )
        forged.write(bytes(64))
    with open(root / "v3.npy", "wb") as v3:
        np.lib.format.write_array(v3, np.ones(4, "float32"), version=(3, 0))
    for name, header in (("digits", f"'shape': ({BIG},)"), ("fortran0", "'shape': (4,), 'fortran_order': 0")):
        raw = f"{{'descr': '<f4', {header}, }}\n".encode()
        (root / f"{name}.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw)
    (root / "bad_header.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4 }   \n")
    for name, text in MODEL_FILES.items():
        (root / name).write_text(text)
    (root / "ref_attr.onnx").write_bytes(ref_attr_model())
    (root / "custom.onnx").write_bytes(
        (Path(__file__).parent.parent / "examples/pool_add_leaky_htanh.onnx").read_bytes()
    )
    for folder, files in OP_DIRS.items():
        (root / folder).mkdir(parents=True)
        for name, text in files.items():
            (root / folder / name).write_text(text)
    return root


def ref_attr_model() -> bytes:
    """A one-node model whose LeakyRelu's alpha refers to a function attribute (`ref_attr_name`),
    which onnx's checker lets pass outside a function."""
    from onnx import AttributeProto, TensorProto, helper

    node = helper.make_node("LeakyRelu", ["x"], ["y"], "act")
    node.attribute.append(AttributeProto(name="alpha", type=AttributeProto.FLOAT, ref_attr_name="slope"))
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y")]
    graph = helper.make_graph([node], "g", value[:1], value[1:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_the_table_holds_150_distinct_inputs():
    commands = [tuple(shlex.split(command)) for command, _, _ in ROWS]
    assert len(set(commands)) == len(commands), "a row is repeated"
    assert len(commands) >= 150


@pytest.mark.parametrize("command,code,fragment", ROWS, ids=[row[0][:80] for row in ROWS])
def test_bad_input_is_one_line(command, code, fragment, hostile_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    registry.load_builtin()
    monkeypatch.setattr(registry, "_OPS", dict(registry._OPS))  # ops a row's --ops-path adds go after it
    args = [arg.replace("TMP/", f"{hostile_files}/") for arg in shlex.split(command)]
    result = invoke(*args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert fragment.replace("TMP/", f"{hostile_files}/") in lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == [], "a refused command wrote nothing"


BOARD_ENTRY = {"name": "b", "host": "h", "user": "u", "port": 22, "arch": "aarch64", "remote_dir": ".deploy"}


@pytest.mark.parametrize(
    "config,fragment",
    [
        (
            '{"b": {"name": "b", "host": "h", "user": "u", "port": 99999}}',
            "board port 99999: expected 1..65535",
        ),
        ('{"b": {"name": "b", "host": 5, "user": null, "port": "x"}}', "board host 5: expected a string"),
        ('{"b": {"name": "b", "host": "h", "user": "u", "port": true}}', "board port True"),
        ('{"b": {"name": "zz", "host": "h", "user": "u"}}', "the entry names the device 'zz'"),
        ('{"b": [1]}', "expected an object of the board's name, host, user, port, key, arch, remote_dir"),
        ('{"b": {"name": "b", "user": "u"}}', "it has no host"),
        ('{"b": {"name": "b", "host": "h", "user": "u", "remote_dir": "/"}}', "remote dir '/'"),
        ('{"b": {"name": "b", "host": "h", "user": "u", "arch": "sparc"}}', "board arch 'sparc'"),
        ("[1, 2]", "expected an object of devices"),
        ("", "Expecting value"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (None, "devices.json: Is a directory"),
    ],
)
def test_a_bad_device_config_is_one_line(config, fragment, tmp_path, monkeypatch):
    """devices.json is checked as `device add` checks a board: a hand-edited port of 99999 is not
    wrapped to another port, nor a host of 5 handed to the SSH helper. A bad entry is named, and
    `device remove` forgets it (the other boards stay usable); a bad file is named."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = tmp_path / "deploy" / "devices.json"
    path.parent.mkdir()
    if config is None:
        path.mkdir()
    else:
        path.write_text(config)
    entry = config is not None and config.startswith('{"b"')
    said = f"device 'b' in {path}: " if entry else f"cannot read device config {path}: "
    build = ["build", "--target", "arm", "--op", "add", "--shape", "4", "--shape", "4", "--device", "b"]
    for command in (["device", "list"], build):
        result = invoke(*command)
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {said}") and fragment in line, line
    if entry:
        assert "(`deploy device remove b` forgets it)" in line
        removed = invoke("device", "remove", "b")
        assert removed.exit_code == 0 and removed.stdout.startswith("removed 'b' ("), removed.output
        assert json.loads(path.read_text()) == {}


@pytest.mark.parametrize("host", ["board.local", "10.0.0.7", "::1", "fe80::1%eth0"])
def test_a_board_host_may_be_an_ipv6_address(host):
    """A ':' in a host is refused (a port belongs in --port) unless the host is an IPv6 address,
    which paramiko takes as it is."""
    from deploy.devices.boards import Board

    assert Board("b", host, "u").check().host == host
