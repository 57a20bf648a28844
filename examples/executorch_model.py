"""Exports a small PyTorch model that calls deploy's ops, for ExecuTorch:
`python examples/executorch_model.py OUT.pt2` (docs/engines.md).

conv_hsig_linear_leaky: Conv2d(3 -> 8, 3x3, padding 1) on `x` [1, 3, 8, 8], then deploy's
hard_sigmoid as its activation (`deploy::hard_sigmoid`), flattened, Linear(512 -> 10), then
deploy's leaky_relu with alpha 0.1 (`deploy::leaky_relu`: an attribute is a keyword). Weights
seeded; float32 throughout. Saved with torch.export.save: `deploy build/test --model OUT.pt2
--engine executorch` lowers it.
"""

from __future__ import annotations

import sys

import torch

import deploy.engines.executorch_ops  # noqa: F401  (defines torch.ops.deploy.<op>)


class ConvHsigLinearLeaky(torch.nn.Module):
    """The model: [1, 3, 8, 8] -> [1, 10]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.linear = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.deploy.hard_sigmoid(self.conv(x))
        return torch.ops.deploy.leaky_relu(self.linear(torch.flatten(y, 1)), alpha=0.1)


def export(path: str) -> None:
    """The model, exported for an input of [1, 3, 8, 8], saved to `path`."""
    torch.manual_seed(0)
    program = torch.export.export(ConvHsigLinearLeaky().eval(), (torch.randn(1, 3, 8, 8),))
    torch.export.save(program, path)


if __name__ == "__main__":
    export(sys.argv[1] if len(sys.argv) > 1 else "conv_hsig_linear_leaky.pt2")
