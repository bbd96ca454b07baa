#!/usr/bin/python3
"""Loads a model exported by `tessera export` into PyTorch's SimpleCNN with load_state_dict
(strict: every key and shape must match) and checks that its logits on the images of
EXPECTED.npz equal Tessera's logits stored beside them.

Usage: /usr/bin/python3 torch_logits_check.py MODEL.npz EXPECTED.npz
Exit status 0 and "logits match" when the largest difference is within 1e-4 of the logits'
scale; 1 otherwise, with the figures."""
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
    model = SimpleCNN()
    with np.load(model_path) as archive:
        state = {name: torch.from_numpy(archive[name]) for name in archive.files}
    model.load_state_dict(state, strict=True)
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
