#!/usr/bin/python3
"""PyTorch reference for bench/train_throughput: SimpleCNN (NIID-Bench), the McMahan CNN
(--model mcmahan-cnn) or the small ResNet (--model resnet8, on random 3x32x32 data) local
training on one
CPU thread, batch 64, SGD lr 0.01 momentum 0.9 weight decay 1e-5, on real Fashion-MNIST
batches. Prints one line: `torch_<model> samples_per_s=<float> steps=<n> data=<source>`.

Run with Debian's /usr/bin/python3 (which has torch), not the python3 on PATH.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class McMahanCNN(nn.Module):
    """McMahan et al. 2017, as Tessera's mcmahan-cnn (examples/pytorch/train_mcmahan.py)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


class BasicBlock(nn.Module):
    """One residual block of Tessera's resnet8: conv-bn-relu-conv-bn plus the shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + self.shortcut(x))


class ResNet8(nn.Module):
    """Tessera's resnet8 preset, same names and shapes (core/model/model.h)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def load_images(directory, count):
    path = os.path.join(directory, "train-images-idx3-ubyte.gz")
    labels_path = os.path.join(directory, "train-labels-idx1-ubyte.gz")
    if not (os.path.exists(path) and os.path.exists(labels_path)):
        images = torch.randn(count, 1, 28, 28)
        labels = torch.randint(0, 10, (count,))
        return images, labels, "random"
    with gzip.open(path, "rb") as f:
        raw = np.frombuffer(f.read(), dtype=np.uint8, offset=16)
    with gzip.open(labels_path, "rb") as f:
        raw_labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    images = torch.from_numpy(raw[: count * 784].astype(np.float32) / 255.0).view(count, 1, 28, 28)
    labels = torch.from_numpy(raw_labels[:count].astype(np.int64))
    return images, labels, "fashion-mnist"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=["simplecnn", "mcmahan-cnn", "resnet8"], default="simplecnn")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = args.warmup + args.steps
    if args.model == "resnet8":
        # CIFAR-10's shape; random values, as bench_train_throughput uses for this model.
        count = min(batches * args.batch, 60000)
        images, labels, source = torch.randn(count, 3, 32, 32), torch.randint(0, 10, (count,)), "random"
    else:
        images, labels, source = load_images(args.data, min(batches * args.batch, 60000))
    count = images.shape[0]

    models = {"simplecnn": SimpleCNN, "mcmahan-cnn": McMahanCNN, "resnet8": ResNet8}
    model = models[args.model]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        start = (i * args.batch) % (count - args.batch + 1)
        x = images[start : start + args.batch]
        y = labels[start : start + args.batch]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    for i in range(args.warmup):
        step(i)
    began = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    elapsed = time.perf_counter() - began
    print(f"torch_{args.model} samples_per_s={args.steps * args.batch / elapsed:.1f} "
          f"steps={args.steps} data={source}")


if __name__ == "__main__":
    main()
