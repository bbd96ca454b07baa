#!/usr/bin/python3
"""An external trainer: the CNN of McMahan et al. 2017 trained in PyTorch, federated by Tessera.

Each Tessera worker runs this script as its external trainer "pytorch"
(tessera-worker --trainer "pytorch=/usr/bin/python3 examples/pytorch/train_mcmahan.py", with
python/ on PYTHONPATH or `pip install ./python`); the job examples/pytorch-mcmahan.toml names
it. Every round it loads the global model into torch, trains on the worker's share with the
job's settings, and sends the trained state_dict back. Run with Debian's /usr/bin/python3,
which has python3-torch.
"""
import sys

import numpy as np
import torch
import torch.nn as nn

import tessera_client as tc


class McMahanCNN(nn.Module):
    """Same parameter names and shapes as Tessera's mcmahan-cnn (core/model/model.cc)."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 512)
        self.fc2 = nn.Linear(512, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def main():
    torch.set_num_threads(1)  # a worker is one client; several share this machine's cores
    model = McMahanCNN()
    while (task := tc.receive()) is not None:
        model.load_state_dict(task.state_dict())
        x, y = task.data()
        images, labels = torch.from_numpy(x), torch.from_numpy(y)
        optimiser = torch.optim.SGD(model.parameters(), lr=task.learning_rate, momentum=task.momentum,
                                    weight_decay=task.weight_decay)
        generator = torch.Generator().manual_seed(task.seed)
        total_loss, seen = 0.0, 0
        model.train()
        for _ in range(task.epochs):
            order = torch.randperm(len(images), generator=generator)
            for start in range(0, len(order), task.batch_size):
                batch = order[start:start + task.batch_size]
                optimiser.zero_grad()
                loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
                loss.backward()
                optimiser.step()
                total_loss += loss.item() * len(batch)
                seen += len(batch)
        print(f"round {task.round}: party {task.party}, {len(images)} samples, loss {total_loss / max(seen, 1):.4f}",
              file=sys.stderr, flush=True)
        tc.send({name: value.detach().numpy() for name, value in model.state_dict().items()},
                samples=len(images), loss=total_loss / max(seen, 1))


if __name__ == "__main__":
    main()
