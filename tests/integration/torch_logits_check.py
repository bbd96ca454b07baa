#!/usr/bin/python3
"""Loads a model exported by `tessera export` into PyTorch's SimpleCNN (or the ResNet-8 of
bench/torch_simplecnn.py) with load_state_dict (every key and shape must match; for ResNet-8
only the batch norms' num_batches_tracked, which Tessera does not keep, may be missing) and
checks that its logits on the images of EXPECTED.npz, in eval mode, equal Tessera's logits
stored beside them.

Usage: /usr/bin/python3 torch_logits_check.py MODEL.npz EXPECTED.npz [simplecnn|resnet8]
Exit status 0 and "logits match" when the largest difference is within 1e-4 of the logits'
scale; 1 otherwise, with the figures."""
import os
import sys

import numpy as np
import torch
import torch.nn as nn


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def main():
    model_path, expected_path = sys.argv[1], sys.argv[2]
    which = sys.argv[3] if len(sys.argv) > 3 else "simplecnn"
    if which == "resnet8":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
        from torch_simplecnn import ResNet8
        model = ResNet8()
    else:
        model = SimpleCNN()
    with np.load(model_path) as archive:
        state = {name: torch.from_numpy(archive[name]) for name in archive.files}
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        print(f"keys differ: missing {missing}, unexpected {result.unexpected_keys}")
        return 1
    model.eval()
    with np.load(expected_path) as expected:
        images = torch.from_numpy(expected["images"])
        tessera_logits = expected["logits"]
    with torch.no_grad():
        torch_logits = model(images).numpy()
    scale = float(np.abs(tessera_logits).max())
    worst = float(np.abs(torch_logits - tessera_logits).max())
    agree = float((torch_logits.argmax(1) == tessera_logits.argmax(1)).mean())
    print(f"images={len(images)} max_abs_diff={worst:.3g} logit_scale={scale:.3g} top1_agreement={agree:.4f}")
    if worst > 1e-4 * max(scale, 1.0):
        print("logits differ")
        return 1
    print("logits match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
