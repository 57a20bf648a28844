"""The schedules of OpenCL targets (family "gpu"), a file per job:

- `generic.py`: every output element, or every vector of them, a work-item: the schedule of an
  op no family has a schedule of its own for, and the binding the others build on;
- `pooling.py`: max_pool2d and max_pool2d_indices, a window max's NaN test a branch, an output a
  work-item;
- `argmax.py`: argmax as strided partials, a work-group per output.
"""

from deploy.schedules.gpu import argmax, generic, pooling  # noqa: F401  (registration on import)
