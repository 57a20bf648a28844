"""Eight bundles in one program against one: does a process pay for each bundle it links?

    .venv/bin/python bench/bundles_in_one_process.py [--rounds 9] [--threads 1,2] [--bundles 8]

Builds `add` 1x64x56x56 (one parallel loop a call) for this host as `--bundles` bundles under
names of their own, links them into one C program, and times, in interleaved rounds at each
thread count, a call of every bundle in turn ("many") against as many calls of the first
("one"): the same work, the same kernel. With one runtime per process (runtime.h) they share one
pool and the two take the same time; with a pool each, every bundle's threads wake for its call
and spin after it while the next bundle's run. Prints microseconds per call (medians with the
interquartile spread) and many/one.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import at_least_one, host_target, run

from deploy.compiler.compile import compile_op
from deploy.compiler.export import export
from deploy.compiler.options import BuildOptions
from deploy.compiler.targets import Target
from deploy.devices.platforms import get_platform
from deploy.ops import TensorType, bind, get_op

SHAPE = (1, 64, 56, 56)
CALLS = 2000
"""Calls a timed run makes (in turns of the bundles): about 20 ms at 1 thread on a laptop core."""

PROGRAM = """#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
{includes}

typedef int (*call_fn)(const DLTensor*, const DLTensor*, DLTensor*);
typedef int (*threads_fn)(int);
static const call_fn calls[] = {{{calls}}};
static const threads_fn setters[] = {{{setters}}};
enum {{ BUNDLES = {count}, SIZE = {size} }};

int main(int argc, char** argv) {{
  int64_t shape[4] = {{{shape}}};
  float *a, *b, *out;
  int threads = atoi(argv[1]), many = strcmp(argv[2], "many") == 0, i;
  struct timespec start, end;
  if (posix_memalign((void**)&a, 64, SIZE * 4) || posix_memalign((void**)&b, 64, SIZE * 4) ||
      posix_memalign((void**)&out, 64, SIZE * 4)) return 3;
  for (i = 0; i < SIZE; ++i) a[i] = (float)(i % 7), b[i] = (float)(i % 5);
  DLTensor ta = {{a, {{kDLCPU, 0}}, 4, {{kDLFloat, 32, 1}}, shape, NULL, 0}}, tb = ta, tout = ta;
  tb.data = b, tout.data = out;
  for (i = 0; i < BUNDLES; ++i) setters[i](threads);  /* each bundle's, as an application would */
  for (i = 0; i < {calls_count}; ++i) calls[many ? i % BUNDLES : 0](&ta, &tb, &tout);  /* warm up */
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (i = 0; i < {calls_count}; ++i) {{
    if (calls[many ? i % BUNDLES : 0](&ta, &tb, &tout) != 0) return 4;
  }}
  clock_gettime(CLOCK_MONOTONIC, &end);
  double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
  printf("%.3f\\n", ns / 1e3 / {calls_count});
  return out[SIZE - 1] == (float)((SIZE - 1) % 7 + (SIZE - 1) % 5) ? 0 : 5;
}}
"""


def build(target: Target, work: Path, count: int) -> Path:
    """The program linking `count` bundles of add (named b0, b1, ...) for `target`, built in `work`."""
    bound = bind(get_op("add"), {}, [TensorType(SHAPE, "float32")] * 2)
    compiled = compile_op(bound, target, BuildOptions())
    names = [f"b{i}" for i in range(count)]
    for name in names:
        export(compiled, work / name, bundle=True, name=name)
    source = work / "many.c"
    source.write_text(
        PROGRAM.format(
            includes="\n".join(f'#include "{n}.h"' for n in names),
            calls=", ".join(names),
            setters=", ".join(f"{n}_set_num_threads" for n in names),
            count=count,
            size=math.prod(SHAPE),
            shape=", ".join(map(str, SHAPE)),
            calls_count=CALLS,
        )
    )
    flags = [f for n in names for f in (f"-I{work / n}", f"-I{work / n / 'include'}")]
    program = work / "many"
    gcc = get_platform(target.arch).tool("gcc")
    libraries = [str(work / n / f"lib{n}.a") for n in names]
    subprocess.run(
        [gcc, "-O2", *flags, str(source), *libraries, "-lm", "-lpthread", "-o", str(program)], check=True
    )
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--bundles", type=int, default=8)
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    at_least_one(parser, "--bundles", args.bundles)
    counts = [int(t) for t in args.threads.split(",") if t.strip().isdigit() and int(t) > 0]
    if not counts or len(counts) != len(args.threads.split(",")):
        parser.error(f"--threads {args.threads}: expected thread counts of at least 1, comma-separated")
    target = host_target(parser, "x86")
    with tempfile.TemporaryDirectory(prefix="bundles-") as tmp:
        program = build(target, Path(tmp), args.bundles)
        print(f"add {'x'.join(map(str, SHAPE))}, {args.bundles} bundles in one program, {CALLS} calls a run")
        print(f"{'threads':>7}  {'many (us/call)':>22}  {'one (us/call)':>22}  many/one")
        for threads in counts:
            runs: dict[str, list[float]] = {"many": [], "one": []}
            for _ in range(args.rounds):
                for mode, times in runs.items():
                    done = subprocess.run([str(program), str(threads), mode], capture_output=True, text=True)
                    if done.returncode != 0:
                        sys.exit(f"the program failed ({mode}, {threads} threads): exit {done.returncode}")
                    times.append(float(done.stdout))
            shown = {mode: spread(times) for mode, times in runs.items()}
            ratio = statistics.median(runs["many"]) / statistics.median(runs["one"])
            print(f"{threads:>7}  {shown['many']:>22}  {shown['one']:>22}  {ratio:8.2f}")


def spread(times: list[float]) -> str:
    """The median and the interquartile range of `times`."""
    low, mid, high = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    return f"{mid:.1f} [{low:.1f}-{high:.1f}]"


if __name__ == "__main__":
    run(main)
