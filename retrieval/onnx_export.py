"""Export a sentence-transformers model's transformer to ONNX (run as a child process).

``python -m engram_memory.retrieval.onnx_export MODEL_DIR OUT_FILE`` writes the transformer's
forward pass (input_ids, attention_mask, token_type_ids -> last_hidden_state) with dynamic
batch and sequence axes. Pooling and normalisation stay outside the graph, in numpy
(retrieval/onnx_runtime.py), exactly as the model's own module list describes them.

It runs in its own process so that the serving process never imports torch: torch alone is
~250 MB of resident memory, and once the file exists nothing needs it. Offline: the model is
read from its directory only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OPSET = 17  # the TorchScript exporter's well-trodden opset; onnxruntime 1.32 runs it as is
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "last_hidden_state"


def export(model_dir: Path, out_file: Path) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import warnings

    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()

    class Forward(torch.nn.Module):
        """Inputs by keyword (BERT's positional order is not input_ids, attention_mask, types)."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    sample = torch.ones((1, 8), dtype=torch.long)
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUTS, OUTPUT)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's notes on advanced indexing: not for operators
        torch.onnx.export(Forward(model), (sample, sample, torch.zeros_like(sample)), str(out_file),
                          input_names=list(INPUTS), output_names=[OUTPUT], dynamic_axes=axes,
                          opset_version=OPSET, dynamo=False)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m engram_memory.retrieval.onnx_export MODEL_DIR OUT_FILE\n")
        return 2
    export(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
