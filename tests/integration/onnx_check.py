#!/usr/bin/python3
"""Checks an ONNX file written by `tessera export -o FILE.onnx` with python3-onnx: the full
checker (with shape inference), the output's inferred shape [batch, classes], and every
initializer equal to the same-named array of the .npz exported beside it.

Usage: /usr/bin/python3 onnx_check.py MODEL.onnx MODEL.npz CLASSES
Prints "onnx ok" and exits 0 when every check holds."""
import sys

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference


def main():
    onnx_path, npz_path, classes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = onnx.load(onnx_path)
    onnx.checker.check_model(model, full_check=True)
    inferred = shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    out = inferred.graph.output[0]
    dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    if out.name != "logits" or dims != ["batch", classes]:
        print(f"unexpected output {out.name} {dims}")
        return 1
    with np.load(npz_path) as archive:
        initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        if sorted(initializers) != sorted(archive.files):
            print(f"initializers {sorted(initializers)} differ from the archive's {sorted(archive.files)}")
            return 1
        for name in archive.files:
            if not np.array_equal(initializers[name], archive[name]):
                print(f"initializer {name} differs")
                return 1
    print(f"onnx ok: {len(model.graph.node)} nodes, {len(initializers)} initializers, output {dims}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
